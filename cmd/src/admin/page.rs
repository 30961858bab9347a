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
//!   escaped.

use std::fmt::Write as _;
use std::time::Duration;

use tether_probes::{BUCKET_WIDTH, Bucket, HISTORY_BUCKETS, HISTORY_WINDOW, Recent};
use tether_supervisor::CauseKind;

use super::view::{
    Attention, CycleView, ElectionView, ProcessView, RemoteView, ShardView, StatusView,
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

/// Escapes text for HTML content and double- or single-quoted attributes.
#[must_use]
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn secs(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.max(0.0))
}

/// `<time>` for an event `seconds` ago, relative, with the moment in its
/// title.
fn ago(seconds: f64) -> String {
    let at = jiff::Timestamp::now()
        .checked_sub(jiff::SignedDuration::from_secs_f64(seconds.max(0.0)))
        .ok()
        .and_then(|t| t.round(jiff::Unit::Second).ok())
        .map_or_else(String::new, |t| t.to_string());
    format!(
        "<time datetime=\"{at}\" title=\"{at}\">{}</time>",
        human::ago(secs(seconds))
    )
}

const STYLE: &str = include_str!("page.css");
const SCRIPT: &str = include_str!("page.js");

/// The whole page. `recent` gives a remote's last 15 minutes, asked only
/// for the rows shown.
#[must_use]
pub(super) fn render(view: &StatusView, query: &Query, recent: &dyn Fn(&str) -> Recent) -> String {
    let mut html = String::with_capacity(64 * 1024);
    let verdict = &view.verdict;
    let _ = write!(
        html,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"color-scheme\" content=\"light dark\">\
         <title>{} · tether</title>\
         <noscript><meta http-equiv=\"refresh\" content=\"{}\"></noscript>\
         <style>{STYLE}</style></head><body data-refresh-seconds=\"{}\">",
        verdict.state.headline(),
        REFRESH.as_secs(),
        REFRESH.as_secs(),
    );
    let _ = write!(
        html,
        "<div id=\"live\"><header><p id=\"verdict\" class=\"verdict {}\" role=\"status\">\
         <span class=\"dot\" aria-hidden=\"true\"></span>{}</p>\
         <p class=\"meta\">tether {} · rendered <time id=\"rendered\" datetime=\"{at}\">{at}</time> · \
         refreshes every {}s · <a href=\"/status.json\">status.json</a> · <a href=\"/metrics\">metrics</a> · \
         <a href=\"/readyz\">readyz</a> · <a href=\"/healthz\">healthz</a></p></header>",
        verdict.state.as_str(),
        escape(&verdict.text),
        view.version,
        REFRESH.as_secs(),
        at = view.rendered_at,
    );
    write_remotes(&mut html, view, query, recent);
    write_cycles(&mut html, view);
    write_facts(&mut html, view);
    let _ = writeln!(html, "</div><script>{SCRIPT}</script></body></html>");
    html
}

