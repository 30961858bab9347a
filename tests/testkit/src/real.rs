//! A real control plane: etcd and kube-apiserver, built from their Go modules
//! by `scripts/peers`, started on loopback by the test and stopped by PID.
//!
//! It has the shape of [`ApiServer`](crate::ApiServer): start it, take its
//! [`Kubeconfig`], strike it with a fault. The faults are the ones a real
//! process can show: [`stop`](ControlPlane::stop) (SIGKILL: refused),
//! [`pause`](ControlPlane::pause) (SIGSTOP: hung, connections open),
//! [`resume`](ControlPlane::resume), [`restart`](ControlPlane::restart) on
//! the same address, [`recreate`](ControlPlane::recreate) (a new CA, token
//! and etcd), [`terminate`](ControlPlane::terminate) (SIGTERM: `/readyz`
//! answers 500 through `--shutdown-delay-duration`), and
//! [`blackhole`](ControlPlane::blackhole) in a [`TestHost`].
//!
//! # Invariants
//!
//! - Nothing from outside the machine: the binaries come from `target/peers`
//!   (or `TETHER_PEERS`), every listener is on loopback or in a test host,
//!   and every file is in a temporary directory of the plane's own.
//! - Every process is started under `setpriv --pdeathsig KILL`, so it dies
//!   with the thread that started it even if the test is killed; dropping
//!   the plane kills both processes by PID and waits for them.
//! - The admin's token and key never appear in `Debug` output.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rcgen::{CertificateParams, DnType, KeyPair, SanType};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::{Error, Kubeconfig, Result, TestHost};

/// How long a start may take before it is an error: a cold kube-apiserver
/// on two loaded cores takes about ten seconds.
const START_DEADLINE: Duration = Duration::from_secs(120);
/// How long a paused apiserver's threads may take to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// Where `scripts/peers` puts the binaries, unless `TETHER_PEERS` says.
#[must_use]
fn peers_dir() -> PathBuf {
    std::env::var_os("TETHER_PEERS")
        .filter(|d| !d.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/peers/bin"),
            PathBuf::from,
        )
}

/// The path of a peer binary built by `scripts/peers`.
///
/// # Errors
///
/// [`Error::Command`] naming the command that builds it, if it is missing.
pub fn peer(name: &str) -> Result<PathBuf> {
    let path = peers_dir().join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Command {
            command: name.to_owned(),
            reason: format!(
                "{} is missing: build it with scripts/peers (needs Go 1.26 or newer on PATH)",
                path.display()
            ),
        })
    }
}

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone, Default)]
pub struct RealOptions {
    name: String,
    shutdown_delay: Duration,
    host: bool,
    shared: Option<Arc<TestHost>>,
    service_endpoints: bool,
    audit_watches: bool,
}

impl RealOptions {
    /// The plane's name, used in its kubeconfig and certificates.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// `--shutdown-delay-duration`: after SIGTERM, `/readyz` answers 500
    /// and requests are served this long before the server closes.
    #[must_use]
    pub fn shutdown_delay(mut self, delay: Duration) -> Self {
        self.shutdown_delay = delay;
        self
    }

    /// Runs both processes in a [`TestHost`] of their own (root only), so
    /// that [`ControlPlane::blackhole`] can drop their packets.
    #[must_use]
    pub fn in_test_host(mut self, host: bool) -> Self {
        self.host = host;
        self
    }

    /// Runs the apiserver in `host`, a [`TestHost`] it shares with other
    /// processes (a [`Node`](crate::Node)'s), on a port of its own there.
    #[must_use]
    pub fn on_host(mut self, host: Arc<TestHost>) -> Self {
        self.shared = Some(host);
        self
    }

    /// Keeps the `kubernetes` Service's endpoints (`--endpoint-reconciler-type
    /// =lease`), for a cluster whose pods reach the apiserver through it;
    /// without, the plane publishes none.
    #[must_use]
    pub fn service_endpoints(mut self, on: bool) -> Self {
        self.service_endpoints = on;
        self
    }

