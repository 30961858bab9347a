//! One probe: `GET <path>` on a connection kept for probing.
//!
//! A probe needs far less than kube's client: one request on one kept-alive
//! connection. kube's client costs a tower buffer task, a connection pool
//! and a stack of layers per remote, which dominated tether's memory and CPU
//! at thousands of remotes. So a remote is probed on a single HTTP/1.1
//! connection held by its probe, with kube's own TLS configuration and auth
//! layers (token files, exec plugins, client certificates, impersonation),
//! so a probe authenticates exactly as the remote's watches do. Remotes
//! behind a proxy are probed through kube's client, which speaks to proxies.

use std::error::Error as StdError;
use std::future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{Request, Response};
use http_body_util::{BodyExt as _, Empty};
use kube::client::ConfigExt as _;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tower::util::BoxService;
use tower::{BoxError, Service as _, ServiceBuilder, ServiceExt as _};

use crate::classify::{
    FailureCause, LocalKind, Outcome, ProbeResult, cause_in, classify, out_of_descriptors,
    root_cause,
};
use crate::credentials::PLUGIN_DEADLINE;
use crate::http::{self as exchange, ExchangeError, MAX_BODY};
use crate::wire::{TlsWire, Wire};
use crate::{Error, ProbeConfig, Result};

/// Turns a probe request into what is sent: base URL, credentials, extra
/// headers, exactly as kube's client would.
type Decorate = BoxService<Request<Empty<Bytes>>, Request<Empty<Bytes>>, BoxError>;

/// The client one remote is probed with: see [`probe_client`].
pub struct ProbeClient(Transport);

impl std::fmt::Debug for ProbeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.0 {
            Transport::Direct(_) => "ProbeClient(direct)",
            Transport::Proxied(_) => "ProbeClient(proxied)",
        })
    }
}

/// Boxed either way: the idle probe task holds it, and a `kube::Client`
/// inline would add 80 bytes to every task for the rare proxied remote.
enum Transport {
    Direct(Box<Direct>),
    Proxied(Box<kube::Client>),
}

struct Direct {
    host: String,
    port: u16,
    /// The `Host` header: the URL's authority, without userinfo.
    authority: String,
    tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    decorate: Decorate,
    /// Whether the credentials can change within the client's life (a
    /// token file, an exec plugin, an auth provider), so that a prepared
    /// request is sent again only within [`REFRESHABLE_REUSE`].
    refreshable: bool,
    /// The request prepared last, sent again while it may be.
    prepared: Option<Reusable>,
    /// A kept connection older than this is replaced by a new one.
    max_age: Duration,
    conn: Option<Conn>,
}

/// How long a request whose credentials can change is sent again before
/// kube's auth layer is asked anew. kube hands out an exec plugin's token
/// with at least 10 s of life left and re-reads a token file every 50 s, so
/// a token sent up to 5 s later is still valid, and a rotated file is seen
/// within 55 s (client-go: a minute).
pub(crate) const REFRESHABLE_REUSE: Duration = Duration::from_secs(5);

/// A prepared request: for which path, its bytes, and until when it may be
/// sent again (`None`: for the client's life, its credentials are fixed).
struct Reusable {
    path: String,
    bytes: Bytes,
    until: Option<Instant>,
}

/// A kept-alive connection, held by the probe itself (no task drives it),
/// and when it reaches the client's `max_age` (`None`: past any instant).
struct Conn {
    stream: Wire,
    retires: Option<Instant>,
}

impl Conn {
    /// Whether it is younger than its `max_age` at `now`, so it may be kept:
    /// a kept connection may answer long after the remote stopped taking
    /// new ones. A comparison, asked twice a probe: the age itself, a
    /// subtraction of instants, cost about 75 instructions a probe.
    fn young(&self, now: Instant) -> bool {
        self.retires.is_none_or(|retires| now < retires)
    }
}

/// Why a request got no status.
enum Failure {
    /// Before the network (credentials, the request itself), or no
    /// descriptor left here.
    Local { kind: LocalKind, error: String },
    /// The transport failed.
    Transport { cause: FailureCause, error: String },
}

