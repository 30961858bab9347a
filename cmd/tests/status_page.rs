//! The `/status` page as a person sees it: rendered by headless Chromium
//! (Debian's `chromium`), its text checked, and a screenshot kept in
//! `target/` as a test artifact.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use tokio::time::Instant;

use tether_testkit::{ApiServer, Fault, Options};

fn chromium() -> PathBuf {
    ["chromium", "chromium-browser"]
        .iter()
        .find_map(|name| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join(name))
                    .find(|candidate| candidate.is_file())
            })
        })
        .unwrap_or_else(|| {
            panic!("chromium is not installed: apt-get install chromium (scripts/test does this)")
        })
}

/// Runs headless Chromium as root, with no reaching out to the internet.
fn headless(profile: &std::path::Path, args: &[String]) -> std::process::Output {
    Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-quic",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_renders_every_remote() {
    let up = ApiServer::start(Options::default().name("alpha"))
        .await
        .expect("server");
    let down = ApiServer::start(Options::default().name("beta"))
        .await
        .expect("server");
    down.set_fault(Fault::Refuse).await.expect("refuse");
    let dir = tempfile::tempdir().expect("dir");
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut yaml = format!(
        "admin: {{address: \"{admin}\"}}\nprobe: {{interval: 1s, timeout: 500ms}}\nremotes:\n"
    );
    for (name, server) in [("alpha", &up), ("beta", &down)] {
        let path = dir.path().join(format!("{name}.kubeconfig"));
        server.kubeconfig().write(&path).expect("kubeconfig");
        let _ = writeln!(yaml, "- {{name: {name}, kubeconfig: {}}}", path.display());
    }
    let config = dir.path().join("tether.yaml");
    std::fs::write(&config, yaml).expect("config");
    let mut tether = tokio::process::Command::new(env!("CARGO_BIN_EXE_tether"))
        .arg("run")
        .arg("--config")
        .arg(&config)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("tether starts");

    // Wait until beta has been declared unreachable and alpha's cache has
    // synced in the cycle after the loss, so the page shows both states.
    let url = format!("http://{admin}/status");
    let started = Instant::now();
    let profile = tempfile::tempdir().expect("profile dir");
    let dom = loop {
        let out = tokio::task::spawn_blocking({
            let profile = profile.path().to_owned();
            let url = url.clone();
            move || headless(&profile, &["--dump-dom".to_owned(), url])
        })
        .await
        .expect("ran");
        let dom = String::from_utf8_lossy(&out.stdout).into_owned();
        if dom.contains("class=\"unreachable\">unreachable") && dom.contains("namespaces: synced") {
            break dom;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the page never showed beta unreachable and alpha synced:\n{dom}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for text in [
        "Supervisor",
        "Remotes",
        "alpha",
        "beta",
        "reachable",
        "unreachable",
        "refused",
        "required",
    ] {
        assert!(dom.contains(text), "{text:?} missing from the page:\n{dom}");
    }

    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let out = headless(
        profile.path(),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,720".to_owned(),
            url,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let png = std::fs::read(&shot).expect("the screenshot was written");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a real screenshot"
    );
    eprintln!("screenshot: {}", shot.display());
    let _ = tether.kill().await;
}
