//! Instruction counts under callgrind, and what /metrics says of the probes.

use crate::*;

/// Probes finished so far, by the probe histograms' counts.
pub(crate) fn probes_finished(admin: &str) -> Result<f64> {
    let (_, text, _) = http_get(admin, "/metrics")?;
    Ok(metric_sum(
        &text,
        "tether_remote_probe_duration_seconds_count",
        "",
    ))
}

/// Runs `callgrind_control FLAG PID`: `-z` zeroes the counts, `-d` dumps.
pub(crate) fn callgrind_control(tether: &Process, flag: &str) -> Result<()> {
    let tool = which("callgrind_control", "apt-get install valgrind")?;
    let status = Command::new(tool)
        .args([flag, &tether.pid().to_string()])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("callgrind_control {flag}: {status}"))
}

/// The instructions (`Ir`) of the newest callgrind dump, which is kept as
/// `keep` for `callgrind_annotate`.
pub(crate) fn callgrind_instructions(remotes: &Remotes, keep: &Path) -> Result<u64> {
    let newest = std::fs::read_dir(remotes.dir.path())
        .map_err(|e| e.to_string())?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("callgrind.out"))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .ok_or("no callgrind dump")?;
    if let Some(dir) = keep.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(newest.path(), keep).map_err(|e| format!("{}: {e}", keep.display()))?;
    eprintln!("callgrind dump: {}", keep.display());
    let text = std::fs::read_to_string(newest.path()).map_err(|e| e.to_string())?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("summary: ")
                .or_else(|| l.strip_prefix("totals: "))
        })
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| "the callgrind dump has no summary".to_owned())
}

/// Each remote's last probe (unix seconds), and how many are reachable,
/// from one `/metrics`.
pub(crate) fn last_probes(admin: &str) -> Result<(BTreeMap<String, f64>, f64)> {
    let (_, text, _) = http_get(admin, "/metrics")?;
    let last = text
        .lines()
        .filter_map(|l| l.strip_prefix("tether_remote_probe_last_timestamp_seconds{remote=\""))
        .filter_map(|l| {
            let (name, rest) = l.split_once('"')?;
            Some((name.to_owned(), rest.rsplit_once(' ')?.1.parse().ok()?))
        })
        .collect();
    Ok((
        last,
        metric_sum(&text, "tether_remote_apiserver_reachable", ""),
    ))
}
