//! Sharding: several processes share the remotes on a real home
//! apiserver's Leases.

use std::collections::BTreeSet;

use crate::*;

/// What the replicas at `admins` report together: remotes reachable (each
/// counted by its owner alone), remotes held, managers up, and each
/// remote's owners (by replica index, from `tether_remote_owned`).
pub(crate) struct Totals {
    reachable: f64,
    held: f64,
    up: f64,
    owners: BTreeMap<String, Vec<usize>>,
}

impl Totals {
    /// One scrape of each replica at `admins`, in turn: not one instant,
    /// so a remote moving between two replicas meanwhile may be seen with
    /// both or neither (only a member's loss moves remotes here).
    pub(crate) fn of(admins: &[String]) -> Result<Self> {
        let mut totals = Self {
            reachable: 0.0,
            held: 0.0,
            up: 0.0,
            owners: BTreeMap::new(),
        };
        for (i, admin) in admins.iter().enumerate() {
            let (_, text, _) = http_get(admin, "/metrics")?;
            totals.reachable += metric_sum(&text, "tether_remote_apiserver_reachable", "");
            totals.held += metric_sum(&text, "tether_owned_remotes", "");
            totals.up += metric_sum(&text, "tether_manager_up", "");
            for line in text.lines() {
                let Some(rest) = line.strip_prefix("tether_remote_owned{remote=\"") else {
                    continue;
                };
                let Some((remote, value)) = rest.split_once("\"} ") else {
                    continue;
                };
                let owners = totals.owners.entry(remote.to_owned()).or_default();
                if value.trim() == "1" {
                    owners.push(i);
                }
            }
        }
        Ok(totals)
    }

    /// The remotes the replica at index `i` holds.
    fn held_by(&self, i: usize) -> BTreeSet<String> {
        self.owners
            .iter()
            .filter(|(_, owners)| owners.contains(&i))
            .map(|(remote, _)| remote.clone())
            .collect()
    }

    /// Remotes held by no replica, and by more than one.
    fn unheld_and_doubled(&self) -> (usize, usize) {
        let unheld = self.owners.values().filter(|o| o.is_empty()).count();
        let doubled = self.owners.values().filter(|o| o.len() > 1).count();
        (unheld, doubled)
    }
}

/// When, after a member's loss, the survivors took its remotes and first
/// probed them reachable, from their own log lines (seconds after the
/// kill): exact to the line, whatever the spacing of the harness's reads.
struct Phases {
    /// The first and the last survivor's "this replica's remotes changed"
    /// that took remotes.
    first_take: Option<f64>,
    last_take: Option<f64>,
    /// The last of the moved remotes' first "remote apiserver reachable".
    last_reachable: Option<f64>,
    /// How many of the moved remotes had such a line.
    reachable: usize,
}

impl Phases {
    fn of(survivors: &[Process], moved: &BTreeSet<String>, killed_at: f64) -> Self {
        let mut takes = Vec::new();
        let mut first_reachable: BTreeMap<&str, f64> = BTreeMap::new();
        for tether in survivors {
            for (at, fields) in tether.events("this replica's remotes changed") {
                if at >= killed_at && fields["taken"].as_u64().unwrap_or(0) > 0 {
                    takes.push(at - killed_at);
                }
            }
            for (at, fields) in tether.events("remote apiserver reachable") {
                if at < killed_at {
                    continue;
                }
                let names = fields["remotes"].as_str().unwrap_or("");
                for name in names.split(", ") {
                    if let Some(name) = moved.get(name) {
                        let first = first_reachable.entry(name).or_insert(at - killed_at);
                        *first = first.min(at - killed_at);
                    }
                }
            }
        }
        Self {
            first_take: takes.iter().copied().reduce(f64::min),
            last_take: takes.iter().copied().reduce(f64::max),
            last_reachable: first_reachable.values().copied().reduce(f64::max),
            reachable: first_reachable.len(),
        }
    }

    fn text(&self, moved: usize) -> String {
        let s = |v: Option<f64>| v.map_or_else(|| "none".to_owned(), |v| format!("{v:.1}s"));
        format!(
            "first take {}, last take {}, the last of {} of {moved} moved remotes first reachable {}",
            s(self.first_take),
            s(self.last_take),
            self.reachable,
            s(self.last_reachable)
        )
    }
}

/// How often the harness reads every replica's `/metrics`: each read of a
/// replica configured with 100,000 remotes is an answer of 100,000 series
/// or more that it builds, so large runs read less often.
fn every(count: usize) -> Duration {
    if count > 50_000 {
        Duration::from_secs(10)
    } else if count > 20_000 {
        Duration::from_secs(2)
    } else {
        Duration::from_millis(200)
    }
}