impl Failure {
    fn local(error: &(dyn StdError + 'static)) -> Self {
        Self::Local {
            kind: LocalKind::of(error),
            error: root_cause(error),
        }
    }

    /// A transport failure, unless it is this process's own (no descriptor
    /// left to connect with).
    fn transport(error: &(dyn StdError + 'static), fallback: FailureCause) -> Self {
        if out_of_descriptors(error) {
            return Self::local(error);
        }
        Self::Transport {
            cause: cause_in(error, fallback),
            error: root_cause(error),
        }
    }

    fn of_exchange(error: &ExchangeError) -> Self {
        match error {
            ExchangeError::Io(err) => Self::transport(err, FailureCause::Reset),
            ExchangeError::Closed { partial: false } => Self::Transport {
                cause: FailureCause::Reset,
                error: "the connection closed before an answer".to_owned(),
            },
            ExchangeError::Closed { partial: true } => Self::Transport {
                cause: FailureCause::Reset,
                error: "the connection closed in the middle of the answer".to_owned(),
            },
            ExchangeError::Invalid(err) => Self::Transport {
                cause: FailureCause::Other,
                error: format!("the answer is not HTTP/1.1: {err}"),
            },
        }
    }
}

/// Builds the client a probe uses from a remote's kube configuration.
///
/// The client keeps one connection to the remote and reuses it from probe to
/// probe, until it is `probe.max_connection_age` old; it never retries a
/// status. Every probe is bounded by its deadline
/// in [`probe_once`], connecting and TLS included.
///
/// A remote behind a proxy is probed through kube's client instead, with
/// `default_retry` off, connect and write timeouts of `probe.timeout`, and
/// a read timeout of twice the interval (shorter, it would also kill the
/// pooled connection idling between probes).
///
/// # Errors
///
/// [`Error::Client`] if the configuration cannot make a client (a bad
/// certificate, an invalid server name, unusable credentials).
pub fn probe_client(config: &kube::Config, probe: &ProbeConfig) -> Result<ProbeClient> {
    let mut config = config.clone();
    // Userinfo in a server URL authenticates nothing for kube, but the URL
    // ends up in library trace logs; the probe's client never carries it.
    config.cluster_url = without_userinfo(&config.cluster_url);
    if config.proxy_url.is_some() {
        config.default_retry = false;
        config.connect_timeout = Some(probe.timeout);
        config.write_timeout = Some(probe.timeout);
        config.read_timeout = Some(probe.interval * 2);
        return kube::Client::try_from(config)
            .map(|client| ProbeClient(Transport::Proxied(Box::new(client))))
            .map_err(Error::Client);
    }
    Direct::new(&config, probe.max_connection_age)
        .map(|direct| ProbeClient(Transport::Direct(Box::new(direct))))
}

impl Direct {
    fn new(config: &kube::Config, max_age: Duration) -> Result<Self> {
        let url = &config.cluster_url;
        let https = url.scheme_str() == Some("https");
        let host = url
            .host()
            .unwrap_or_default()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let authority = url
            .authority()
            .map_or_else(|| "localhost".to_owned(), |a| a.as_str().to_owned());
        let tls = if https {
            let mut tls = config.rustls_client_config().map_err(Error::Client)?;
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            // No session resumption: each stored TLS 1.3 ticket keeps a copy
            // of the server's certificate chain, 3.4 KiB a remote at
            // 10,000 remotes, to save a certificate check on the rare new
            // connection (past `maxConnectionAge`, or after a failure).
            tls.resumption = rustls::client::Resumption::disabled();
            let name = config
                .tls_server_name
                .clone()
                .unwrap_or_else(|| host.clone());
            let name =
                ServerName::try_from(name.clone()).map_err(|_| Error::InvalidServerName(name))?;
            Some((Arc::new(tls), name))
        } else {
            None
        };
        // kube's auth layer only wraps services that answer with a
        // `Response`, so the innermost service hands the finished request
        // back as a response's body.
        let echo =
            tower::service_fn(|request| future::ready(Ok::<_, BoxError>(Response::new(request))));
        let decorate = ServiceBuilder::new()
            .layer(config.base_uri_layer())
            .option_layer(config.auth_layer().map_err(Error::Client)?)
            .layer(config.extra_headers_layer().map_err(Error::Client)?)
            .service(echo)
            .map_response(Response::into_body);
        let auth = &config.auth_info;
        Ok(Self {
            host,
            port,
            authority,
            tls,
            decorate: BoxService::new(decorate),
            refreshable: auth.token_file.is_some()
                || auth.exec.is_some()
                || auth.auth_provider.is_some(),
            prepared: None,
            max_age,
            conn: None,
        })
    }

    /// The request prepared last for `path`, if it may be sent again: the
    /// same bytes kube's layers would give, without running them.
    fn reusable(&self, path: &str) -> Option<Bytes> {
        let prepared = self.prepared.as_ref()?;
        (prepared.path == path && prepared.until.is_none_or(|until| Instant::now() < until))
            .then(|| prepared.bytes.clone())
    }

    /// The request as kube would send it (base URL, credentials, which may
    /// run an exec plugin's refresh, extra headers), written out as
    /// HTTP/1.1: the path and a `Host` header, not the absolute URL.
    async fn prepare(&mut self, path: &str) -> Result<Bytes, Failure> {
        let request = Request::get(path)
            .body(Empty::new())
            .map_err(|err| Failure::local(&err))?;
        let request = self
            .decorate
            .ready()
            .await
            .map_err(|err| Failure::local(err.as_ref()))?
            .call(request)
            .await
            .map_err(|err| Failure::local(err.as_ref()))?;
        let target = request
            .uri()
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let mut out = Vec::with_capacity(128);
        for part in [
            b"GET ".as_slice(),
            target.as_bytes(),
            b" HTTP/1.1\r\nhost: ",
            self.authority.as_bytes(),
            b"\r\n",
        ] {
            out.extend_from_slice(part);
        }
        for (name, value) in request.headers() {
            if name != HOST {
                for part in [name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"] {
                    out.extend_from_slice(part);
                }
            }
        }
        out.extend_from_slice(b"\r\n");
        let bytes = Bytes::from(out);
        self.prepared = Some(Reusable {
            path: path.to_owned(),
            bytes: bytes.clone(),
            until: self.refreshable.then(|| Instant::now() + REFRESHABLE_REUSE),
        });
        Ok(bytes)
    }

    /// Sends `request` on the kept connection, or a new one; `now` is when
    /// the probe started.
    async fn exchange(&mut self, request: &[u8], now: Instant) -> Result<u16, Failure> {
        // A kept connection may answer long after the remote stopped taking
        // new ones; past its age, the probe checks a new one.
        if let Some(conn) = self.conn.take()
            && conn.young(now)
        {
            // A kept connection may have died since the last probe; a fresh
            // one answers for the remote, as a pool would retry.
            if let Ok(status) = self.send(conn, request).await {
                return Ok(status);
            }
        }
        // Boxed: a new connection is rare, and its handshake inline would
        // size every probe's future (1,680 bytes, not 1,008: see the test
        // `a_probe_future_fits_the_allocator_cache`).
        let conn = Box::pin(self.connect()).await?;
        self.send(conn, request).await
    }

    /// One exchange on `conn`, which is kept if the answer leaves it clean.
    async fn send(&mut self, mut conn: Conn, request: &[u8]) -> Result<u16, Failure> {
        let answer = exchange::exchange(&mut conn.stream, request)
            .await
            .map_err(|err| Failure::of_exchange(&err))?;
        if answer.reusable {
            conn.stream.idle();
            self.conn = Some(conn);
        }
        Ok(answer.status)
    }

    async fn connect(&self) -> Result<Conn, Failure> {
        let addresses = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(|err| Failure::transport(&err, FailureCause::Dns))?;
        let mut last = None;
        let mut stream = None;
        for address in addresses {
            match TcpStream::connect(address).await {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(err) => last = Some(err),
            }
        }
        let stream = match (stream, last) {
            (Some(stream), _) => stream,
            (None, Some(err)) => return Err(Failure::transport(&err, FailureCause::Other)),
            (None, None) => {
                return Err(Failure::Transport {
                    cause: FailureCause::Dns,
                    error: format!("{} resolved to no address", self.host),
                });
            }
        };
        // Nagle would hold back the request behind the handshake's last ack.
        stream
            .set_nodelay(true)
            .map_err(|err| Failure::transport(&err, FailureCause::Other))?;
        let stream = match &self.tls {
            None => Wire::Plain(stream),
            Some((config, name)) => Wire::Tls(Box::new(
                TlsWire::connect(stream, Arc::clone(config), name.clone())
                    .await
                    .map_err(|err| Failure::transport(&err, FailureCause::Tls))?,
            )),
        };
        Ok(Conn {
            stream,
            retires: Instant::now().checked_add(self.max_age),
        })
    }
}

/// A probe request with its credentials, ready to send.
enum Prepared {
    /// The request's bytes.
    Direct(Bytes),
    /// kube's client adds the credentials itself as it sends.
    Proxied(String),
}

impl ProbeClient {
    /// The request for `path` if it is ready without waiting: prepared
    /// before and still valid, or through a proxy (kube's client adds the
    /// credentials as it sends).
    fn reusable(&self, path: &str) -> Option<Prepared> {
        match &self.0 {
            Transport::Direct(direct) => direct.reusable(path).map(Prepared::Direct),
            Transport::Proxied(_) => Some(Prepared::Proxied(path.to_owned())),
        }
    }

    async fn prepare(&mut self, path: &str) -> Result<Prepared, Failure> {
        match &mut self.0 {
            Transport::Direct(direct) => direct.prepare(path).await.map(Prepared::Direct),
            Transport::Proxied(_) => Ok(Prepared::Proxied(path.to_owned())),
        }
    }

    async fn exchange(&mut self, prepared: &Prepared, now: Instant) -> Result<u16, Failure> {
        match (&mut self.0, prepared) {
            (Transport::Direct(direct), Prepared::Direct(request)) => {
                direct.exchange(request, now).await
            }
            (Transport::Proxied(client), Prepared::Proxied(path)) => {
                proxied_get(client, path).await
            }
            _ => Err(Failure::Local {
                kind: LocalKind::Other,
                error: "a request prepared for another transport".to_owned(),
            }),
        }
    }

    /// Whether a probe starting at `now` opens a new connection: none is
    /// kept, or the kept one is past its age. kube's client (through a
    /// proxy) keeps its own.
    pub(crate) fn needs_connection(&self, now: Instant) -> bool {
        match &self.0 {
            Transport::Direct(direct) => direct.conn.as_ref().is_none_or(|conn| !conn.young(now)),
            Transport::Proxied(_) => false,
        }
    }

    /// Drops the kept connection, so the next probe opens a new one: after a
    /// probe that did not finish, or when a new connection is to be checked.
    pub(crate) fn reset(&mut self) {
        if let Transport::Direct(direct) = &mut self.0 {
            direct.conn = None;
        }
    }

    /// Resolves when the remote closes the connection kept for probing,
    /// which is news worth a probe; never if none is kept.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe.
    pub async fn closed(&mut self) {
        match &mut self.0 {
            Transport::Direct(direct) => match &mut direct.conn {
                Some(conn) => {
                    // Between probes the remote has nothing to say: an end of
                    // stream, an error or unasked-for bytes all leave the
                    // connection unusable.
                    conn.stream.closed().await;
                    direct.conn = None;
                }
                None => future::pending().await,
            },
            Transport::Proxied(_) => future::pending().await,
        }
    }
}

/// Sends one `GET path` and classifies what happened, within `timeout`.
///
/// Any HTTP status is a response: reachable, unless listed in
/// `unreachable_statuses`. A transport failure or the deadline is
/// unreachable. A failure before the network (credentials, an exec plugin
/// that fails or does not answer within [`PLUGIN_DEADLINE`]) is local: the
/// credentials are made ready first, under their own deadline, and only the
/// exchange runs under `timeout` and counts toward the latency. The request
/// prepared for the last probe is sent again while its credentials cannot
/// have changed (for the client's life with fixed ones, for 5 s otherwise):
/// kube's layers would build the same bytes.
///
/// # Cancellation safety
///
/// Cancel safe: dropping the future drops the request (and the connection
/// it was on is not reused).
pub async fn probe_once(
    client: &mut ProbeClient,
    path: &str,
    timeout: Duration,
    unreachable_statuses: &[u16],
) -> ProbeResult {
    let timer = std::pin::pin!(tokio::time::sleep(timeout));
    probe_on(client, path, timeout, unreachable_statuses, timer)
        .await
        .0
}

/// [`probe_once`] with the deadline kept on `timer`, which is reset to it:
/// a probe task reuses the timer it waits for its ticks on, so that a probe
/// neither makes a timer nor drops one (the timer driver's lock each time).
/// With the result comes when the probe finished, which the task records
/// rather than reading the clock again.
pub(crate) async fn probe_on(
    client: &mut ProbeClient,
    path: &str,
    timeout: Duration,
    unreachable_statuses: &[u16],
    mut timer: Pin<&mut Sleep>,
) -> (ProbeResult, Instant) {
    let prepared = match client.reusable(path) {
        Some(prepared) => prepared,
        None => match prepare_within_deadline(client, path).await {
            Ok(prepared) => prepared,
            Err(local) => return (local, Instant::now()),
        },
    };
    let started = Instant::now();
    // Until the request finishes, the connection is in an unknown state.
    timer.as_mut().reset(started + timeout);
    // The exchange first, as `tokio::time::timeout` polls it: an answer
    // that came by the deadline counts.
    let answered = tokio::select! {
        biased;
        answered = client.exchange(&prepared, started) => Some(answered),
        () = timer => None,
    };
    let outcome = match answered {
        None => {
            client.reset();
            Outcome::Unreachable {
                cause: FailureCause::Timeout,
                error: format!("no answer within {timeout:?}"),
            }
        }
        Some(Err(Failure::Local { kind, error })) => Outcome::LocalError { kind, error },
        Some(Err(Failure::Transport { cause, error })) => Outcome::Unreachable { cause, error },
        Some(Ok(status)) if unreachable_statuses.contains(&status) => Outcome::Unreachable {
            cause: FailureCause::Status,
            error: format!("answered {status}, which unreachableStatuses lists"),
        },
        Some(Ok(status)) => Outcome::Reachable { status },
    };
    let finished = Instant::now();
    let result = ProbeResult {
        outcome,
        latency: finished.saturating_duration_since(started),
    };
    (result, finished)
}

/// Prepares the request under [`PLUGIN_DEADLINE`]; a failure is local.
async fn prepare_within_deadline(
    client: &mut ProbeClient,
    path: &str,
) -> Result<Prepared, ProbeResult> {
    let local = |kind, error: String| ProbeResult {
        outcome: Outcome::LocalError { kind, error },
        latency: Duration::ZERO,
    };
    match tokio::time::timeout(PLUGIN_DEADLINE, client.prepare(path)).await {
        Err(_) => Err(local(
            LocalKind::Credentials,
            format!(
                "the credentials were not ready within {PLUGIN_DEADLINE:?}: an exec credential plugin that hangs?"
            ),
        )),
        Ok(Err(Failure::Local { kind, error })) => Err(local(kind, error)),
        Ok(Err(Failure::Transport { error, .. })) => Err(local(LocalKind::Other, error)),
        Ok(Ok(prepared)) => Ok(prepared),
    }
}

/// `uri` as it may be shown: no `user:password@`, and no query, which can
/// carry a token (`?access_token=...`) as well.
#[must_use]
pub fn shown_url(uri: &http::Uri) -> String {
    let bare = without_userinfo(uri);
    match (bare.scheme_str(), bare.authority()) {
        (Some(scheme), Some(authority)) => format!("{scheme}://{authority}{}", bare.path()),
        _ => bare.path().to_owned(),
    }
}

/// `uri` without its `user:password@` part.
#[must_use]
pub fn without_userinfo(uri: &http::Uri) -> http::Uri {
    let Some(authority) = uri.authority() else {
        return uri.clone();
    };
    let Some((_, host)) = authority.as_str().rsplit_once('@') else {
        return uri.clone();
    };
    let mut parts = uri.clone().into_parts();
    parts.authority = host.parse().ok();
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}

async fn proxied_get(client: &kube::Client, path: &str) -> Result<u16, Failure> {
    let request = Request::get(path)
        .body(Vec::new())
        .map_err(|err| Failure::local(&err))?;
    let response =
        client
            .send(request.map(Into::into))
            .await
            .map_err(|err| match classify(&err) {
                Outcome::Unreachable { cause, error } => Failure::Transport { cause, error },
                Outcome::LocalError { .. } | Outcome::Reachable { .. } => Failure::local(&err),
            })?;
    let status = response.status().as_u16();
    let limit = usize::try_from(MAX_BODY).unwrap_or(usize::MAX);
    let body = http_body_util::Limited::new(response.into_body(), limit);
    if let Err(err) = body.collect().await {
        tracing::debug!(error = %root_cause(err.as_ref()), "probe body not fully read");
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(auth: impl FnOnce(&mut kube::config::AuthInfo)) -> Direct {
        let mut config = kube::Config::new("http://h:8080/prefix".parse().expect("valid"));
        auth(&mut config.auth_info);
        Direct::new(&config, Duration::from_secs(60)).expect("a client")
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_with_fixed_credentials_is_prepared_once_for_the_clients_life() {
        let mut client = direct(|auth| auth.token = Some("t0k3n".to_owned().into()));
        assert!(client.reusable("/readyz").is_none(), "nothing prepared yet");
        let prepared = client.prepare("/readyz").await.ok().expect("prepared");
        assert_eq!(
            prepared.as_ref(),
            b"GET /prefix/readyz HTTP/1.1\r\nhost: h:8080\r\nauthorization: Bearer t0k3n\r\n\r\n"
        );
        tokio::time::advance(Duration::from_secs(24 * 3600)).await;
        assert_eq!(client.reusable("/readyz"), Some(prepared));
        assert!(
            client.reusable("/livez").is_none(),
            "another path is prepared anew"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_with_credentials_that_can_change_is_reused_only_briefly() {
        let file = tempfile::NamedTempFile::new().expect("a file");
        std::fs::write(file.path(), "from-file").expect("written");
        let mut client = direct(|auth| auth.token_file = Some(file.path().display().to_string()));
        let prepared = client.prepare("/readyz").await.ok().expect("prepared");
        assert!(
            prepared
                .windows(b"Bearer from-file".len())
                .any(|w| w == b"Bearer from-file")
        );
        tokio::time::advance(REFRESHABLE_REUSE.saturating_sub(Duration::from_millis(1))).await;
        assert_eq!(client.reusable("/readyz"), Some(prepared));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            client.reusable("/readyz").is_none(),
            "kube's auth layer is asked again"
        );
    }

    /// A TLS server of the simulated apiserver, and a probe client for it.
    async fn tls_server_and_client() -> (tether_testkit::ApiServer, ProbeClient) {
        use tether_testkit::{ApiServer, Options};

        let server = ApiServer::start(Options::default().tls(true))
            .await
            .expect("a TLS server");
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig().to_yaml())
            .expect("a kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .expect("a config");
        let client = probe_client(&config, &ProbeConfig::default()).expect("a client");
        (server, client)
    }

    /// Between probes, a kept connection holds no read buffer, and its wait
    /// for the peer takes none: the answer's last read was short, so the
    /// socket was drained and its readiness is not taken for new bytes.
    #[tokio::test]
    async fn a_kept_connection_holds_no_read_buffer_between_probes() {
        let (_server, mut client) = tls_server_and_client().await;
        for probe in 1..=3 {
            let result = probe_once(&mut client, "/readyz", Duration::from_secs(5), &[]).await;
            assert!(result.ready(), "probe {probe}: {result:?}");
            let Transport::Direct(direct) = &client.0 else {
                panic!("a direct client")
            };
            let conn = direct.conn.as_ref().expect("the connection kept");
            assert!(
                !conn.stream.holds_a_buffer(),
                "probe {probe} left its read buffer"
            );
            let taken = crate::scratch::taken();
            // One poll of the wait: the peer has nothing more to say.
            tokio::select! {
                biased;
                () = client.closed() => panic!("probe {probe}: the connection closed"),
                () = std::future::ready(()) => {}
            }
            assert_eq!(
                crate::scratch::taken(),
                taken,
                "probe {probe}: the wait took a buffer"
            );
        }
    }

    /// At a start, thousands of connections wait on their peers at once:
    /// none holds a read buffer until its peer has sent something.
    #[tokio::test]
    async fn a_connection_waiting_on_its_peer_holds_no_read_buffer() {
        use crate::wire::Transport as _;

        let (server, mut client) = tls_server_and_client().await;
        let result = probe_once(&mut client, "/readyz", Duration::from_secs(5), &[]).await;
        assert!(result.ready(), "{result:?}");
        server
            .set_fault(tether_testkit::Fault::Slow(Duration::from_secs(3600)))
            .await
            .expect("slow");
        let Transport::Direct(direct) = &mut client.0 else {
            panic!("a direct client")
        };
        let conn = direct.conn.as_mut().expect("the connection kept");
        conn.stream
            .send(b"GET /readyz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("sent");
        let mut plain = Vec::new();
        // One poll of the read: the answer is an hour away.
        tokio::select! {
            biased;
            read = conn.stream.recv(&mut plain) => panic!("an answer: {read:?}"),
            () = std::future::ready(()) => {}
        }
        assert!(
            !conn.stream.holds_a_buffer(),
            "a read buffer held while the peer is silent"
        );
    }

    #[test]
    fn userinfo_is_stripped_and_the_rest_kept() {
        let uri: http::Uri = "https://admin:pw@Example.com:6443/prefix?x=1"
            .parse()
            .expect("valid");
        assert_eq!(
            without_userinfo(&uri).to_string(),
            "https://Example.com:6443/prefix?x=1"
        );
        let plain: http::Uri = "https://h:6443".parse().expect("valid");
        assert_eq!(without_userinfo(&plain), plain);
    }
}
