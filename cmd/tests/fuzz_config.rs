//! Bad input never panics, and every rejection names a field: a
//! time-bounded random search over config files, server URLs, kubeconfigs
//! and the home cluster's Secrets (whose skips never quote a secret).
//!
//! `FUZZ_SECONDS` sets the budget (default 5; scripts/test's fuzz step runs
//! it for 60). The total executions are printed.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use secrecy::ExposeSecret as _;
use tether::config::Config;
use tokio::time::Instant;

/// Each top-level section, valid or mangled, at most once, so that random
/// files get past the YAML parser often enough to reach validation.
fn admin() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("admin: {address: \"0.0.0.0:9090\"}".to_owned()),
        "[a-z:0-9. ]{0,20}".prop_map(|a| format!("admin: {{address: \"{a}\"}}")),
    ]
}

/// A duration as a person might write one, right or wrong: up to 25 digits
/// (so past `u64`), fractions, signs, compound and unknown units.
fn duration() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,3}(ms|s|m|h|x|)",
        "-?[0-9]{1,25}(\\.[0-9]{1,4})?(ns|us|ms|s|m|h|d|w|y|sec|min|hours|)",
        "[0-9]{1,20}h[0-9]{1,20}m[0-9]{1,20}s",
        "(PT[0-9]{1,6}S|[0-9]{1,3} (seconds|minutes)|1e9s|inf|NaNs)",
    ]
}

fn probe() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("probe: {interval: 10s, timeout: 5s}".to_owned()),
        (duration(), duration())
            .prop_map(|(i, t)| format!("probe: {{interval: \"{i}\", timeout: \"{t}\"}}")),
        duration().prop_map(|a| format!("probe: {{maxConnectionAge: \"{a}\"}}")),
        (-2i64..6, -1.0f64..2.0)
            .prop_map(|(n, j)| format!("probe: {{failureThreshold: {n}, jitter: {j}}}")),
    ]
}

fn supervisor() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (0.0f64..4.0, -0.5f64..1.5)
            .prop_map(|(f, j)| format!("supervisor: {{backoff: {{factor: {f}, jitter: {j}}}}}")),
        (duration(), duration()).prop_map(|(i, m)| format!(
            "supervisor: {{backoff: {{initial: \"{i}\", max: \"{m}\"}}}}"
        )),
        (duration(), duration()).prop_map(|(s, g)| format!(
            "supervisor: {{stableAfter: \"{s}\", shutdownGrace: \"{g}\"}}"
        )),
    ]
}

fn remotes() -> impl Strategy<Value = String> {
    let remote = prop_oneof![
        "[a-z]{1,6}".prop_map(|n| format!("{{name: {n}, server: \"https://{n}.example:6443\"}}")),
        (
            "[a-zA-Z0-9._ -]{0,12}",
            "(https?|ftp|)://[a-zA-Z0-9.:@\\[\\]/-]{0,30}"
        )
            .prop_map(|(n, s)| format!("{{name: \"{n}\", server: \"{s}\"}}")),
        "[a-zA-Z0-9._/-]{0,20}".prop_map(|k| format!("{{name: k, kubeconfig: \"{k}\"}}")),
        Just("{name: both, kubeconfig: x, server: \"https://h\"}".to_owned()),
    ];
    prop::collection::vec(remote, 0..4).prop_map(|rs| format!("remotes: [{}]", rs.join(", ")))
}

fn watch() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("watch: [{apiVersion: v1, kind: ConfigMap, namespace: default}]".to_owned()),
        (
            "(v1|apps/v1|v9|[a-z0-9/.]{0,8})",
            "(ConfigMap|Node|Deployment|[A-Za-z]{0,8})",
            prop::option::of("[a-z]{1,6}")
        )
            .prop_map(|(v, k, ns)| match ns {
                Some(ns) =>
                    format!("watch: [{{apiVersion: \"{v}\", kind: \"{k}\", namespace: {ns}}}]"),
                None => format!("watch: [{{apiVersion: \"{v}\", kind: \"{k}\"}}]"),
            }),
    ]
}

fn file() -> impl Strategy<Value = String> {
    (
        admin(),
        probe(),
        supervisor(),
        remotes(),
        watch(),
        prop_oneof![3 => Just(String::new()), 1 => "[ -~\n]{0,40}"],
    )
        .prop_map(|(a, p, s, r, w, noise)| [a, p, s, r, w, noise].join("\n"))
}