    /// Logs every watch's start and end in the apiserver's audit log, for
    /// [`ControlPlane::watches`]: a witness of who watched it, and when.
    #[must_use]
    pub fn audit_watches(mut self, on: bool) -> Self {
        self.audit_watches = on;
        self
    }
}

/// The ClusterIP of the `kubernetes` Service: the first address of
/// `--service-cluster-ip-range`. The serving certificate names it, as
/// kubeadm's does, for clients in pods.
pub const SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 1);

/// The secrets of one incarnation of a cluster: a CA, the apiserver's
/// serving certificate, the admin's token and client certificate, and the
/// service-account signing key, all fresh.
struct Credentials {
    ca_pem: String,
    token: String,
    admin_cert: (String, String),
}

impl Credentials {
    /// Makes them and writes the files the apiserver reads into `dir`.
    fn generate(name: &str, ip: IpAddr, dir: &Path) -> Result<Self> {
        let ca = tether_sim::certificate_authority(&format!("{name}-ca"))?;

        let mut serving = CertificateParams::new(vec![
            "localhost".to_owned(),
            "kubernetes.default.svc".to_owned(),
        ])
        .map_err(Error::Tls)?;
        serving.subject_alt_names.push(SanType::IpAddress(ip));
        serving
            .subject_alt_names
            .push(SanType::IpAddress(Ipv4Addr::LOCALHOST.into()));
        serving
            .subject_alt_names
            .push(SanType::IpAddress(SERVICE_IP.into()));
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let serving_key = KeyPair::generate().map_err(Error::Tls)?;
        let serving = serving.signed_by(&serving_key, &ca).map_err(Error::Tls)?;

        let mut admin = CertificateParams::new(Vec::<String>::new()).map_err(Error::Tls)?;
        admin.distinguished_name.push(DnType::CommonName, "admin");
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        let admin_key = KeyPair::generate().map_err(Error::Tls)?;
        let admin = admin.signed_by(&admin_key, &ca).map_err(Error::Tls)?;

        let token = format!("{name}-{:016x}", fastrand::u64(..));
        let signing = KeyPair::generate().map_err(Error::Tls)?;
        let files = [
            ("ca.crt", ca.pem()),
            ("apiserver.crt", serving.pem()),
            ("apiserver.key", serving_key.serialize_pem()),
            ("sa.key", signing.serialize_pem()),
            ("sa.pub", signing.public_key_pem()),
            (
                "tokens.csv",
                format!("{token},admin,admin,\"system:masters\"\n"),
            ),
        ];
        for (file, text) in files {
            std::fs::write(dir.join(file), text)?;
        }
        Ok(Self {
            ca_pem: ca.pem(),
            token,
            admin_cert: (admin.pem(), admin_key.serialize_pem()),
        })
    }
}

/// A running process of the plane (or of a [`Node`](crate::Node)), with
/// its log file.
pub(crate) struct Process {
    child: Child,
    log: PathBuf,
}

impl Process {
    pub(crate) fn spawn(mut command: Command, what: &str, log: PathBuf) -> Result<Self> {
        let child = command.spawn().map_err(|source| Error::Command {
            command: what.to_owned(),
            reason: format!("could not start it ({source}); setpriv is in util-linux"),
        })?;
        Ok(Self { child, log })
    }

    fn pid(&self) -> rustix::process::Pid {
        let pid = i32::try_from(self.child.id()).expect("a PID fits in i32");
        rustix::process::Pid::from_raw(pid).expect("a child's PID is positive")
    }

    fn signal(&self, signal: rustix::process::Signal) {
        // It may have exited already; then there is nothing to signal.
        let _ = rustix::process::kill_process(self.pid(), signal);
    }

