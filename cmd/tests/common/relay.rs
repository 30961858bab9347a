//! A TCP relay that a test can cut: refuse or hang a path while others
//! stay up, as a network partition does.

// Real sockets: the relay runs on the real clock.
#![allow(clippy::disallowed_methods)]

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
}

impl Relay {
    pub(crate) async fn start(to: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new((Path::Up, CancellationToken::new())));
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
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
        Self { addr, state }
    }

    /// Switches to `path`: connections open now end (refuse) or freeze
    /// (hang), and new ones follow the new path.
    pub(crate) fn set(&self, path: Path) {
        let mut state = self.state.lock().expect("not poisoned");
        let old = std::mem::replace(&mut *state, (path, CancellationToken::new()));
        old.1.cancel();
    }
}
