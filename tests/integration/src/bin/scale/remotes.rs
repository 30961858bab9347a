//! Simulated remotes, and tether's configuration over them.

use crate::*;

/// Simulated remotes, served by child processes of this binary, with a
/// kubeconfig, a CA file and a token file each in one folder. Each process
/// serves its remotes on a loopback address of its own ([`address`]): one
/// address has about 28,000 ephemeral ports, fewer than 100,000 remotes.
pub(crate) struct Remotes {
    pub(crate) servers: Vec<Server>,
    pub(crate) urls: Vec<String>,
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) stdin: std::process::ChildStdin,
    pub(crate) stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Remotes {
    pub(crate) fn start(count: usize) -> Result<Self> {
        Self::start_as(count, Apiservers::Simulated)
    }

    /// `count` remotes served by `apiservers`.
    pub(crate) fn start_as(count: usize, apiservers: Apiservers) -> Result<Self> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut servers = Vec::new();
        for (process, from) in (0..count).step_by(PER_PROCESS).enumerate() {
            let kind = clap::ValueEnum::to_possible_value(&apiservers).expect("none is skipped");
            let mut child = Command::new(&exe)
                .args(["--apiservers", kind.get_name()])
                .args(["--serve-dir", &dir.path().to_string_lossy()])
                .args(["--serve-address", &address(process)?.to_string()])
                .args(["--serve-from", &from.to_string()])
                .args(["--serve-count", &PER_PROCESS.min(count - from).to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("server process: {e}"))?;
            let stdin = child.stdin.take().expect("piped");
            let stdout = BufReader::new(child.stdout.take().expect("piped"));
            servers.push(Server {
                child,
                stdin,
                stdout,
            });
        }
        let mut urls = Vec::with_capacity(count);
        for server in &mut servers {
            loop {
                let mut line = String::new();
                if server
                    .stdout
                    .read_line(&mut line)
                    .map_err(|e| e.to_string())?
                    == 0
                {
                    return Err("a server process ended before it was ready".to_owned());
                }
                match line.trim().split_once(' ') {
                    Some(("url", url)) => urls.push(url.to_owned()),
                    _ if line.trim() == "ready" => break,
                    _ => return Err(format!("server process said {line:?}")),
                }
            }
        }
        Ok(Self { servers, urls, dir })
    }

    pub(crate) fn len(&self) -> usize {
        self.urls.len()
    }

    pub(crate) fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    /// The LISTs of `path` each remote has served, in order.
    pub(crate) fn lists(&mut self, path: &str) -> Result<Vec<u64>> {
        let mut counts = Vec::with_capacity(self.len());
        for server in &mut self.servers {
            writeln!(server.stdin, "lists {path}").map_err(|e| e.to_string())?;
            let mut line = String::new();
            server
                .stdout
                .read_line(&mut line)
                .map_err(|e| e.to_string())?;
            let counted = line
                .trim()
                .strip_prefix("lists")
                .ok_or_else(|| format!("asked for lists, the server said {line:?}"))?;
            for count in counted.split_whitespace() {
                counts.push(count.parse().map_err(|_| format!("a count: {count:?}"))?);
            }
        }
        Ok(counts)
    }

    pub(crate) fn set_fault(&mut self, i: usize, fault: &Fault) -> Result<()> {
        let server = &mut self.servers[i / PER_PROCESS];
        writeln!(server.stdin, "{i} {fault}").map_err(|e| e.to_string())?;
        let mut line = String::new();
        server
            .stdout
            .read_line(&mut line)
            .map_err(|e| e.to_string())?;
        if line.trim() == "ok" {
            Ok(())
        } else {
            Err(format!("setting {fault} on remote {i}: {line}"))
        }
    }
}

/// A remote the server process holds.
pub(crate) enum Served {
    Simulated(ApiServer),
    Real(Box<ControlPlane>),
}

/// The loopback address the `process`th server process listens on:
/// 127.0.1.1, 127.0.1.2, and on (all of 127.0.0.0/8 is the loopback).
fn address(process: usize) -> Result<Ipv4Addr> {
    let last = u8::try_from(process + 1)
        .ok()
        .filter(|n| *n < u8::MAX)
        .ok_or_else(|| format!("more than 254 server processes ({process})"))?;
    Ok(Ipv4Addr::new(127, 0, 1, last))
}

