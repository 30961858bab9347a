//! Sharding: several processes share the remotes on Leases.

use crate::*;

/// What the replicas at `admins` report together: remotes reachable (each
/// counted by its owner alone), remotes held, and managers up.
pub(crate) fn shard_totals(admins: &[String]) -> Result<(f64, f64, f64)> {
    let mut totals = (0.0, 0.0, 0.0);
    for admin in admins {
        let (_, text, _) = http_get(admin, "/metrics")?;
        totals.0 += metric_sum(&text, "tether_remote_apiserver_reachable", "");
        totals.1 += metric_sum(&text, "tether_owned_remotes", "");
        totals.2 += metric_sum(&text, "tether_manager_up", "");
    }
    Ok(totals)
}

/// Waits until the replicas at `admins` hold and reach all `count` remotes
/// between them, each with its manager up.
pub(crate) fn until_shared(
    tethers: &mut [Process],
    admins: &[String],
    count: usize,
) -> Result<Duration> {
    let started = Instant::now();
    #[allow(clippy::cast_precision_loss)]
    let (want, managers) = (count as f64, admins.len() as f64);
    poll(
        "every remote held, reachable, and every manager up",
        Duration::from_secs(600),
        Duration::from_millis(200),
        || {
            for tether in tethers.iter_mut() {
                tether.alive()?;
            }
            let Ok((reachable, held, up)) = shard_totals(admins) else {
                return Ok(None);
            };
            Ok((reachable >= want && held >= want && up >= managers).then(|| started.elapsed()))
        },
    )
}

/// `--replicas N --remotes M`: N tether processes share M remotes; CPU and
/// RSS of each while measuring, then the time for the survivors to hold
/// and reach every remote after one is killed (SIGKILL: its Lease must
/// expire).
#[allow(clippy::cast_precision_loss)]
pub(crate) fn shards(args: &Args) -> Result<Value> {
    let count = args.remotes;
    let interval = args.interval.as_secs_f64();
    eprintln!("starting {count} simulated remotes, and one more for the Leases");
    let remotes = Remotes::start(count)?;
    let leases = Remotes::start(1)?;
    let lease_kubeconfig = leases.path(&format!("{}.kubeconfig", name(0)));
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
        tethers.push(start_tether(&config)?);
        admins.push(admin);
    }
    let warmup = until_shared(&mut tethers, &admins, count)?;
    eprintln!(
        "{} replicas: all {count} held and reachable after {warmup:.1?}; measuring for {:?}",
        args.replicas, args.measure
    );
    let before: Vec<Sample> = tethers.iter().map(sample).collect();
    std::thread::sleep(args.measure);
    let mut rows = vec![
        ("remotes".to_owned(), count.to_string()),
        ("replicas".to_owned(), args.replicas.to_string()),
        ("probe interval".to_owned(), format!("{interval}s")),
        (
            "warm-up (all held, reachable, managers up)".to_owned(),
            format!("{:.1}s", warmup.as_secs_f64()),
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
    let (_, text, _) = http_get(&lost_admin, "/metrics")?;
    let moving = metric_sum(&text, "tether_owned_remotes", "");
    let killed = Instant::now();
    let _ = Command::new("kill")
        .args(["-KILL", &lost.pid().to_string()])
        .status();
    let _ = lost.alive();
    until_shared(&mut tethers, &admins, count)?;
    let settled = killed.elapsed();
    drop(lost);
    rows.push((
        "a member killed: its remotes held and reachable again".to_owned(),
        format!(
            "{moving:.0} remotes in {:.1}s (leaseDuration {duration}s, retryPeriod {retry}s, interval {interval}s)",
            settled.as_secs_f64()
        ),
    ));
    print_table(&rows);
    Ok(json!({
        "remotes": count,
        "replicas": args.replicas,
        "interval_seconds": interval,
        "measure_seconds": args.measure.as_secs_f64(),
        "warmup_seconds": warmup.as_secs_f64(),
        "processes": per_process,
        "member_loss": {
            "moved": moving,
            "settled_seconds": settled.as_secs_f64(),
            "lease_duration_seconds": duration,
            "retry_period_seconds": retry,
        },
    }))
}