/// The remotes: the filter, the legend, the ones needing attention, then
/// the healthy ones folded away.
fn write_remotes(
    html: &mut String,
    view: &StatusView,
    query: &Query,
    recent: &dyn Fn(&str) -> Recent,
) {
    let c = &view.counts;
    let _ = write!(
        html,
        "<section id=\"remotes\"><h2>Remotes <small>{} of {} reachable",
        human::number(c.reachable as u64),
        human::number(c.total as u64)
    );
    if c.unreachable > 0 {
        let _ = write!(
            html,
            " · {} unreachable",
            human::number(c.unreachable as u64)
        );
    }
    let filter = query.filter.as_deref().unwrap_or("");
    let _ = write!(
        html,
        "</small></h2><form class=\"filter\" method=\"get\" action=\"/status\" role=\"search\">\
         <label for=\"q\">Filter</label><input id=\"q\" name=\"q\" type=\"search\" value=\"{}\" \
         placeholder=\"name or host\" autocomplete=\"off\"><button type=\"submit\">Filter</button>",
        escape(filter)
    );
    if !filter.is_empty() {
        html.push_str(" <a href=\"/status\">clear</a>");
    }
    html.push_str("</form>");
    let _ = write!(
        html,
        "<p class=\"legend\">Last {} minutes, {} s a mark: \
         <span class=\"swatch ok\"></span>answered 2xx \
         <span class=\"swatch nr\"></span>answered, not ready \
         <span class=\"swatch mix\"></span>some probes failed, not lost \
         <span class=\"swatch down\"></span>unreachable (lost) \
         <span class=\"swatch none\"></span>no probe; \
         the line above the marks is the slowest answer in each.</p>",
        HISTORY_WINDOW.as_secs() / 60,
        BUCKET_WIDTH.as_secs(),
    );

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

    if attention.is_empty() {
        let _ = write!(
            html,
            "<p class=\"calm\">{}</p>",
            if needle.is_empty() {
                "No remote needs attention."
            } else {
                "No matching remote needs attention."
            }
        );
    } else {
        let _ = write!(
            html,
            "<h3>Needing attention <small>{}</small></h3>",
            human::number(attention.len() as u64)
        );
        write_table(html, attention, "attention", ATTENTION_SHOWN, recent, view);
    }
    if !healthy.is_empty() {
        // Open by default when nothing else is shown.
        let open = if attention.is_empty() { " open" } else { "" };
        // The fold claims of the caches only what its rows show: synced
        // while a cycle runs; none on a replica that stands by; between
        // cycles, whatever the last one left.
        let caches = match view.supervisor.phase {
            "running" => "caches synced",
            "standby" => "no caches here (this replica stands by)",
            _ => "no cycle runs now",
        };
        let _ = write!(
            html,
            "<details id=\"healthy\"{open}><summary>{} healthy: reachable, ready, {caches}, \
             no failed probe in 15 minutes</summary>",
            human::count(healthy.len() as u64, "remote", "remotes")
        );
        write_table(html, healthy, "healthy", HEALTHY_SHOWN, recent, view);
        html.push_str("</details>");
    }
    if !needle.is_empty() && shown.is_empty() {
        let _ = write!(
            html,
            "<p class=\"calm\">No remote's name or host contains “{}”.</p>",
            escape(filter)
        );
    }
    html.push_str("</section>");
}

/// Whether this replica stands by (a follower, or a shard member holding
/// nothing): it runs no manager.
fn standing_by(view: &StatusView) -> bool {
    view.supervisor.phase == "standby"
}

fn write_table(
    html: &mut String,
    rows: &[&RemoteView],
    id: &str,
    shown: usize,
    recent: &dyn Fn(&str) -> Recent,
    view: &StatusView,
) {
    let _ = write!(
        html,
        "<table class=\"remotes\" id=\"{id}-table\"><thead><tr><th>remote</th><th>state</th>\
         <th>last 15 minutes <span class=\"axis\">15m ago → now</span></th><th>latency</th>\
         <th>last failure</th><th>caches</th></tr></thead><tbody>"
    );
    for remote in rows.iter().take(shown) {
        write_row(html, remote, &recent(&remote.name), standing_by(view));
    }
    html.push_str("</tbody></table>");
    if rows.len() > shown {
        let _ = write!(
            html,
            "<p class=\"more\">Showing {shown} of {}: filter by name or host to see the others.</p>",
            human::number(rows.len() as u64)
        );
    }
}

fn write_row(html: &mut String, r: &RemoteView, recent: &Recent, standing_by: bool) {
    let name = escape(&r.name);
    let host = escape(&r.host);
    let _ = write!(
        html,
        "<tr data-name=\"{name}\" data-host=\"{host}\" class=\"{}\"><td><strong>{name}</strong>\
         <div class=\"sub\">{host} · {}</div></td>",
        r.attention.as_str(),
        if r.required { "required" } else { "optional" },
    );
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
    let _ = write!(
        html,
        "<td><span class=\"badge {}\">{}</span><div class=\"sub\">{since}</div>",
        r.attention.as_str(),
        r.attention.words(),
    );
    if r.stopped_in_cycle {
        html.push_str("<div class=\"sub\">its watches are stopped until it is back</div>");
    }
    html.push_str("</td><td>");
    write_strip(html, &r.name, recent);
    let slowest = recent.buckets.iter().map(|b| b.slowest_ms).max();
    let _ = write!(
        html,
        "</td><td class=\"num\">{}<div class=\"sub\">{}</div></td>",
        r.latency_seconds
            .filter(|_| r.attention != Attention::Unreachable)
            .map_or_else(|| "—".to_owned(), |l| human::latency(secs(l))),
        slowest
            .filter(|ms| *ms > 0)
            .map_or_else(String::new, |ms| format!("slowest {ms} ms")),
    );
    // The last failure, stamped; faded once the remote is reachable again.
    html.push_str("<td class=\"error\">");
    if let Some(local) = &r.local_error {
        let _ = write!(
            html,
            "<span class=\"now\">cannot probe from here: {}</span>",
            escape(local)
        );
    } else if let Some(error) = &r.last_error {
        let class = if r.attention == Attention::Unreachable {
            "now"
        } else {
            "past"
        };
        let _ = write!(
            html,
            "<span class=\"{class}\">{}: {}</span>",
            r.last_cause.unwrap_or("failed"),
            escape(error)
        );
        if let Some(s) = r.last_failure_seconds_ago {
            let _ = write!(html, "<div class=\"sub\">{}</div>", ago(s));
        }
    } else {
        html.push('—');
    }
    html.push_str("</td><td>");
    write_caches(html, r, standing_by);
    html.push_str("</td></tr>");
}

