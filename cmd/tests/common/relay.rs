//! A TCP relay that a test can cut: refuse or hang a path while others
//! stay up, as a network partition does.

// Real sockets: the relay runs on the real clock.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// What a relay does with the connections it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Up,
    /// Connections are closed at once, and open ones cut.
    Refuse,
    /// Connections are held and carry nothing, open ones included.
    Hang,
}

/// A TCP relay from its own port to the Lease's apiserver.
pub(crate) struct Relay {
    pub(crate) addr: std::net::SocketAddr,
    /// The path, and the generation token every connection watches: it is
    /// cancelled, and replaced, whenever the path changes.
    state: Arc<Mutex<(Path, CancellationToken)>>,
    /// The process whose connections are counted (0: none), and how many
    /// it opened.
    watched: Arc<(AtomicU32, AtomicU64)>,
}

/// The inode of the TCP socket bound to 127.0.0.1:`port` on this host, as
/// `/proc/net/tcp` lists it.
fn socket_inode(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        (fields.get(1) == Some(&local.as_str()))
            .then(|| fields.get(9)?.parse().ok())
            .flatten()
    })
}

/// Whether process `pid` holds the socket `inode`.
fn holds(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
        fds.flatten().any(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|link| link.as_os_str() == want.as_str())
        })
    })
}

impl Relay {
    pub(crate) async fn start(to: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new((Path::Up, CancellationToken::new())));
        let shared = Arc::clone(&state);
        let watched = Arc::new((AtomicU32::new(0), AtomicU64::new(0)));
        let counting = Arc::clone(&watched);
        tokio::spawn(async move {
            while let Ok((inbound, peer)) = listener.accept().await {
                let pid = counting.0.load(Ordering::SeqCst);
                if pid != 0 && socket_inode(peer.port()).is_some_and(|inode| holds(pid, inode)) {
                    counting.1.fetch_add(1, Ordering::SeqCst);
                }
                let shared = Arc::clone(&shared);
                tokio::spawn(async move {
                    let (path, generation) = shared.lock().expect("not poisoned").clone();
                    let mut held = vec![inbound];
                    if path == Path::Up
                        && let Ok(outbound) = TcpStream::connect(to).await
                    {
                        let mut inbound = held.pop().expect("one");
                        let mut outbound = outbound;
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => return,
                            () = generation.cancelled() => held = vec![inbound, outbound],
                        }
                    }
                    // Refused: dropped at once. Hung: held open, carrying
                    // nothing, until the path changes again.
                    let (path, generation) = shared.lock().expect("not poisoned").clone();
                    if path == Path::Hang {
                        generation.cancelled().await;
                    }
                    drop(held);
                });
            }
        });
        Self {
            addr,
            state,
            watched,
        }
    }

    /// Counts, from now on, the connections process `pid` opens.
    pub(crate) fn watch(&self, pid: u32) {
        self.watched.1.store(0, Ordering::SeqCst);
        self.watched.0.store(pid, Ordering::SeqCst);
    }

    /// The connections the watched process opened since [`Relay::watch`].
    pub(crate) fn opened(&self) -> u64 {
        self.watched.1.load(Ordering::SeqCst)
    }

    /// Switches to `path`: connections open now end (refuse) or freeze
    /// (hang), and new ones follow the new path.
    pub(crate) fn set(&self, path: Path) {
        let mut state = self.state.lock().expect("not poisoned");
        let old = std::mem::replace(&mut *state, (path, CancellationToken::new()));
        old.1.cancel();
    }
}
