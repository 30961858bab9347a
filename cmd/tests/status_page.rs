//! The `/status` page as a person sees it, in each state it can be in (all
//! up, one remote down, draining, standing by, a cycle that holds its
//! manager for a lost remote): rendered by headless
//! Chromium (Debian's `chromium`), its DOM checked for the verdict, the SVG
//! strips and words that agree with each other, and screenshots, light and
//! dark, kept as test artifacts in `target/tmp/status-page/`.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{DEADLINE, Shape, Tether, remote};
use tether_testkit::Fault;

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

/// Headless Chromium as root, reaching nothing but the page.
struct Browser {
    profile: tempfile::TempDir,
    shots: PathBuf,
}

impl Browser {
    fn new() -> Self {
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page");
        std::fs::create_dir_all(&shots).expect("the artifacts folder");
        Self {
            profile: tempfile::tempdir().expect("a profile folder"),
            shots,
        }
    }

    fn run(&self, args: &[String]) -> String {
        let out = Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-quic",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            .args(args)
            .output()
            .expect("chromium runs");
        assert!(
            out.status.success(),
            "chromium failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The DOM after the page's script ran.
    fn dom(&self, url: &str) -> String {
        self.run(&["--dump-dom".to_owned(), url.to_owned()])
    }

    /// Screenshots of `url`, light and dark, as `<name>.png` and
    /// `<name>-dark.png`; checks each is a real picture.
    fn screenshots(&self, url: &str, name: &str) {
        for (suffix, scheme) in [("", None), ("-dark", Some("--force-dark-mode"))] {
            let path = self.shots.join(format!("{name}{suffix}.png"));
            let _ = std::fs::remove_file(&path);
            let mut args = vec![
                format!("--screenshot={}", path.display()),
                "--window-size=1280,1000".to_owned(),
            ];
            args.extend(scheme.map(str::to_owned));
            args.push(url.to_owned());
            self.run(&args);
            let png = std::fs::read(&path).expect("the screenshot was written");
            assert!(
                png.starts_with(b"\x89PNG") && png.len() > 20_000,
                "{} is not a real screenshot ({} bytes)",
                path.display(),
                png.len()
            );
            eprintln!("screenshot: {}", path.display());
        }
    }
}

/// The text of the element with `id`, its tags stripped.
fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no element #{id}:\n{dom}"));
    let open = start + dom[start..].find('>').expect("the tag closes");
    let tag_end = open + dom[open..].find("</p>").expect("a <p> element");
    let mut text = String::new();
    let mut in_tag = false;
    for c in dom[open + 1..tag_end].chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text.replace("&amp;", "&").replace("&#39;", "'")
}

/// The `class` attribute of the element with `id`.
fn class_of(dom: &str, id: &str) -> String {
    let start = dom.find(&format!("id=\"{id}\"")).expect("the element");
    let tag = &dom[dom[..start].rfind('<').expect("a tag")..];
    let tag = &tag[..tag.find('>').expect("the tag closes")];
    let class = tag.find("class=\"").expect("a class") + 7;
    tag[class..class + tag[class..].find('"').expect("quoted")].to_owned()
}

/// Asserts the verdict's state (its class) and how its text begins;
/// returns the text.
fn verdict_reads(dom: &str, state: &str, begins: &str) -> String {
    assert_eq!(class_of(dom, "verdict"), format!("verdict {state}"));
    let text = text_of(dom, "verdict");
    assert!(text.starts_with(begins), "{text}");
    text
}

/// The table row of `remote`, as the DOM has it.
fn row<'d>(dom: &'d str, remote: &str) -> &'d str {
    let start = dom
        .find(&format!("<tr data-name=\"{remote}\""))
        .unwrap_or_else(|| panic!("no row for {remote}:\n{dom}"));
    &dom[start..start + dom[start..].find("</tr>").expect("the row ends")]
}

/// Polls `/status.json` until `ready` holds of it.
async fn until_status(tether: &Tether, what: &str, ready: impl Fn(&serde_json::Value) -> bool) {
    common::until(format!("/status.json shows {what}"), DEADLINE, async || {
        let (code, body) = tether.get("/status.json").await?;
        let status = serde_json::from_str::<serde_json::Value>(&body).ok()?;
        (code == 200 && ready(&status)).then_some(())
    })
    .await;
}

