//! A single-node Kubernetes cluster in processes, for the cluster step: the
//! real control plane ([`ControlPlane`]) with kube-controller-manager and
//! kube-scheduler beside it, and a node of kube-proxy, kubelet, containerd
//! and runc, all built from their Go modules by `scripts/peers cluster`
//! (containerd, runc and the CNI plugins come from Debian's packages).
//!
//! Everything runs in one [`TestHost`], the node's network namespace: the
//! home apiserver and any remote planes ([`Node::remote`]) listen on its
//! address, which the machine reaches through the veth pair and the pods
//! through their bridge's gateway; kube-proxy's nftables rules send the
//! `kubernetes` Service's ClusterIP ([`SERVICE_IP`](crate::SERVICE_IP)) to the home apiserver.
//! Pods get addresses from the CNI bridge plugin, so each replica has a
//! port 9090 of its own.
//!
//! # Invariants
//!
//! - Nothing is pulled: every image is imported from an OCI archive
//!   ([`Node::import`]); containerd's sandbox image is `localhost/pause:tether`
//!   ([`PAUSE_IMAGE`]).
//! - Nothing outside the node is touched: containerd's root, state and
//!   socket, the kubelet's root, the CNI configuration and its address
//!   leases all live in a temporary directory of the node's own; the bridge
//!   and every packet rule live in the node's namespace.
//! - The node's processes join only the namespace's network (`nsenter
//!   --net`), never a mount namespace of their own, so the volumes the
//!   kubelet mounts are the ones containerd gives the containers.
//! - Every process dies with the thread that started it (`setpriv
//!   --pdeathsig KILL`). Dropping the node kills the kubelet first, then
//!   every container through containerd, then the rest by PID, then any
//!   containerd shim still serving its socket, and unmounts what is left
//!   under its directory.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::real::{Process, peer};
use crate::{ControlPlane, Error, RealOptions, Result, TestHost};

/// The node's name, as the kubelet registers it.
pub const NODE_NAME: &str = "node";

/// The sandbox image containerd uses, built by the cluster step FROM
/// scratch (`tests/peers/pause`).
pub const PAUSE_IMAGE: &str = "localhost/pause:tether";

/// The pods' addresses, inside the node's namespace.
const POD_SUBNET: &str = "10.88.0.0/24";

/// A start of the whole node (control plane, then the node's processes,
/// then the Node Ready) within this; most of it is the kubelet's first
/// status.
const START_DEADLINE: Duration = Duration::from_secs(180);

/// What the machine must have besides the peers, and how to install it.
const TOOLS: [(&str, &str); 5] = [
    ("/usr/bin/containerd", "apt-get install containerd"),
    ("/usr/sbin/runc", "apt-get install runc"),
    (
        "/usr/lib/cni/bridge",
        "apt-get install containernetworking-plugins",
    ),
    ("/usr/bin/nsenter", "apt-get install util-linux"),
    ("/usr/sbin/nft", "apt-get install nftables"),
];

