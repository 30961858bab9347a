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

/// The command line that runs tether under callgrind, with `options`;
/// its dumps go beside the remotes.
pub(crate) fn callgrind_wrap(remotes: &Remotes, options: &[&str]) -> Vec<String> {
    let mut wrap = vec![
        "valgrind".to_owned(),
        "--tool=callgrind".to_owned(),
        format!(
            "--callgrind-out-file={}",
            remotes.path("callgrind.out").display()
        ),
    ];
    wrap.extend(options.iter().map(|o| (*o).to_owned()));
    wrap
}

/// Runs `callgrind_control FLAG PID`: `-z` zeroes the counts, `-d` dumps,
/// `--instr=on` starts instrumenting.
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

/// The calls to `function` in the callgrind dump at `dump`, from its call
/// lines: `cfn=(id) name` names the callee (only its first mention has the
/// name), and the `calls=N ...` line after it counts them.
pub(crate) fn callgrind_calls(dump: &Path, function: &str) -> Result<u64> {
    let text = std::fs::read_to_string(dump).map_err(|e| format!("{}: {e}", dump.display()))?;
    let mut named = BTreeMap::new();
    let (mut callee, mut calls) = (None, 0);
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("fn=")
            .or_else(|| line.strip_prefix("cfn="))
        {
            let (id, name) = rest.split_once(' ').unwrap_or((rest, ""));
            if !name.is_empty() {
                named.insert(id.to_owned(), name.to_owned());
            }
            callee = line
                .starts_with("cfn=")
                .then(|| named.get(id).cloned())
                .flatten();
        } else if let Some(count) = line.strip_prefix("calls=")
            && callee.as_deref() == Some(function)
        {
            calls += count
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| format!("{}: a bad calls line: {line}", dump.display()))?;
        }
    }
    Ok(calls)
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