    /// Its exit status, once it has exited.
    pub(crate) fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub(crate) fn kill(&mut self) {
        self.signal(rustix::process::Signal::CONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines of its log, for an error.
    pub(crate) fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

struct Running {
    credentials: Credentials,
    etcd: Option<Process>,
    apiserver: Option<Process>,
    incarnation: u32,
    /// When each incarnation's apiserver was started, the first first.
    started: Vec<jiff::Timestamp>,
}

/// A real etcd and kube-apiserver on one address.
pub struct ControlPlane {
    options: RealOptions,
    dir: tempfile::TempDir,
    host: Option<Arc<TestHost>>,
    ip: Ipv4Addr,
    port: u16,
    etcd_ports: (u16, u16),
    running: Mutex<Running>,
    started_in: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("name", &self.options.name)
            .field("addr", &self.addr())
            .finish_non_exhaustive()
    }
}

/// A port free on `ip`, as [`crate::plumbing::free_port_on`] finds one.
fn free_port(ip: Ipv4Addr) -> Result<u16> {
    crate::plumbing::free_port_on(ip).ok_or_else(|| Error::Bind {
        addr: SocketAddr::new(ip.into(), 0),
        source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "no free port in 10000-31999"),
    })
}

impl ControlPlane {
    /// Starts etcd, then kube-apiserver, and waits until `/readyz` answers
    /// 200.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] if a binary is missing (naming `scripts/peers`), a
    /// process exits, or `/readyz` is not 200 within two minutes (with the
    /// tail of its log); [`Error::NotRoot`] for a test host without root.
    pub async fn start(options: RealOptions) -> Result<Self> {
        let begun = Instant::now();
        let options = if options.name.is_empty() {
            options.name("real")
        } else {
            options
        };
        peer("etcd")?;
        peer("kube-apiserver")?;
        let own = options.shared.is_none() && options.host;
        let host = match &options.shared {
            Some(host) => Some(Arc::clone(host)),
            None if own => Some(Arc::new(TestHost::create()?)),
            None => None,
        };
        let ip = host.as_ref().map_or(Ipv4Addr::LOCALHOST, |h| h.addr());
        let dir = tempfile::Builder::new()
            .prefix(&format!("tether-real-{}-", options.name))
            .tempdir()?;
        let credentials = Credentials::generate(&options.name, ip.into(), dir.path())?;
        let etcd_ip = host.as_ref().map_or(Ipv4Addr::LOCALHOST, |h| h.host_addr());
        let mut plane = Self {
            // A fresh test host has every port free; a shared one hands
            // out its own.
            port: match &host {
                Some(_) if own => 6443,
                Some(host) => host.take_port(),
                None => free_port(ip)?,
            },
            etcd_ports: (free_port(etcd_ip)?, free_port(Ipv4Addr::LOCALHOST)?),
            options,
            dir,
            host,
            ip,
            running: Mutex::new(Running {
                credentials,
                etcd: None,
                apiserver: None,
                incarnation: 0,
                started: Vec::new(),
            }),
            started_in: Duration::ZERO,
        };
        plane.start_etcd().await?;
        plane.start_apiserver().await?;
        plane.started_in = begun.elapsed();
        Ok(plane)
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().expect("not poisoned")
    }

    /// A command for `binary` that dies with its parent; `in_host`: in the
    /// test host, if there is one.
    fn command(&self, binary: &Path, log: &Path, in_host: bool) -> Result<Command> {
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL"]);
        if let Some(host) = self.host.as_ref().filter(|_| in_host) {
            command.args(["ip", "netns", "exec", host.namespace()]);
        }
        command.arg(binary);
        let log = std::fs::File::create(log)?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(command)
    }

