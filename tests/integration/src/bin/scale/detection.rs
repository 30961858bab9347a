//! Detection and rebuild latency.

use crate::*;

/// Whether a "cycle ended" line's cause is of `kind`.
pub(crate) fn cause_is(fields: &Value, kind: &str) -> bool {
    fields["cause"]
        .as_str()
        .is_some_and(|c| c.starts_with(kind))
}

/// Parses a `Duration`'s `Debug` form (`1.5s`, `850.2ms`, `12µs`).
pub(crate) fn parse_debug_duration(text: &str) -> Option<f64> {
    for (unit, scale) in [("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0)] {
        if let Some(number) = text.strip_suffix(unit) {
            return number.parse::<f64>().ok().map(|n| n * scale);
        }
    }
    None
}

#[allow(clippy::too_many_lines)]
pub(crate) fn detection(trials: usize, apiservers: Apiservers) -> Result<Value> {
    let (interval, threshold, deadline) = (1.0, 3.0, 0.5);
    let ideal = (threshold - 1.0) * interval + deadline;
    let mut remotes = Remotes::start_as(3, apiservers)?;
    // Two resources on each of three remotes.
    let admin = format!("127.0.0.1:{}", tether_testkit::free_port());
    let config = tether_config(
        &remotes,
        remotes.len(),
        &admin,
        "{ interval: 1s, timeout: 500ms, failureThreshold: 3, jitter: 0.1 }",
        "{ backoff: { initial: 200ms, max: 200ms, jitter: 0.0 }, stableAfter: 1s }",
        "[{ apiVersion: v1, kind: Namespace }, { apiVersion: v1, kind: ConfigMap }]",
    )?;
    let mut tether = start_tether(&config)?;
    until_all_reachable(&mut tether, &admin, 3)?;

    let mut report = json!({ "interval_seconds": interval, "failure_threshold": threshold, "timeout_seconds": deadline, "ideal_seconds": ideal });
    let mut rows = vec![(
        "ideal (threshold−1)·interval + deadline".to_owned(),
        format!("{ideal:.2}s"),
    )];
    let mut rebuilds = Vec::new();
    for fault in [Fault::Refuse, Fault::Hang] {
        let mut ratios = Vec::new();
        for trial in 0..trials {
            let i = trial % 3;
            // A random phase against the probe interval.
            std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
            let struck = now();
            remotes.set_fault(i, &fault)?;
            let (cancelled, _) = tether.wait_event("cycle ended", |at, f| {
                at >= struck && cause_is(f, "remote_lost")
            })?;
            let ratio = (cancelled - struck) / ideal;
            ratios.push(ratio);
            remotes.set_fault(i, &Fault::Up)?;
            // The way back: the recovery ends the cycle at once; the rebuild
            // is from there to the manager up, minus the backoff, with the
            // old manager's teardown included.
            let remote = name(i);
            let (recovered, _) = tether.wait_event("remote apiserver reachable", |at, f| {
                at > cancelled && names(f, &remote)
            })?;
            let (_, ended) = tether.wait_event("cycle ended", |at, f| {
                at >= recovered && cause_is(f, "remote_recovered")
            })?;
            let backoff = ended["next_backoff"]
                .as_str()
                .and_then(parse_debug_duration)
                .ok_or_else(|| format!("no next_backoff in {ended}"))?;
            let (up, _) = tether
                .wait_event("manager up: every required cache synced", |at, _| {
                    at > recovered
                })?;
            let rebuild_ms = (up - recovered - backoff) * 1000.0;
            rebuilds.push(rebuild_ms);
            eprintln!(
                "{fault} trial {}: cancel after {:.3}s (ratio {ratio:.3}); rebuild {rebuild_ms:.1} ms past the backoff",
                trial + 1,
                cancelled - struck
            );
        }
        let mut sorted = ratios.clone();
        let med = median(&mut sorted);
        rows.push((
            format!("{fault}: median ratio to ideal ({trials} trials)"),
            format!(
                "{med:.3} (min {:.3}, max {:.3})",
                sorted[0],
                sorted[sorted.len() - 1]
            ),
        ));
        report[fault.to_string()] = json!({ "ratios": ratios, "median_ratio": med });
    }
    let mut sorted = rebuilds.clone();
    let med = median(&mut sorted);
    rows.push((
        "rebuild: cancel to manager up − backoff (3 remotes × 2 resources)".to_owned(),
        format!("median {med:.1} ms, max {:.1} ms", sorted[sorted.len() - 1]),
    ));
    report["rebuild_ms"] =
        json!({ "samples": rebuilds, "median": med, "max": sorted[sorted.len() - 1] });

    if apiservers == Apiservers::Real {
        // A real process cannot refuse new connections while serving the
        // open ones; the rows below are the simulated remotes' alone.
        drop(tether);
        print_table(&rows);
        return Ok(report);
    }

    // refuse_new: the probe's kept connection still answers. With the
    // manager's hint, from its first failed reconnect to remote_lost; the
    // bound is (threshold−1)·interval + deadline, plus one interval.
    let mut hinted = Vec::new();
    for trial in 0..trials {
        let i = trial % 3;
        std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
        let struck = now();
        remotes.set_fault(i, &Fault::RefuseNew)?;
        let (failed, _) = tether.wait_event("watch failing; retrying with backoff", |at, f| {
            at >= struck && f["remote"] == name(i).as_str()
        })?;
        let (lost, _) = tether.wait_event("cycle ended", |at, f| {
            at >= struck && f["cause"] == format!("remote_lost (remote {})", name(i)).as_str()
        })?;
        hinted.push(lost - failed);
        eprintln!(
            "refuse_new trial {}: remote_lost {:.3}s after the first failed reconnect",
            trial + 1,
            lost - failed
        );
        remotes.set_fault(i, &Fault::Up)?;
        tether.wait_event("manager up: every required cache synced", |at, _| at > lost)?;
    }
    drop(tether);
    let bound = ideal + interval;
    let mut sorted = hinted.clone();
    let med = median(&mut sorted);
    rows.push((
        format!("refuse_new with the manager's hint: first failed reconnect to remote_lost (bound {bound:.1}s)"),
        format!("median {med:.2}s, max {:.2}s", sorted[sorted.len() - 1]),
    ));
    report["refuse_new_hinted_seconds"] =
        json!({ "samples": hinted, "median": med, "bound": bound });

    // Without a manager (watch: []), only the connection's age finds it.
    let max_age = 5.0;
    let config = tether_config(
        &remotes,
        remotes.len(),
        &admin,
        "{ interval: 1s, timeout: 500ms, failureThreshold: 3, jitter: 0.1, maxConnectionAge: 5s }",
        "{ backoff: { initial: 200ms, max: 200ms, jitter: 0.0 } }",
        "[]",
    )?;
    let mut tether = start_tether(&config)?;
    until_all_reachable(&mut tether, &admin, 3)?;
    let mut aged = Vec::new();
    for trial in 0..trials {
        let i = trial % 3;
        std::thread::sleep(Duration::from_millis(1000 + fastrand::u64(..1000)));
        let struck = now();
        remotes.set_fault(i, &Fault::RefuseNew)?;
        let remote = name(i);
        let (lost, _) = tether.wait_event("remote apiserver unreachable", |at, f| {
            at >= struck && names(f, &remote)
        })?;
        aged.push(lost - struck);
        eprintln!(
            "refuse_new trial {} without a manager: unreachable {:.3}s after the fault",
            trial + 1,
            lost - struck
        );
        remotes.set_fault(i, &Fault::Up)?;
        tether.wait_event("remote apiserver reachable", |at, f| {
            at > lost && names(f, &remote)
        })?;
    }
    let bound = max_age + threshold * interval * 1.1 + deadline;
    let mut sorted = aged.clone();
    let med = median(&mut sorted);
    rows.push((
        format!("refuse_new without a manager (maxConnectionAge 5s): fault to unreachable (bound {bound:.1}s)"),
        format!("median {med:.2}s, max {:.2}s", sorted[sorted.len() - 1]),
    ));
    report["refuse_new_aged_seconds"] = json!({ "samples": aged, "median": med, "bound": bound });
    print_table(&rows);
    Ok(report)
}
