//! `/status` as a page: the view model laid out for a person after
//! `kubectl port-forward`.
//!
//! - The verdict first, in words; then the remotes, the ones that need
//!   attention first, each with an SVG strip of its last 15 minutes; the
//!   healthy ones folded away; then the cycles as a timeline.
//! - No external assets (the pod has no internet): the CSS and the script
//!   are inline. Light and dark follow `prefers-color-scheme`.
//! - It works without JavaScript: the filter is a GET form, and a
//!   `<noscript>` refresh reloads the page. The script only enhances: it
//!   filters as one types and refreshes in place, keeping what is open.
//! - At most [`ATTENTION_SHOWN`] rows needing attention and
//!   [`HEALTHY_SHOWN`] healthy ones, whatever the remote count, so the page
//!   stays fast at 10,000 remotes; the filter reaches the rest.
//! - Every text from outside (names, hosts, URLs, errors, commands) is
//!   escaped: the page is a maud template, checked when tether is built,
//!   and maud escapes whatever it is given unless told it is markup (only
//!   the inline CSS and script are).

use std::fmt::Write as _;
use std::time::Duration;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use tether_probes::{BUCKET_WIDTH, Bucket, HISTORY_BUCKETS, HISTORY_WINDOW, Recent};
use tether_supervisor::{CauseKind, Phase};

use super::view::{
    Attention, CycleView, DiscoveryView, ElectionView, ProcessView, RemoteView, ShardView,
    StatusView, listed,
};
use crate::human;

/// The most rows needing attention the page shows; the filter finds the
/// others. With [`HEALTHY_SHOWN`], Chromium lays the page out in about
/// 70 ms on the benchmark machine (docs/benchmarks.md).
pub const ATTENTION_SHOWN: usize = 200;

/// The most healthy rows the page shows, folded away.
pub const HEALTHY_SHOWN: usize = 100;

/// How often the page refreshes itself.
pub const REFRESH: Duration = Duration::from_secs(10);

/// What the request asks the page for.
#[derive(Debug, Default)]
pub struct Query {
    /// Only remotes whose name or host contains this, ignoring case.
    pub filter: Option<String>,
}

impl Query {
    /// The page's query from a URL's query string (`q=...`).
    #[must_use]
    pub fn parse(query: Option<&str>) -> Self {
        let filter = query.and_then(|q| {
            form_urlencoded::parse(q.as_bytes())
                .find(|(key, _)| key == "q")
                .map(|(_, value)| value.trim().to_owned())
                .filter(|value| !value.is_empty())
        });
        Self { filter }
    }
}

fn secs(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.max(0.0))
}

/// `<time>` for an event `seconds` ago, relative, with the moment in its
/// title.
fn ago(seconds: f64) -> Markup {
    let at = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_secs_f64(seconds.max(0.0)))
        .ok()
        .and_then(|t| t.round(jiff::Unit::Second).ok())
        .map_or_else(String::new, |t| t.to_string());
    html! { time datetime=(at) title=(at) { (human::ago(secs(seconds))) } }
}

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The whole page. `recent` gives a remote's last 15 minutes, asked only
/// for the rows shown.
#[must_use]
pub(super) fn render(view: &StatusView, query: &Query, recent: &dyn Fn(&str) -> Recent) -> String {
    let verdict = &view.verdict;
    let refresh = REFRESH.as_secs();
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="color-scheme" content="light dark";
                title { (verdict.state.headline()) " · tether" }
                noscript { meta http-equiv="refresh" content=(refresh); }
                style { (PreEscaped(STYLE)) }
            }
            body data-refresh-seconds=(refresh) {
                div #live {
                    header {
                        p #verdict class={ "verdict " (verdict.state.as_str()) } role="status" {
                            span.dot aria-hidden="true" {}
                            (verdict.text)
                        }
                        p.meta {
                            "tether " (view.version) " · rendered "
                            time #rendered datetime=(view.rendered_at) { (view.rendered_at) }
                            " · refreshes every " (refresh) "s · "
                            a href="/status.json" { "status.json" } " · "
                            a href="/metrics" { "metrics" } " · "
                            a href="/readyz" { "readyz" } " · "
                            a href="/healthz" { "healthz" }
                        }
                    }
                    (remotes(view, query, recent))
                    @if let Some(d) = &view.discovery { (discovery(d)) }
                    (cycles(view))
                    (facts(view))
                }
                script { (PreEscaped(SCRIPT)) }
            }
        }
    };
    let mut out = page.into_string();
    out.push('\n');
    out
}