    async fn start_etcd(&self) -> Result<()> {
        let data = self.dir.path().join("etcd");
        let peer_port = self.etcd_ports.1;
        let client_url = format!("http://{}", self.etcd_addr());
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let log = self.dir.path().join("etcd.log");
        let mut command = self.command(&peer("etcd")?, &log, false)?;
        command
            .arg("--name=default")
            .arg(format!("--data-dir={}", data.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        let process = Process::spawn(command, "etcd", log)?;
        self.running().etcd = Some(process);
        self.until(|| async { self.etcd_healthy().await }, "etcd")
            .await
    }

    async fn etcd_healthy(&self) -> bool {
        plain_get(&self.etcd_addr(), "/health")
            .await
            .is_some_and(|(code, body)| code == 200 && body.contains("true"))
    }

    /// etcd's client address. etcd always runs on the machine's side: in a
    /// test host, the apiserver reaches it through the veth pair, and the
    /// black hole drops only the apiserver's port.
    fn etcd_addr(&self) -> String {
        let ip = self
            .host
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, |h| h.host_addr());
        format!("{ip}:{}", self.etcd_ports.0)
    }

    async fn start_apiserver(&self) -> Result<()> {
        let dir = self.dir.path();
        let file = |name: &str| dir.join(name).display().to_string();
        let log = dir.join("kube-apiserver.log");
        let mut command = self.command(&peer("kube-apiserver")?, &log, true)?;
        command
            .arg(format!("--etcd-servers=http://{}", self.etcd_addr()))
            .arg(format!("--bind-address={}", self.ip))
            .arg(format!("--advertise-address={}", self.ip))
            .arg(format!("--secure-port={}", self.port))
            .arg(format!("--tls-cert-file={}", file("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", file("apiserver.key")))
            .arg(format!("--client-ca-file={}", file("ca.crt")))
            .arg(format!("--token-auth-file={}", file("tokens.csv")))
            .arg("--authorization-mode=RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", file("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                file("sa.key")
            ))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            .arg(format!("--cert-dir={}", file("certs")))
            .arg(if self.options.service_endpoints {
                "--endpoint-reconciler-type=lease"
            } else {
                "--endpoint-reconciler-type=none"
            })
            .arg("--profiling=false")
            // A Node's name resolves nowhere here: `kubectl logs` reaches
            // a kubelet by its address.
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg(format!(
                "--shutdown-delay-duration={}ms",
                self.options.shutdown_delay.as_millis()
            ));
        let incarnation = self.running().incarnation + 1;
        if self.options.audit_watches {
            std::fs::write(dir.join("audit-policy.yaml"), crate::audit::POLICY)?;
            command
                .arg(format!("--audit-policy-file={}", file("audit-policy.yaml")))
                .arg(format!(
                    "--audit-log-path={}",
                    file(&format!("audit-{incarnation}.log"))
                ))
                // Each event is written before the request goes on, so the
                // log's order is the apiserver's.
                .arg("--audit-log-mode=blocking");
        }
        let process = Process::spawn(command, "kube-apiserver", log)?;
        {
            let mut running = self.running();
            running.apiserver = Some(process);
            running.incarnation = incarnation;
            running.started.push(jiff::Timestamp::now());
        }
        self.until(
            || async {
                self.get("/readyz")
                    .await
                    .is_some_and(|(code, _)| code == 200)
            },
            "kube-apiserver",
        )
        .await
    }

    /// Polls `ready` every 100ms until it holds, failing early if a process
    /// exited.
    async fn until<F, Fut>(&self, ready: F, what: &str) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let begun = Instant::now();
        loop {
            if ready().await {
                return Ok(());
            }
            let failed = {
                let mut running = self.running();
                let Running {
                    etcd, apiserver, ..
                } = &mut *running;
                [etcd.as_mut(), apiserver.as_mut()]
                    .into_iter()
                    .flatten()
                    .find_map(|p| match p.child.try_wait() {
                        Ok(Some(status)) => Some(format!("exited ({status}):\n{}", p.tail())),
                        _ => None,
                    })
            };
            let failed = failed.or_else(|| {
                (begun.elapsed() > START_DEADLINE).then(|| {
                    let running = self.running();
                    let tail = running.apiserver.as_ref().map(Process::tail);
                    format!(
                        "not ready within {START_DEADLINE:?}:\n{}",
                        tail.unwrap_or_default()
                    )
                })
            });
            if let Some(reason) = failed {
                return Err(Error::Command {
                    command: what.to_owned(),
                    reason,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `GET path` as the admin, over a new connection: the status and body,
    /// or `None` if nothing answered within two seconds.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let (ca, token) = {
            let running = self.running();
            (
                running.credentials.ca_pem.clone(),
                running.credentials.token.clone(),
            )
        };
        tls_get(self.addr(), &ca, &token, path).await
    }

    /// The apiserver's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip.into(), self.port)
    }

    /// `https://<addr>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("https://{}", self.addr())
    }

    /// The plane's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.options.name
    }

    /// The current CA certificate, PEM.
    #[must_use]
    pub fn ca_pem(&self) -> String {
        self.running().credentials.ca_pem.clone()
    }

    /// The admin's bearer token (in `system:masters`).
    #[must_use]
    pub fn token(&self) -> String {
        self.running().credentials.token.clone()
    }

    /// A kubeconfig for the admin, by token.
    #[must_use]
    pub fn kubeconfig(&self) -> Kubeconfig {
        let running = self.running();
        Kubeconfig {
            name: self.options.name.clone(),
            server: self.url(),
            ca_pem: Some(running.credentials.ca_pem.clone()),
            token: Some(running.credentials.token.clone()),
            client_cert: None,
            impersonate: None,
        }
    }

    /// A kubeconfig for the admin, by client certificate.
    #[must_use]
    pub fn cert_kubeconfig(&self) -> Kubeconfig {
        let admin_cert = self.running().credentials.admin_cert.clone();
        Kubeconfig {
            token: None,
            client_cert: Some(admin_cert),
            ..self.kubeconfig()
        }
    }

    /// How long [`start`](Self::start) took, etcd and apiserver together.
    #[must_use]
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// How many times the apiserver has been started.
    #[must_use]
    pub fn incarnation(&self) -> u32 {
        self.running().incarnation
    }

    /// The resident memory of etcd and of kube-apiserver, in KiB.
    #[must_use]
    pub fn rss_kib(&self) -> (u64, u64) {
        let running = self.running();
        let rss = |p: &Option<Process>| {
            p.as_ref()
                .and_then(|p| crate::procfs::status_kib(Some(p.child.id()), "VmRSS"))
                .unwrap_or(0)
        };
        (rss(&running.etcd), rss(&running.apiserver))
    }

    /// The apiserver's PID, while it runs.
    #[must_use]
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.running().apiserver.as_ref().map(|p| p.child.id())
    }

