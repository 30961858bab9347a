//! `tether check`: every remote probed once, and the Lease read, as a
//! table or one JSON document.

use std::fmt::Write as _;
use std::process::ExitCode;

use tether_probes::{Outcome, ProbeResult};

use super::validate::gate;
use super::{CheckArgs, Output, load_with_remotes};
use crate::config::remote;
use crate::discovery::{Discovery, SourceStatus};
use crate::stdout;

fn describe(result: &ProbeResult) -> (&'static str, String) {
    match &result.outcome {
        Outcome::Reachable { status } => ("reachable", status.to_string()),
        Outcome::Unreachable { cause, error } => ("unreachable", format!("{cause}: {error}")),
        Outcome::LocalError { kind, error } => ("error", format!("local ({kind}): {error}")),
    }
}

/// `tether check`: every remote probed once, and the Lease read.
pub(super) async fn run(args: &CheckArgs) -> ExitCode {
    let (config, mut remotes) = match load_with_remotes(&args.config, &[]).await {
        Ok(loaded) => loaded,
        Err(exit) => return exit,
    };
    let (sources, home) = match discover(&config, &mut remotes).await {
        Ok(found) => found,
        Err(exit) => return exit,
    };
    let mut probed = remote::probed(&remotes);
    probed.extend(home);
    let rows = match tether_probes::check(&probed, &config.probe).await {
        Ok(rows) => rows,
        Err(err) => {
            eprintln!(
                "tether: invalid configuration: {}",
                tether_supervisor::error_chain(&err)
            );
            return ExitCode::from(2);
        }
    };
    let required: std::collections::BTreeSet<&str> = remotes
        .iter()
        .filter(|r| r.required)
        .map(|r| r.name.as_str())
        .collect();
    let election = match &config.leader_election {
        Some(spec) => Some(election_finding(spec).await),
        None => None,
    };
    let all_reachable = rows
        .iter()
        .all(|row| matches!(row.result.outcome, Outcome::Reachable { .. }));
    let election_ok = election.as_ref().is_none_or(|(_, ok)| *ok);
    let discovery_ok = sources
        .iter()
        .all(|s| s.listed && s.failing.is_none() && s.skipped.is_empty());
    let out = match args.output {
        Output::Table => {
            let mut out = check_table(&rows, &required, election.as_ref());
            discovery_table(&mut out, &sources);
            out
        }
        Output::Json => check_json(&rows, &required, election.as_ref(), &sources),
    };
    stdout::write(&out);
    if all_reachable && election_ok && discovery_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How long `check` waits for the sources' first lists.
const LIST_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What each discovery source finds now, its remotes added to `remotes`,
/// and the home cluster to probe; nothing without discovery.
async fn discover(
    config: &crate::config::Config,
    remotes: &mut Vec<remote::ResolvedRemote>,
) -> Result<(Vec<SourceStatus>, Option<tether_probes::Remote>), ExitCode> {
    if config.discovery.is_empty() {
        return Ok((Vec::new(), None));
    }
    let discovery = Discovery::start(&config.discovery, false, &prometheus::Registry::new())
        .await
        .map_err(|err| {
            eprintln!(
                "tether: discovery: {}",
                tether_supervisor::error_chain(&err)
            );
            ExitCode::from(2)
        })?;
    discovery.first_lists(LIST_WAIT).await;
    let statics: crate::config::ranked::Remotes = remotes.iter().cloned().collect();
    let mut found = crate::discovery::Found::new();
    discovery.update(Some(&statics), &mut found);
    // In the order the sources and their Secrets come.
    let mut found: Vec<_> = found.into_values().collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    remotes.extend(found.into_iter().map(|(_, remote)| remote));
    let sources = discovery.status();
    discovery.stop();
    Ok((sources, Some(discovery.home())))
}

/// Each discovery source's finding, after the remotes' table.
fn discovery_table(out: &mut String, sources: &[SourceStatus]) {
    for s in sources {
        let state = match (&s.failing, s.listed) {
            (Some((error, _)), _) => format!("cannot list: {error}"),
            (None, false) => "not listed yet".to_owned(),
            (None, true) => "listed".to_owned(),
        };
        let _ = writeln!(
            out,
            "discovery {}: {state}; {} found, {} skipped",
            s.source,
            crate::human::count(s.remotes as u64, "remote", "remotes"),
            crate::human::count(s.skipped.len() as u64, "Secret", "Secrets"),
        );
        for k in &s.skipped {
            let _ = writeln!(out, "  skipped Secret {}: {}", k.secret, k.skipped);
        }
    }
}

/// `tether check`'s table: a row a remote, then the Lease's finding.
fn check_table(
    rows: &[tether_probes::CheckRow],
    required: &std::collections::BTreeSet<&str>,
    election: Option<&(String, bool)>,
) -> String {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let host_width = rows.iter().map(|r| r.host.len()).max().unwrap_or(4).max(4);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:width$}  {:host_width$}  {:8}  {:11}  {:>9}  STATUS/CAUSE",
        "NAME", "HOST", "GATE", "STATE", "LATENCY"
    );
    for row in rows {
        let (state, detail) = describe(&row.result);
        let _ = writeln!(
            out,
            "{:width$}  {:host_width$}  {:8}  {state:11}  {:>7.1}ms  {detail}",
            row.name,
            row.host,
            gate(required.contains(row.name.as_str())),
            row.result.latency.as_secs_f64() * 1000.0
        );
    }
    if let Some((finding, _)) = election {
        let _ = writeln!(out, "leader election: {finding}");
    }
    out
}

