//! What `/proc` says of a process, for benchmarks and leak checks: its
//! memory and CPU time. `pid` `None` is this process.

use std::time::Duration;

use procfs::process::Process;

fn process(pid: Option<u32>) -> Option<Process> {
    match pid {
        None => Process::myself().ok(),
        Some(pid) => Process::new(i32::try_from(pid).ok()?).ok(),
    }
}

/// A `/proc/<pid>/status` memory field in KiB: `VmRSS`, `VmHWM` (peak
/// RSS), `VmSize` or `VmPeak`; `None` for another field, or if the process
/// or the field is gone.
#[must_use]
pub fn status_kib(pid: Option<u32>, field: &str) -> Option<u64> {
    let status = process(pid)?.status().ok()?;
    match field {
        "VmRSS" => status.vmrss,
        "VmHWM" => status.vmhwm,
        "VmSize" => status.vmsize,
        "VmPeak" => status.vmpeak,
        _ => None,
    }
}

/// User plus system CPU time so far; `None` if the process is gone.
#[must_use]
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let stat = process(pid)?.stat().ok()?;
    let ticks = stat.utime + stat.stime;
    Some(Duration::from_secs_f64(
        ticks as f64 / procfs::ticks_per_second() as f64,
    ))
}

/// Whether every thread of `pid` is stopped (by `SIGSTOP`); `None` if the
/// process is gone. A thread that exits while it is read is not counted.
#[must_use]
pub fn stopped(pid: u32) -> Option<bool> {
    let tasks = process(Some(pid))?.tasks().ok()?;
    Some(
        tasks
            .filter_map(|task| task.ok()?.stat().ok())
            .all(|stat| stat.state == 'T'),
    )
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

    #[test]
    fn a_stopped_child_reads_as_stopped_and_a_gone_one_as_none() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let raw = rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("pid");
        assert_eq!(stopped(pid), Some(false), "running");
        rustix::process::kill_process(raw, rustix::process::Signal::STOP).expect("STOP");
        // A child's own stop is reported by waitpid once it has happened.
        rustix::process::waitpid(Some(raw), rustix::process::WaitOptions::UNTRACED)
            .expect("waitpid");
        assert_eq!(stopped(pid), Some(true), "stopped");
        child.kill().expect("kill");
        child.wait().expect("wait");
        assert_eq!(stopped(pid), None, "gone");
    }
}
