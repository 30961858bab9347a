//! The mirror controller's side of a real control plane: a client, and a
//! ConfigMap labelled for the mirror (`tests/peers/mirror-controller`).

use k8s_openapi::api::core::v1::ConfigMap;
use tether_testkit::ControlPlane;

/// A client of `plane`.
pub(crate) async fn client(plane: &ControlPlane) -> kube::Client {
    kube::Client::try_from(super::config_of(plane).await).expect("client")
}

/// `default`'s ConfigMaps, through `client`.
pub(crate) fn configmaps(client: kube::Client) -> kube::Api<ConfigMap> {
    kube::Api::namespaced(client, "default")
}

/// Creates ConfigMap `name`, labelled for the mirror, its data naming it,
/// on `remote`.
pub(crate) async fn create_labelled(remote: &ControlPlane, name: &str) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"tether.test/mirror": "yes"}},
        "data": {"made": name},
    }))
    .expect("a ConfigMap");
    configmaps(client(remote).await)
        .create(&kube::api::PostParams::default(), &cm)
        .await
        .expect("the remote creates it");
}