/// The rows of the table `id` (`healthy-table`, `attention-table`).
fn rows_of<'d>(dom: &'d str, id: &str) -> Vec<&'d str> {
    let Some(start) = dom.find(&format!("id=\"{id}\"")) else {
        return Vec::new();
    };
    let table = &dom[start..start + dom[start..].find("</table>").expect("the table ends")];
    table.split("<tr data-name=").skip(1).collect()
}

/// The words of the page agree with each other, whatever its state: what
/// the fold claims of the healthy rows, each row's caches and objects, the
/// strips' size and the latency line's scale.
fn words_agree(dom: &str) {
    let fold = dom.find("<details id=\"healthy\"").map(|at| {
        let summary = &dom[at..];
        &summary[..summary.find("</summary>").expect("a summary")]
    });
    if let Some(fold) = fold {
        for row in rows_of(dom, "healthy-table") {
            if fold.contains("caches synced") {
                let (synced, of) = synced_of(row);
                assert_eq!(synced, of, "the fold says synced, the row does not:\n{row}");
            } else if fold.contains("no caches here (this replica stands by)") {
                assert!(row.contains("none here: this replica stands by"), "{row}");
            } else {
                // Between cycles (backing off, draining), the caches are what
                // the last cycle left, and say so.
                assert!(fold.contains("no cycle runs now"), "{fold}");
            }
        }
    }
    for table in ["healthy-table", "attention-table"] {
        for row in rows_of(dom, table) {
            if row.contains(" synced<div") {
                let (synced, of) = synced_of(row);
                assert_eq!(
                    synced < of,
                    row.contains(", not current"),
                    "objects beside unsynced caches must say they are not current:\n{row}"
                );
            }
            assert!(row.contains("<svg class=\"strip\" width=\"360\""), "{row}");
            // The line's top (12 px lane, 1 px from its top) stands for
            // 250 ms, or the slowest answer if slower: answers a few ms
            // apart draw a flat line, not a slope scaled to the slowest of
            // them. The slowest is the strip's own label, so a probe slowed
            // by a loaded machine moves the expectation with it.
            let attribute = "class=\"latency\" d=\"";
            if let Some(at) = row.find(attribute) {
                let d = &row[at + attribute.len()..];
                let d = &d[..d.find('"').expect("quoted")];
                let ys: Vec<f64> = d
                    .split(['M', 'L'])
                    .filter_map(|p| p.split_whitespace().nth(1)?.parse().ok())
                    .collect();
                let highest = ys.iter().copied().fold(f64::INFINITY, f64::min);
                let slowest: f64 = row
                    .split("slowest answer ")
                    .nth(1)
                    .and_then(|rest| rest.split(" ms").next()?.parse().ok())
                    .unwrap_or_else(|| panic!("the strip's label names its slowest answer: {row}"));
                let expected = 12.0 - 11.0 * slowest / slowest.max(250.0);
                assert!(
                    (highest - expected).abs() < 0.06,
                    "the slowest answer ({slowest} ms) at y {expected:.1} on a 250 ms scale, not {highest}: {d}"
                );
            }
        }
    }
}

/// `X of Y synced` of a row.
fn synced_of(row: &str) -> (usize, usize) {
    let at = row.find(" synced<div").expect("a caches cell");
    let cell = &row[row[..at].rfind('>').expect("the cell opens") + 1..at];
    let (x, y) = cell.split_once(" of ").expect("X of Y");
    (
        x.trim().parse().expect("a number"),
        y.trim().parse().expect("a number"),
    )
}

