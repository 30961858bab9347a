//! Processes, and the figures read from them.

use crate::*;

// Processes and their figures.

pub(crate) fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target"))
}

/// The `tether` that `TETHER_BINARY` names, else the release one next to
/// this binary.
pub(crate) fn tether_binary() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("TETHER_BINARY") {
        let path = PathBuf::from(path);
        return if path.exists() {
            Ok(path)
        } else {
            Err(format!("TETHER_BINARY: {} is missing", path.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.with_file_name("tether");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: run `cargo build --release -p tether` first",
            path.display()
        ))
    }
}

pub(crate) fn which(tool: &str, install: &str) -> Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(tool))
        .find(|p| p.exists())
        .ok_or_else(|| format!("{tool} not found: {install}"))
}

pub(crate) fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    json!({
        "cores": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "cpu": cpu,
    })
}

pub(crate) fn today() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%d").to_string()
}

/// Seconds since the epoch of an RFC 3339 timestamp, as tracing writes.
pub(crate) fn parse_timestamp(text: &str) -> Option<f64> {
    let at: jiff::Timestamp = text.parse().ok()?;
    Some(at.as_duration().as_secs_f64())
}

pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A child process, killed when dropped, with its stderr kept.
pub(crate) struct Process {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) lines: Arc<Mutex<Vec<String>>>,
    /// Stopped with SIGTERM to its process group, so that a wrapper
    /// (heaptrack, valgrind) writes its profile.
    pub(crate) graceful: bool,
}

impl Process {
    pub(crate) fn spawn(name: &'static str, command: &mut Command) -> Result<Self> {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{name}: {e}"))?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped");
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("lines").push(line);
            }
        });
        Ok(Self {
            name,
            child,
            lines,
            graceful: false,
        })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User plus system CPU seconds so far.
    pub(crate) fn cpu(&self) -> f64 {
        procfs::cpu_time(Some(self.pid())).map_or(0.0, |t| t.as_secs_f64())
    }

    /// A `/proc/<pid>/status` field in KiB (`VmRSS`, `VmHWM`).
    pub(crate) fn kib(&self, field: &str) -> u64 {
        procfs::status_kib(Some(self.pid()), field).unwrap_or(0)
    }

    pub(crate) fn alive(&mut self) -> Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited ({status}); last lines:\n{}",
                self.name,
                self.tail(20)
            )),
            Err(e) => Err(format!("{}: {e}", self.name)),
        }
    }

    /// Waits up to 30 s for the first `message` log line that `matches`
    /// (its unix time and fields).
    pub(crate) fn wait_event(
        &mut self,
        message: &str,
        matches: impl Fn(f64, &Value) -> bool,
    ) -> Result<(f64, Value)> {
        self.wait_event_within(message, Duration::from_secs(30), matches)
    }

    /// As [`Process::wait_event`], for at most `within`.
    pub(crate) fn wait_event_within(
        &mut self,
        message: &str,
        within: Duration,
        matches: impl Fn(f64, &Value) -> bool,
    ) -> Result<(f64, Value)> {
        poll(message, within, Duration::from_millis(20), || {
            self.alive()?;
            Ok(self
                .events(message)
                .into_iter()
                .find(|(at, fields)| matches(*at, fields)))
        })
        .map_err(|err| format!("{err}; tether's last lines:\n{}", self.tail(15)))
    }

    pub(crate) fn tail(&self, n: usize) -> String {
        let lines = self.lines.lock().expect("lines");
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The JSON log lines of `message`, as (unix time, fields).
    pub(crate) fn events(&self, message: &str) -> Vec<(f64, Value)> {
        self.lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.contains(message))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .filter_map(|v| {
                Some((
                    parse_timestamp(v["timestamp"].as_str()?)?,
                    v["fields"].clone(),
                ))
            })
            .collect()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.graceful {
            let group = format!("-{}", self.pid());
            let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
            let _ = poll(
                self.name,
                Duration::from_secs(120),
                Duration::from_millis(200),
                || Ok(self.child.try_wait().ok().flatten().map(|_| ())),
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTP/1.0: status, body, and how long it took.
pub(crate) fn http_get(addr: &str, path: &str) -> Result<(u16, String, Duration)> {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("{addr}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| format!("{addr}{path}: {e}"))?;
    let elapsed = started.elapsed();
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{addr}{path}: no status"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    Ok((status, body, elapsed))
}

/// The sum of a metric's samples in Prometheus text, over lines that
/// contain `filter`.
pub(crate) fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Polls `check` every `every` until it returns `Some`, for at most `limit`.
pub(crate) fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = check()? {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {limit:?}"));
        }
        std::thread::sleep(every);
    }
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => f64::midpoint(values[n / 2 - 1], values[n / 2]),
    }
}
