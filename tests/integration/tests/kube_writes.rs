//! kube-rs's write paths against the simulated apiserver: server-side apply
//! and merge patches, `dryRun`, delete preconditions, and a Lease update race
//! that exactly one client wins.

mod common;

use common::client_for;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::{Api, Client};
use serde_json::json;
use tether_testkit::{ApiServer, Options};

async fn start() -> (ApiServer, Client) {
    let server = ApiServer::start(Options::default().tls(true).token("kube-rs"))
        .await
        .expect("starts");
    let client = client_for(&server).await;
    (server, client)
}

fn api_error(err: kube::Error) -> (u16, String) {
    match err {
        kube::Error::Api(status) => (status.code, status.reason),
        other => panic!("expected a Status error, got {other:?}"),
    }
}

fn applied(value: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"a": value}})
}

#[tokio::test]
async fn server_side_apply_owns_fields_conflicts_with_a_merge_patch_and_forces() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let apply = PatchParams::apply("tether-test");

    let created = api
        .patch("ssa", &apply, &Patch::Apply(applied("1")))
        .await
        .expect("an apply creates");
    let managed = created.metadata.managed_fields.expect("managedFields");
    assert_eq!(managed.len(), 1);
    assert_eq!(managed[0].manager.as_deref(), Some("tether-test"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));

    let again = api
        .patch("ssa", &apply, &Patch::Apply(applied("1")))
        .await
        .expect("a repeat applies");
    assert_eq!(
        again.metadata.resource_version, created.metadata.resource_version,
        "a repeated apply is not written"
    );

    let merge = PatchParams {
        field_manager: Some("editor".into()),
        ..PatchParams::default()
    };
    let merged = api
        .patch(
            "ssa",
            &merge,
            &Patch::Merge(json!({"data": {"a": "2", "b": "3"}})),
        )
        .await
        .expect("a merge patch");
    assert_eq!(
        merged.data.expect("data").get("a").map(String::as_str),
        Some("2")
    );

    let err = api
        .patch("ssa", &apply, &Patch::Apply(applied("1")))
        .await
        .expect_err("the editor owns data.a now");
    assert_eq!(api_error(err), (409, "Conflict".to_owned()));

    let forced = api
        .patch("ssa", &apply.clone().force(), &Patch::Apply(applied("1")))
        .await
        .expect("force takes it back");
    let data = forced.data.expect("data");
    assert_eq!(data.get("a").map(String::as_str), Some("1"));
    assert_eq!(
        data.get("b").map(String::as_str),
        Some("3"),
        "the editor's own field stays"
    );

    let no_manager = api
        .patch("ssa", &PatchParams::default(), &Patch::Apply(applied("1")))
        .await
        .expect_err("apply needs a field manager");
    assert_eq!(api_error(no_manager).0, 400);
}

#[tokio::test]
async fn exactly_one_of_two_racing_lease_updates_wins() {
    let (server, first) = start().await;
    let second = client_for(&server).await;
    let leases: Api<Lease> = Api::default_namespaced(first);
    let rival: Api<Lease> = Api::default_namespaced(second);
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "leader"},
        "spec": {"holderIdentity": "", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }))
    .expect("a Lease");
    let created = leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("created");

    // Both read the same version, and both try to take the Lease.
    let take = |holder: &str| {
        let mut lease = created.clone();
        let spec = lease.spec.as_mut().expect("spec");
        spec.holder_identity = Some(holder.to_owned());
        spec.lease_transitions = Some(1);
        lease
    };
    let (mine, theirs, post) = (take("replica-a"), take("replica-b"), PostParams::default());
    let (a, b) = tokio::join!(
        leases.replace("leader", &post, &mine),
        rival.replace("leader", &post, &theirs),
    );
    let (winner, loser) = match (a, b) {
        (Ok(won), Err(lost)) | (Err(lost), Ok(won)) => (won, lost),
        (a, b) => panic!("exactly one must win: {a:?} / {b:?}"),
    };
    assert_eq!(api_error(loser), (409, "Conflict".to_owned()));
    let now = leases.get("leader").await.expect("get");
    assert_eq!(
        now.spec.expect("spec").holder_identity,
        winner.spec.expect("spec").holder_identity
    );
}

#[tokio::test]
async fn dry_run_changes_nothing_and_a_stale_delete_precondition_conflicts() {
    let (_server, client) = start().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "dry"}, "data": {"a": "1"}}))
            .expect("a ConfigMap");
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let would = api.create(&dry, &cm).await.expect("a dry-run create");
    assert_eq!(would.metadata.name.as_deref(), Some("dry"));
    assert_eq!(
        api_error(api.get("dry").await.expect_err("nothing stored")).0,
        404
    );

    let created = api
        .create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let dry_delete = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    api.delete("dry", &dry_delete)
        .await
        .expect("a dry-run delete");
    api.get("dry").await.expect("still there");

    let stale = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: Some("1".to_owned()),
            uid: None,
        }),
        ..DeleteParams::default()
    };
    let err = api
        .delete("dry", &stale)
        .await
        .expect_err("a stale precondition");
    assert_eq!(api_error(err), (409, "Conflict".to_owned()));
    let current = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: created.metadata.resource_version.clone(),
            uid: created.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    api.delete("dry", &current)
        .await
        .expect("the current version deletes");
    assert_eq!(api_error(api.get("dry").await.expect_err("gone")).0, 404);
}