fn verdict(status: &serde_json::Value) -> (&str, &str) {
    (
        status["verdict"]["state"].as_str().unwrap_or_default(),
        status["verdict"]["text"].as_str().unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_tells_all_up_one_down_and_draining_apart() {
    let (alpha, beta, gamma) = (
        remote("alpha", true).await,
        remote("beta", true).await,
        remote("gamma", false).await,
    );
    let mut tether = Tether::start(
        &[("alpha", &alpha), ("beta", &beta), ("gamma", &gamma)],
        &[],
        &Shape {
            optional: &["gamma"],
            drain_window: Some("60s"),
            ..Shape::default()
        },
    );
    let url = format!("http://{}/status", tether.admin);
    let browser = Browser::new();

    // All up.
    until_status(&tether, "all up", |s| {
        verdict(s).0 == "ready" && s["counts"]["healthy"] == 3
    })
    .await;
    let dom = browser.dom(&url);
    verdict_reads(
        &dom,
        "ready",
        "Ready: 3 of 3 remotes reachable; manager up for",
    );
    assert!(dom.contains("No remote needs attention."), "{dom}");
    assert_eq!(dom.matches("<svg class=\"strip\"").count(), 3, "{dom}");
    for name in ["alpha", "beta", "gamma"] {
        let row = row(&dom, name);
        assert!(row.contains("class=\"healthy\""), "{row}");
        assert!(
            row.contains("<rect class=\"ok\""),
            "{name}'s strip has no answered mark:\n{row}"
        );
        assert!(!row.contains("<rect class=\"down\""), "{row}");
        assert!(
            row.contains(" ms</td>") || row.contains(" ms<div"),
            "a latency in ms:\n{row}"
        );
    }
    words_agree(&dom);
    browser.screenshots(&url, "all-up");

    // One required remote down: the verdict says what the cycle waits for.
    beta.set_fault(Fault::Refuse).await.expect("refuse");
    until_status(&tether, "beta's loss", |s| {
        verdict(s)
            .1
            .contains("waits for beta's caches; beta unreachable for")
    })
    .await;
    let dom = browser.dom(&url);
    let text = verdict_reads(
        &dom,
        "not_ready",
        "Not ready: cycle 2 waits for beta's caches; beta unreachable for",
    );
    assert!(text.contains("(refused, "), "{text}");
    let beta_row = row(&dom, "beta");
    assert!(beta_row.contains("class=\"unreachable\""), "{beta_row}");
    // Its last 15 s hold answers and failures, or failures alone.
    assert!(
        beta_row.contains("<rect class=\"mix\"") || beta_row.contains("<rect class=\"down\""),
        "beta's strip shows no failed mark:\n{beta_row}"
    );
    assert!(beta_row.contains("refused: "), "{beta_row}");
    assert!(
        beta_row.contains("<time datetime="),
        "the error is stamped:\n{beta_row}"
    );
    // The problem comes first, the healthy are folded away.
    let attention = dom.find("Needing attention").expect("a section for beta");
    assert!(attention < dom.find("<details id=\"healthy\"").expect("the fold"));
    assert!(dom.find("data-name=\"beta\"") < dom.find("data-name=\"alpha\""));
    assert!(dom.contains("2 remotes healthy"), "{dom}");
    assert!(
        dom.contains("beta unreachable · <time"),
        "the cycle timeline names the loss:\n{dom}"
    );
    assert!(dom.contains("<svg class=\"timeline\""), "{dom}");
    // Lost, not merely failing: its marks since the loss are red.
    assert!(beta_row.contains("<rect class=\"down\""), "{beta_row}");
    words_agree(&dom);
    browser.screenshots(&url, "one-down");

    // The filter works without JavaScript: the server filters.
    let (_, filtered) = tether.get("/status?q=ALP").await.expect("the page");
    assert!(filtered.contains("data-name=\"alpha\""), "{filtered}");
    assert!(!filtered.contains("data-name=\"beta\""), "{filtered}");
    // Without JavaScript the page is what the server sends: the verdict,
    // the strips and a refresh are in the HTML itself, not built by the
    // script. (Chromium's headless dumps need scripts, so a plain GET.)
    let (_, served) = tether.get("/status").await.expect("the page");
    assert_eq!(class_of(&served, "verdict"), "verdict not_ready");
    assert_eq!(served.matches("<svg class=\"strip\"").count(), 3);
    assert!(
        served.contains("<noscript><meta http-equiv=\"refresh\""),
        "{served}"
    );

    // Draining: SIGTERM, and the drain window holds the page up.
    tether.signal("TERM");
    until_status(&tether, "draining", |s| verdict(s).0 == "draining").await;
    let dom = browser.dom(&url);
    verdict_reads(&dom, "draining", "Draining: /readyz answers 503");
    words_agree(&dom);
    browser.screenshots(&url, "draining");
    // A second SIGTERM ends the drain window at once.
    tether.signal("TERM");
    assert_eq!(tether.wait().await.code(), Some(130), "{}", tether.logs());
}

/// A follower stands by: no manager, so no caches. The verdict, the fold
/// and each row say so, and nothing claims a cache synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_followers_status_page_says_it_stands_by_and_claims_no_caches() {
    let server = remote("alpha", true).await;
    let lease = dir_with_kubeconfig(&server);
    let extra = format!(
        "leaderElection: {{enabled: true, leaseNamespace: default, leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 500ms, kubeconfig: {}}}",
        lease.1.display()
    );
    let start = |id: &'static str| {
        Tether::start(
            &[("alpha", &server)],
            &[],
            &Shape {
                extra: &extra,
                env: &[("POD_NAME", id)],
                ..Shape::default()
            },
        )
    };
    let leader = start("first");
    until_status(&leader, "leading", |s| s["election"]["role"] == "leader").await;
    let follower = start("second");
    until_status(&follower, "standing by", |s| {
        verdict(s).0 == "standby" && s["counts"]["healthy"] == 1
    })
    .await;
    let url = format!("http://{}/status", follower.admin);
    let browser = Browser::new();
    let dom = browser.dom(&url);
    let text = verdict_reads(&dom, "standby", "Standby (leader: first-");
    assert!(!text.contains("synced"), "{text}");
    assert!(
        dom.contains("1 remote healthy: reachable, ready, no caches here (this replica stands by)"),
        "{dom}"
    );
    assert!(!dom.contains(" of 1 synced"), "{dom}");
    words_agree(&dom);
    browser.screenshots(&url, "standby");
}