/// The remotes: the filter, the legend, the ones needing attention, then
/// the healthy ones folded away.
fn remotes(view: &StatusView, query: &Query, recent: &dyn Fn(&str) -> Recent) -> Markup {
    let c = &view.counts;
    let filter = query.filter.as_deref().unwrap_or("");
    let needle = filter.to_lowercase();
    let mut shown: Vec<&RemoteView> = view
        .remotes
        .iter()
        .filter(|r| {
            needle.is_empty()
                || r.name.to_lowercase().contains(&needle)
                || r.host.to_lowercase().contains(&needle)
        })
        .collect();
    // Problems first, the required before the optional, then by name
    // (the view is already by name, and the sort is stable).
    shown.sort_by_key(|r| (r.attention, !r.required));
    let split = shown.partition_point(|r| r.attention != Attention::Healthy);
    let (attention, healthy) = shown.split_at(split);
    // The fold claims of the caches only what its rows show: synced
    // while a cycle runs; none on a replica that stands by; between
    // cycles, whatever the last one left.
    let caches = match view.supervisor.phase {
        Phase::Running => "caches synced",
        Phase::Standby => "no caches here (this replica stands by)",
        Phase::Starting | Phase::BackingOff | Phase::ShuttingDown | Phase::Stopped => {
            "no cycle runs now"
        }
    };
    html! {
        section #remotes {
            h2 {
                "Remotes "
                small {
                    (human::number(c.reachable as u64)) " of " (human::number(c.total as u64)) " reachable"
                    @if c.unreachable > 0 {
                        " · " (human::number(c.unreachable as u64)) " unreachable"
                    }
                }
            }
            form.filter method="get" action="/status" role="search" {
                label for="q" { "Filter" }
                input #q name="q" type="search" value=(filter) placeholder="name or host" autocomplete="off";
                button type="submit" { "Filter" }
                @if !filter.is_empty() {
                    " " a href="/status" { "clear" }
                }
            }
            p.legend {
                "Last " (HISTORY_WINDOW.as_secs() / 60) " minutes, " (BUCKET_WIDTH.as_secs()) " s a mark: "
                span.swatch.ok {} "answered 2xx "
                span.swatch.nr {} "answered, not ready "
                span.swatch.mix {} "some probes failed, not lost "
                span.swatch.down {} "unreachable (lost) "
                span.swatch.none {} "no probe; the line above the marks is the slowest answer in each."
            }
            @if attention.is_empty() {
                p.calm {
                    @if needle.is_empty() { "No remote needs attention." }
                    @else { "No matching remote needs attention." }
                }
            } @else {
                h3 { "Needing attention " small { (human::number(attention.len() as u64)) } }
                (table(attention, "attention", ATTENTION_SHOWN, recent, view))
            }
            @if !healthy.is_empty() {
                // Open by default when nothing else is shown.
                details #healthy open[attention.is_empty()] {
                    summary {
                        (human::count(healthy.len() as u64, "remote", "remotes"))
                        " healthy: reachable, ready, " (caches) ", no failed probe in 15 minutes"
                    }
                    (table(healthy, "healthy", HEALTHY_SHOWN, recent, view))
                }
            }
            @if !needle.is_empty() && shown.is_empty() {
                p.calm { "No remote's name or host contains “" (filter) "”." }
            }
        }
    }
}

/// Whether this replica stands by (a follower, or a shard member holding
/// nothing): it runs no manager.
fn standing_by(view: &StatusView) -> bool {
    view.supervisor.phase == Phase::Standby
}