/// One value of `strategy`.
fn draw<S: Strategy>(strategy: &S, runner: &mut TestRunner) -> S::Value {
    strategy
        .new_tree(runner)
        .expect("a value can be generated")
        .current()
}

/// A runner that draws values; nothing is persisted between runs.
fn runner() -> TestRunner {
    TestRunner::new(RunnerConfig {
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

#[test]
fn random_configs_never_panic_and_every_rejection_names_a_field() {
    let deadline = Instant::now() + tether_testkit::fuzz_budget();
    let mut runner = runner();
    let strategy = file();
    let (mut executions, mut accepted) = (0u64, 0u64);
    while Instant::now() < deadline {
        let text = draw(&strategy, &mut runner);
        executions += 1;
        match std::panic::catch_unwind(|| {
            Config::parse(&text, "fuzz.yaml", Path::new("/nonexistent"))
        }) {
            Ok(Ok(config)) => {
                accepted += 1;
                // An accepted duration is one the timers can add to now.
                let day = Duration::from_secs(24 * 3600);
                for (field, value) in [
                    ("probe.interval", config.probe.interval),
                    ("probe.timeout", config.probe.timeout),
                    ("probe.maxConnectionAge", config.probe.max_connection_age),
                    (
                        "supervisor.backoff.initial",
                        config.supervisor.backoff.initial,
                    ),
                    ("supervisor.backoff.max", config.supervisor.backoff.max),
                    ("supervisor.stableAfter", config.supervisor.stable_after),
                    ("supervisor.shutdownGrace", config.supervisor.shutdown_grace),
                ] {
                    assert!(value <= day, "{field} = {value:?} accepted from {text:?}");
                }
                let _ = config.probe.detection_bound();
            }
            Ok(Err(err)) => {
                assert_eq!(err.file, "fuzz.yaml");
                assert!(!err.field.is_empty(), "no field for {text:?}: {err}");
                assert!(!err.message.is_empty(), "no reason for {text:?}: {err}");
            }
            Err(payload) => {
                std::panic::resume_unwind(Box::new(format!(
                    "Config::parse panicked on {text:?}: {payload:?}"
                )));
            }
        }
    }
    println!("config fuzz: {executions} executions, {accepted} accepted");
    assert!(executions > 100, "the budget allowed too few executions");
}

#[test]
fn random_server_urls_never_panic_identity() {
    let deadline = Instant::now() + tether_testkit::fuzz_budget();
    let mut runner = runner();
    let strategy = "(https?|HTTPS?|ftp|)(://)?([a-zA-Z0-9_-]{0,8}(:[a-z0-9]{0,6})?@)?[a-zA-Z0-9.\\[\\]:-]{0,24}(:[0-9]{0,6})?(/[a-z/]{0,10})?";
    let mut executions = 0u64;
    while Instant::now() < deadline {
        let text = draw(&strategy, &mut runner);
        executions += 1;
        let Ok(uri) = text.parse::<http::Uri>() else {
            continue;
        };
        let outcome = std::panic::catch_unwind(|| {
            let normalized = tether_probes::client::normalize_url(&uri);
            let identity = tether_probes::Identity::of(&kube::Config::new(uri.clone()));
            (normalized, identity)
        });
        let (normalized, identity) =
            outcome.unwrap_or_else(|_| panic!("identity panicked on {text:?}"));
        if let (Ok(url), Ok(identity)) = (normalized, identity) {
            assert_eq!(url, identity.url);
            assert!(
                !identity.host().contains('@'),
                "userinfo in the host label of {text:?}"
            );
        }
    }
    println!("identity fuzz: {executions} executions");
    assert!(executions > 100);
}

/// A kubeconfig, valid or mangled: clusters, users and contexts that refer
/// to each other or not, files that exist or not, exec plugins, noise.
fn kubeconfig() -> impl Strategy<Value = String> {
    let server = prop_oneof![
        Just("https://h:6443".to_owned()),
        "(https?|ftp|)://[a-z0-9.:\\[\\]@-]{0,24}",
    ];
    let cluster_extra = prop_oneof![
        Just(String::new()),
        Just(", insecure-skip-tls-verify: true".to_owned()),
        "[a-z/.]{0,20}".prop_map(|p| format!(", certificate-authority: \"{p}\"")),
        "[A-Za-z0-9+/=]{0,40}".prop_map(|d| format!(", certificate-authority-data: \"{d}\"")),
    ];
    let user = prop_oneof![
        Just("token: t0ken".to_owned()),
        "[a-z/.]{0,20}".prop_map(|p| format!("tokenFile: \"{p}\"")),
        "[a-z/.]{0,12}".prop_map(|p| format!("client-certificate: \"{p}\", client-key: \"{p}\"")),
        Just("exec: {apiVersion: client.authentication.k8s.io/v1, command: \"true\"}".to_owned()),
        Just("exec: {}".to_owned()),
        Just(String::new()),
    ];
    let names = "(one|two|)";
    (server, cluster_extra, user, names, names, "[ -~\n]{0,30}").prop_map(
        |(server, cluster, user, context, current, noise)| {
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: \"{current}\"\n\
                 clusters: [{{name: c, cluster: {{server: \"{server}\"{cluster}}}}}]\n\
                 users: [{{name: u, user: {{{user}}}}}]\n\
                 contexts: [{{name: \"{context}\", context: {{cluster: c, user: u}}}}]\n{noise}"
            )
        },
    )
}

#[test]
fn random_kubeconfigs_never_panic_and_every_rejection_names_the_remote() {
    let deadline = Instant::now() + tether_testkit::fuzz_budget();
    let mut runner = runner();
    let strategy = kubeconfig();
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig_path = dir.path().join("k.yaml");
    // The kubeconfig must exist for the config to load; its content changes.
    std::fs::write(&kubeconfig_path, "apiVersion: v1\n").expect("write");
    let config_path = dir.path().join("fuzz.yaml");
    std::fs::write(&config_path, "remotes: [{name: a, kubeconfig: k.yaml}]\n").expect("write");
    let config = Config::load(&config_path).expect("a config naming the kubeconfig");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (mut executions, mut accepted) = (0u64, 0u64);
    while Instant::now() < deadline {
        let text = draw(&strategy, &mut runner);
        std::fs::write(&kubeconfig_path, &text).expect("write");
        executions += 1;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(tether::config::remote::resolve(&config))
        }));
        match outcome {
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(err)) => {
                assert_eq!(err.file, config_path.display().to_string());
                assert!(
                    err.field.starts_with("remotes[0]"),
                    "no remote field for {text:?}: {err}"
                );
                assert!(!err.message.is_empty(), "no reason for {text:?}: {err}");
            }
            Err(payload) => std::panic::resume_unwind(Box::new(format!(
                "resolving panicked on {text:?}: {payload:?}"
            ))),
        }
    }
    println!("kubeconfig fuzz: {executions} executions, {accepted} accepted");
    assert!(executions > 100, "the budget allowed too few executions");
}

