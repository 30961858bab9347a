//! The simulated apiserver: a listener, its connections, and the faults that
//! act on them.
//!
//! # Invariants
//!
//! - Every connection's kill switch is a child of the current connection
//!   generation. A fault that ends open connections cancels the generation
//!   and starts a new one, so it reaches every connection open at that
//!   moment and none accepted after.
//! - A killed connection is reset (`SO_LINGER` 0), not closed politely: a
//!   deleted cluster does not say goodbye.
//! - While the fault is `refuse` or `refuse_new`, no listener exists, so the
//!   kernel refuses connections; one accepted while the listener closes is
//!   reset. Leaving the fault binds the same port again, so a server asked
//!   for any port gets one outside the kernel's ephemeral range: no
//!   outgoing connection can take it while it is free.
//! - Under `refuse_new`, established connections are served, but every
//!   watch is cut: its connection is reset, whether the watch was open when
//!   the fault began or started on a kept connection since.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::AsFd as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use http::HeaderMap;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::ServerConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::store::Store;
use crate::tls::Identity;
use crate::{Error, Fault, Kubeconfig, Resource, Result};

/// How to start a simulated apiserver.
#[derive(Debug, Clone)]
pub struct Options {
    /// The address to listen on. Default `127.0.0.1:0`: any free port
    /// below the kernel's ephemeral range.
    pub addr: SocketAddr,
    /// Serve HTTPS with a CA of the server's own. Default `false`.
    pub tls: bool,
    /// Require this bearer token. Default: none.
    pub token: Option<String>,
    /// Whether `/readyz`, `/livez` and `/healthz` answer without a token, as
    /// the apiserver's `system:public-info-viewer` role allows. Default `true`.
    pub anonymous_health: bool,
    /// How often a watch that allows bookmarks gets one. Default 60s, about
    /// what the apiserver does.
    pub bookmark_interval: Duration,
    /// Extra names and addresses the serving certificate is valid for.
    pub extra_names: Vec<String>,
    /// Over HTTPS, require a client certificate the server's CA signed;
    /// kubeconfigs carry one. Default `false`.
    pub client_certs: bool,
    /// Where to keep the CA and serving certificate across starts, so a
    /// server started again comes back as itself. Default: none, a new CA
    /// each start.
    pub state_dir: Option<std::path::PathBuf>,
    /// The name of the cluster in kubeconfigs. Default `fake`.
    pub name: String,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            token: None,
            anonymous_health: true,
            bookmark_interval: Duration::from_secs(60),
            extra_names: Vec::new(),
            client_certs: false,
            state_dir: None,
            name: "fake".to_owned(),
        }
    }
}

impl Options {
    /// Sets the listen address.
    #[must_use]
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Serves HTTPS.
    #[must_use]
    pub fn tls(mut self, tls: bool) -> Self {
        self.tls = tls;
        self
    }

    /// Over HTTPS, requires a client certificate.
    #[must_use]
    pub fn client_certs(mut self, required: bool) -> Self {
        self.client_certs = required;
        self
    }

    /// Requires a bearer token.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Sets whether health endpoints answer without a token.
    #[must_use]
    pub fn anonymous_health(mut self, anonymous: bool) -> Self {
        self.anonymous_health = anonymous;
        self
    }

    /// Sets the bookmark interval.
    #[must_use]
    pub fn bookmark_interval(mut self, interval: Duration) -> Self {
        self.bookmark_interval = interval;
        self
    }

    /// Sets the cluster's name in kubeconfigs.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Adds a name or address to the serving certificate.
    #[must_use]
    pub fn extra_name(mut self, name: impl Into<String>) -> Self {
        self.extra_names.push(name.into());
        self
    }
}

/// How [`ApiServer::restart`] brings the server back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The same CA, token and objects: a process restart.
    SameIdentity,
    /// A recreated cluster: a new CA and token, and an empty store whose
    /// resource versions start a new epoch.
    Recreated,
}