impl Served {
    /// The `i`th remote; a simulated one listens on `address`, and a real
    /// one, whose certificate names 127.0.0.1, on its own.
    async fn start(i: usize, apiservers: Apiservers, address: Ipv4Addr) -> Result<Self> {
        if apiservers == Apiservers::Real {
            ControlPlane::start(RealOptions::default().name(name(i)))
                .await
                .map(|plane| Self::Real(Box::new(plane)))
                .map_err(|e| format!("real remote {i}: {e}"))
        } else {
            let mut options = Options::default()
                .addr(SocketAddr::from((address, 0)))
                .tls(true)
                .token(format!("token-{i:05}"))
                .name(name(i));
            options.extra_names.push(address.to_string());
            ApiServer::start(options)
                .await
                .map(Self::Simulated)
                .map_err(|e| format!("simulated remote {i}: {e}"))
        }
    }

    pub(crate) fn files(&self) -> (tether_testkit::Kubeconfig, String, String, String) {
        match self {
            Self::Simulated(s) => (
                s.kubeconfig(),
                s.ca_pem().unwrap_or_default(),
                s.token().unwrap_or_default(),
                s.url(),
            ),
            Self::Real(p) => (p.kubeconfig(), p.ca_pem(), p.token(), p.url()),
        }
    }