/// A running single-node cluster.
pub struct Node {
    host: Arc<TestHost>,
    home: ControlPlane,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    socket: PathBuf,
    /// Started in this order; the kubelet is last.
    processes: Mutex<Vec<(&'static str, Process)>>,
    started_in: Duration,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("home", &self.home)
            .field("addr", &self.host.addr())
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Starts the home control plane, kube-controller-manager,
    /// kube-scheduler, containerd, kube-proxy and the kubelet, and waits
    /// until the Node is Ready.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] naming what is missing and how to get it (a peer:
    /// `scripts/peers cluster`; a package: its `apt-get install`), or which
    /// process exited or did not come up, with the tail of its log;
    /// [`Error::NotRoot`] without root.
    pub async fn start() -> Result<Self> {
        let begun = Instant::now();
        for name in [
            "kube-controller-manager",
            "kube-scheduler",
            "kube-proxy",
            "kubelet",
        ] {
            peer(name).map_err(|_| Error::Command {
                command: name.to_owned(),
                reason: "missing: build the node's peers with `scripts/peers cluster`".to_owned(),
            })?;
        }
        for (path, install) in TOOLS {
            if !Path::new(path).exists() {
                return Err(Error::Command {
                    command: path.to_owned(),
                    reason: format!("missing: {install}"),
                });
            }
        }
        let host = Arc::new(TestHost::create()?);
        let home = ControlPlane::start(
            RealOptions::default()
                .name("home")
                .on_host(Arc::clone(&host))
                .service_endpoints(true),
        )
        .await?;
        let dir = tempfile::Builder::new().prefix("tether-node-").tempdir()?;
        let kubeconfig = dir.path().join("admin.kubeconfig");
        home.kubeconfig().write(&kubeconfig)?;
        let socket = dir.path().join("containerd/containerd.sock");
        let mut node = Self {
            host,
            home,
            dir,
            kubeconfig,
            socket,
            processes: Mutex::new(Vec::new()),
            started_in: Duration::ZERO,
        };
        node.start_control_plane()?;
        node.start_containerd().await?;
        node.start_kube_proxy()?;
        node.start_kubelet()?;
        node.until(begun, "the Node Ready", || async { node.ready().await })
            .await?;
        node.started_in = begun.elapsed();
        Ok(node)
    }

    /// The home cluster's control plane.
    #[must_use]
    pub fn home(&self) -> &ControlPlane {
        &self.home
    }

    /// The admin's kubeconfig for the home cluster, for `kubectl` and
    /// `helm` on the machine.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The node's address: the apiservers', and the kubelet's.
    #[must_use]
    pub fn addr(&self) -> Ipv4Addr {
        self.host.addr()
    }

    /// How long [`start`](Self::start) took.
    #[must_use]
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Starts another real control plane on the node's address: a remote
    /// cluster its pods can reach, that [`ControlPlane::pause`] can hang,
    /// and whose watches [`ControlPlane::watches`] lists (with each pod's
    /// IP as the source).
    ///
    /// # Errors
    ///
    /// As [`ControlPlane::start`].
    pub async fn remote(&self, name: &str) -> Result<ControlPlane> {
        ControlPlane::start(
            RealOptions::default()
                .name(name)
                .on_host(Arc::clone(&self.host))
                .audit_watches(true),
        )
        .await
    }

    /// A TCP listener on a fresh port of the node's address, where its
    /// pods reach it: for a server the test runs itself, such as an
    /// [`AlertWebhook`](crate::AlertWebhook).
    ///
    /// # Errors
    ///
    /// As [`TestHost::listen`].
    pub fn listen(&self) -> Result<std::net::TcpListener> {
        self.host.listen(self.host.take_port())
    }

    /// A TCP connection to `addr` made from inside the node's network
    /// namespace: to a pod's own port, which the machine cannot reach.
    ///
    /// # Errors
    ///
    /// As [`TestHost::connect`].
    pub fn connect(
        &self,
        addr: std::net::SocketAddr,
        timeout: Duration,
    ) -> Result<std::net::TcpStream> {
        self.host.connect(addr, timeout)
    }

    /// Imports an OCI archive (`buildah push oci-archive:...`) into
    /// containerd's `k8s.io` namespace, where the kubelet finds its images.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] with `ctr`'s own words.
    pub fn import(&self, archive: &Path) -> Result<()> {
        let mut args = vec!["images".as_ref(), "import".as_ref()];
        args.push(archive.as_os_str());
        self.ctr(&args).map(drop)
    }

    /// The log of one of the node's processes (`kubelet`, `containerd`,
    /// `kube-proxy`, `kube-scheduler`, `kube-controller-manager`).
    #[must_use]
    pub fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{process}.log"))).unwrap_or_default()
    }