/// What [`ApiServer::rotate`] renews, as a cluster's operator rotates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// A new CA and serving certificate (and, with client certificates, a
    /// new client CA): open connections are reset, as the apiserver
    /// restarts to load them.
    Ca,
    /// A new client CA, and a client certificate it signed: the old client
    /// certificate is refused from now on. Open connections are reset.
    ClientCertificate,
    /// A new bearer token: the old one is refused from the next request.
    Token,
}

/// The requests of one client (a user it acts as) on one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requests {
    /// How many.
    pub count: u64,
    /// When the first came.
    pub first: tokio::time::Instant,
    /// When the last came.
    pub last: tokio::time::Instant,
}

/// Counts and facts about a running server, for assertions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    /// Requests received, by path (without the query); watches count under
    /// `<path>?watch`.
    pub requests: BTreeMap<String, u64>,
    /// Connections open now.
    pub open_connections: usize,
    /// Connections accepted since the server started.
    pub connections_accepted: u64,
    /// Watch streams open now.
    pub open_watches: usize,
    /// Requests that sent or asked for protobuf.
    pub protobuf_requests: u64,
    /// Watch streams served in protobuf framing.
    pub protobuf_watches: u64,
    /// The store's current resource version.
    pub resource_version: u64,
}

#[derive(Debug)]
struct State {
    fault: Fault,
    flap_position: usize,
    identity: Option<Identity>,
    mismatched: Option<Identity>,
    token: Option<String>,
    generation: CancellationToken,
    /// Cancelled while the fault is `refuse_new`: every watch under it is cut.
    watch_cut: CancellationToken,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    options: Options,
    addr: SocketAddr,
    store: Store,
    state: Mutex<State>,
    requests: Mutex<BTreeMap<String, u64>>,
    /// Requests by path and by the user a client acts as: how many, and
    /// when the first and the last came.
    requests_as: Mutex<BTreeMap<(String, String), Requests>>,
    /// Watches open now, by the user their client acts as.
    pub(crate) watches_as: Mutex<BTreeMap<String, usize>>,
    open_connections: AtomicUsize,
    connections_accepted: AtomicU64,
    pub(crate) open_watches: AtomicUsize,
    pub(crate) protobuf_requests: AtomicU64,
    pub(crate) protobuf_watches: AtomicU64,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections only assign fields; a poisoned lock is consistent.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn new_token() -> String {
    format!("tether-{:016x}", fastrand::u64(..))
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn fault(&self) -> Fault {
        self.state().fault.clone()
    }

    /// The token that cuts a watch starting now.
    pub(crate) fn watch_cut(&self) -> CancellationToken {
        self.state().watch_cut.child_token()
    }

    /// Steps the flap script; returns whether this tick is up.
    pub(crate) fn advance_flap(&self) -> bool {
        let mut state = self.state();
        let position = state.flap_position;
        state.flap_position += 1;
        match &state.fault {
            Fault::Flap(steps) if !steps.is_empty() => steps[position % steps.len()],
            _ => true,
        }
    }

    pub(crate) fn anonymous_health(&self) -> bool {
        self.options.anonymous_health
    }

    pub(crate) fn bookmark_interval(&self) -> Duration {
        self.options.bookmark_interval
    }

    pub(crate) fn authorized(&self, headers: &HeaderMap) -> bool {
        let state = self.state();
        let Some(token) = &state.token else {
            return true;
        };
        headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| given == token)
    }

    pub(crate) fn count_request(&self, path: &str, acting_as: Option<&str>) {
        *lock(&self.requests).entry(path.to_owned()).or_default() += 1;
        if let Some(user) = acting_as {
            let now = tokio::time::Instant::now();
            lock(&self.requests_as)
                .entry((path.to_owned(), user.to_owned()))
                .and_modify(|r| {
                    r.count += 1;
                    r.last = now;
                })
                .or_insert(Requests {
                    count: 1,
                    first: now,
                    last: now,
                });
        }
    }

    /// Resets every open connection and starts a new generation.
    fn kill_connections(state: &mut State) {
        state.generation.cancel();
        state.generation = CancellationToken::new();
    }

