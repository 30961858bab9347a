//! The binary's command line, run as a real process.

use std::path::Path;
use std::process::{Command, Output};

fn tether(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("the tether binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A folder with a config file (and the files it points to).
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            dir.path().join("ca.crt"),
            "not checked until a client is built\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("token"), "t0ken\n").expect("write");
        Self { dir }
    }

    fn config(&self, yaml: &str) -> String {
        let path = self.dir.path().join("tether.yaml");
        std::fs::write(&path, yaml).expect("write config");
        path.display().to_string()
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

#[test]
fn version_prints_the_crate_version() {
    let out = tether(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        text(&out.stdout).trim(),
        format!("tether {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn without_a_config_or_a_cluster_to_infer_run_exits_2_and_says_why() {
    let home = tempfile::tempdir().expect("temp dir");
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("run")
        .env("HOME", home.path())
        .env("KUBECONFIG", home.path().join("none"))
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("RUST_LOG")
        .output()
        .expect("the tether binary runs");
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("<defaults>") && stderr.contains("remotes[0]"),
        "{stderr}"
    );
    assert!(stderr.contains("no config file"), "{stderr}");
}

#[test]
fn every_config_mistake_exits_2_naming_the_file_and_the_field() {
    const REMOTE: &str = "remotes: [{name: a, server: \"https://10.0.0.7:6443\"}]\n";
    let cases: &[(&str, String, &str)] = &[
        ("an unknown top-level key", format!("remotess: []\n{REMOTE}"), "remotess"),
        ("an unknown remote key", "remotes: [{name: a, server: \"https://h:6443\", tokenFle: x}]\n".to_owned(), "tokenFle"),
        ("a duplicate name", "remotes: [{name: a, server: \"https://h:6443\"}, {name: a, server: \"https://g:6443\"}]\n".to_owned(), "remotes[1].name"),
        ("an invalid name", "remotes: [{name: \"Cluster A\", server: \"https://h:6443\"}]\n".to_owned(), "remotes[0].name"),
        ("a bad URL", "remotes: [{name: a, server: \"ftp://h\"}]\n".to_owned(), "remotes[0].server"),
        ("a missing CA file", "remotes: [{name: a, server: \"https://h:6443\", caFile: missing.crt}]\n".to_owned(), "remotes[0].caFile"),
        ("a missing kubeconfig", "remotes: [{name: a, kubeconfig: nope.yaml}]\n".to_owned(), "remotes[0].kubeconfig"),
        ("kubeconfig and server both", "remotes: [{name: a, kubeconfig: token, server: \"https://h:6443\"}]\n".to_owned(), "remotes[0]"),
        ("a timeout over half the interval", format!("probe: {{interval: 10s, timeout: 6s}}\n{REMOTE}"), "probe.timeout"),
        ("a zero failure threshold", format!("probe: {{failureThreshold: 0}}\n{REMOTE}"), "probe.failureThreshold"),
        ("a bad duration", format!("probe: {{interval: 10x}}\n{REMOTE}"), "probe.interval"),
        ("a backoff jitter out of range", format!("supervisor: {{backoff: {{jitter: 1.5}}}}\n{REMOTE}"), "supervisor.backoff.jitter"),
        ("an unknown watch kind", format!("{REMOTE}watch: [{{apiVersion: v9, kind: Gadget}}]\n"), "watch[0]"),
        ("a bad admin address", format!("admin: {{address: nine-oh-nine-oh}}\n{REMOTE}"), "admin.address"),
        ("no remotes", "remotes: []\n".to_owned(), "remotes"),
        ("a wrong type", format!("probe: {{failureThreshold: three}}\n{REMOTE}"), "probe.failureThreshold"),
        ("a wrong type in a nested section", format!("supervisor: {{backoff: {{jitter: lots}}}}\n{REMOTE}"), "supervisor.backoff.jitter"),
        ("a misspelt key", format!("probe:\n  failureTreshold: 3\n{REMOTE}"), "probe.failureTreshold: unknown field; did you mean failureThreshold?"),
        ("three misspelt keys (the last named too)", "probe: {failureTreshold: 3, intervl: 1s}\nremotes: [{name: a, sever: x}]\n".to_owned(), "remotes[0].sever: unknown field; did you mean server?"),
        ("an overflowing duration", format!("probe: {{interval: 1142673313454786114h}}\n{REMOTE}"), "probe.interval"),
        ("a duration over a day", format!("supervisor: {{shutdownGrace: 25h}}\n{REMOTE}"), "supervisor.shutdownGrace"),
        ("a zero connection age", format!("probe: {{maxConnectionAge: 0s}}\n{REMOTE}"), "probe.maxConnectionAge"),
        ("a duration past u64", format!("probe: {{interval: 18446744073709551615s}}\n{REMOTE}"), "probe.interval"),
        ("a backoff past a day", format!("supervisor: {{backoff: {{max: 307445734561825861m}}}}\n{REMOTE}"), "supervisor.backoff.max"),
        ("a port out of range", "remotes: [{name: a, server: \"https://h:99999\"}]\n".to_owned(), "remotes[0].server: invalid URL \"https://h:99999\": invalid URL: port 99999"),
        ("a probe path with CR/LF", format!("probe: {{path: \"/readyz\\r\\nX-Injected: 1\"}}\n{REMOTE}"), "probe.path"),
        ("a CA file with no certificate", "remotes: [{name: a, server: \"https://h:6443\", caFile: token}]\n".to_owned(), "remotes[0].caFile: its certificate authority holds no certificate"),
        ("an invalid label selector", format!("{REMOTE}watch: [{{apiVersion: v1, kind: ConfigMap, labelSelector: \"app in x\"}}]\n"), "watch[0].labelSelector"),
        ("a kubeconfig that is a directory", "remotes: [{name: a, kubeconfig: .}]\n".to_owned(), "is a directory, not a file"),
        ("an exec manager without a command", format!("{REMOTE}manager: {{exec: {{env: []}}}}\n"), "manager.exec.command"),
        ("an exec manager and a watch list", format!("{REMOTE}watch: []\nmanager: {{exec: {{command: [x]}}}}\n"), "watch: does not go with manager.exec"),
        ("an unknown stop signal", format!("{REMOTE}manager: {{exec: {{command: [x], stopSignal: SIGFOO}}}}\n"), "manager.exec.stopSignal"),
        ("a grace period past the shutdown grace", format!("{REMOTE}manager: {{exec: {{command: [x], gracePeriod: 40s}}}}\n"), "manager.exec.gracePeriod"),
        ("a readiness check without a port", format!("{REMOTE}manager: {{exec: {{command: [x], readiness: {{httpGet: {{path: /readyz}}}}}}}}\n"), "manager.exec.readiness.httpGet.port"),
        ("an env entry without a name", format!("{REMOTE}manager: {{exec: {{command: [x], env: [{{value: v}}]}}}}\n"), "manager.exec.env[0].name"),
        ("a renew deadline past the lease duration", format!("{REMOTE}leaderElection: {{enabled: true, leaseNamespace: x, leaseDuration: 10s, renewDeadline: 10s}}\n"), "leaderElection.leaseDuration"),
        ("a retry period past the renew deadline", format!("{REMOTE}leaderElection: {{enabled: true, leaseNamespace: x, retryPeriod: 10s}}\n"), "leaderElection.renewDeadline"),
        ("a bad lease name", format!("{REMOTE}leaderElection: {{enabled: true, leaseName: \"Bad Name\"}}\n"), "leaderElection.leaseName"),
        ("an exec grace past the fence", format!("{REMOTE}leaderElection: {{enabled: true}}\nmanager: {{exec: {{command: [x], gracePeriod: 8s}}}}\n"), "manager.exec.gracePeriod: 8s must be at most leaderElection.leaseDuration - renewDeadline (5s)"),
        ("a working directory that is not one", format!("{REMOTE}manager: {{exec: {{command: [x], workingDir: token}}}}\n"), "manager.exec.workingDir"),
    ];
    for (what, yaml, field) in cases {
        let setup = Setup::new();
        let file = setup.config(yaml);
        for command in ["validate", "check"] {
            let out = tether(&[command, "--config", &file]);
            let stderr = text(&out.stderr);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{what} ({command}): exit {:?}, stderr {stderr}",
                out.status
            );
            assert!(
                stderr.contains(&file),
                "{what}: the message does not name the file: {stderr}"
            );
            assert!(
                stderr.contains(field),
                "{what}: the message does not name {field}: {stderr}"
            );
            assert!(
                out.stdout.is_empty(),
                "{what}: printed something besides the error"
            );
        }
    }
}

#[test]
fn a_command_after_dashes_is_the_exec_manager_and_clashes_with_one_in_the_file() {
    const REMOTE: &str = "remotes: [{name: a, server: \"https://10.0.0.7:6443\"}]\n";
    let setup = Setup::new();
    let file = setup.config(REMOTE);
    let out = tether(&[
        "validate",
        "--config",
        &file,
        "--",
        "/bin/true",
        "--leader-elect=false",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("manager: exec, a new process each cycle, in a process group of its own: /bin/true '--leader-elect=false'"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sends SIGTERM to the group, then SIGKILL after 20s"),
        "{stdout}"
    );

    let file = setup.config(&format!(
        "{REMOTE}manager: {{exec: {{command: [/bin/true], env: [{{name: TOKEN, value: s3cret}}]}}}}\n"
    ));
    let out = tether(&["validate", "--config", &file]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("env TOKEN (value not shown)"), "{stdout}");
    assert!(
        !stdout.contains("s3cret"),
        "an env value reached the output: {stdout}"
    );
    // Settings from the file, the command after `--`, as the chart's second
    // way runs it.
    let other = Setup::new();
    let settings = other.config(&format!(
        "{REMOTE}manager: {{exec: {{readiness: {{httpGet: {{port: 8081, path: /readyz}}}}, gracePeriod: 5s}}}}\n"
    ));
    let out = tether(&["validate", "--config", &settings, "--", "/bin/true"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("in a process group of its own: /bin/true\n")
            && stdout.contains("up when GET http://127.0.0.1:8081/readyz")
            && stdout.contains("SIGKILL after 5s"),
        "{stdout}"
    );
    for command in ["validate", "run"] {
        let out = tether(&[command, "--config", &file, "--", "/other"]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains(&file)
                && stderr.contains("manager.exec")
                && stderr.contains("after `--`"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn validate_prints_the_normalized_config_and_deduplicated_identities() {
    let setup = Setup::new();
    let file = setup.config(
        "probe: {interval: 4s, timeout: 2s}\n\
         remotes:\n\
         - {name: a, server: \"https://API.example.com:6443/\", tokenFile: token}\n\
         - {name: a-alias, server: \"https://api.example.com:6443\", tokenFile: token}\n\
         - {name: b, server: \"https://admin:hunter2@10.0.0.8:6443\", required: false}\n",
    );
    let out = tether(&["validate", "--config", &file]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("every 4s"), "{stdout}");
    assert!(
        stdout.contains("https://api.example.com:6443: a, a-alias"),
        "{stdout}"
    );
    assert!(stdout.contains("https://10.0.0.8:6443: b"), "{stdout}");
    assert!(stdout.contains("b (optional)"), "{stdout}");
    assert!(
        !stdout.contains("hunter2"),
        "userinfo was printed: {stdout}"
    );
    let _ = setup.path();
}

/// A kubeconfig with one context whose cluster and user carry `cluster`
/// and `user` (YAML flow fields).
fn kubeconfig_with(setup: &Setup, cluster: &str, user: &str) -> String {
    let path = setup.path().join("k.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: one\n\
             clusters: [{{name: c, cluster: {{server: \"https://h:6443\"{cluster}}}}}]\n\
             users: [{{name: u, user: {{{user}}}}}]\n\
             contexts: [{{name: one, context: {{cluster: c, user: u}}}}]\n"
        ),
    )
    .expect("write");
    setup.config(&format!(
        "remotes: [{{name: a, kubeconfig: {}}}]\n",
        path.display()
    ))
}

#[test]
fn files_a_kubeconfig_names_must_be_readable_and_are_named() {
    for (cluster, user, named) in [
        (
            ", certificate-authority: /nonexistent/ca.crt",
            "token: t",
            "its certificate-authority: file /nonexistent/ca.crt does not exist",
        ),
        (
            "",
            "tokenFile: /nonexistent/token",
            "its tokenFile: file /nonexistent/token does not exist",
        ),
        (
            "",
            "client-certificate: /nonexistent/c.crt, client-key: /nonexistent/c.key",
            "its client-certificate: file /nonexistent/c.crt does not exist",
        ),
    ] {
        let setup = Setup::new();
        let file = kubeconfig_with(&setup, cluster, user);
        let out = tether(&["validate", "--config", &file]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{named}: {stderr}");
        assert!(
            stderr.contains("remotes[0].kubeconfig") && stderr.contains(named),
            "{stderr}"
        );
    }
}

#[test]
fn a_kubeconfig_behind_a_symlink_loop_is_named_as_such() {
    let setup = Setup::new();
    let (one, two) = (setup.path().join("loop1"), setup.path().join("loop2"));
    std::os::unix::fs::symlink(&two, &one).expect("symlink");
    std::os::unix::fs::symlink(&one, &two).expect("symlink");
    let file = setup.config("remotes: [{name: a, kubeconfig: loop1}]\n");
    let out = tether(&["validate", "--config", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("remotes[0].kubeconfig") && stderr.contains("symbolic links"),
        "{stderr}"
    );
    assert!(!stderr.contains("does not exist"), "{stderr}");
}

#[test]
fn validate_warns_of_unverified_tls_and_tokens_over_plain_http() {
    let setup = Setup::new();
    let file = kubeconfig_with(&setup, ", insecure-skip-tls-verify: true", "token: t");
    let out = tether(&["validate", "--config", &file]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.contains("warning: TLS verification is OFF"),
        "{stdout}"
    );
    assert!(stdout.contains("TLS verification OFF: a"), "{stdout}");

    let plain = setup.config("remotes: [{name: a, server: \"http://h:6443\", tokenFile: token}]\n");
    let out = tether(&["validate", "--config", &plain]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("warning: a bearer token is sent over plain http"),
        "{stdout}"
    );
}

#[test]
fn a_missing_context_is_named_with_the_contexts_that_exist() {
    let setup = Setup::new();
    let kubeconfig = setup.path().join("k.yaml");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: one\n\
         clusters: [{name: c, cluster: {server: \"https://h:6443\"}}]\n\
         users: [{name: u, user: {token: t}}]\n\
         contexts: [{name: one, context: {cluster: c, user: u}}, {name: two, context: {cluster: c, user: u}}]\n",
    )
    .expect("write");
    let file = setup.config(&format!(
        "remotes: [{{name: a, kubeconfig: {}, context: nosuch}}]\n",
        kubeconfig.display()
    ));
    let out = tether(&["validate", "--config", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("remotes[0].context")
            && stderr.contains("has no context \"nosuch\"; it has: one, two"),
        "{stderr}"
    );
}

/// Runs tether with a stdout whose reader is already gone.
fn with_closed_stdout(args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("the tether binary runs")
}

#[test]
fn validate_ends_quietly_when_its_reader_is_gone() {
    let setup = Setup::new();
    let file = setup.config("remotes: [{name: a, server: \"https://h:6443\"}]\n");
    let out = with_closed_stdout(&["validate", "--config", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));
}

mod check {
    use tether_testkit::{ApiServer, Fault, Options};

    use super::*;
    use crate::with_closed_stdout;

    fn kubeconfig(setup: &Setup, name: &str, server: &ApiServer) -> String {
        let path = setup.path().join(format!("{name}.kubeconfig"));
        server.kubeconfig().write(&path).expect("kubeconfig");
        path.display().to_string()
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn check_exits_0_when_all_are_reachable_and_1_when_one_is_not() {
        let a = ApiServer::start(Options::default().tls(true).token("s3cret"))
            .await
            .expect("server");
        let b = ApiServer::start(Options::default()).await.expect("server");
        let setup = Setup::new();
        let file = setup.config(&format!(
            "remotes:\n- {{name: a, kubeconfig: {}}}\n- {{name: b, kubeconfig: {}}}\n",
            kubeconfig(&setup, "a", &a),
            kubeconfig(&setup, "b", &b),
        ));
        let run = |file: String| {
            tokio::task::spawn_blocking(move || tether(&["check", "--config", &file]))
        };

        let out = run(file.clone()).await.expect("ran");
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
        assert_eq!(
            stdout
                .lines()
                .filter(|l| l.contains("required") && l.contains("reachable"))
                .count(),
            2,
            "{stdout}"
        );
        assert!(!stdout.contains("s3cret"));
        let quiet = tokio::task::spawn_blocking({
            let file = file.clone();
            move || with_closed_stdout(&["check", "--config", &file])
        })
        .await
        .expect("ran");
        assert_eq!(quiet.status.code(), Some(0), "{}", text(&quiet.stderr));
        assert!(quiet.stderr.is_empty(), "{}", text(&quiet.stderr));

        b.set_fault(Fault::Refuse).await.expect("refuse");
        let out = run(file).await.expect("ran");
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{stdout}");
        let row = stdout
            .lines()
            .find(|l| l.starts_with("b "))
            .expect("a row for b");
        // Under load a refusing port can read as a reset.
        assert!(
            row.contains("unreachable") && (row.contains("refused") || row.contains("reset")),
            "{row}"
        );
    }
}

#[test]
fn a_token_in_a_server_urls_query_is_never_printed() {
    let setup = Setup::new();
    let file = setup.config(
        "remotes: [{name: a, server: \"https://h:6443/?access_token=S3cr3tQuery\", tokenFile: token}]\n",
    );
    let out = tether(&["validate", "--config", &file]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("server https://h:6443/"), "{stdout}");
    assert!(
        !stdout.contains("S3cr3tQuery") && !stderr.contains("S3cr3tQuery"),
        "{stdout}{stderr}"
    );
}

#[test]
fn a_token_an_http_header_cannot_carry_is_refused_naming_the_field() {
    let setup = Setup::new();
    // In a kubeconfig: kube would panic building every client with it.
    let file = kubeconfig_with(&setup, "", "token: \"ab\\u0001c\"");
    for command in ["validate", "check"] {
        let out = tether(&[command, "--config", &file]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {stderr}");
        assert!(
            stderr.contains("remotes[0].kubeconfig: its user's token holds a character an HTTP header cannot carry"),
            "{command}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // In a token file.
    std::fs::write(setup.path().join("bad-token"), "ab\u{1}c\n").expect("write");
    let file =
        setup.config("remotes: [{name: a, server: \"https://h:6443\", tokenFile: bad-token}]\n");
    let out = tether(&["validate", "--config", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("remotes[0].tokenFile: its token file"),
        "{stderr}"
    );
}

/// What `run` needs beyond the file is checked by `validate` and `check`
/// too: a Lease with no cluster to hold it (outside a pod, no kubeconfig),
/// and an exec command that is not there. Each exits 2 naming the field,
/// with no cause said twice.
#[test]
fn validate_and_check_refuse_what_run_would_refuse() {
    let setup = Setup::new();
    let remote = "remotes: [{name: a, server: \"http://127.0.0.1:1\"}]\n";
    let cases = [
        (
            format!("{remote}leaderElection: {{enabled: true}}\n"),
            "leaderElection: no cluster to hold the Lease",
        ),
        (
            format!("{remote}leaderElection: {{enabled: true, kubeconfig: missing.yaml}}\n"),
            "leaderElection.kubeconfig",
        ),
        (
            format!("{remote}manager: {{exec: {{command: [no-such-controller]}}}}\n"),
            "manager.exec.command: no-such-controller is not found on PATH",
        ),
    ];
    for (yaml, says) in &cases {
        let config = setup.config(yaml);
        for command in ["validate", "check", "run"] {
            let out = Command::new(env!("CARGO_BIN_EXE_tether"))
                .args([command, "--config", &config])
                .env_remove("RUST_LOG")
                .env("HOME", setup.path())
                .env_remove("KUBECONFIG")
                .env_remove("KUBERNETES_SERVICE_HOST")
                .output()
                .expect("runs");
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{command} {yaml}: {stderr}");
            assert!(stderr.contains(says), "{command} {yaml}: {stderr}");
            for part in stderr.split(": ") {
                assert!(
                    part.len() < 20 || stderr.matches(part).count() == 1,
                    "{command}: {part:?} said twice: {stderr}"
                );
            }
        }
    }
}

#[test]
fn check_prints_json_with_dash_o_and_exits_1_for_an_unreachable_remote() {
    let setup = Setup::new();
    let config = setup.config("remotes: [{name: a, server: \"http://127.0.0.1:1\"}]\n");
    let out = tether(&["check", "-o", "json", "--config", &config]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["remotes"][0]["name"], "a");
    assert_eq!(doc["remotes"][0]["state"], "unreachable");
    assert_eq!(doc["remotes"][0]["gate"], "required");
    assert!(doc["leaderElection"].is_null());
}

#[test]
fn validate_says_which_lease_leader_election_keeps_and_where() {
    let setup = Setup::new();
    let lease = setup.path().join("home.kubeconfig");
    std::fs::write(
        &lease,
        "apiVersion: v1\nkind: Config\nclusters: [{name: h, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: h, user: {token: t}}]\ncontexts: [{name: h, context: {cluster: h, user: h, namespace: ops}}]\n\
         current-context: h\n",
    )
    .expect("write");
    let config = setup.config(&format!(
        "remotes: [{{name: a, server: \"http://127.0.0.1:1\"}}]\nleaderElection: {{enabled: true, kubeconfig: {}}}\n",
        lease.display()
    ));
    let out = tether(&["validate", "--config", &config]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "leader election: Lease tether in the pod's namespace, else the kubeconfig's, on the cluster of kubeconfig {}; held for 15s, renewed within 10s, tried every 2s",
            lease.display()
        )),
        "{stdout}"
    );
}