/// The exec manager starts only while no remote it needs is lost: the
/// cycle after a loss holds its manager, and the page says for what rather
/// than that the process is about to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_that_holds_its_manager_for_a_lost_remote_says_so() {
    let alpha = remote("alpha", true).await;
    let tether = Tether::start(
        &[("alpha", &alpha)],
        &[],
        &Shape {
            manager: Some("{exec: {command: [sleep, \"3600\"], gracePeriod: 1s}}"),
            ..Shape::default()
        },
    );
    until_status(&tether, "the manager up", |s| verdict(s).0 == "ready").await;
    alpha.set_fault(Fault::Refuse).await.expect("refuse");
    until_status(&tether, "a cycle held for alpha", |s| {
        s["supervisor"]["heldFor"] == serde_json::json!(["alpha"])
    })
    .await;
    let (_, body) = tether.get("/status.json").await.expect("status");
    let status: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert!(status["process"]["pid"].is_null(), "{status}");
    let url = format!("http://{}/status", tether.admin);
    let browser = Browser::new();
    let dom = browser.dom(&url);
    let text = verdict_reads(
        &dom,
        "not_ready",
        "Not ready: cycle 2 holds the manager until alpha is reachable again; alpha unreachable for",
    );
    assert!(!text.contains("process to start"), "{text}");
    assert!(
        dom.contains("holds the manager until alpha is back"),
        "the running cycle's row says it holds:\n{dom}"
    );
    assert!(
        dom.contains("not started: held until alpha is back"),
        "{dom}"
    );
    words_agree(&dom);
    browser.screenshots(&url, "holding");

    // Back: the same cycle starts its manager, and holds nothing.
    alpha.set_fault(Fault::Up).await.expect("up");
    until_status(&tether, "the manager up again", |s| {
        verdict(s).0 == "ready"
            && s["supervisor"]["cycle"] == 2
            && s["supervisor"]["heldFor"] == serde_json::json!([])
    })
    .await;
}

/// A folder holding `server`'s kubeconfig, for the Lease.
fn dir_with_kubeconfig(server: &tether_testkit::ApiServer) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("dir");
    let path = common::write_kubeconfig(dir.path(), "lease", server);
    (dir, path)
}
