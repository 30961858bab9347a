//! The load of N remotes, and the side-by-side with `blackbox_exporter`.

use crate::*;

pub(crate) struct Sample {
    pub(crate) cpu: f64,
    pub(crate) at: Instant,
}

pub(crate) fn sample(process: &Process) -> Sample {
    Sample {
        cpu: process.cpu(),
        at: Instant::now(),
    }
}

pub(crate) fn cpu_percent(process: &Process, since: &Sample) -> f64 {
    100.0 * (process.cpu() - since.cpu) / since.at.elapsed().as_secs_f64()
}

#[allow(clippy::too_many_lines, clippy::cast_precision_loss)]
pub(crate) fn scale(args: &Args) -> Result<Value> {
    let count = args.remotes;
    let interval = args.interval.as_secs_f64();
    eprintln!("starting {count} simulated remotes (HTTPS, token each)");
    let mut remotes = Remotes::start(count)?;
    let admin = format!("127.0.0.1:{}", tether_testkit::free_port());
    // In the side-by-side run both sides call a remote lost on its first
    // failed probe, as blackbox's probe_success does.
    let threshold = if args.blackbox { 1 } else { 3 };
    let configured = count
        .checked_sub(args.reload_add)
        .ok_or("--reload-add is more than --remotes")?;
    let watch = match args.watch.as_str() {
        "default" => "[{ apiVersion: v1, kind: Namespace }]",
        "none" => "[]",
        other => return Err(format!("--watch {other}: say default or none")),
    };
    let config_with = |configured| {
        tether_config(
            &remotes,
            configured,
            &admin,
            &format!(
                "{{ interval: {interval}s, timeout: {}s, failureThreshold: {threshold} }}",
                interval / 2.0
            ),
            "{ rebuildOnRecovery: true }",
            watch,
        )
    };
    let config = config_with(configured)?;
    let wrap: Vec<String> = if args.callgrind {
        callgrind_wrap(&remotes, &[])
    } else {
        args.wrapper()
    };
    let mut tether = start_tether_under(&config, &wrap)?;
    let warmup = until_all_reachable(&mut tether, &admin, configured)?;
    eprintln!("tether: all {configured} reachable and the manager up after {warmup:.1?}");

    let mut peers = if args.blackbox {
        Some(start_blackbox(&remotes, interval)?)
    } else {
        None
    };
    if let Some((blackbox, prometheus, prom_addr)) = peers.as_mut() {
        poll(
            "Prometheus has every probe_success",
            Duration::from_secs(600),
            Duration::from_secs(1),
            || {
                blackbox.alive()?;
                prometheus.alive()?;
                let up = prom_query(prom_addr, "count(probe_success == 1)")?;
                Ok((up.first().map(|(_, v)| *v) == Some(count as f64)).then_some(()))
            },
        )?;
        eprintln!("blackbox: all {count} probe_success == 1");
    }

    eprintln!("measuring for {:?}", args.measure);
    let probes_before = probes_finished(&admin)?;
    if args.callgrind {
        callgrind_control(&tether, "-z")?;
    }
    let t0 = sample(&tether);
    let peers_before = peers.as_ref().map(|(b, p, _)| (sample(b), sample(p)));
    std::thread::sleep(args.measure);
    let tether_cpu = cpu_percent(&tether, &t0);
    let instructions = if args.callgrind {
        callgrind_control(&tether, "-d")?;
        let keep = target_dir().join("scale").join("callgrind.out");
        Some(callgrind_instructions(&remotes, &keep)?)
    } else {
        None
    };
    let probes = probes_finished(&admin)? - probes_before;
    let peer_cpu = peers
        .as_ref()
        .zip(peers_before.as_ref())
        .map(|((b, p, _), (b0, p0))| (cpu_percent(b, b0), cpu_percent(p, p0)));
    tether.alive()?;
    let tether_peak = tether.kib("VmHWM");
    let tether_rss = tether.kib("VmRSS");

    let (scrape_median, scrape_max, size) = timed_gets(&admin, "/metrics")?;
    let (status_median, status_max, status_size) = timed_gets(&admin, "/status.json")?;
    let (page_median, page_max, page_size) = timed_gets(&admin, "/status")?;

    let mut rows = vec![
        ("remotes".to_owned(), count.to_string()),
        ("probe interval".to_owned(), format!("{interval}s")),
        ("built-in manager watches".to_owned(), args.watch.clone()),
        (
            "warm-up (all reachable, manager up)".to_owned(),
            format!("{:.1}s", warmup.as_secs_f64()),
        ),
        (
            "tether CPU".to_owned(),
            format!("{tether_cpu:.2}% of one core"),
        ),
        (
            "tether RSS (peak / now)".to_owned(),
            format!(
                "{:.1} / {:.1} MiB",
                tether_peak as f64 / 1024.0,
                tether_rss as f64 / 1024.0
            ),
        ),
        (
            "/metrics scrape (median / max of 5)".to_owned(),
            format!(
                "{scrape_median:.1} / {scrape_max:.1} ms, {} KiB",
                size / 1024
            ),
        ),
        (
            "probes while measuring".to_owned(),
            format!(
                "{probes:.0} ({:.1} µs of CPU each)",
                tether_cpu / 100.0 * args.measure.as_secs_f64() / probes * 1e6
            ),
        ),
        (
            "/status.json (median / max of 5)".to_owned(),
            format!(
                "{status_median:.1} / {status_max:.1} ms, {} KiB",
                status_size / 1024
            ),
        ),
        (
            "/status page (median / max of 5)".to_owned(),
            format!(
                "{page_median:.1} / {page_max:.1} ms, {} KiB",
                page_size / 1024
            ),
        ),
    ];
    let mut report = json!({
        "remotes": count,
        "interval_seconds": interval,
        "watch": args.watch,
        "measure_seconds": args.measure.as_secs_f64(),
        "warmup_seconds": warmup.as_secs_f64(),
        "tether": {
            "cpu_percent": tether_cpu,
            "peak_rss_kib": tether_peak,
            "rss_kib": tether_rss,
            "metrics_scrape_ms_median": scrape_median,
            "metrics_scrape_ms_max": scrape_max,
            "metrics_bytes": size,
            "status_json_ms_median": status_median,
            "status_json_ms_max": status_max,
            "status_json_bytes": status_size,
            "status_page_ms_median": page_median,
            "status_page_ms_max": page_max,
            "status_page_bytes": page_size,
            "failure_threshold": threshold,
            "probes_measured": probes,
        },
    });
    if let Some(instructions) = instructions {
        rows.push((
            "instructions (callgrind, while measuring)".to_owned(),
            format!(
                "{instructions} ({:.0} a probe)",
                instructions as f64 / probes
            ),
        ));
        report["tether"]["instructions"] = json!(instructions);
        report["tether"]["instructions_per_probe"] = json!(instructions as f64 / probes);
    }
    if args.reload_add > 0 {
        let (gap_before, gap_across, took) =
            reload_adding(&mut tether, &admin, (configured, count), interval, || {
                config_with(count).map(drop)
            })?;
        rows.push((
            format!("reload adding {}: all reachable after", args.reload_add),
            format!("{took:.1}s"),
        ));
        rows.push((
            "longest gap between two probes of a running remote (before / across the reload)"
                .to_owned(),
            format!("{gap_before:.2}s / {gap_across:.2}s"),
        ));
        report["reload"] = json!({
            "added": args.reload_add,
            "all_reachable_seconds": took,
            "max_probe_gap_before_seconds": gap_before,
            "max_probe_gap_across_seconds": gap_across,
        });
    }

    if let (Some((blackbox, prometheus, prom_addr)), Some((b_cpu, p_cpu))) =
        (peers.as_mut(), peer_cpu)
    {
        let (b_peak, p_peak) = (blackbox.kib("VmHWM"), prometheus.kib("VmHWM"));
        let peer_cpu = b_cpu + p_cpu;
        let peer_peak = b_peak + p_peak;
        rows.push((
            "blackbox_exporter CPU / peak RSS".to_owned(),
            format!("{b_cpu:.2}% / {:.1} MiB", b_peak as f64 / 1024.0),
        ));
        rows.push((
            "Prometheus CPU / peak RSS".to_owned(),
            format!("{p_cpu:.2}% / {:.1} MiB", p_peak as f64 / 1024.0),
        ));
        rows.push((
            "peer ÷ tether, CPU".to_owned(),
            format!("{:.1}×", peer_cpu / tether_cpu),
        ));
        rows.push((
            "peer ÷ tether, peak RSS".to_owned(),
            format!("{:.1}×", peer_peak as f64 / tether_peak as f64),
        ));
        let detections =
            side_by_side_detection(&mut remotes, &mut tether, prom_addr, args.blackbox_trials)?;
        for (fault, (tether_s, blackbox_s)) in &detections {
            let (mut t, mut b) = (tether_s.clone(), blackbox_s.clone());
            rows.push((
                format!("detection, {fault} (median: tether / blackbox)"),
                format!("{:.2}s / {:.2}s", median(&mut t), median(&mut b)),
            ));
        }
        report["blackbox_exporter"] = json!({ "cpu_percent": b_cpu, "peak_rss_kib": b_peak });
        report["prometheus"] = json!({ "cpu_percent": p_cpu, "peak_rss_kib": p_peak });
        report["ratio_cpu"] = json!(peer_cpu / tether_cpu);
        report["ratio_peak_rss"] = json!(peer_peak as f64 / tether_peak as f64);
        report["detection_seconds"] = json!(
            detections
                .iter()
                .map(|(fault, (t, b))| (fault.clone(), json!({ "tether": t, "blackbox": b })))
                .collect::<BTreeMap<_, _>>()
        );
    }
    print_table(&rows);
    Ok(report)
}
