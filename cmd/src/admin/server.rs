//! The admin server's socket: a bounded number of connections, a deadline
//! on request heads, and a descriptor held in reserve for `/healthz`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Admin;

/// The admin server's listener, and a file descriptor held in reserve for
/// it, taken before anything else can use them up.
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    spare: Option<std::fs::File>,
}

impl Listener {
    /// The address it listens on.
    ///
    /// # Errors
    ///
    /// As `TcpListener::local_addr`.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// How many connections the kernel may hold for the admin server before it
/// accepts them: the kernel caps it at `net.core.somaxconn` (4096 since
/// Linux 5.4), as Go's servers ask for. Tokio's own `bind` asks for 128,
/// and a burst of connections that outran the accept loop by that many
/// had the kernel drop the next ones: a kubelet probe among them waits a
/// second for its SYN to be sent again, as long as its timeout.
const BACKLOG: u32 = 4096;

/// Binds the admin address, and reserves a descriptor for it.
///
/// # Errors
///
/// The bind error, for the caller to report with the address and exit.
pub fn bind(addr: SocketAddr) -> std::io::Result<Listener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind`: a restarted tether may take its port back
    // from connections still closing.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(Listener {
        tcp: socket.listen(BACKLOG)?,
        spare: reserve(),
    })
}

/// The most admin connections open at once. A new one beyond it closes
/// the oldest, so idle connections from outside can neither run tether out
/// of descriptors nor lock the kubelet out of `/healthz`.
pub const MAX_CONNECTIONS: usize = 32;

/// How long a connection may take to send a request's head, waiting for
/// the next one on an idle kept-alive connection included.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest the accept loop waits after an accept fails (out of
/// descriptors, say) before it tries again; the wait starts at 10 ms and
/// doubles.
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// The descriptor held in reserve for the admin server, while it is.
type Spare = Arc<std::sync::Mutex<Option<std::fs::File>>>;

/// Opens a descriptor to hold in reserve.
fn reserve() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Closes the reserved descriptor, if there is one to give up.
fn give_up(spare: &Spare) -> bool {
    crate::lock(spare).take().is_some()
}

/// Reserves a descriptor again, if none is.
fn take_back(spare: &Spare) {
    let mut spare = crate::lock(spare);
    if spare.is_none() {
        *spare = reserve();
    }
}

/// The open connections, oldest first, each with what closes it.
type Open = Arc<std::sync::Mutex<std::collections::VecDeque<(u64, CancellationToken)>>>;

fn open_lock(
    open: &Open,
) -> std::sync::MutexGuard<'_, std::collections::VecDeque<(u64, CancellationToken)>> {
    // Critical sections only push and remove; a poisoned queue is whole.
    open.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serves `admin` on `listener` until `stop`.
///
/// At most [`MAX_CONNECTIONS`] connections are open; a request head must
/// arrive within [`HEAD_TIMEOUT`]. An accept that fails backs off, up to a
/// second, instead of spinning.
///
/// # Cancellation safety
///
/// Cancel safe: dropping it stops accepting; open connections finish.
pub async fn serve(listener: Listener, admin: Arc<Admin>, stop: CancellationToken) {
    let Listener {
        tcp: listener,
        spare,
    } = listener;
    let open: Open = Arc::default();
    let mut next_id = 0u64;
    let mut backoff = Duration::ZERO;
    // A descriptor held in reserve: when the process has none left (its
    // remotes took them all), it is given up to accept one admin connection,
    // so `/healthz` still answers, and that connection takes it back as it
    // closes, before anything else can.
    let spare: Spare = Arc::new(std::sync::Mutex::new(spare));
    loop {
        take_back(&spare);
        let mut reserved = false;
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    backoff = Duration::ZERO;
                    stream
                }
                Err(err) if tether_probes::client::out_of_descriptors(&err) && give_up(&spare) => {
                    debug!("admin accept: out of descriptors; using the reserved one");
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            reserved = true;
                            stream
                        }
                        Err(err) => {
                            debug!(error = %err, "admin accept failed even with the reserved descriptor");
                            take_back(&spare);
                            continue;
                        }
                    }
                }
                Err(err) => {
                    if backoff.is_zero() {
                        warn!(error = %err, "admin accept failed; backing off");
                    } else {
                        debug!(error = %err, ?backoff, "admin accept failed again");
                    }
                    backoff = (backoff * 2).clamp(Duration::from_millis(10), MAX_ACCEPT_BACKOFF);
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(backoff) => {}
                    }
                    continue;
                }
            },
        };
        let id = next_id;
        next_id += 1;
        let close = CancellationToken::new();
        {
            let mut open = open_lock(&open);
            if open.len() >= MAX_CONNECTIONS
                && let Some((_, oldest)) = open.pop_front()
            {
                oldest.cancel();
            }
            open.push_back((id, close.clone()));
        }
        let admin = Arc::clone(&admin);
        let open = Arc::clone(&open);
        let spare = Arc::clone(&spare);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = admin.respond(req.method(), req.uri());
                async move { Ok::<_, Infallible>(response) }
            });
            let mut http = http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT);
            let served = http.serve_connection(TokioIo::new(stream), service);
            // Dropping the connection closes its socket.
            tokio::select! {
                _ = served => {}
                () = close.cancelled() => debug!("admin connection closed: the oldest of too many"),
            }
            open_lock(&open).retain(|(open_id, _)| *open_id != id);
            if reserved {
                take_back(&spare);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_kernel_holds_a_burst_of_connections_the_server_has_not_accepted_yet() {
        let listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).expect("binds");
        let addr = listener.local_addr().expect("bound");
        // More than the 129 that tokio's own `bind` lets the kernel hold;
        // nothing accepts them, so a SYN the kernel dropped for a full
        // queue would never be answered.
        let mut held = Vec::new();
        for i in 0..300 {
            let connected =
                tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                    .await
                    .unwrap_or_else(|_| {
                        panic!("the kernel dropped connection {i}: the backlog is full")
                    });
            held.push(connected.expect("connects"));
        }
        drop(listener);
    }
}
