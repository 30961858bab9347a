//! A reload that adds remotes, and timed GETs.

use crate::*;

/// Follows every running remote's probes for 1.5 intervals, then has
/// `rewrite` list `count` remotes where the config file listed `configured`
/// and reloads tether (SIGHUP; it would also see the file change within
/// 2 s), and follows on until 1.5 intervals after the new ones are
/// reachable. Gives the longest gap between two probes of one running
/// remote before the reload and across it, and how long the new remotes
/// took to be reachable; an error if any remote turned unreachable.
pub(crate) fn reload_adding(
    tether: &mut Process,
    admin: &str,
    (configured, count): (usize, usize),
    interval: f64,
    rewrite: impl FnOnce() -> Result<()>,
) -> Result<(f64, f64, f64)> {
    let mut seen: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let follow = |seen: &mut BTreeMap<String, Vec<f64>>| -> Result<f64> {
        let (last, reachable) = last_probes(admin)?;
        for (name, at) in last {
            let times = seen.entry(name).or_default();
            if times.last() != Some(&at) {
                times.push(at);
            }
        }
        Ok(reachable)
    };
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < interval * 1.5 {
        follow(&mut seen)?;
        std::thread::sleep(Duration::from_secs(1));
    }
    let reload_at = now();
    let reloaded = Instant::now();
    rewrite()?;
    let status = Command::new("kill")
        .args(["-HUP", &tether.pid().to_string()])
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("kill -HUP: {status}"));
    }
    let mut took = None;
    #[allow(clippy::cast_precision_loss)]
    let want = count as f64;
    loop {
        tether.alive()?;
        let reachable = follow(&mut seen)?;
        if took.is_none() && reachable >= want {
            took = Some(reloaded.elapsed().as_secs_f64());
        }
        match took {
            Some(took) if reloaded.elapsed().as_secs_f64() > took + interval * 1.5 => break,
            None if reloaded.elapsed() > Duration::from_secs(600) => {
                return Err("the added remotes: not all reachable within 600s".to_owned());
            }
            _ => std::thread::sleep(Duration::from_secs(1)),
        }
    }
    let (_, text, _) = http_get(admin, "/metrics")?;
    let lost = metric_sum(
        &text,
        "tether_remote_transitions_total",
        "to=\"unreachable\"",
    );
    if lost > 0.0 {
        return Err(format!(
            "{lost} remotes turned unreachable across the reload"
        ));
    }
    let (mut gap_before, mut gap_across) = (0.0_f64, 0.0_f64);
    let running = seen.iter().filter(|(name, _)| {
        name.strip_prefix("remote-")
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < configured)
    });
    for (_, times) in running {
        for pair in times.windows(2) {
            let gap = pair[1] - pair[0];
            if pair[1] < reload_at {
                gap_before = gap_before.max(gap);
            } else {
                gap_across = gap_across.max(gap);
            }
        }
    }
    Ok((gap_before, gap_across, took.unwrap_or_default()))
}

/// Five `GET path`s: the median and the most milliseconds, and the size.
pub(crate) fn timed_gets(admin: &str, path: &str) -> Result<(f64, f64, usize)> {
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..5 {
        let (status, body, took) = http_get(admin, path)?;
        if status != 200 {
            return Err(format!("{path} answered {status}"));
        }
        size = body.len();
        times.push(took.as_secs_f64() * 1000.0);
    }
    let max = times.iter().copied().fold(0.0, f64::max);
    Ok((median(&mut times), max, size))
}
