//! What `/proc` says of a process, for benchmarks and leak checks: its
//! memory and CPU time. `pid` `None` is this process.

use std::time::Duration;

fn read(pid: Option<u32>, file: &str) -> Option<String> {
    let pid = pid.map_or_else(|| "self".to_owned(), |p| p.to_string());
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()
}

/// A `/proc/<pid>/status` field in KiB, such as `VmRSS` or `VmHWM` (peak
/// RSS); `None` if the process or the field is gone.
#[must_use]
pub fn status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    read(pid, "status")?.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// User plus system CPU time so far; `None` if the process is gone.
#[must_use]
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let stat = read(pid, "stat")?;
    // After the command name (which may hold spaces), utime and stime are
    // fields 14 and 15 of the line, in clock ticks of 100 per second.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_memory_and_cpu_time() {
        let rss = status_kib(None, "VmRSS").expect("VmRSS");
        let peak = status_kib(Some(std::process::id()), "VmHWM").expect("VmHWM");
        assert!(rss > 0 && peak >= rss, "rss {rss}, peak {peak}");
        assert!(status_kib(None, "NoSuchField").is_none());
        assert!(cpu_time(None).is_some());
    }
}