/// `tether check -o json`: one document, the same findings as the table.
fn check_json(
    rows: &[tether_probes::CheckRow],
    required: &std::collections::BTreeSet<&str>,
    election: Option<&(String, bool)>,
    sources: &[SourceStatus],
) -> String {
    let discovery: Vec<serde_json::Value> = sources
        .iter()
        .map(|s| {
            serde_json::json!({
                "source": s.source,
                "listed": s.listed,
                "failing": s.failing.as_ref().map(|(error, _)| error),
                "remotes": s.remotes,
                "skipped": s.skipped.iter().map(|k| serde_json::json!({
                    "secret": k.secret,
                    "field": k.skipped.field,
                    "message": k.skipped.message,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let remotes: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let (state, detail) = describe(&row.result);
            serde_json::json!({
                "name": row.name,
                "host": row.host,
                "gate": gate(required.contains(row.name.as_str())),
                "state": state,
                "latencySeconds": row.result.latency.as_secs_f64(),
                "detail": detail,
            })
        })
        .collect();
    let election = election.map(|(finding, ok)| serde_json::json!({"finding": finding, "ok": ok}));
    let mut out =
        serde_json::json!({"remotes": remotes, "leaderElection": election, "discovery": discovery})
            .to_string();
    out.push('\n');
    out
}

/// The Lease's holder, and this replica's role, as `tether check` shows
/// them; and whether the Lease could be read.
async fn election_finding(spec: &crate::config::LeaderElectionSpec) -> (String, bool) {
    let registry = prometheus::Registry::new();
    let election = match crate::lease::election::Election::new(spec.clone(), &registry).await {
        Ok(election) => election,
        Err(err) => return (tether_supervisor::error_chain(&err), false),
    };
    let lease = election.handle().state().lease;
    let me = election.identity().to_owned();
    match election.holder().await {
        Ok(None) => (
            format!(
                "Lease {lease} does not exist yet; the first replica creates it (this one: {me})"
            ),
            true,
        ),
        Ok(Some((holder, age))) if holder.is_empty() => (
            format!(
                "Lease {lease} is free{}; this replica ({me}) would take it",
                age.map(|a| format!(", released {}s ago", a.as_secs()))
                    .unwrap_or_default()
            ),
            true,
        ),
        Ok(Some((holder, age))) => (
            format!(
                "Lease {lease} held by {holder}{}; this replica ({me}) {}",
                age.map(|a| format!(", renewed {}s ago", a.as_secs()))
                    .unwrap_or_default(),
                if holder == me { "leads" } else { "stands by" }
            ),
            true,
        ),
        Err(err) => (format!("cannot read Lease {lease}: {err}"), false),
    }
}