    fn stop_listening(state: &mut State) -> Option<JoinHandle<()>> {
        let acceptor = state.acceptor.take();
        if let Some(task) = &acceptor {
            task.abort();
        }
        acceptor
    }
}

/// A running simulated apiserver. Cloning gives another handle to the same
/// server; the server stops when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct ApiServer {
    shared: Arc<Shared>,
    _stop: Arc<StopOnDrop>,
}

#[derive(Debug)]
struct StopOnDrop(Arc<Shared>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let mut state = self.0.state();
        Shared::stop_listening(&mut state);
        Shared::kill_connections(&mut state);
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

/// The first port of the kernel's ephemeral range, which it gives outgoing
/// connections and binds to port 0.
fn ephemeral_from() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// The lowest port [`bind_new`] picks from.
const FIRST_PORT: u16 = 10_000;

/// `addr`, or, when it asks for any port (0), a free port of its address
/// below the ephemeral range. A server that leaves `refuse` binds its port
/// again, and an ephemeral port left free meanwhile may be taken by any
/// outgoing connection on the machine (seen under load as `AddrInUse`).
async fn bind_new(addr: SocketAddr) -> Result<TcpListener> {
    let below = ephemeral_from().unwrap_or(0);
    if addr.port() != 0 || below <= FIRST_PORT {
        return bind(addr).await;
    }
    for _ in 0..256 {
        let port = SocketAddr::new(addr.ip(), fastrand::u16(FIRST_PORT..below));
        match TcpListener::bind(port).await {
            Ok(listener) => return Ok(listener),
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(source) => return Err(Error::Bind { addr, source }),
        }
    }
    bind(addr).await
}

impl ApiServer {
    /// Starts a server with `options`.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] if the address is taken, and [`Error::Tls`] or
    /// [`Error::Rustls`] if the certificates cannot be made.
    pub async fn start(options: Options) -> Result<Self> {
        let listener = bind_new(options.addr).await?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: options.addr,
            source,
        })?;
        let ca_name = format!("{}-ca", options.name);
        let identity = match (&options.state_dir, options.tls) {
            (_, false) => None,
            (Some(dir), true) => Some(Identity::kept_in(
                dir,
                &ca_name,
                &options.extra_names,
                options.client_certs,
            )?),
            (None, true) => Some(Identity::generate(
                &ca_name,
                &options.extra_names,
                options.client_certs,
            )?),
        };
        let shared = Arc::new(Shared {
            addr,
            store: Store::new(),
            state: Mutex::new(State {
                fault: Fault::Up,
                flap_position: 0,
                identity,
                mismatched: None,
                token: options.token.clone(),
                generation: CancellationToken::new(),
                watch_cut: CancellationToken::new(),
                acceptor: None,
            }),
            requests: Mutex::default(),
            requests_as: Mutex::default(),
            watches_as: Mutex::default(),
            open_connections: AtomicUsize::new(0),
            connections_accepted: AtomicU64::new(0),
            open_watches: AtomicUsize::new(0),
            protobuf_requests: AtomicU64::new(0),
            protobuf_watches: AtomicU64::new(0),
            options,
        });
        shared.state().acceptor = Some(tokio::spawn(accept_loop(Arc::clone(&shared), listener)));
        Ok(Self {
            _stop: Arc::new(StopOnDrop(Arc::clone(&shared))),
            shared,
        })
    }

    /// The address the server listens on.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The server's URL, `http(s)://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        let scheme = if self.shared.options.tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The current CA certificate (PEM), for HTTPS servers.
    #[must_use]
    pub fn ca_pem(&self) -> Option<String> {
        self.shared
            .state()
            .identity
            .as_ref()
            .map(|i| i.ca_pem.clone())
    }

    /// The current bearer token, if one is required.
    #[must_use]
    pub fn token(&self) -> Option<String> {
        self.shared.state().token.clone()
    }

    /// A kubeconfig that reaches the server as it is now.
    #[must_use]
    pub fn kubeconfig(&self) -> Kubeconfig {
        Kubeconfig {
            name: self.shared.options.name.clone(),
            server: self.url(),
            ca_pem: self.ca_pem(),
            token: self.token(),
            client_cert: self
                .shared
                .state()
                .identity
                .as_ref()
                .and_then(|i| i.client.clone()),
            impersonate: None,
        }
    }

    /// The fault in force.
    #[must_use]
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// Switches to `fault`. When this returns, the fault is in force for new
    /// connections, and open ones are reset if the fault ends them.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] if leaving `refuse` or `refuse_new` cannot bind the
    /// port again, and
    /// [`Error::Unsupported`] for `tls_mismatch` on a plain-HTTP server.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe: dropped while leaving `refuse` or `refuse_new`, the
    /// server may stay without a listener until the next call.
    pub async fn set_fault(&self, fault: Fault) -> Result<()> {
        if fault == Fault::TlsMismatch && !self.shared.options.tls {
            return Err(Error::Unsupported(
                "tls_mismatch needs a server started with TLS",
            ));
        }
        let stopped = {
            let mut state = self.shared.state();
            if fault == Fault::TlsMismatch && state.mismatched.is_none() {
                state.mismatched = Some(Identity::generate(
                    "impostor-ca",
                    &self.shared.options.extra_names,
                    self.shared.options.client_certs,
                )?);
            }
            state.fault = fault.clone();
            state.flap_position = 0;
            if fault.kills_connections() {
                Shared::kill_connections(&mut state);
            }
            if fault == Fault::RefuseNew {
                state.watch_cut.cancel();
            } else if state.watch_cut.is_cancelled() {
                state.watch_cut = CancellationToken::new();
            }
            if fault.closes_listener() {
                Shared::stop_listening(&mut state)
            } else {
                None
            }
        };
        if let Some(task) = stopped {
            // Wait until the task, and with it the listener, is gone.
            let _ = task.await;
        }
        if !fault.closes_listener() {
            self.ensure_listening().await?;
        }
        debug!(server = %self.shared.addr, %fault, "fault set");
        Ok(())
    }

    async fn ensure_listening(&self) -> Result<()> {
        if self.shared.state().acceptor.is_some() {
            return Ok(());
        }
        let listener = bind(self.shared.addr).await?;
        let task = tokio::spawn(accept_loop(Arc::clone(&self.shared), listener));
        let previous = self.shared.state().acceptor.replace(task);
        if let Some(previous) = previous {
            previous.abort();
        }
        Ok(())
    }

    /// Restarts the server on the same port: connections are reset, and the
    /// server comes back `up`, as itself or as a recreated cluster.
    ///
    /// # Errors
    ///
    /// As for [`set_fault`](Self::set_fault), and [`Error::Tls`] if new
    /// certificates cannot be made.
    ///
    /// # Cancellation safety
    ///
    /// Not cancel safe, as [`set_fault`](Self::set_fault).
    pub async fn restart(&self, how: Restart) -> Result<()> {
        self.set_fault(Fault::Refuse).await?;
        if how == Restart::Recreated {
            let identity = if self.shared.options.tls {
                Some(Identity::generate(
                    &format!("{}-ca", self.shared.options.name),
                    &self.shared.options.extra_names,
                    self.shared.options.client_certs,
                )?)
            } else {
                None
            };
            let mut state = self.shared.state();
            state.identity = identity;
            state.mismatched = None;
            if state.token.is_some() {
                state.token = Some(new_token());
            }
            self.shared.store.recreate();
        }
        self.set_fault(Fault::Up).await
    }

    /// Renews what `what` names while the server keeps serving, its objects
    /// and its other credentials unchanged: between this call and the
    /// client's update, only the client's old credentials fail.
    ///
    /// # Errors
    ///
    /// [`Error::Unsupported`] for a credential the server does not use
    /// (a CA over plain HTTP, a token or client certificate not required),
    /// and [`Error::Tls`] if new certificates cannot be made.
    pub fn rotate(&self, what: Rotation) -> Result<()> {
        let options = &self.shared.options;
        let mut state = self.shared.state();
        match what {
            Rotation::Ca => {
                if !options.tls {
                    return Err(Error::Unsupported("a CA needs a server started with TLS"));
                }
                state.identity = Some(Identity::generate(
                    &format!("{}-ca", options.name),
                    &options.extra_names,
                    options.client_certs,
                )?);
            }
            Rotation::ClientCertificate => {
                let renewed = match &state.identity {
                    Some(identity) if options.client_certs => identity.with_new_client_ca()?,
                    _ => {
                        return Err(Error::Unsupported(
                            "a client certificate needs a server that requires one",
                        ));
                    }
                };
                state.identity = Some(renewed);
            }
            Rotation::Token => {
                if state.token.is_none() {
                    return Err(Error::Unsupported("no token is required"));
                }
                state.token = Some(new_token());
                return Ok(());
            }
        }
        Shared::kill_connections(&mut state);
        Ok(())
    }

    /// Creates or replaces an object, as an API client would, and returns it
    /// as stored. The object passes through its kind's schema, as a
    /// client's would: unknown fields are dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Api`] if the store rejects it (a missing name or namespace,
    /// a field of the wrong type).
    pub fn put(
        &self,
        resource: Resource,
        namespace: &str,
        object: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let name = object["metadata"]["name"]
            .as_str()
            .ok_or_else(|| Error::Api("metadata.name is required".to_owned()))?
            .to_owned();
        if resource.namespaced() && !self.shared.store.namespace_exists(namespace) {
            return Err(Error::Api(format!(
                "namespace {namespace:?} does not exist"
            )));
        }
        let mut object = object;
        if let Some(metadata) = object["metadata"].as_object_mut() {
            metadata.remove("resourceVersion");
        }
        let object = crate::proto::admit(resource, &object)
            .map_err(|e| Error::Api(e.message))?
            .object;
        self.shared
            .store
            .commit(resource, namespace, &name, false, |_| {
                Ok(crate::store::Change::Put(object))
            })
            .map_err(|e| Error::Api(e.message))
    }

    /// Makes the next `n` updates (PUT) of any object of `resource` lose a
    /// race: just before each, another writer changes the object's
    /// annotations, so the update, which carries the `resourceVersion` its
    /// client read, gets `409 Conflict`, as a real apiserver answers when
    /// two writers race. `u64::MAX` makes every update lose.
    pub fn lose_updates(&self, resource: Resource, n: u64) {
        self.shared.store.lose_updates(resource, n);
    }

    /// Deletes an object; returns whether it existed.
    #[must_use = "a delete of an object that does not exist is usually a test bug"]
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> bool {
        self.shared
            .store
            .write(
                resource,
                namespace,
                name,
                serde_json::Value::Null,
                crate::store::EventType::Deleted,
            )
            .is_ok()
    }

    /// Requests, connections and watches, as counted now.
    #[must_use]
    pub fn stats(&self) -> Stats {
        Stats {
            requests: lock(&self.shared.requests).clone(),
            open_connections: self.shared.open_connections.load(Ordering::SeqCst),
            connections_accepted: self.shared.connections_accepted.load(Ordering::SeqCst),
            open_watches: self.shared.open_watches.load(Ordering::SeqCst),
            protobuf_requests: self.shared.protobuf_requests.load(Ordering::SeqCst),
            protobuf_watches: self.shared.protobuf_watches.load(Ordering::SeqCst),
            resource_version: self.shared.store.rv(),
        }
    }

    /// How many requests `path` has received from each client that acts as
    /// a user (`Impersonate-User`, a kubeconfig's `as:`), by that user.
    #[must_use]
    pub fn requests_by(&self, path: &str) -> BTreeMap<String, Requests> {
        lock(&self.shared.requests_as)
            .iter()
            .filter(|((p, _), _)| p == path)
            .map(|((_, user), r)| (user.clone(), *r))
            .collect()
    }

    /// The watches open now from each client that acts as a user, by
    /// that user.
    #[must_use]
    pub fn open_watches_by(&self) -> BTreeMap<String, usize> {
        lock(&self.shared.watches_as).clone()
    }

    /// How many requests `path` has received.
    #[must_use]
    pub fn requests(&self, path: &str) -> u64 {
        lock(&self.shared.requests).get(path).copied().unwrap_or(0)
    }
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(err) => {
                // Out of descriptors and the like: back off, then go on.
                warn!(error = %err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (fault, kill, tls) = {
            let state = shared.state();
            let identity = if state.fault == Fault::TlsMismatch {
                state.mismatched.as_ref()
            } else {
                state.identity.as_ref()
            };
            (
                state.fault.clone(),
                state.generation.child_token(),
                identity.map(|i| Arc::clone(&i.server_config)),
            )
        };
        tokio::spawn(serve_connection(
            Arc::clone(&shared),
            stream,
            fault,
            kill,
            tls,
        ));
    }
}