fn write_caches(html: &mut String, r: &RemoteView, standing_by: bool) {
    if standing_by {
        // No manager runs here: its caches are the leader's.
        html.push_str("—<div class=\"sub\">none here: this replica stands by</div>");
        return;
    }
    if r.caches.is_empty() {
        html.push('—');
        return;
    }
    let synced = r.caches.iter().filter(|c| c.synced && !c.stale).count();
    let objects: usize = r.caches.iter().map(|c| c.objects).sum();
    // Objects a cache keeps while it is not current are what it last saw.
    let current = if synced == r.caches.len() {
        ""
    } else {
        ", not current"
    };
    let _ = write!(
        html,
        "{synced} of {} synced<div class=\"sub\">{}{current}</div>",
        r.caches.len(),
        human::count(objects as u64, "object", "objects")
    );
    for cache in r.caches.iter().filter(|c| !c.synced || c.stale) {
        let how = if cache.stale {
            let since = cache.failing_seconds_ago.map_or_else(String::new, |s| {
                format!(", failing since {}", human::ago(secs(s)))
            });
            format!("stale: its watch keeps failing{since}")
        } else {
            "not synced".to_owned()
        };
        let _ = write!(
            html,
            "<div class=\"sub warn\">{}: {how}</div>",
            escape(&cache.resource)
        );
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

/// The remote's last 15 minutes: marks of reachability, runs of one kind
/// drawn as one rect, and the slowest answer of each mark as a line.
fn write_strip(html: &mut String, name: &str, recent: &Recent) {
    let buckets = &recent.buckets;
    let width = HISTORY_BUCKETS * MARK;
    let answered = buckets.iter().filter(|b| b.answered()).count();
    let failed = buckets.iter().filter(|b| b.failed > 0).count();
    let slowest = buckets.iter().map(|b| b.slowest_ms).max().unwrap_or(0);
    let label = format!(
        "{}: last {} minutes, {answered} of {HISTORY_BUCKETS} marks answered, {failed} with failed probes; slowest answer {slowest} ms",
        escape(name),
        HISTORY_WINDOW.as_secs() / 60,
    );
    let _ = write!(
        html,
        "<svg class=\"strip\" width=\"{width}\" height=\"{h}\" viewBox=\"0 0 {width} {h}\" role=\"img\" \
         aria-label=\"{label}\"><title>{label}</title><rect class=\"track\" x=\"0\" y=\"{y}\" width=\"{width}\" height=\"{MARKS}\"/>",
        h = LINE + 2 + MARKS,
        y = LINE + 2,
    );
    let mut start = 0;
    while start < buckets.len() {
        let kind = mark(buckets[start]);
        let end = start
            + buckets[start..]
                .iter()
                .take_while(|b| mark(**b) == kind)
                .count();
        if kind != "none" {
            let _ = write!(
                html,
                "<rect class=\"{kind}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{MARKS}\"/>",
                start * MARK,
                LINE + 2,
                (end - start) * MARK - usize::from(end < buckets.len() && kind != "ok"),
            );
        }
        start = end;
    }
    if slowest > 0 {
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
            // A run's first point is a dot (round caps), so a lone answer
            // between gaps still shows.
            let _ = if pen_down {
                write!(path, " L{x} {y:.1}")
            } else {
                write!(path, " M{x} {y:.1} h0.1")
            };
            pen_down = true;
        }
        let _ = write!(
            html,
            "<path class=\"latency\" d=\"{}\"/>",
            path.trim_start()
        );
    }
    html.push_str("</svg>");
}

/// The cycles: a timeline over the same 15 minutes as the strips, then a
/// table, newest first.
fn write_cycles(html: &mut String, view: &StatusView) {
    let s = &view.supervisor;
    let _ = write!(
        html,
        "<section id=\"cycles\"><h2>Cycles <small>cycle {} · {}</small></h2>",
        s.cycle, s.phase
    );
    if s.cycles.is_empty() {
        html.push_str("<p class=\"calm\">No cycle has started yet.</p></section>");
        return;
    }
    write_timeline(html, &s.cycles, s.manager_up);
    html.push_str(
        "<table class=\"cycles\"><thead><tr><th>cycle</th><th>started</th><th>lived</th>\
         <th>ended by</th><th>then waited</th></tr></thead><tbody>",
    );
    for c in &s.cycles {
        let lived = c
            .ended_seconds_ago
            .map_or(c.started_seconds_ago, |e| c.started_seconds_ago - e);
        let ended = match (&c.ended_by, c.ended_seconds_ago) {
            (Some(by), Some(at)) => format!("{} · {}", escape(by), ago(at)),
            _ => "running".to_owned(),
        };
        let _ = write!(
            html,
            "<tr class=\"{}\"><td>{}</td><td>{}</td><td>{}</td><td>{ended}</td><td>{}</td></tr>",
            cycle_class(c, s.manager_up),
            c.number,
            ago(c.started_seconds_ago),
            human::span(secs(lived)),
            c.backoff_seconds
                .map_or_else(|| "—".to_owned(), |b| human::span(secs(b))),
        );
    }
    html.push_str("</tbody></table></section>");
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
fn write_timeline(html: &mut String, cycles: &[CycleView], up: bool) {
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
    let _ = write!(
        html,
        "<svg class=\"timeline\" viewBox=\"0 0 {WIDTH} 26\" preserveAspectRatio=\"none\" role=\"img\" \
         aria-label=\"{label}\"><title>{label}</title>"
    );
    for c in cycles {
        if c.ended_seconds_ago.is_some_and(|e| e >= window) {
            continue;
        }
        let x0 = x(c.started_seconds_ago);
        let x1 = x(c.ended_seconds_ago.unwrap_or(0.0));
        let title = match (&c.ended_by, c.ended_seconds_ago) {
            (Some(by), Some(at)) => format!(
                "cycle {}: lived {}, ended by {} {}",
                c.number,
                human::span(secs(c.started_seconds_ago - at)),
                escape(by),
                human::ago(secs(at)),
            ),
            _ => format!(
                "cycle {}: running for {}",
                c.number,
                human::span(secs(c.started_seconds_ago))
            ),
        };
        let _ = write!(
            html,
            "<rect class=\"{}\" x=\"{x0:.1}\" y=\"4\" width=\"{:.1}\" height=\"18\"><title>{title}</title></rect>",
            cycle_class(c, up),
            (x1 - x0).max(1.5),
        );
        if let (Some(backoff), Some(at)) = (c.backoff_seconds, c.ended_seconds_ago) {
            let x2 = x((at - backoff).max(0.0));
            let _ = write!(
                html,
                "<rect class=\"backoff\" x=\"{x1:.1}\" y=\"9\" width=\"{:.1}\" height=\"8\"><title>backoff {}</title></rect>",
                (x2 - x1).max(1.0),
                human::span(secs(backoff)),
            );
        }
    }
    // The axis in HTML: the SVG stretches to the page's width, and text
    // in it would stretch with it.
    let _ = write!(
        html,
        "</svg><div class=\"axis-row\"><span>{} ago</span><span class=\"legend\">\
         <span class=\"swatch run\"></span>up <span class=\"swatch wait\"></span>not up yet \
         <span class=\"swatch down\"></span>ended by a lost remote \
         <span class=\"swatch info\"></span>ended by a recovery, new config or shutdown \
         <span class=\"swatch mix\"></span>ended by a manager failure \
         <span class=\"swatch backoff\"></span>backoff</span><span>now</span></div>",
        human::span(secs(window)),
    );
}

/// The supervisor, the manager process and the election, as facts.
fn write_facts(html: &mut String, view: &StatusView) {
    let s = &view.supervisor;
    html.push_str("<section id=\"facts\"><h2>Details</h2><dl>");
    let mut fact = |term: &str, value: String| {
        let _ = write!(html, "<dt>{term}</dt><dd>{value}</dd>");
    };
    fact("supervisor", format!("cycle {} · {}", s.cycle, s.phase));
    if let Some(age) = s.cycle_age_seconds {
        fact("cycle started", ago(age));
    }
    fact(
        "manager",
        s.up_for_seconds.map_or_else(
            || "not up".to_owned(),
            |up| format!("up for {}", human::span(secs(up))),
        ),
    );
    if let Some(backoff) = s.backoff_seconds {
        fact("backoff", human::span(secs(backoff)));
    }
    let ended: Vec<String> = s
        .ended
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(cause, n)| format!("{cause} {n}"))
        .collect();
    fact(
        "cycles ended",
        if ended.is_empty() {
            "none yet".to_owned()
        } else {
            ended.join(" · ")
        },
    );
    fact(
        "draining",
        if view.draining { "yes" } else { "no" }.to_owned(),
    );
    if let Some(p) = &view.process {
        process_facts(&mut fact, p);
    }
    if let Some(e) = &view.election {
        election_facts(&mut fact, e);
    }
    if let Some(shard) = &view.shard {
        shard_facts(&mut fact, shard);
    }
    html.push_str("</dl></section>");
}

/// The exec manager's process, as facts.
fn process_facts(fact: &mut impl FnMut(&str, String), p: &ProcessView) {
    fact(
        "manager process",
        format!("<code>{}</code>", escape(&human::command(&p.command))),
    );
    fact(
        "process",
        match (p.pid, p.running_seconds) {
            (Some(pid), Some(run)) => {
                format!("pid {pid}, running for {}", human::span(secs(run)))
            }
            (Some(pid), None) => format!("pid {pid}"),
            _ => "not running".to_owned(),
        },
    );
    if let Some(check) = &p.readiness_check {
        fact("readiness check", escape(check));
    }
    if let (Some(how), Some(at)) = (&p.last_exit, p.last_exit_seconds_ago) {
        let by = if p.last_exit_stopped == Some(true) {
            "stopped by tether"
        } else {
            "ended by itself"
        };
        fact(
            "last exit",
            format!(
                "{} ({by}, cycle {}) · {}",
                escape(how),
                p.last_exit_cycle.unwrap_or_default(),
                ago(at)
            ),
        );
    }
    if let Some(err) = &p.spawn_error {
        fact(
            "spawn error",
            format!("<span class=\"now\">{}</span>", escape(err)),
        );
    }
}

/// The leader election, as facts.
fn election_facts(fact: &mut impl FnMut(&str, String), e: &ElectionView) {
    fact("role", e.role.as_str().to_owned());
    fact("this replica", escape(&e.identity));
    fact(
        "leader",
        if e.holder.is_empty() {
            "none".to_owned()
        } else {
            escape(&e.holder)
        },
    );
    fact("lease", escape(&e.lease));
    if e.twin {
        fact(
            "identity clash",
            "<span class=\"now\">another process writes the Lease under this replica's identity</span>".to_owned(),
        );
    }
    if let Some(err) = &e.last_error {
        fact(
            "lease error",
            format!("<span class=\"now\">{}</span>", escape(err)),
        );
    }
}

/// This replica among the shards, as facts.
fn shard_facts(fact: &mut impl FnMut(&str, String), shard: &ShardView) {
    fact("shard group", escape(&shard.group));
    fact("this replica", escape(&shard.identity));
    fact("members", escape(&shard.members.join(", ")));
    fact(
        "holds",
        format!(
            "{} of {}{}",
            human::number(shard.owned.len() as u64),
            human::count(shard.configured as u64, "remote", "remotes"),
            if shard.waiting.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} more once another member gives them up",
                    human::number(shard.waiting.len() as u64)
                )
            }
        ),
    );
    if let Some(left) = shard.joining_seconds {
        fact(
            "joining",
            format!(
                "takes its share in {}",
                human::span(std::time::Duration::from_secs_f64(left))
            ),
        );
    }
    if shard.twin {
        fact(
            "identity clash",
            "<span class=\"now\">another process writes this replica's shard Lease under its identity</span>".to_owned(),
        );
    }
    if let Some(err) = &shard.last_error {
        fact(
            "shard error",
            format!("<span class=\"now\">{}</span>", escape(err)),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_outside_cannot_become_markup() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
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