fn table(
    rows: &[&RemoteView],
    id: &str,
    shown: usize,
    recent: &dyn Fn(&str) -> Recent,
    view: &StatusView,
) -> Markup {
    html! {
        table.remotes id={ (id) "-table" } {
            thead {
                tr {
                    th { "remote" }
                    th { "state" }
                    th { "last 15 minutes " span.axis { "15m ago → now" } }
                    th { "latency" }
                    th { "last failure" }
                    th { "caches" }
                }
            }
            tbody {
                @for remote in rows.iter().take(shown) {
                    (row(remote, &recent(&remote.name), standing_by(view)))
                }
            }
        }
        @if rows.len() > shown {
            p.more {
                "Showing " (shown) " of " (human::number(rows.len() as u64))
                ": filter by name or host to see the others."
            }
        }
    }
}

fn row(r: &RemoteView, recent: &Recent, standing_by: bool) -> Markup {
    // The state, and since when.
    let since = match (r.attention, r.last_transition_seconds_ago) {
        (Attention::Unreachable, Some(s)) => format!(
            "for {} · {}",
            human::span(secs(s)),
            human::count(
                u64::from(r.consecutive_failures),
                "failed probe",
                "failed probes"
            )
        ),
        (Attention::NotReady, _) => r
            .last_status
            .map_or_else(String::new, |s| format!("/readyz answered {s}")),
        (_, Some(s)) => format!("{} for {}", r.state, human::span(secs(s))),
        (_, None) => String::new(),
    };
    let slowest = recent.buckets.iter().map(|b| b.slowest_ms).max();
    let latency = r
        .latency_seconds
        .filter(|_| r.attention != Attention::Unreachable)
        .map_or_else(|| "—".to_owned(), |l| human::latency(secs(l)));
    let slowest = slowest
        .filter(|ms| *ms > 0)
        .map_or_else(String::new, |ms| format!("slowest {ms} ms"));
    html! {
        tr data-name=(r.name) data-host=(r.host) class=(r.attention.as_str()) {
            td {
                strong { (r.name) }
                div.sub { (r.host) " · " (if r.required { "required" } else { "optional" }) }
            }
            td {
                span class={ "badge " (r.attention.as_str()) } { (r.attention.words()) }
                div.sub { (since) }
                @if r.stopped_in_cycle {
                    div.sub { "its watches are stopped until it is back" }
                }
            }
            td { (strip(&r.name, recent)) }
            td.num { (latency) div.sub { (slowest) } }
            // The last failure, stamped; faded once the remote is
            // reachable again.
            td.error {
                @if let Some(local) = &r.local_error {
                    span.now { "cannot probe from here: " (local) }
                } @else if let Some(error) = &r.last_error {
                    span class=(if r.attention == Attention::Unreachable { "now" } else { "past" }) {
                        (r.last_cause.unwrap_or("failed")) ": " (error)
                    }
                    @if let Some(s) = r.last_failure_seconds_ago {
                        div.sub { (ago(s)) }
                    }
                } @else {
                    "—"
                }
            }
            td { (caches(r, standing_by)) }
        }
    }
}

fn caches(r: &RemoteView, standing_by: bool) -> Markup {
    if standing_by {
        // No manager runs here: its caches are the leader's.
        return html! { "—" div.sub { "none here: this replica stands by" } };
    }
    if r.caches.is_empty() {
        return html! { "—" };
    }
    let synced = r.caches.iter().filter(|c| c.synced && !c.stale).count();
    let objects: usize = r.caches.iter().map(|c| c.objects).sum();
    // Objects a cache keeps while it is not current are what it last saw.
    let current = if synced == r.caches.len() {
        ""
    } else {
        ", not current"
    };
    html! {
        (synced) " of " (r.caches.len()) " synced"
        div.sub { (human::count(objects as u64, "object", "objects")) (current) }
        @for cache in r.caches.iter().filter(|c| !c.synced || c.stale) {
            div.sub.warn {
                (cache.resource) ": "
                @if cache.stale {
                    "stale: its watch keeps failing"
                    @if let Some(s) = cache.failing_seconds_ago {
                        ", failing since " (human::ago(secs(s)))
                    }
                } @else {
                    "not synced"
                }
            }
        }
    }
}