/// Counts a connection as open for as long as it lives.
struct OpenConnection(Arc<Shared>);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.open_connections.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn serve_connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    fault: Fault,
    kill: CancellationToken,
    tls: Option<Arc<ServerConfig>>,
) {
    shared.open_connections.fetch_add(1, Ordering::SeqCst);
    shared.connections_accepted.fetch_add(1, Ordering::SeqCst);
    let _open = OpenConnection(Arc::clone(&shared));
    let _ = stream.set_nodelay(true);
    // A second handle on the socket, so it can be reset after hyper owns it.
    let Ok(socket) = stream
        .as_fd()
        .try_clone_to_owned()
        .map(socket2::Socket::from)
    else {
        return;
    };
    let reset = || {
        let _ = socket.set_linger(Some(Duration::ZERO));
    };
    match fault {
        // Accepted while the listener was being closed: a refusing server
        // has no listener, so it never serves this.
        Fault::Reset | Fault::Refuse | Fault::RefuseNew => return reset(),
        Fault::Hang => {
            kill.cancelled().await;
            return reset();
        }
        _ => {}
    }

    let service = {
        let kill = kill.clone();
        service_fn(move |req| {
            let shared = Arc::clone(&shared);
            let kill = kill.clone();
            async move { Ok::<_, std::convert::Infallible>(crate::api::handle(shared, kill, req).await) }
        })
    };
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new());
    let served = async {
        match tls {
            Some(config) => match TlsAcceptor::from(config).accept(stream).await {
                Ok(tls) => http.serve_connection(TokioIo::new(tls), service).await,
                Err(err) => {
                    debug!(error = %err, "TLS handshake failed");
                    Ok(())
                }
            },
            None => http.serve_connection(TokioIo::new(stream), service).await,
        }
    };
    tokio::select! {
        result = served => {
            if let Err(err) = result {
                debug!(error = %err, "connection ended with an error");
            }
        }
        () = kill.cancelled() => reset(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server asked for any port listens below the ephemeral range, so
    /// that no outgoing connection can take its port while a `refuse`
    /// fault has it free, and it binds that port again when the fault ends.
    #[tokio::test]
    async fn any_port_is_below_the_ephemeral_range_and_kept_across_a_refusal() {
        let below = ephemeral_from().expect("the kernel's ephemeral range");
        let server = ApiServer::start(Options::default())
            .await
            .expect("a server");
        let port = server.addr().port();
        assert!(
            (FIRST_PORT..below).contains(&port),
            "{port} is not in {FIRST_PORT}..{below}"
        );
        server.set_fault(Fault::Refuse).await.expect("refuse");
        assert!(
            std::net::TcpStream::connect(server.addr()).is_err(),
            "refused"
        );
        server.set_fault(Fault::Up).await.expect("up");
        assert_eq!(server.addr().port(), port);
        std::net::TcpStream::connect(server.addr()).expect("listening again");
    }
}