/// Waits until the replicas at `admins` hold and reach all `count` remotes
/// between them, each with its manager up; counts, meanwhile, the reads
/// that saw a remote held by two replicas at once (`doubled`).
pub(crate) fn until_shared(
    tethers: &mut [Process],
    admins: &[String],
    count: usize,
    doubled: &mut usize,
) -> Result<Duration> {
    let started = Instant::now();
    #[allow(clippy::cast_precision_loss)]
    let (want, managers) = (count as f64, admins.len() as f64);
    poll(
        "every remote held, reachable, and every manager up",
        Duration::from_secs(900),
        every(count),
        || {
            for tether in tethers.iter_mut() {
                tether.alive()?;
            }
            let Ok(totals) = Totals::of(admins) else {
                return Ok(None);
            };
            *doubled += usize::from(totals.unheld_and_doubled().1 > 0);
            Ok(
                (totals.reachable >= want && totals.held >= want && totals.up >= managers)
                    .then(|| started.elapsed()),
            )
        },
    )
}

/// The requests on Leases the apiserver has served, by verb, from its
/// `apiserver_request_total`.
fn lease_requests(
    runtime: &tokio::runtime::Runtime,
    home: &ControlPlane,
) -> Result<BTreeMap<String, f64>> {
    let (status, text) = runtime
        .block_on(home.get("/metrics"))
        .ok_or("the home apiserver's /metrics did not answer")?;
    if status != 200 {
        return Err(format!("the home apiserver's /metrics: {status}"));
    }
    let mut by_verb = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        if !line.contains("resource=\"leases\"") {
            continue;
        }
        let verb = line
            .split("verb=\"")
            .nth(1)
            .and_then(|v| v.split('"').next())
            .unwrap_or("?");
        let value: f64 = line
            .rsplit_once(' ')
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0.0);
        *by_verb.entry(verb.to_owned()).or_insert(0.0) += value;
    }
    Ok(by_verb)
}

/// Requests a second, by verb, between two readings `seconds` apart (with
/// `seconds` 1, what `after` counts past `before`).
fn rates(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    seconds: f64,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(verb, n)| {
            (
                verb.clone(),
                (n - before.get(verb).unwrap_or(&0.0)) / seconds,
            )
        })
        .filter(|(_, rate)| *rate > 0.0)
        .collect()
}

fn rates_text(rates: &BTreeMap<String, f64>) -> String {
    let total: f64 = rates.values().sum();
    let each: Vec<String> = rates.iter().map(|(v, r)| format!("{v} {r:.2}")).collect();
    format!("{total:.2}/s ({})", each.join(", "))
}