/// What one mark of the strip shows: red while the remote was lost in it
/// (answers at its end included), orange for failed probes that made no
/// loss.
fn mark(bucket: Bucket) -> &'static str {
    match (bucket.failed > 0, bucket.answered()) {
        _ if bucket.lost => "down",
        (false, false) => "none",
        (true, _) => "mix",
        (false, true) if bucket.not_ready > 0 => "nr",
        (false, true) => "ok",
    }
}

/// Width of one mark in the strip, in px: 60 marks make 360 px.
const MARK: usize = 6;
/// The latency the line's top stands for, at least: below it, answers a few
/// milliseconds apart draw a flat line, not a slope that reads as a mark.
const LATENCY_TOP_MS: u16 = 250;
/// Heights of the strip's two lanes, in px: the latency line, then (after
/// a gap of 2) the marks.
const LINE: usize = 12;
const MARKS: usize = 10;

/// The marks of `buckets`: each run of one kind as `(kind, first, past
/// the last)`, runs without a probe left out.
fn runs(buckets: &[Bucket]) -> Vec<(&'static str, usize, usize)> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < buckets.len() {
        let kind = mark(buckets[start]);
        let end = start
            + buckets[start..]
                .iter()
                .take_while(|b| mark(**b) == kind)
                .count();
        if kind != "none" {
            runs.push((kind, start, end));
        }
        start = end;
    }
    runs
}

/// The latency line's path: the slowest answer of each mark, scaled so
/// `slowest` (or [`LATENCY_TOP_MS`]) is the top; a run's first point is a
/// dot (round caps), so a lone answer between gaps still shows.
fn latency_path(buckets: &[Bucket], slowest: u16) -> String {
    let mut path = String::new();
    let mut pen_down = false;
    for (i, b) in buckets.iter().enumerate() {
        if !b.answered() {
            pen_down = false;
            continue;
        }
        let x = i * MARK + MARK / 2;
        let lane = LINE as f64;
        let top = slowest.max(LATENCY_TOP_MS);
        let y = lane - (lane - 1.0) * f64::from(b.slowest_ms) / f64::from(top);
        let _ = if pen_down {
            write!(path, " L{x} {y:.1}")
        } else {
            write!(path, " M{x} {y:.1} h0.1")
        };
        pen_down = true;
    }
    path.trim_start().to_owned()
}

/// The remote's last 15 minutes: marks of reachability, runs of one kind
/// drawn as one rect, and the slowest answer of each mark as a line.
fn strip(name: &str, recent: &Recent) -> Markup {
    let buckets = &recent.buckets;
    let width = HISTORY_BUCKETS * MARK;
    let height = LINE + 2 + MARKS;
    let answered = buckets.iter().filter(|b| b.answered()).count();
    let failed = buckets.iter().filter(|b| b.failed > 0).count();
    let slowest = buckets.iter().map(|b| b.slowest_ms).max().unwrap_or(0);
    let label = format!(
        "{name}: last {} minutes, {answered} of {HISTORY_BUCKETS} marks answered, {failed} with failed probes; slowest answer {slowest} ms",
        HISTORY_WINDOW.as_secs() / 60,
    );
    html! {
        svg.strip width=(width) height=(height) viewBox={ "0 0 " (width) " " (height) } role="img" aria-label=(label) {
            title { (label) }
            rect.track x="0" y=(LINE + 2) width=(width) height=(MARKS) {}
            @for (kind, start, end) in runs(buckets) {
                rect class=(kind) x=(start * MARK) y=(LINE + 2)
                    width=((end - start) * MARK - usize::from(end < buckets.len() && kind != "ok"))
                    height=(MARKS) {}
            }
            @if slowest > 0 {
                path.latency d=(latency_path(buckets, slowest)) {}
            }
        }
    }
}

