//! The whole alerting path with the real tools: the real `tether` binary
//! against simulated remotes, real Prometheus scraping it and evaluating
//! `alerts/tether.rules.yaml` (with short `for:` durations generated from
//! that file), real Alertmanager routing to a webhook this test runs.
//!
//! Needs Debian's `prometheus` and `prometheus-alertmanager` (scripts/test
//! installs them); fails naming them if they are missing.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
mod common;

use common::{free_port, http_get, write_kubeconfig};
use tether_testkit::{ApiServer, Fault, Options};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

/// Prometheus start-up and discovery, then the alert's own path.
const DEADLINE: Duration = Duration::from_secs(90);

fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|candidate| candidate.is_file())
        })
        .unwrap_or_else(|| {
            panic!("{name} is not installed: apt-get install prometheus prometheus-alertmanager (scripts/test does this)")
        })
}

fn spawn(program: &Path, args: &[String], log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", program.display()))
}

/// The alert rules with every `for:` shortened to 3s, generated from the
/// source file so the test can never drift from it.
fn fast_rules() -> String {
    let source = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../alerts/tether.rules.yaml"
    ))
    .expect("alerts/tether.rules.yaml");
    let rules: String = source
        .lines()
        .map(|line| match line.split_once("for:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}for: 3s\n"),
            _ => format!("{line}\n"),
        })
        .collect();
    assert!(
        rules.contains("for: 3s") && !rules.contains("for: 5m"),
        "no for: was rewritten"
    );
    rules
}

/// Accepts Alertmanager's webhook posts and forwards each JSON body.
async fn webhook(listener: TcpListener, tx: mpsc::UnboundedSender<Value>) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            return;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 8192];
            loop {
                let Ok(n) = stream.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                let Some((head, body)) = text.split_once("\r\n\r\n") else {
                    continue;
                };
                let length: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                if body.len() < length {
                    continue;
                }
                if let Ok(json) = serde_json::from_str(&body[..length]) {
                    let _ = tx.send(json);
                }
                let _ = stream
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                return;
            }
        });
    }
}

/// The next notification about `alertname` for `remote` with `status`.
async fn notification(
    rx: &mut mpsc::UnboundedReceiver<Value>,
    seen: &mut Vec<Value>,
    remote: &str,
    status: &str,
) -> Value {
    timeout(DEADLINE, async {
        while let Some(payload) = rx.recv().await {
            seen.push(payload.clone());
            let hit = payload["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|alert| {
                    alert["labels"]["alertname"] == "TetherRemoteApiserverUnreachable"
                        && alert["labels"]["remote"] == remote
                        && alert["status"] == status
                });
            if hit {
                return payload;
            }
        }
        panic!("the webhook stopped");
    })
    .await
    .unwrap_or_else(|_| {
        panic!("no {status} notification for {remote} within {DEADLINE:?}; got {seen:#?}")
    })
}