    /// Kills the apiserver (SIGKILL): new connections are refused, open ones
    /// reset. etcd keeps running.
    pub fn stop(&self) {
        if let Some(mut process) = self.running().apiserver.take() {
            process.kill();
        }
    }

    /// Stops the apiserver (SIGSTOP): connections are accepted by the
    /// kernel and never answered. Returns once every one of its threads
    /// has stopped: `kill` returns when the signal is queued, and until a
    /// thread takes it the others run on, so on a loaded machine a new
    /// connection could still be answered.
    ///
    /// # Panics
    ///
    /// If a thread still runs after ten seconds.
    pub async fn pause(&self) {
        let Some(pid) = self.apiserver_pid() else {
            return;
        };
        self.signal(rustix::process::Signal::STOP);
        let begun = Instant::now();
        while crate::procfs::stopped(pid) == Some(false) {
            assert!(
                begun.elapsed() < STOP_DEADLINE,
                "the apiserver of {} did not stop within {STOP_DEADLINE:?}",
                self.options.name
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Continues a paused apiserver (SIGCONT).
    pub fn resume(&self) {
        self.signal(rustix::process::Signal::CONT);
    }

    /// Asks the apiserver to shut down (SIGTERM): `/readyz` answers 500
    /// (`[-]shutdown failed`) for the shutdown delay, then it exits.
    pub fn terminate(&self) {
        self.signal(rustix::process::Signal::TERM);
    }

    fn signal(&self, signal: rustix::process::Signal) {
        if let Some(process) = &self.running().apiserver {
            process.signal(signal);
        }
    }

    /// Kills the apiserver if it runs and starts it again on the same
    /// address with the same credentials and data.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn restart(&self) -> Result<()> {
        self.stop();
        self.start_apiserver().await
    }

    /// The cluster is torn down and made anew on the same address: a new
    /// CA, token and service-account key, and an empty etcd. Kubeconfigs
    /// taken before no longer work.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn recreate(&self) -> Result<()> {
        self.stop();
        if let Some(mut etcd) = self.running().etcd.take() {
            etcd.kill();
        }
        let data = self.dir.path().join("etcd");
        if data.exists() {
            std::fs::remove_dir_all(&data)?;
        }
        let credentials =
            Credentials::generate(&self.options.name, self.ip.into(), self.dir.path())?;
        self.running().credentials = credentials;
        self.start_etcd().await?;
        self.start_apiserver().await
    }

    /// Drops (`on`) or passes again (`!on`) every packet to the apiserver's
    /// port: new connections time out, open ones go silent.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] unless started
    /// [`in_test_host`](RealOptions::in_test_host); else as
    /// [`TestHost::blackhole`].
    pub fn blackhole(&self, on: bool) -> Result<()> {
        let host = self.host.as_ref().ok_or(Error::Unsupported(
            "a black hole needs a plane started in a test host",
        ))?;
        host.blackhole(self.port, on)
    }

    /// The path of one of the plane's files: `ca.crt`, `sa.key`, `sa.pub`
    /// (what a kube-controller-manager beside it reads).
    #[must_use]
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Every watch of this plane so far, in the order they opened, from
    /// its audit logs ([`RealOptions::audit_watches`]), one per incarnation:
    /// a watch left open by an apiserver since killed ended by the time
    /// the next one started.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] without `audit_watches`; [`Error::Io`] if the
    /// log cannot be read.
    pub fn watches(&self) -> Result<Vec<crate::audit::Watch>> {
        if !self.options.audit_watches {
            return Err(Error::Unsupported(
                "watches need a plane started with audit_watches",
            ));
        }
        let started = self.running().started.clone();
        let mut watches = Vec::new();
        for (index, _) in started.iter().enumerate() {
            let log = self.dir.path().join(format!("audit-{}.log", index + 1));
            watches.extend(crate::audit::read(&log, started.get(index + 1).copied())?);
        }
        Ok(watches)
    }

    /// The apiserver's log so far.
    #[must_use]
    pub fn apiserver_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kube-apiserver.log")).unwrap_or_default()
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let mut running = self
            .running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for process in [running.apiserver.take(), running.etcd.take()]
            .into_iter()
            .flatten()
        {
            let mut process = process;
            process.kill();
        }
    }
}

/// `GET path` over plain HTTP/1.0.
async fn plain_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let stream = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    exchange(stream, path, None).await
}

/// `GET path` over HTTPS trusting `ca_pem`, with `token`.
async fn tls_get(addr: SocketAddr, ca_pem: &str, token: &str, path: &str) -> Option<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.ok()?).ok()?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::time::timeout(Duration::from_secs(2), async {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        connector
            .connect(ServerName::IpAddress(addr.ip().into()), tcp)
            .await
            .ok()
    })
    .await
    .ok()??;
    exchange(stream, path, Some(token)).await
}

async fn exchange(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    path: &str,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let mut request = format!("GET {path} HTTP/1.0\r\nHost: kubernetes\r\n");
    if let Some(token) = token {
        let _ = write!(request, "Authorization: Bearer {token}\r\n");
    }
    request.push_str("\r\n");
    tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        // A peer that closes without a TLS close_notify still sent it all.
        let _ = stream.read_to_end(&mut response).await;
        let response = String::from_utf8_lossy(&response);
        let code = response.split_whitespace().nth(1)?.parse().ok()?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((code, body))
    })
    .await
    .ok()?
}