    /// `ctr --address <socket> -n k8s.io ARGS`: its output, or its error.
    fn ctr(&self, args: &[&std::ffi::OsStr]) -> Result<String> {
        let output = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["-n", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(Error::Command {
                command: format!(
                    "ctr {}",
                    args.iter()
                        .map(|a| a.to_string_lossy())
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            })
        }
    }

    /// Starts `binary` with `args` in the node's network namespace, logging
    /// to `<name>.log`.
    fn spawn(&self, name: &'static str, binary: &Path, args: &[String]) -> Result<()> {
        let log = self.dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "nsenter"])
            .arg(format!("--net=/run/netns/{}", self.host.namespace()))
            .arg("--")
            .arg(binary)
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let process = Process::spawn(command, name, log)?;
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((name, process));
        Ok(())
    }

    /// Writes `config` to `<name>.<extension>` and starts `binary
    /// --config=<that file>`, then `args`.
    fn spawn_configured(
        &self,
        name: &'static str,
        binary: &Path,
        extension: &str,
        config: &str,
        args: &[String],
    ) -> Result<()> {
        let file = self.dir.path().join(format!("{name}.{extension}"));
        std::fs::write(&file, config)?;
        let mut all = vec![format!("--config={}", file.display())];
        all.extend_from_slice(args);
        self.spawn(name, binary, &all)
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn start_control_plane(&self) -> Result<()> {
        let kubeconfig = self.kubeconfig.display().to_string();
        let clients = [
            format!("--kubeconfig={kubeconfig}"),
            format!("--authentication-kubeconfig={kubeconfig}"),
            format!("--authorization-kubeconfig={kubeconfig}"),
            "--leader-elect=false".to_owned(),
            "--bind-address=127.0.0.1".to_owned(),
        ];
        let mut manager = clients.to_vec();
        manager.extend([
            // The kube-root-ca.crt ConfigMap every projected token needs.
            format!("--root-ca-file={}", self.home.file("ca.crt").display()),
            format!(
                "--service-account-private-key-file={}",
                self.home.file("sa.key").display()
            ),
            "--use-service-account-credentials=false".to_owned(),
        ]);
        self.spawn(
            "kube-controller-manager",
            &peer("kube-controller-manager")?,
            &manager,
        )?;
        self.spawn("kube-scheduler", &peer("kube-scheduler")?, &clients)
    }

    async fn start_containerd(&self) -> Result<()> {
        let cni = self.dir.path().join("cni");
        std::fs::create_dir_all(&cni)?;
        std::fs::write(
            cni.join("10-tether.conflist"),
            format!(
                r#"{{"cniVersion": "0.4.0", "name": "tether", "plugins": [{{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_SUBNET}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}], "dataDir": "{leases}"}}}}]}}"#,
                leases = self.path("cni-leases"),
            ),
        )?;
        // restrict_oom_score_adj: the sandbox lacks CAP_SYS_RESOURCE, and
        // runc fails to start a container whose score it cannot raise.
        self.spawn_configured(
            "containerd",
            Path::new("/usr/bin/containerd"),
            "toml",
            &format!(
                r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"#,
                root = self.path("containerd/root"),
                state = self.path("containerd/state"),
                socket = self.socket.display(),
                cni = cni.display(),
            ),
            &[],
        )?;
        let begun = Instant::now();
        self.until(begun, "containerd", || async {
            self.ctr(&["version".as_ref()]).is_ok()
        })
        .await
    }

    fn start_kube_proxy(&self) -> Result<()> {
        // conntrack: zeros leave the machine-wide tables alone.
        self.spawn_configured(
            "kube-proxy",
            &peer("kube-proxy")?,
            "yaml",
            &format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {{kubeconfig: {kubeconfig}}}
hostnameOverride: {NODE_NAME}
clusterCIDR: {POD_SUBNET}
bindAddress: {addr}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
",
                kubeconfig = self.kubeconfig.display(),
                addr = self.host.addr(),
            ),
            &[],
        )
    }

    fn start_kubelet(&self) -> Result<()> {
        // cgroupfs and failCgroupV1/failSwapOn off: the machines mount
        // cgroup v1 beside v2, with no systemd. Anonymous and AlwaysAllow:
        // its port is in the node's namespace, reached only by the
        // apiserver (kubectl logs). syncFrequency: a Secret's change
        // reaches its volume within about 10s, not a minute. The image
        // collection and eviction thresholds: the machine's disk and memory
        // are shared with the rest of the tests, and the node's imported
        // images cannot be pulled again.
        self.spawn_configured(
            "kubelet",
            &peer("kubelet")?,
            "yaml",
            &format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://{socket}
authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: {addr}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
resolvConf: \"\"
syncFrequency: 10s
imageGCHighThresholdPercent: 100
evictionHard: {{memory.available: 1Mi}}
",
                socket = self.socket.display(),
                addr = self.host.addr(),
            ),
            &[
                format!("--kubeconfig={}", self.kubeconfig.display()),
                format!("--hostname-override={NODE_NAME}"),
                format!("--node-ip={}", self.host.addr()),
                format!("--root-dir={}", self.path("kubelet")),
                format!("--cert-dir={}", self.path("kubelet-pki")),
            ],
        )
    }

    /// Whether the Node's Ready condition is True.
    async fn ready(&self) -> bool {
        let Some((200, body)) = self.home.get(&format!("/api/v1/nodes/{NODE_NAME}")).await else {
            return false;
        };
        let node: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        node["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
    }

    /// Polls `ready` every 200ms until it holds, failing early if one of
    /// the node's processes exited, or at [`START_DEADLINE`] after `begun`.
    async fn until<F, Fut>(&self, begun: Instant, what: &str, ready: F) -> Result<()>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        loop {
            if ready().await {
                return Ok(());
            }
            let exited = self
                .processes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter_mut()
                .find_map(|(name, p)| {
                    p.exited()
                        .map(|status| format!("{name} exited ({status}):\n{}", p.tail()))
                });
            let failed = exited.or_else(|| {
                (begun.elapsed() > START_DEADLINE).then(|| {
                    let processes = self
                        .processes
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let last = processes.last().map(|(name, p)| (*name, p.tail()));
                    let (name, tail) = last.unwrap_or_default();
                    format!("not within {START_DEADLINE:?}; the {name}'s log ends:\n{tail}")
                })
            });
            if let Some(reason) = failed {
                return Err(Error::Command {
                    command: what.to_owned(),
                    reason,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Kills every container through containerd, while it still runs, and
    /// returns the network namespaces its sandboxes were given (which only
    /// the CRI's own teardown would remove).
    fn kill_containers(&self) -> Vec<String> {
        let mut namespaces = Vec::new();
        if let Ok(containers) = self.ctr(&["containers".as_ref(), "ls".as_ref(), "-q".as_ref()]) {
            for id in containers.lines().filter(|l| !l.is_empty()) {
                let Ok(info) = self.ctr(&["containers".as_ref(), "info".as_ref(), id.as_ref()])
                else {
                    continue;
                };
                let info: serde_json::Value = serde_json::from_str(&info).unwrap_or_default();
                if let Some(all) = info["Spec"]["linux"]["namespaces"].as_array() {
                    namespaces.extend(all.iter().filter(|n| n["type"] == "network").filter_map(
                        |n| {
                            n["path"]
                                .as_str()
                                .filter(|p| p.contains("/netns/cni-"))
                                .map(str::to_owned)
                        },
                    ));
                }
            }
        }
        let Ok(tasks) = self.ctr(&["tasks".as_ref(), "ls".as_ref(), "-q".as_ref()]) else {
            return namespaces;
        };
        for task in tasks.lines().filter(|l| !l.is_empty()) {
            let _ = self.ctr(&[
                "tasks".as_ref(),
                "kill".as_ref(),
                "--all".as_ref(),
                "--signal".as_ref(),
                "SIGKILL".as_ref(),
                task.as_ref(),
            ]);
            let _ = self.ctr(&[
                "tasks".as_ref(),
                "delete".as_ref(),
                "--force".as_ref(),
                task.as_ref(),
            ]);
        }
        namespaces
    }

    /// SIGKILLs every process whose command line names this node's
    /// containerd socket: the shims, which containerd starts in sessions of
    /// their own.
    fn kill_shims(&self) {
        let socket = self.socket.as_os_str().as_encoded_bytes();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if cmdline.windows(socket.len()).any(|w| w == socket)
                && let Some(pid) = rustix::process::Pid::from_raw(pid)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }

    /// Lazily unmounts every mount under the node's directory, deepest
    /// first: the kubelet's volumes and containerd's root filesystems,
    /// left behind by a node that was not drained.
    fn unmount_all(&self) {
        let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let under = self.dir.path().display().to_string();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .filter(|point| point.starts_with(&under))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for point in points {
            let _ = Command::new("umount").args(["--lazy", point]).status();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let mut processes = std::mem::take(
            &mut *self
                .processes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        // The kubelet first, so it restarts nothing; then the containers,
        // while containerd can still stop them.
        if let Some(index) = processes.iter().position(|(name, _)| *name == "kubelet") {
            processes.remove(index).1.kill();
        }
        let namespaces = self.kill_containers();
        for (_, mut process) in processes.into_iter().rev() {
            process.kill();
        }
        self.kill_shims();
        self.unmount_all();
        for namespace in namespaces {
            // The CRI's teardown may have removed it already.
            let _ = Command::new("umount")
                .args(["--lazy", &namespace])
                .stderr(Stdio::null())
                .status();
            let _ = std::fs::remove_file(&namespace);
        }
    }
}
