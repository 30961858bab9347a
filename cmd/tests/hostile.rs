//! Hostile peers and a hostile host: credential plugins that hang or leak,
//! remotes that answer with endless or enormous responses, an admin port
//! flooded with idle connections, a process out of file descriptors. Each
//! case failed before its fix. Everything is on loopback and bounded in time.

// Metric values compared here are small integers, exact in f64.
#![allow(clippy::float_cmp)]

use std::time::Duration;

mod common;

use common::{DEADLINE, Shape, Tether, exec_kubeconfig, probes, remote, until};
use tokio::time::Instant;

/// Polls `/status.json` until `name`'s local error satisfies `pred`.
async fn until_local_error(tether: &Tether, name: &str, pred: impl Fn(&str) -> bool) -> String {
    until(format!("{name}'s local error"), DEADLINE, async || {
        tether
            .remote_status(name)
            .await
            .and_then(|r| r["localError"].as_str().map(str::to_owned))
            .filter(|error| pred(error))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_exec_plugin_is_a_local_error_of_its_remote_alone() {
    let (a, h) = (remote("a", false).await, remote("h", false).await);
    let hung = exec_kubeconfig(&h, "sleep 600");
    let mut tether = Tether::start(
        &[("a", &a), ("h", &h)],
        &[],
        &Shape {
            kubeconfigs: &[("h", &hung)],
            optional: &["h"],
            ..Shape::default()
        },
    );
    tether.until_metric("tether_cycle", "1", |v| v == 1.0).await;
    // Past the plugin's deadline, everything else answers promptly.
    let started = Instant::now();
    let probed = a.requests("/readyz");
    while started.elapsed() < tether_probes::client::PLUGIN_DEADLINE + Duration::from_secs(3) {
        let asked = Instant::now();
        let answer = tether.get("/healthz").await;
        assert_eq!(
            answer.as_ref().map(|(code, _)| *code),
            Some(200),
            "/healthz: {answer:?}; logs:\n{}",
            tether.logs()
        );
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "/healthz took {:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        a.requests("/readyz") >= probed + 10,
        "the other remote stopped being probed"
    );
    let error = until_local_error(&tether, "h", |e| e.contains("has not finished")).await;
    assert!(error.contains("exec credential plugin"), "{error}");
    tether.until_ready(true).await;

    // The signals still work.
    tether
        .terminates_cleanly_within(Duration::from_secs(8))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_hanging_exec_plugin_instead_of_hanging() {
    let h = remote("h", false).await;
    let dir = tempfile::tempdir().expect("dir");
    let kubeconfig = dir.path().join("h.kubeconfig");
    std::fs::write(&kubeconfig, exec_kubeconfig(&h, "sleep 600")).expect("write");
    let config = dir.path().join("tether.yaml");
    std::fs::write(
        &config,
        format!(
            "remotes: [{{name: h, kubeconfig: {}}}]\n",
            kubeconfig.display()
        ),
    )
    .expect("write");
    let asked = Instant::now();
    let out = tokio::time::timeout(
        DEADLINE,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_tether"))
            .args(["check", "--config"])
            .arg(&config)
            .output(),
    )
    .await
    .expect("check hangs")
    .expect("check runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("error") && stdout.contains("exec credential plugin"),
        "{stdout}"
    );
    assert!(
        asked.elapsed() < tether_probes::client::PLUGIN_DEADLINE + Duration::from_secs(5),
        "took {:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_exec_plugin_is_told_by_its_exit_status_never_its_output() {
    let (a, h) = (remote("a", false).await, remote("h", false).await);
    let leaky = exec_kubeconfig(&h, "echo token-s3cret-out; echo s3cret-err >&2; exit 3");
    let tether = Tether::start(
        &[("a", &a), ("h", &h)],
        &[],
        &Shape {
            kubeconfigs: &[("h", &leaky)],
            optional: &["h"],
            ..Shape::default()
        },
    );
    let error = until_local_error(&tether, "h", |_| true).await;
    assert!(error.contains("exit status: 3"), "{error}");
    tether.until_ready(true).await;
    let (_, page) = tether.get("/status").await.expect("the page");
    assert!(
        page.contains("exit status: 3"),
        "the page lacks the local error:\n{page}"
    );
    for (what, text) in [
        ("/status.json", error.as_str()),
        ("/status", page.as_str()),
        ("the logs", tether.logs().as_str()),
    ] {
        assert!(
            !text.contains("s3cret"),
            "the plugin's output reached {what}:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_neither_spin_the_admin_server_nor_lock_out_healthz() {
    let a = remote("a", false).await;
    let tether = Tether::start(
        &[("a", &a)],
        &[],
        &Shape {
            ulimit: Some("-n 128"),
            ..Shape::default()
        },
    );
    tether.until_ready(true).await;
    let pid = tether.child.id().expect("running");
    // More idle connections than tether has descriptors, each connected
    // within the kubelet's default probe timeout.
    let mut idle = Vec::new();
    let mut refused = Vec::new();
    for i in 0..200 {
        match tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect(&tether.admin),
        )
        .await
        {
            Ok(Ok(stream)) => idle.push(stream),
            Ok(Err(err)) => refused.push(format!("{i}: {err}")),
            Err(_) => refused.push(format!("{i}: not connected in 1 s")),
        }
    }
    assert!(
        refused.is_empty(),
        "the kernel refused idle connections: {refused:?}\n{}",
        tether.logs()
    );
    let cpu_before = tether_testkit::procfs::cpu_time(Some(pid)).expect("/proc");
    let measured = Instant::now();
    for _ in 0..10 {
        let asked = Instant::now();
        let answer = tether.get("/healthz").await;
        assert_eq!(answer.map(|(code, _)| code), Some(200), "{}", tether.logs());
        assert!(
            asked.elapsed() < Duration::from_secs(1),
            "/healthz took {:?}",
            asked.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let cpu = tether_testkit::procfs::cpu_time(Some(pid))
        .expect("/proc")
        .saturating_sub(cpu_before)
        .as_secs_f64()
        / measured.elapsed().as_secs_f64();
    assert!(
        cpu < 0.25,
        "tether used {:.0}% of a core while 200 idle connections were open",
        cpu * 100.0
    );
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoints_are_read_only() {
    let a = remote("a", false).await;
    let tether = Tether::run(&[("a", &a)]);
    tether.until_ready(true).await;
    for method in ["POST", "PUT", "DELETE", "PATCH"] {
        for path in ["/healthz", "/readyz", "/metrics", "/status", "/status.json"] {
            let mut stream = tokio::net::TcpStream::connect(&tether.admin)
                .await
                .expect("connects");
            tokio::io::AsyncWriteExt::write_all(
                &mut stream,
                format!("{method} {path} HTTP/1.0\r\nHost: t\r\nContent-Length: 0\r\n\r\n")
                    .as_bytes(),
            )
            .await
            .expect("writes");
            let mut answer = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
                .await
                .expect("reads");
            assert!(
                answer.starts_with("HTTP/1.0 405")
                    && answer.to_ascii_lowercase().contains("allow: get, head"),
                "{method} {path}: {answer}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_remotes_are_reported_and_cannot_eat_the_process() {
    use tether_testkit::{HostileServer, Hostility};

    let healthy = remote("healthy", false).await;
    let hostile = [
        ("endless-list", Hostility::EndlessList),
        ("endless-event", Hostility::EndlessWatchEvent),
        ("huge-head", Hostility::HugeHead(1_300)),
        ("drip", Hostility::Drip),
        ("stall", Hostility::Stall),
        ("garbage", Hostility::Garbage),
    ];
    let mut servers = Vec::new();
    let mut kubeconfigs = Vec::new();
    for (name, hostility) in hostile {
        let server = HostileServer::start(hostility).await.expect("server");
        kubeconfigs.push((name, server.kubeconfig().to_yaml()));
        servers.push(server);
    }
    let kubeconfig_refs: Vec<(&str, &str)> = kubeconfigs
        .iter()
        .map(|(name, yaml)| (*name, yaml.as_str()))
        .collect();
    let names: Vec<&str> = hostile.iter().map(|(name, _)| *name).collect();
    // Their kubeconfigs are written from `kubeconfigs`; the server given
    // here for each is never read.
    let mut remotes = vec![("healthy", &healthy)];
    remotes.extend(names.iter().map(|name| (*name, &healthy)));
    let tether = Tether::start(
        &remotes,
        &[],
        &Shape {
            kubeconfigs: &kubeconfig_refs,
            optional: &names,
            ..Shape::default()
        },
    );
    let pid = tether.child.id().expect("running");
    // Four times the list bound, plus the process itself: a remote that
    // streams without end must never be buffered whole.
    let bound_kib = 4 * (tether_probes::client::MAX_RESPONSE >> 10) + 100 * 1024;
    let rss = || tether_testkit::procfs::status_kib(Some(pid), "VmHWM").unwrap_or(0);
    tether.until_metric("tether_cycle", "1", |v| v == 1.0).await;
    let started = Instant::now();
    loop {
        let peak = rss();
        assert!(
            peak < bound_kib,
            "tether's peak RSS reached {peak} KiB, past {bound_kib}; logs:\n{}",
            tether.logs()
        );
        assert_eq!(
            tether.get("/healthz").await.map(|(code, _)| code),
            Some(200),
            "{}",
            tether.logs()
        );
        let logs = tether.logs();
        let states: Vec<(String, String)> = names
            .iter()
            .map(|name| {
                let line = logs.lines().rev().find(|l| {
                    l.contains("remote apiserver") && l.contains(&format!("remotes={name} "))
                });
                ((*name).to_owned(), line.unwrap_or("").to_owned())
            })
            .collect();
        let unreachable = |name: &str| {
            states
                .iter()
                .any(|(n, line)| n == name && line.contains("unreachable"))
        };
        let done = logs.contains("passed 64 MiB")
            && logs.contains("watch event from the remote passed 4 MiB")
            && ["drip", "stall", "garbage"]
                .iter()
                .all(|name| unreachable(name))
            && started.elapsed() > Duration::from_secs(10);
        if done {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the hostile remotes were not all reported: {states:?}; logs:\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "hostile remotes: tether's peak RSS {} KiB (bound {bound_kib} KiB)",
        rss()
    );
    // Remotes that answer are reachable, however they answer.
    for name in ["endless-list", "endless-event", "huge-head"] {
        let status = tether.remote_status(name).await.expect("listed");
        assert_eq!(status["state"], "reachable", "{name}: {status}");
    }
    tether.until_ready(true).await;
}

/// `count` remotes named `r0`, `r1`, ..., probed (no watches) by a tether
/// under `ulimit` with these arguments.
async fn many_under(
    count: usize,
    ulimit: &str,
) -> (Vec<(String, tether_testkit::ApiServer)>, Tether) {
    let mut servers = Vec::new();
    for i in 0..count {
        let server = tether_testkit::ApiServer::start(tether_testkit::Options::default())
            .await
            .expect("server");
        servers.push((format!("r{i}"), server));
    }
    let remotes: Vec<(&str, &tether_testkit::ApiServer)> =
        servers.iter().map(|(n, s)| (n.as_str(), s)).collect();
    let tether = Tether::start(
        &remotes,
        &[],
        &Shape {
            ulimit: Some(ulimit),
            watch: Some("[]"),
            ..Shape::default()
        },
    );
    (servers, tether)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_descriptor_left_is_a_local_error_never_a_lost_remote() {
    // 64 descriptors, soft and hard: fewer than 64 remotes and tether's own.
    let (mut servers, tether) = many_under(64, "-n 64").await;
    // While it has none to spare, its admin server may not get one either:
    // watch its logs.
    until(
        "a local error for want of descriptors",
        DEADLINE,
        async || tether.logs().contains("kind=descriptors").then_some(()),
    )
    .await;
    // Five probe intervals more: no remote is lost for it. Which remotes
    // hold a descriptor is up to the race for them, so count on one that
    // is being probed.
    let (_, probed) = servers
        .iter()
        .max_by_key(|(_, server)| server.requests("/readyz"))
        .expect("there are remotes");
    probes(probed, 5).await;
    let logs = tether.logs();
    assert!(
        !logs.contains("remote apiserver unreachable"),
        "a remote was lost for want of descriptors:\n{logs}"
    );
    // Half the remotes go away, and their connections with them: with
    // descriptors to spare again, tether exports what happened.
    let kept = servers.split_off(32);
    drop(servers);
    let local = "tether_local_errors_total{kind=\"descriptors\"}";
    tether.until_metric(local, "> 0", |v| v > 0.0).await;
    let (_, metrics) = tether.get("/metrics").await.expect("metrics");
    let lost: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            l.starts_with("tether_remote_transitions_total")
                && l.contains("to=\"unreachable\"")
                && kept
                    .iter()
                    .any(|(name, _)| l.contains(&format!("remote=\"{name}\"")))
        })
        .filter(|l| !l.ends_with(" 0"))
        .collect();
    assert!(
        lost.is_empty(),
        "remotes lost for want of descriptors: {lost:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_descriptor_limit_is_raised_to_the_hard_limit() {
    // A soft limit of 64 under a higher hard one: tether raises it.
    let (servers, tether) = many_under(47, "-Sn 64").await;
    tether.until_ready(true).await;
    tether
        .until_metric("process_max_fds", "> 64", |v| v > 64.0)
        .await;
    probes(&servers[0].1, 3).await;
    assert_eq!(
        tether
            .metric("tether_local_errors_total{kind=\"descriptors\"}")
            .await,
        Some(0.0),
        "{}",
        tether.logs()
    );
    assert!(
        tether
            .logs()
            .contains("raised the soft limit on open file descriptors"),
        "{}",
        tether.logs()
    );
}

/// A kubeconfig for `server` whose exec plugin prints an `ExecCredential`
/// with `token` (JSON-escaped already).
fn plugin_token_kubeconfig(server: &tether_testkit::ApiServer, token: &str) -> String {
    let credential = format!(
        "{{\\\"apiVersion\\\":\\\"client.authentication.k8s.io/v1\\\",\\\"kind\\\":\\\"ExecCredential\\\",\\\"status\\\":{{\\\"token\\\":\\\"{token}\\\"}}}}"
    );
    exec_kubeconfig(server, &format!("printf '%s' '{credential}'"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_token_an_http_header_cannot_carry_is_a_local_error_never_a_panic() {
    let (a, p) = (remote("a", false).await, remote("p", false).await);
    // \u0001 in the JSON: a control character in the token.
    let bad = plugin_token_kubeconfig(&p, "ab\\\\u0001c");
    let tether = Tether::start(
        &[("a", &a), ("p", &p)],
        &[],
        &Shape {
            kubeconfigs: &[("p", &bad)],
            optional: &["p"],
            ..Shape::default()
        },
    );
    let error = until_local_error(&tether, "p", |e| e.contains("not valid header")).await;
    assert!(error.contains("inside kube"), "{error}");
    // A few more tries: every one fails the same way, and none prints a
    // panic or a backtrace.
    probes(&a, 3).await;
    let logs = tether.logs();
    assert!(!logs.contains("panicked"), "{logs}");
    assert!(!logs.contains("stack backtrace"), "{logs}");
    tether.until_ready(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_status_message_can_neither_forge_nor_flood_the_log() {
    use tether_testkit::{FORGED_LINE, HostileServer, Hostility};

    let healthy = remote("healthy", false).await;
    let hostile = HostileServer::start(Hostility::ForgedStatus)
        .await
        .expect("server");
    let kubeconfig = hostile.kubeconfig().to_yaml();
    let tether = Tether::start(
        &[("healthy", &healthy), ("forger", &healthy)],
        &[],
        &Shape {
            kubeconfigs: &[("forger", &kubeconfig)],
            optional: &["forger"],
            ..Shape::default()
        },
    );
    until("watch failing", DEADLINE, async || {
        tether.logs().contains("watch failing").then_some(())
    })
    .await;
    // Let the watch fail a few more times.
    probes(&healthy, 3).await;
    let logs = tether.logs();
    let forged = logs.lines().filter(|l| l.starts_with(FORGED_LINE)).count();
    let longest = logs.lines().map(str::len).max().unwrap_or(0);
    println!(
        "a remote's 4 MiB Status message with a forged line: {forged} forged lines, longest log line {longest} bytes, {} bytes of log",
        logs.len()
    );
    assert_eq!(forged, 0, "the remote forged a log line:\n{logs}");
    assert!(!logs.contains('\u{1b}'), "a terminal escape went through");
    assert!(
        logs.contains("denied\\n2026-01-01"),
        "the message is shown, escaped"
    );
    assert!(
        longest < 8 * 1024,
        "a log line of {longest} bytes: {}",
        logs.lines()
            .find(|l| l.len() == longest)
            .map_or("", |l| &l[..600])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remotes_at_one_url_with_other_credentials_are_probed_apart() {
    let server = remote("one", false).await;
    // One apiserver, two users: "plain" needs no credential, "plugged"
    // runs a plugin that never answers. Neither decides for the other.
    let hung = exec_kubeconfig(&server, "sleep 600");
    let tether = Tether::start(
        &[("plain", &server), ("plugged", &server)],
        &[],
        &Shape {
            kubeconfigs: &[("plugged", &hung)],
            optional: &["plugged"],
            ..Shape::default()
        },
    );
    let error = until_local_error(&tether, "plugged", |e| e.contains("has not finished")).await;
    assert!(error.contains("exec credential plugin"), "{error}");
    let plain = tether.remote_status("plain").await.expect("listed");
    assert_eq!(plain["state"], "reachable", "{plain}");
    assert!(plain["localError"].is_null(), "{plain}");
    tether.until_ready(true).await;
    // validate lists them as two identities.
    let out = std::process::Command::new(common::binary())
        .args(["validate", "--config"])
        .arg(&tether.config)
        .output()
        .expect("tether validate runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let url = server.url();
    let lines = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with(&url))
        .count();
    assert_eq!(lines, 2, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_lease_answer_costs_a_try_not_memory() {
    use tether_testkit::{HostileServer, Hostility};

    let a = remote("a", false).await;
    // A Lease apiserver whose every answer is endless.
    let endless = HostileServer::start(Hostility::EndlessList)
        .await
        .expect("server");
    let dir = tempfile::tempdir().expect("temp dir");
    let endless_kubeconfig = dir.path().join("endless.kubeconfig");
    endless
        .kubeconfig()
        .write(&endless_kubeconfig)
        .expect("kubeconfig");
    let extra = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, leaseDuration: 2s, renewDeadline: 1s, retryPeriod: 300ms, kubeconfig: {}}}",
        endless_kubeconfig.display()
    );
    let tether = Tether::start(
        &[("a", &a)],
        &[],
        &Shape {
            extra: &extra,
            ..Shape::default()
        },
    );
    let pid = tether.child.id().expect("running");
    let error = until("the election's last error", DEADLINE, async || {
        let (_, body) = tether.get("/status.json").await?;
        let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        status["election"]["lastError"].as_str().map(str::to_owned)
    })
    .await;
    assert!(error.contains("passed 1 MiB"), "{error}");
    // Several tries later, memory has not grown with the bodies.
    probes(&a, 3).await;
    let peak = tether_testkit::procfs::status_kib(Some(pid), "VmHWM").unwrap_or(0);
    println!("an endless Lease body: tether's peak RSS {peak} KiB");
    assert!(peak < 100 * 1024, "peak RSS {peak} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enormous_or_escaping_lease_holder_is_cut_and_never_shown_raw() {
    use tether_testkit::Resource;

    // A Lease whose holder is 2 MiB, and one whose holder would drive a
    // terminal: the first is cut at the bound, the second escaped in
    // /status.json, /readyz and `tether check`.
    let a = remote("a", false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let leases = remote("leases", true).await;
    let kubeconfig = dir.path().join("leases.kubeconfig");
    leases.kubeconfig().write(&kubeconfig).expect("kubeconfig");
    let put = |name: &str, holder: String| {
        leases
            .put(
                Resource::Lease,
                "default",
                serde_json::json!({
                    "metadata": {"name": name},
                    "spec": {"holderIdentity": holder, "leaseDurationSeconds": 600,
                             "renewTime": "2026-12-01T00:00:00.000000Z"},
                }),
            )
            .expect("put");
    };
    put("huge", "h".repeat(2 << 20));
    put(
        "evil",
        format!("\u{1b}]0;owned\u{7}\u{1b}[31mred\nline{}", "y".repeat(300)),
    );
    for (lease, check) in [("huge", "passed 1 MiB"), ("evil", "\\u{1b}")] {
        let extra = format!(
            "leaderElection: {{enabled: true, leaseName: {lease}, leaseNamespace: default, leaseDuration: 2s, renewDeadline: 1s, retryPeriod: 300ms, kubeconfig: {}}}",
            kubeconfig.display()
        );
        let tether = Tether::start(
            &[("a", &a)],
            &[],
            &Shape {
                extra: &extra,
                ..Shape::default()
            },
        );
        let body = until(
            format!("/status.json shows {check}"),
            DEADLINE,
            async || {
                let (_, body) = tether.get("/status.json").await?;
                body.contains(check).then_some(body)
            },
        )
        .await;
        assert!(
            body.len() < 64 * 1024,
            "/status.json is {} bytes",
            body.len()
        );
        assert!(!body.contains('\u{1b}'), "{body}");
        let (_, readyz) = tether.get("/readyz").await.expect("answers");
        assert!(
            readyz.len() < 2048 && !readyz.contains('\u{1b}'),
            "{readyz}"
        );
        let out = std::process::Command::new(common::binary())
            .args(["check", "--config"])
            .arg(&tether.config)
            .output()
            .expect("tether check runs");
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            !shown.contains('\u{1b}'),
            "check printed an escape: {shown:?}"
        );
        assert!(
            shown.len() < 8 * 1024,
            "check printed {} bytes",
            shown.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_password_never_reaches_the_log_the_status_or_check() {
    let a = remote("a", false).await;
    let proxied = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n\
         clusters: [{{name: x, cluster: {{server: \"{}\", proxy-url: \"http://puser:Pr0xyPa55@127.0.0.1:9\"}}}}]\n\
         users: [{{name: x, user: {{}}}}]\n\
         contexts: [{{name: x, context: {{cluster: x, user: x}}}}]\n",
        a.url()
    );
    let tether = Tether::start(
        &[("a", &a), ("proxied", &a)],
        &[],
        &Shape {
            kubeconfigs: &[("proxied", &proxied)],
            optional: &["proxied"],
            ..Shape::default()
        },
    );
    until_local_error(&tether, "proxied", |_| true).await;
    probes(&a, 2).await;
    let (_, status) = tether.get("/status").await.expect("answers");
    let (_, json) = tether.get("/status.json").await.expect("answers");
    let out = std::process::Command::new(common::binary())
        .args(["check", "--config"])
        .arg(&tether.config)
        .output()
        .expect("tether check runs");
    for (what, text) in [
        ("the log", tether.logs()),
        ("/status", status),
        ("/status.json", json),
        ("check", String::from_utf8_lossy(&out.stdout).into_owned()),
        (
            "check's errors",
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ),
    ] {
        assert!(
            !text.contains("Pr0xyPa55"),
            "{what} shows the proxy's password:\n{text}"
        );
    }
}