/// Argo CD's cluster config JSON, valid or mangled: a token (the secret a
/// message must never show), TLS data that is base64 or not, plugins,
/// noise.
fn argocd_config() -> impl Strategy<Value = String> {
    let tls = prop_oneof![
        Just(String::new()),
        "[A-Za-z0-9+/=!]{0,24}".prop_map(|d| format!("\"caData\": \"{d}\"")),
        "[A-Za-z0-9+/=!]{0,24}"
            .prop_map(|d| format!("\"certData\": \"{d}\", \"keyData\": \"{d}\"")),
        Just("\"insecure\": true, \"serverName\": \"api\"".to_owned()),
        Just("\"insecure\": \"yes\"".to_owned()),
    ];
    let auth = prop_oneof![
        Just("\"bearerToken\": \"s3cret\"".to_owned()),
        Just("\"username\": \"u\", \"password\": \"s3cret\"".to_owned()),
        Just("\"execProviderConfig\": {\"command\": \"s3cret\"}".to_owned()),
        Just("\"awsAuthConfig\": {\"clusterName\": \"s3cret\"}".to_owned()),
        Just(String::new()),
    ];
    (auth, tls, "[ -~]{0,12}").prop_map(|(auth, tls, noise)| {
        let auth = if auth.is_empty() {
            auth
        } else {
            format!("{auth}, ")
        };
        format!("{{{auth}\"tlsClientConfig\": {{{tls}}}}}{noise}")
    })
}

