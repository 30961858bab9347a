//! Test hosts: network namespaces this process makes itself, joined to the
//! host by a veth pair, for faults that need a real network path between
//! client and server, such as dropping packets (`blackhole`).
//!
//! # Invariants
//!
//! - The kit only ever changes firewall rules inside a namespace it created,
//!   through `ip netns exec <its namespace> nft ...`. It never touches the
//!   host's rules or any address outside its namespaces.
//! - Addresses come from `10.253.0.0/16`, a `/30` per host: the host side is
//!   `.1`, the namespace side `.2`. No other address is ever used.
//! - Dropping a [`TestHost`] deletes its namespace, and with it the veth pair
//!   and every rule in it.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use crate::{Error, Result};

static HOSTS: AtomicU32 = AtomicU32::new(0);

/// The table the kit's blackhole rules live in, inside a test host.
const TABLE: &str = "tether_blackhole";

/// A network namespace with an address the host can reach.
#[derive(Debug)]
pub struct TestHost {
    namespace: String,
    veth: String,
    addr: Ipv4Addr,
    host_addr: Ipv4Addr,
    next_port: AtomicU16,
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Command {
            command: format!("{program} {}", args.join(" ")),
            reason: format!("could not start it ({source}); is it installed?"),
        })?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            command: format!("{program} {}", args.join(" ")),
            reason: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        })
    }
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        })
        .unwrap_or(false)
}

impl TestHost {
    /// Makes a namespace, a veth pair into it, and addresses on both ends.
    ///
    /// # Errors
    ///
    /// [`Error::NotRoot`] without root, and [`Error::Command`] naming the
    /// step that failed (with `ip` missing: install `iproute2`).
    ///
    /// # Panics
    ///
    /// Never: the subnet index is reduced below 16384 first, so its octets
    /// fit.
    pub fn create() -> Result<Self> {
        if !is_root() {
            return Err(Error::NotRoot(
                "network namespaces and packet filters need root; run the test as root (CI does)",
            ));
        }
        let pid = std::process::id();
        let n = HOSTS.fetch_add(1, Ordering::Relaxed);
        // A /30 per host in 10.253.0.0/16: 16384 of them.
        let index = (pid.wrapping_mul(64).wrapping_add(n)) % 16_384;
        let third = u8::try_from(index / 64).expect("index / 64 < 256");
        let fourth = u8::try_from(index % 64 * 4).expect("index % 64 * 4 < 256");
        let host_addr = Ipv4Addr::new(10, 253, third, fourth + 1);
        let addr = Ipv4Addr::new(10, 253, third, fourth + 2);
        let namespace = format!("tether-{pid}-{n}");
        let veth = format!("tt{}x{n}", pid % 1_000_000);
        let peer = format!("{veth}n");

        run("ip", &["netns", "add", &namespace])?;
        let host = Self {
            namespace,
            veth,
            addr,
            host_addr,
            next_port: AtomicU16::new(6443),
        };
        let ns = host.namespace.as_str();
        run(
            "ip",
            &[
                "link", "add", &host.veth, "type", "veth", "peer", "name", &peer, "netns", ns,
            ],
        )?;
        run(
            "ip",
            &["addr", "add", &format!("{host_addr}/30"), "dev", &host.veth],
        )?;
        run("ip", &["link", "set", &host.veth, "up"])?;
        run(
            "ip",
            &[
                "netns",
                "exec",
                ns,
                "ip",
                "addr",
                "add",
                &format!("{addr}/30"),
                "dev",
                &peer,
            ],
        )?;
        run(
            "ip",
            &["netns", "exec", ns, "ip", "link", "set", &peer, "up"],
        )?;
        run(
            "ip",
            &["netns", "exec", ns, "ip", "link", "set", "lo", "up"],
        )?;
        Ok(host)
    }

    /// The namespace's address, reachable from the host.
    #[must_use]
    pub fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    /// The machine's end of the veth pair, reachable from the namespace.
    #[must_use]
    pub fn host_addr(&self) -> Ipv4Addr {
        self.host_addr
    }

    /// A port on [`addr`](Self::addr) that no one was given before: the
    /// namespace is fresh, so 6443 and up are free in it, and each call
    /// hands out the next.
    pub fn take_port(&self) -> u16 {
        self.next_port.fetch_add(1, Ordering::Relaxed)
    }

    /// The namespace's name.
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A TCP listener on `port` of [`addr`](Self::addr), inside the
    /// namespace: for a server the test runs itself that the namespace's
    /// own peers (the node's pods) must reach. The socket is made on a
    /// thread of its own that enters the namespace and ends; it stays in
    /// the namespace it was made in.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the namespace cannot be entered, and
    /// [`Error::Bind`] if the port is taken.
    ///
    /// # Panics
    ///
    /// If the thread that makes the socket panics.
    pub fn listen(&self, port: u16) -> Result<std::net::TcpListener> {
        let path = Path::new("/var/run/netns").join(&self.namespace);
        let addr = std::net::SocketAddr::from((self.addr, port));
        std::thread::spawn(move || {
            enter(&path)?;
            let listener =
                std::net::TcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .join()
        .expect("the thread that makes the socket")
    }

    /// A TCP connection to `addr` made inside the namespace, within
    /// `timeout`: for the test to reach what only the namespace's peers
    /// can (a pod's port). As [`listen`](Self::listen), the socket is made
    /// on a thread of its own and stays in the namespace.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the namespace cannot be entered or the connection
    /// fails.
    ///
    /// # Panics
    ///
    /// If the thread that makes the socket panics.
    pub fn connect(
        &self,
        addr: std::net::SocketAddr,
        timeout: std::time::Duration,
    ) -> Result<std::net::TcpStream> {
        let path = Path::new("/var/run/netns").join(&self.namespace);
        std::thread::spawn(move || {
            enter(&path)?;
            Ok(std::net::TcpStream::connect_timeout(&addr, timeout)?)
        })
        .join()
        .expect("the thread that makes the socket")
    }

    /// A command that runs `program` inside the namespace.
    #[must_use]
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.namespace])
            .arg(program);
        command
    }

    /// Drops (`on`) or passes again (`!on`) every TCP packet to `port` inside
    /// the namespace: new connections time out, open ones go silent.
    ///
    /// # Errors
    ///
    /// [`Error::Command`] if `nft` fails; with `nft` missing, install
    /// `nftables` (`apt-get install nftables`).
    pub fn blackhole(&self, port: u16, on: bool) -> Result<()> {
        let ns = self.namespace.as_str();
        let nft = |args: &[&str]| {
            let mut full = vec!["netns", "exec", ns, "nft"];
            full.extend_from_slice(args);
            run("ip", &full)
        };
        if on {
            nft(&["add", "table", "inet", TABLE])?;
            nft(&[
                "add",
                "chain",
                "inet",
                TABLE,
                "input",
                "{ type filter hook input priority 0 ; policy accept ; }",
            ])?;
            nft(&[
                "add",
                "rule",
                "inet",
                TABLE,
                "input",
                "tcp",
                "dport",
                &port.to_string(),
                "drop",
            ])
        } else {
            nft(&["delete", "table", "inet", TABLE])
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // Deleting the namespace removes the veth pair and every rule in it.
        let _ = run("ip", &["netns", "del", &self.namespace]);
        let _ = run("ip", &["link", "del", &self.veth]);
    }
}

/// Moves this thread into the network namespace at `path`.
fn enter(path: &Path) -> std::io::Result<()> {
    let namespace = std::fs::File::open(path)?;
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&namespace),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
}