    /// A real process shows `refuse` (killed) and `hang` (stopped); `up`
    /// continues or restarts it.
    async fn set_fault(&self, fault: Fault) -> Result<()> {
        match (self, fault) {
            (Self::Simulated(s), fault) => s.set_fault(fault).await.map_err(|e| e.to_string()),
            (Self::Real(p), Fault::Refuse) => {
                p.stop();
                Ok(())
            }
            (Self::Real(p), Fault::Hang) => {
                p.pause().await;
                Ok(())
            }
            (Self::Real(p), Fault::Up) => {
                p.resume();
                if p.apiserver_pid().is_none() {
                    p.restart().await.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            (Self::Real(_), other) => Err(format!("a real remote cannot show {other}")),
        }
    }
}

/// A runtime of `workers` threads, and a real home cluster on it, its
/// kubeconfig written beside the remotes' files as `home.kubeconfig`.
pub(crate) fn home_cluster(
    remotes: &Remotes,
    workers: usize,
) -> Result<(tokio::runtime::Runtime, ControlPlane, PathBuf)> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let home = runtime
        .block_on(ControlPlane::start(RealOptions::default().name("home")))
        .map_err(|e| format!("the home cluster: {e}"))?;
    let kubeconfig = remotes.path("home.kubeconfig");
    home.kubeconfig()
        .write(&kubeconfig)
        .map_err(|e| e.to_string())?;
    Ok((runtime, home, kubeconfig))
}

/// The server process: starts `count` remotes served by `apiservers`
/// (simulated ones on `address`), writes their files, prints `url <url>` for each and `ready`,
/// then applies `<index> <fault>` lines from stdin until it closes, and
/// answers `lists <path>` with the requests of `path` each remote served.
pub(crate) fn serve(
    dir: &Path,
    address: Ipv4Addr,
    from: usize,
    count: usize,
    apiservers: Apiservers,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let servers = runtime.block_on(async {
        let mut servers = Vec::with_capacity(count);
        for i in from..from + count {
            servers.push(Served::start(i, apiservers, address).await?);
        }
        Ok::<_, String>(servers)
    })?;
    let mut out = std::io::stdout().lock();
    for (offset, server) in servers.iter().enumerate() {
        let n = name(from + offset);
        let write = |file: String, text: &str| {
            std::fs::write(dir.join(file), text).map_err(|e| e.to_string())
        };
        let (kubeconfig, ca, token, url) = server.files();
        write(format!("{n}.kubeconfig"), &kubeconfig.to_yaml())?;
        write(format!("{n}.ca.pem"), &ca)?;
        write(format!("{n}.token"), &token)?;
        writeln!(out, "url {url}").map_err(|e| e.to_string())?;
    }
    writeln!(out, "ready").map_err(|e| e.to_string())?;
    out.flush().map_err(|e| e.to_string())?;
    for line in std::io::stdin().lines().map_while(Result::ok) {
        if let Some(path) = line.strip_prefix("lists ") {
            let counts: Vec<String> = servers
                .iter()
                .map(|server| match server {
                    Served::Simulated(s) => s.requests(path).to_string(),
                    // A real apiserver does not count for us.
                    Served::Real(_) => "0".to_owned(),
                })
                .collect();
            writeln!(out, "lists {}", counts.join(" ")).map_err(|e| e.to_string())?;
            out.flush().map_err(|e| e.to_string())?;
            continue;
        }
        let (index, fault) = line.split_once(' ').ok_or("a line: <index> <fault>")?;
        let index: usize = index.parse().map_err(|_| format!("bad index {index:?}"))?;
        let fault: Fault = fault.parse()?;
        let server = servers
            .get(index.wrapping_sub(from))
            .ok_or_else(|| format!("remote {index} is not served here"))?;
        runtime.block_on(server.set_fault(fault))?;
        writeln!(out, "ok").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Whether a log event's `remotes` field (the names of one remote
/// apiserver's remotes, comma-separated) includes `remote`.
pub(crate) fn names(fields: &Value, remote: &str) -> bool {
    fields["remotes"]
        .as_str()
        .is_some_and(|list| list.split(',').any(|n| n.trim() == remote))
}

pub(crate) fn name(i: usize) -> String {
    format!("remote-{i:05}")
}

/// A tether config for `remotes`: `probe` and `supervisor` in YAML flow
/// form, and `watch` as a YAML value.
pub(crate) fn tether_config(
    remotes: &Remotes,
    configured: usize,
    admin: &str,
    probe: &str,
    supervisor: &str,
    watch: &str,
) -> Result<PathBuf> {
    tether_config_as(
        remotes,
        configured,
        "tether.yaml",
        &format!(
            "admin: {{ address: \"{admin}\" }}\nprobe: {probe}\nsupervisor: {supervisor}\nwatch: {watch}\n"
        ),
    )
}

/// A tether config named `file`: `head` (YAML), then the first
/// `configured` remotes.
pub(crate) fn tether_config_as(
    remotes: &Remotes,
    configured: usize,
    file: &str,
    head: &str,
) -> Result<PathBuf> {
    let mut yaml = format!("{head}remotes:\n");
    for i in 0..configured {
        let _ = writeln!(
            yaml,
            "  - {{ name: {n}, kubeconfig: {n}.kubeconfig }}",
            n = name(i)
        );
    }
    let path = remotes.path(file);
    std::fs::write(&path, yaml).map_err(|e| e.to_string())?;
    Ok(path)
}

pub(crate) fn start_tether(config: &Path) -> Result<Process> {
    start_tether_under(config, &[])
}

/// tether, run under `wrap` (a profiler's command line) if it is not empty.
pub(crate) fn start_tether_under(config: &Path, wrap: &[String]) -> Result<Process> {
    let binary = tether_binary()?;
    let mut command = match wrap.split_first() {
        None => Command::new(&binary),
        Some((program, args)) => {
            let mut command = Command::new(program);
            command.args(args).arg(&binary);
            command
        }
    };
    command.args([
        "run",
        "--config",
        &config.to_string_lossy(),
        "--log-format",
        "json",
    ]);
    if wrap.is_empty() {
        return Process::spawn("tether", &mut command);
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut process = Process::spawn("tether", &mut command)?;
    process.graceful = true;
    Ok(process)
}

/// Waits until tether reports every remote reachable and its manager up.
pub(crate) fn until_all_reachable(
    tether: &mut Process,
    admin: &str,
    count: usize,
) -> Result<Duration> {
    let started = Instant::now();
    #[allow(clippy::cast_precision_loss)]
    let want = count as f64;
    poll(
        "every remote reachable and the manager up",
        Duration::from_secs(600),
        Duration::from_millis(500),
        || {
            tether.alive()?;
            let Ok((_, text, _)) = http_get(admin, "/metrics") else {
                return Ok(None);
            };
            let reachable = metric_sum(&text, "tether_remote_apiserver_reachable", "");
            let up = metric_sum(&text, "tether_manager_up", "");
            Ok((reachable >= want && up >= 1.0).then(|| started.elapsed()))
        },
    )
}