/// `--replicas N --remotes M`: N tether processes share M remotes on a
/// real home apiserver's Leases (`scripts/peers`); CPU and RSS of each
/// while measuring, each remote's owners at every read, the Leases'
/// requests on the apiserver, then the time for the survivors to hold and
/// reach every remote after one is killed (SIGKILL: its Lease must expire).
#[allow(clippy::cast_precision_loss, clippy::too_many_lines)]
pub(crate) fn shards(args: &Args) -> Result<Value> {
    let count = args.remotes;
    let interval = args.interval.as_secs_f64();
    eprintln!("starting {count} simulated remotes");
    let remotes = Remotes::start(count)?;
    eprintln!("starting the home cluster, for the Leases");
    let (runtime, home, lease_kubeconfig) = home_cluster(&remotes, 1)?;
    // The apiserver's own Leases (its identity, renewed every 10 s) are
    // counted first, to tell them from the replicas'.
    let quiet = Duration::from_secs(30);
    let own_before = lease_requests(&runtime, &home)?;
    std::thread::sleep(quiet);
    let own = rates(
        &own_before,
        &lease_requests(&runtime, &home)?,
        quiet.as_secs_f64(),
    );
    let (duration, deadline, retry) = (15, 10, 2);
    let mut admins = Vec::new();
    let mut tethers = Vec::new();
    for i in 0..args.replicas {
        let admin = format!("127.0.0.1:{}", tether_testkit::free_port());
        let head = format!(
            "admin: {{ address: \"{admin}\" }}\n\
             probe: {{ interval: {interval}s, timeout: {}s }}\n\
             watch: []\n\
             leaderElection: {{ enabled: true, leaseNamespace: default, identity: shard-{i}, \
             leaseDuration: {duration}s, renewDeadline: {deadline}s, retryPeriod: {retry}s, kubeconfig: {} }}\n\
             sharding: {{ enabled: true }}\n",
            interval / 2.0,
            lease_kubeconfig.display()
        );
        let config = tether_config_as(&remotes, count, &format!("tether-{i}.yaml"), &head)?;
        // The first replica runs under `--wrap`, if given (a heap profile).
        let wrap = if i == 0 { args.wrapper() } else { Vec::new() };
        tethers.push(start_tether_under(&config, &wrap)?);
        admins.push(admin);
    }
    let mut doubled_reads = 0;
    let warmup = until_shared(&mut tethers, &admins, count, &mut doubled_reads)?;
    eprintln!(
        "{} replicas: all {count} held and reachable after {warmup:.1?}; measuring for {:?}",
        args.replicas, args.measure
    );
    let before: Vec<Sample> = tethers.iter().map(sample).collect();
    let leases_before = lease_requests(&runtime, &home)?;
    // Each remote's owners, read as a Prometheus would scrape: every 15 s.
    let measuring = Instant::now();
    let mut reads = Vec::new();
    while measuring.elapsed() < args.measure {
        let totals = Totals::of(&admins)?;
        reads.push(totals.unheld_and_doubled());
        let next = Duration::from_secs(15) * u32::try_from(reads.len()).unwrap_or(u32::MAX);
        std::thread::sleep(
            next.saturating_sub(measuring.elapsed())
                .min(args.measure.saturating_sub(measuring.elapsed())),
        );
    }
    let seconds = measuring.elapsed().as_secs_f64();
    let leases = rates(&leases_before, &lease_requests(&runtime, &home)?, seconds);
    let steady_ok = reads.iter().all(|r| *r == (0, 0));
    let mut rows = vec![
        ("remotes".to_owned(), count.to_string()),
        ("replicas".to_owned(), args.replicas.to_string()),
        ("probe interval".to_owned(), format!("{interval}s")),
        (
            "warm-up (all held, reachable, managers up)".to_owned(),
            format!("{:.1}s", warmup.as_secs_f64()),
        ),
        (
            "reads while measuring: every remote held by exactly one replica".to_owned(),
            format!(
                "{} of {} (unheld, doubled per read: {reads:?})",
                reads.iter().filter(|r| **r == (0, 0)).count(),
                reads.len()
            ),
        ),
        (
            "Lease requests on the apiserver, the replicas'".to_owned(),
            rates_text(&rates(&own, &leases, 1.0)),
        ),
        (
            "Lease requests on the apiserver, its own (before the replicas)".to_owned(),
            rates_text(&own),
        ),
    ];
    let mut per_process = Vec::new();
    for (i, (tether, since)) in tethers.iter_mut().zip(&before).enumerate() {
        tether.alive()?;
        let cpu = cpu_percent(tether, since);
        let (peak, rss) = (tether.kib("VmHWM"), tether.kib("VmRSS"));
        let (_, text, _) = http_get(&admins[i], "/metrics")?;
        let held = metric_sum(&text, "tether_owned_remotes", "");
        rows.push((
            format!("shard-{i}: remotes held, CPU, RSS peak / now"),
            format!(
                "{held:.0}, {cpu:.2}% of one core, {:.1} / {:.1} MiB",
                peak as f64 / 1024.0,
                rss as f64 / 1024.0
            ),
        ));
        per_process.push(json!({
            "identity": format!("shard-{i}"),
            "held": held,
            "cpu_percent": cpu,
            "peak_rss_kib": peak,
            "rss_kib": rss,
        }));
    }
    // A member lost: SIGKILL, so its Lease stays until it expires.
    let mut lost = tethers.pop().ok_or("no replica")?;
    let lost_admin = admins.pop().ok_or("no replica")?;
    let moved = Totals::of(std::slice::from_ref(&lost_admin))?.held_by(0);
    let killed = Instant::now();
    let killed_at = now();
    let _ = Command::new("kill")
        .args(["-KILL", &lost.pid().to_string()])
        .status();
    let _ = lost.alive();
    let mut doubled_after = 0;
    until_shared(&mut tethers, &admins, count, &mut doubled_after)?;
    let settled = killed.elapsed();
    let phases = Phases::of(&tethers, &moved, killed_at);
    if let Some(dir) = &args.logs {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (i, tether) in tethers.iter().chain([&lost]).enumerate() {
            let path = dir.join(format!("shard-{i}.log"));
            let lines = tether.lines.lock().expect("lines").join("\n");
            std::fs::write(&path, lines).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    drop(lost);
    rows.push((
        "a member killed: its remotes held and reachable again".to_owned(),
        format!(
            "{} remotes in {:.1}s (leaseDuration {duration}s, retryPeriod {retry}s, interval {interval}s; read every {:?})",
            moved.len(),
            settled.as_secs_f64(),
            every(count)
        ),
    ));
    rows.push((
        "  from the survivors' logs, after the kill".to_owned(),
        phases.text(moved.len()),
    ));
    rows.push((
        "reads that saw a remote held by two replicas".to_owned(),
        format!("{doubled_reads} while warming up, {doubled_after} after the loss"),
    ));
    print_table(&rows);
    // Remotes move only while warming up and after the loss, where a
    // read of one replica after another may catch one mid-move; while
    // measuring none moves, and every read must find each remote held once.
    if !steady_ok {
        return Err(
            "while measuring, a remote was held by no replica or by two: see the table".to_owned(),
        );
    }
    Ok(json!({
        "remotes": count,
        "replicas": args.replicas,
        "interval_seconds": interval,
        "measure_seconds": seconds,
        "warmup_seconds": warmup.as_secs_f64(),
        "processes": per_process,
        "reads": reads.iter().map(|(u, d)| json!({"unheld": u, "doubled": d})).collect::<Vec<_>>(),
        "lease_requests_per_second": {"apiserver_own": own, "with_replicas": leases},
        "member_loss": {
            "moved": moved.len(),
            "settled_seconds": settled.as_secs_f64(),
            "lease_duration_seconds": duration,
            "retry_period_seconds": retry,
            "doubled_reads": doubled_after,
            "first_take_seconds": phases.first_take,
            "last_take_seconds": phases.last_take,
            "last_reachable_seconds": phases.last_reachable,
            "reachable_logged": phases.reachable,
        },
    }))
}