/// A Secret of each format, its keys present or not, its values valid,
/// mangled or not UTF-8.
fn discovered_secret()
-> impl Strategy<Value = (tether::config::SecretFormat, Vec<(String, Vec<u8>)>, String)> {
    use tether::config::SecretFormat;
    let format = prop_oneof![
        Just(SecretFormat::ArgoCd),
        Just(SecretFormat::ClusterApi),
        Just(SecretFormat::Kubeconfig),
    ];
    let big = tether::discovery::secret::MAX_VALUE;
    let value = prop_oneof![
        4 => kubeconfig().prop_map(|k| k.replace("t0ken", "s3cret").into_bytes()),
        4 => argocd_config().prop_map(String::into_bytes),
        1 => proptest::collection::vec(any::<u8>(), 0..24),
        // Anchors and aliases, nested: each level a copy of the one below.
        1 => (kubeconfig(), 1..6usize, 1..8usize).prop_map(|(k, levels, fan)| {
            use std::fmt::Write as _;

            let mut bomb = String::from("extensions:\n- name: e\n  extension:\n    l0: &l0 [s3cret]\n");
            for level in 1..=levels {
                let refs = vec![format!("*l{}", level - 1); fan].join(", ");
                let _ = writeln!(bomb, "    l{level}: &l{level} [{refs}]");
            }
            format!("{bomb}{}", k.replace("t0ken", "s3cret")).into_bytes()
        }),
        // Around the bound on a value: under it, at it and past it.
        1 => (kubeconfig(), prop_oneof![Just(big - 200), Just(big), Just(big + 1)]).prop_map(
            |(k, size)| {
                let mut text = k.replace("t0ken", "s3cret");
                text.push_str("\n# ");
                while text.len() < size {
                    text.push('x');
                }
                text.into_bytes()
            }
        ),
    ];
    let key = prop_oneof![
        Just("name".to_owned()),
        Just("server".to_owned()),
        Just("config".to_owned()),
        Just("value".to_owned()),
        Just("kubeconfig".to_owned()),
    ];
    // A hostile or proxied home cluster may send any name at all.
    let name = prop_oneof![
        Just("c-1".to_owned()),
        "[a-zA-Z0-9_.-]{0,70}",
        "(home|c-1)?[\\x00-\\x1f\\x7f\\u{80}-\\u{9f}a-z]{1,20}",
    ];
    (format, proptest::collection::vec((key, value), 0..5), name)
}

#[test]
fn random_secrets_never_panic_and_every_skip_names_a_field_and_no_secret() {
    use std::sync::Arc;

    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;

    let deadline = Instant::now() + tether_testkit::fuzz_budget();
    let mut runner = runner();
    let strategy = discovered_secret();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let (mut executions, mut found) = (0u64, 0u64);
    while Instant::now() < deadline {
        let (format, data, name) = draw(&strategy, &mut runner);
        executions += 1;
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.clone());
        secret.metadata.labels = Some(
            [(
                "cluster.x-k8s.io/cluster-name".to_owned(),
                name.trim_end_matches("-kubeconfig").to_owned(),
            )]
            .into(),
        );
        secret.data = Some(data.into_iter().map(|(k, v)| (k, ByteString(v))).collect());
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match tether::discovery::secret::read(format, &secret) {
                Ok(Some(cluster)) => {
                    let kept = cluster.json.expose_secret().len();
                    assert!(
                        kept <= tether::discovery::secret::MAX_KEPT,
                        "{kept} bytes kept of one cluster"
                    );
                    let source = Arc::new(tether::config::SecretSource {
                        namespace: "ns".to_owned(),
                        name: name.clone(),
                        digest: Vec::new(),
                        kubeconfig: Some(cluster.json),
                    });
                    runtime
                        .block_on(tether::config::remote::discovered(
                            &cluster.name,
                            true,
                            &cluster.kubeconfig,
                            source,
                        ))
                        .map(drop)
                        .map_err(|(field, message)| {
                            (tether::discovery::secret::field_of(format, field), message)
                        })
                }
                Ok(None) => Ok(()),
                Err(skipped) => Err((skipped.field, skipped.message)),
            }
        }));
        match outcome {
            Ok(Ok(())) => found += 1,
            Ok(Err((field, message))) => {
                assert!(
                    !field.is_empty() && !message.is_empty(),
                    "{field}: {message}"
                );
                assert!(
                    !message.contains("s3cret"),
                    "a secret in {field}: {message}"
                );
                assert!(
                    !message.chars().any(char::is_control),
                    "a peer's control character in {field}: {message:?}"
                );
            }
            Err(payload) => std::panic::resume_unwind(Box::new(format!(
                "reading a {format} Secret panicked: {payload:?}"
            ))),
        }
    }
    println!("secret fuzz: {executions} executions, {found} read as a cluster or passed over");
    assert!(executions > 100, "the budget allowed too few executions");
}