/// The cycles: a timeline over the same 15 minutes as the strips, then a
/// table, newest first.
fn cycles(view: &StatusView) -> Markup {
    let s = &view.supervisor;
    html! {
        section #cycles {
            h2 { "Cycles " small { "cycle " (s.cycle) " · " (s.phase) } }
            @if s.cycles.is_empty() {
                p.calm { "No cycle has started yet." }
            } @else {
                (timeline(&s.cycles, s.manager_up))
                table.cycles {
                    thead {
                        tr {
                            th { "cycle" } th { "started" } th { "lived" }
                            th { "ended by" } th { "then waited" }
                        }
                    }
                    tbody {
                        @for c in &s.cycles {
                            tr class=(cycle_class(c, s.manager_up)) {
                                td { (c.number) }
                                td { (ago(c.started_seconds_ago)) }
                                td {
                                    (human::span(secs(c.ended_seconds_ago
                                        .map_or(c.started_seconds_ago, |e| c.started_seconds_ago - e))))
                                }
                                td {
                                    @match (&c.ended_by, c.ended_seconds_ago) {
                                        (Some(by), Some(at)) => { (by) " · " (ago(at)) }
                                        _ if !s.held_for.is_empty() => {
                                            "holds the manager until " (listed(&s.held_for)) " is back"
                                        }
                                        _ => { "running" }
                                    }
                                }
                                td {
                                    (c.backoff_seconds
                                        .map_or_else(|| "—".to_owned(), |b| human::span(secs(b))))
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A cycle's colour: how it ended, or whether it is up.
fn cycle_class(c: &CycleView, up: bool) -> &'static str {
    match c.cause {
        None if up => "run",
        None => "wait",
        Some(CauseKind::RemoteLost | CauseKind::TransitionsMissed) => "lost",
        Some(
            CauseKind::ManagerFailed
            | CauseKind::ManagerPanicked
            | CauseKind::BuildFailed
            | CauseKind::ManagerExited,
        ) => "fail",
        Some(
            CauseKind::RemoteRecovered
            | CauseKind::ConfigChanged
            | CauseKind::LeadershipLost
            | CauseKind::ShardChanged
            | CauseKind::Shutdown,
        ) => "info",
    }
}

/// The cycles over the time since the oldest one shown started: a minute
/// at least, [`HISTORY_WINDOW`] at most, so a young process's cycles are
/// not a sliver at the edge.
fn timeline(cycles: &[CycleView], up: bool) -> Markup {
    const WIDTH: f64 = 900.0;
    let oldest = cycles
        .iter()
        .map(|c| c.started_seconds_ago)
        .fold(0.0, f64::max);
    let window = (oldest * 1.05).clamp(60.0, HISTORY_WINDOW.as_secs_f64());
    let x = |seconds_ago: f64| WIDTH - (seconds_ago.min(window) / window) * WIDTH;
    let label = format!(
        "the last {} over the last {}",
        human::count(cycles.len() as u64, "cycle", "cycles"),
        human::span(secs(window))
    );
    let shown = cycles
        .iter()
        .filter(|c| c.ended_seconds_ago.is_none_or(|e| e < window));
    html! {
        svg.timeline viewBox={ "0 0 " (WIDTH) " 26" } preserveAspectRatio="none" role="img" aria-label=(label) {
            title { (label) }
            @for c in shown {
                @let x0 = x(c.started_seconds_ago);
                @let x1 = x(c.ended_seconds_ago.unwrap_or(0.0));
                rect class=(cycle_class(c, up)) x=(format!("{x0:.1}")) y="4"
                    width=(format!("{:.1}", (x1 - x0).max(1.5))) height="18" {
                    title {
                        @match (&c.ended_by, c.ended_seconds_ago) {
                            (Some(by), Some(at)) => {
                                "cycle " (c.number) ": lived " (human::span(secs(c.started_seconds_ago - at)))
                                ", ended by " (by) " " (human::ago(secs(at)))
                            }
                            _ => {
                                "cycle " (c.number) ": running for " (human::span(secs(c.started_seconds_ago)))
                            }
                        }
                    }
                }
                @if let (Some(backoff), Some(at)) = (c.backoff_seconds, c.ended_seconds_ago) {
                    @let x2 = x((at - backoff).max(0.0));
                    rect.backoff x=(format!("{x1:.1}")) y="9" width=(format!("{:.1}", (x2 - x1).max(1.0))) height="8" {
                        title { "backoff " (human::span(secs(backoff))) }
                    }
                }
            }
        }
        // The axis in HTML: the SVG stretches to the page's width, and
        // text in it would stretch with it.
        div.axis-row {
            span { (human::span(secs(window))) " ago" }
            span.legend {
                span.swatch.run {} "up "
                span.swatch.wait {} "not up yet "
                span.swatch.down {} "ended by a lost remote "
                span.swatch.info {} "ended by a recovery, new config or shutdown "
                span.swatch.mix {} "ended by a manager failure "
                span.swatch.backoff {} "backoff"
            }
            span { "now" }
        }
    }
}

/// One fact: a term and what it is.
fn fact(term: &str, value: impl maud::Render) -> Markup {
    html! { dt { (term) } dd { (value) } }
}

/// Discovery: each source, what it gives, and each Secret it skips.
fn discovery(d: &DiscoveryView) -> Markup {
    html! {
        section #discovery {
            h2 { "Discovery" }
            p.meta { "From the home cluster's Secrets; the home cluster is probed as the remote " code { (d.home) } "." }
            @for s in &d.sources {
                dl {
                    (fact("source", &s.source))
                    (fact("selector", html! { code { (s.selector) } }))
                    (fact("gives", format!(
                        "{}{}",
                        human::count(s.remotes as u64, "remote", "remotes"),
                        if s.required { ", required" } else { ", not required" },
                    )))
                    (fact("listed", if let (true, Some(seconds)) = (s.listed, s.listed_seconds_ago) {
                        ago(seconds)
                    } else {
                        html! { span.now { "not yet" } }
                    }))
                    @if let Some(err) = &s.failing {
                        (fact("failing", html! {
                            span.now { (err) }
                            @if let Some(seconds) = s.failing_seconds { " · since " (ago(seconds)) }
                            " · the last known remotes stay"
                        }))
                    }
                }
                @if !s.skipped.is_empty() {
                    table {
                        caption { (human::count(s.skipped.len() as u64, "Secret skipped", "Secrets skipped")) }
                        thead { tr { th { "Secret" } th { "field" } th { "why" } } }
                        tbody {
                            @for k in &s.skipped {
                                tr { td { code { (k.secret) } } td { code { (k.field) } } td { (k.message) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The supervisor, the manager process and the election, as facts.
fn facts(view: &StatusView) -> Markup {
    let s = &view.supervisor;
    let ended: Vec<String> = s
        .ended
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(cause, n)| format!("{cause} {n}"))
        .collect();
    let changed: Vec<String> = s
        .remote_changed
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(change, n)| format!("{change} {n}"))
        .collect();
    html! {
        section #facts {
            h2 { "Details" }
            dl {
                (fact("supervisor", format!("cycle {} · {}", s.cycle, s.phase)))
                @if let Some(age) = s.cycle_age_seconds {
                    (fact("cycle started", ago(age)))
                }
                (fact("manager", s.up_for_seconds.map_or_else(
                    || if s.held_for.is_empty() {
                        "not up".to_owned()
                    } else {
                        format!("not started: held until {} is back", listed(&s.held_for))
                    },
                    |up| format!("up for {}", human::span(secs(up))),
                )))
                @if let Some(backoff) = s.backoff_seconds {
                    (fact("backoff", human::span(secs(backoff))))
                }
                (fact("cycles ended", if ended.is_empty() { "none yet".to_owned() } else { ended.join(" · ") }))
                @if let Some(last) = s.remote_changes.last() {
                    (fact("remotes changed in a running cycle", html! {
                        (changed.join(" · ")) " · last: " code { (last.remote) } " " (last.change)
                        " (" (last.cause) ", cycle " (last.cycle) ") · " (ago(last.seconds_ago))
                    }))
                }
                (fact("draining", if view.draining { "yes" } else { "no" }))
                @if let Some(p) = &view.process { (process_facts(p)) }
                @if let Some(e) = &view.election { (election_facts(e)) }
                @if let Some(shard) = &view.shard { (shard_facts(shard)) }
            }
        }
    }
}

/// The exec manager's process, as facts.
fn process_facts(p: &ProcessView) -> Markup {
    let process = match (p.pid, p.running_seconds) {
        (Some(pid), Some(run)) => format!("pid {pid}, running for {}", human::span(secs(run))),
        (Some(pid), None) => format!("pid {pid}"),
        _ => "not running".to_owned(),
    };
    let by = if p.last_exit_stopped == Some(true) {
        "stopped by tether"
    } else {
        "ended by itself"
    };
    html! {
        (fact("manager process", html! { code { (human::command(&p.command)) } }))
        (fact("process", process))
        @if let Some(check) = &p.readiness_check {
            (fact("readiness check", check))
        }
        @if let (Some(how), Some(at)) = (&p.last_exit, p.last_exit_seconds_ago) {
            (fact("last exit", html! {
                (how) " (" (by) ", cycle " (p.last_exit_cycle.unwrap_or_default()) ") · " (ago(at))
            }))
        }
        @if let Some(err) = &p.spawn_error {
            (fact("spawn error", html! { span.now { (err) } }))
        }
    }
}

/// The leader election, as facts.
fn election_facts(e: &ElectionView) -> Markup {
    html! {
        (fact("role", e.role.as_str()))
        (fact("this replica", &e.identity))
        (fact("leader", if e.holder.is_empty() { "none" } else { e.holder.as_str() }))
        (fact("lease", &e.lease))
        @if e.twin {
            (fact("identity clash", html! {
                span.now { "another process writes the Lease under this replica's identity" }
            }))
        }
        @if let Some(err) = &e.last_error {
            (fact("lease error", html! { span.now { (err) } }))
        }
    }
}

/// This replica among the shards, as facts.
fn shard_facts(shard: &ShardView) -> Markup {
    let waiting = if shard.waiting.is_empty() {
        String::new()
    } else {
        format!(
            "; {} more once another member gives them up",
            human::number(shard.waiting.len() as u64)
        )
    };
    html! {
        (fact("shard group", &shard.group))
        (fact("this replica", &shard.identity))
        (fact("members", shard.members.join(", ")))
        (fact("holds", format!(
            "{} of {}{waiting}",
            human::number(shard.owned.len() as u64),
            human::count(shard.configured as u64, "remote", "remotes"),
        )))
        @if let Some(left) = shard.joining_seconds {
            (fact("joining", format!(
                "takes its share in {}",
                human::span(std::time::Duration::from_secs_f64(left))
            )))
        }
        @if shard.twin {
            (fact("identity clash", html! {
                span.now { "another process writes this replica's shard Lease under its identity" }
            }))
        }
        @if let Some(err) = &shard.last_error {
            (fact("shard error", html! { span.now { (err) } }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_outside_cannot_become_markup() {
        let hostile = "<script>alert('x')</script> & \"q\"";
        let markup = fact(hostile, hostile).into_string();
        assert!(!markup.contains("<script"), "{markup}");
        assert!(
            markup.contains("&lt;script&gt;alert('x')&lt;/script&gt; &amp; &quot;q&quot;"),
            "{markup}"
        );
    }

    #[test]
    fn the_filter_comes_from_the_query_decoded() {
        assert_eq!(
            Query::parse(Some("q=cluster%2Db+east")).filter.as_deref(),
            Some("cluster-b east")
        );
        assert_eq!(Query::parse(Some("q=")).filter, None);
        assert_eq!(Query::parse(Some("other=1")).filter, None);
        assert_eq!(Query::parse(None).filter, None);
    }

    #[test]
    fn a_mark_shows_the_worst_and_the_mixed() {
        let b = |ready, not_ready, failed| Bucket {
            ready,
            not_ready,
            failed,
            slowest_ms: 1,
            lost: false,
        };
        assert_eq!(mark(b(0, 0, 0)), "none");
        assert_eq!(mark(b(1, 0, 0)), "ok");
        assert_eq!(mark(b(0, 1, 0)), "nr");
        assert_eq!(mark(b(1, 0, 1)), "mix");
        // Failed probes short of the threshold are no loss.
        assert_eq!(mark(b(0, 0, 2)), "mix");
        // An outage's mark is red, even with the answer that ended it.
        let ended = Bucket {
            lost: true,
            ..b(1, 0, 2)
        };
        assert_eq!(mark(ended), "down");
    }
}