/// Starts Alertmanager (routing to the webhook) and Prometheus (scraping
/// tether every second, with the fast rules); returns both and Prometheus's
/// address.
fn start_monitoring(
    work: &Path,
    admin: &str,
    hook_addr: std::net::SocketAddr,
) -> (Child, Child, String) {
    let (prometheus, alertmanager) = (tool("prometheus"), tool("prometheus-alertmanager"));
    let am_port = free_port();
    std::fs::write(
        work.join("alertmanager.yml"),
        format!(
            "route: {{receiver: hook, group_by: [alertname, remote], group_wait: 1s, group_interval: 1s, repeat_interval: 1h}}\n\
             receivers:\n- name: hook\n  webhook_configs: [{{url: \"http://{hook_addr}/hook\", send_resolved: true}}]\n"
        ),
    )
    .expect("alertmanager config");
    let alertmanager = spawn(
        &alertmanager,
        &[
            format!("--config.file={}", work.join("alertmanager.yml").display()),
            format!(
                "--storage.path={}",
                work.join("alertmanager-data").display()
            ),
            format!("--web.listen-address=127.0.0.1:{am_port}"),
            "--cluster.listen-address=".into(),
        ],
        &work.join("alertmanager.log"),
    );
    std::fs::write(work.join("rules.yaml"), fast_rules()).expect("rules");
    let prom_port = free_port();
    std::fs::write(
        work.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
             rule_files: [{}]\n\
             alerting: {{alertmanagers: [{{static_configs: [{{targets: [\"127.0.0.1:{am_port}\"]}}]}}]}}\n\
             scrape_configs:\n- job_name: tether\n  static_configs: [{{targets: [\"{admin}\"]}}]\n",
            work.join("rules.yaml").display()
        ),
    )
    .expect("prometheus config");
    let prometheus = spawn(
        &prometheus,
        &[
            format!("--config.file={}", work.join("prometheus.yml").display()),
            format!(
                "--storage.tsdb.path={}",
                work.join("prometheus-data").display()
            ),
            format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ],
        &work.join("prometheus.log"),
    );

    (alertmanager, prometheus, format!("127.0.0.1:{prom_port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_remote_pages_through_prometheus_and_alertmanager() {
    let work =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("alerting-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).expect("work dir");

    // Three remotes: a healthy, b to be lost, c answering 403 throughout.
    let a = ApiServer::start(Options::default().name("a"))
        .await
        .expect("server");
    let b = ApiServer::start(Options::default().name("b"))
        .await
        .expect("server");
    let c = ApiServer::start(Options::default().name("c"))
        .await
        .expect("server");
    c.set_fault(Fault::Status {
        code: 403,
        all_paths: false,
    })
    .await
    .expect("403");
    let admin = format!("127.0.0.1:{}", free_port());
    let mut config = format!(
        "admin: {{address: \"{admin}\"}}\nprobe: {{interval: 1s, timeout: 500ms, failureThreshold: 3}}\nremotes:\n"
    );
    for (name, server) in [("a", &a), ("b", &b), ("c", &c)] {
        let path = write_kubeconfig(&work, name, server);
        let _ = writeln!(
            config,
            "- {{name: {name}, kubeconfig: {}, required: false}}",
            path.display()
        );
    }
    std::fs::write(work.join("tether.yaml"), config).expect("config");
    let _tether = spawn(
        Path::new(env!("CARGO_BIN_EXE_tether")),
        &[
            "run".into(),
            "--config".into(),
            work.join("tether.yaml").display().to_string(),
        ],
        &work.join("tether.log"),
    );

    // The webhook, Alertmanager and Prometheus, all on 127.0.0.1.
    let hook = TcpListener::bind("127.0.0.1:0").await.expect("webhook");
    let hook_addr = hook.local_addr().expect("addr");
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(webhook(hook, tx));
    let (_alertmanager, _prometheus, prom) = start_monitoring(&work, &admin, hook_addr);

    // Wait until Prometheus scrapes every remote's reachability.
    let scraped = async || {
        let (_, body) = http_get(
            &prom,
            "/api/v1/query?query=count(tether_remote_apiserver_reachable%3D%3D1)",
        )
        .await?;
        (body.contains("\"value\":[") && body.contains(",\"3\"]")).then_some(())
    };
    common::until_every(
        "Prometheus sees three reachable remotes",
        DEADLINE,
        Duration::from_millis(250),
        scraped,
    )
    .await;

    let refused_at = Instant::now();
    b.set_fault(Fault::Refuse).await.expect("refuse");
    let mut seen = Vec::new();
    let firing = notification(&mut rx, &mut seen, "b", "firing").await;
    let to_page = refused_at.elapsed();
    let alert = firing["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .find(|a| a["labels"]["remote"] == "b")
        .expect("the alert for b");
    assert_eq!(alert["labels"]["host"], b.addr().to_string());
    assert_eq!(alert["labels"]["severity"], "critical");
    eprintln!("refuse to firing notification: {to_page:?}\npayload: {firing:#}");

    b.set_fault(Fault::Up).await.expect("up");
    notification(&mut rx, &mut seen, "b", "resolved").await;

    for payload in &seen {
        for alert in payload["alerts"].as_array().into_iter().flatten() {
            assert!(
                !(alert["labels"]["alertname"] == "TetherRemoteApiserverUnreachable"
                    && alert["labels"]["remote"] != "b"),
                "an alert for a remote that answered all along: {alert:#}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}
