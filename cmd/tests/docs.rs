//! The docs say only what is true of the repository: every alert they name
//! exists, every alert has its runbook and its line in troubleshooting, and
//! every page in `docs/` is in the README's layout table.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The alert names the rules define.
fn alerts() -> BTreeSet<String> {
    read(&root().join("alerts/tether.rules.yaml"))
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .map(str::to_owned)
        .collect()
}

/// Every word of `text` that names an alert: `Tether` and a capital.
fn named_alerts(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            w.strip_prefix("Tether")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_uppercase()))
        })
        .map(str::to_owned)
        .collect()
}

fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages.push(root().join("README.md"));
    pages.push(root().join("helm/tether/values.yaml"));
    pages
}

#[test]
fn every_alert_the_docs_name_exists() {
    let alerts = alerts();
    assert!(alerts.len() >= 6, "{alerts:?}");
    for page in pages() {
        for name in named_alerts(&read(&page)) {
            assert!(
                alerts.contains(&name),
                "{} names {name}, which alerts/tether.rules.yaml does not define ({alerts:?})",
                page.display()
            );
        }
    }
}

#[test]
fn every_alert_has_a_runbook_and_a_line_in_troubleshooting() {
    let runbooks = read(&root().join("docs/runbooks.md"));
    let troubleshooting = read(&root().join("docs/troubleshooting.md"));
    for alert in alerts() {
        assert!(
            runbooks.contains(&format!("## {alert}\n")),
            "docs/runbooks.md has no page for {alert}"
        );
        assert!(
            troubleshooting.contains(&format!("- `{alert}`:")),
            "docs/troubleshooting.md's alert list lacks {alert}"
        );
    }
}

#[test]
fn every_page_in_docs_is_in_the_readmes_layout_table() {
    let readme = read(&root().join("README.md"));
    let table = readme
        .lines()
        .find(|l| l.starts_with("| `docs/` |"))
        .expect("the layout table's docs/ row");
    for page in pages() {
        if page.parent().is_some_and(|p| p.ends_with("docs")) {
            let name = page.file_name().expect("a name").to_string_lossy();
            assert!(
                table.contains(&format!("(docs/{name})")),
                "README's layout table lacks docs/{name}"
            );
        }
    }
}
