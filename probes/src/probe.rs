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
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONNECTION, HOST};
use http::{HeaderValue, Request, Response, Uri};
use http_body_util::{BodyExt as _, Empty};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use kube::client::ConfigExt as _;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tower::util::BoxService;
use tower::{BoxError, Service as _, ServiceBuilder, ServiceExt as _};

use crate::classify::{
    FailureCause, LocalKind, Outcome, ProbeResult, cause_in, classify, out_of_descriptors,
    root_cause,
};
use crate::credentials::PLUGIN_DEADLINE;
use crate::{Error, ProbeConfig, Result};

/// The most of a probe's response body that is read, so the connection can
/// be reused; `/readyz` answers a few bytes.
const MAX_BODY: usize = 64 * 1024;

/// The largest response head a probe reads: load balancers, proxies and
/// audit IDs add headers, and 32 KiB holds any real head several times
/// over. A larger head still answered: it counts as a response, with status
/// [`HEAD_TOO_LARGE`].
const MAX_HEAD: usize = 32 * 1024;

/// The status recorded for an answer whose head passed [`MAX_HEAD`]: the
/// remote answered (reachable), but what it said could not be read (not
/// ready).
pub const HEAD_TOO_LARGE: u16 = 0;

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

enum Transport {
    Direct(Box<Direct>),
    Proxied(kube::Client),
}

struct Direct {
    host: String,
    port: u16,
    /// The `Host` header: the URL's authority, without userinfo.
    authority: HeaderValue,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    decorate: Decorate,
    /// A kept connection older than this is replaced by a new one.
    max_age: Duration,
    conn: Option<Conn>,
}

/// A kept-alive connection: the sender, the task driving it, which ends
/// when the connection closes, and when it was opened.
struct Conn {
    sender: http1::SendRequest<Empty<Bytes>>,
    task: JoinHandle<()>,
    opened: Instant,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
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
            .map(|client| ProbeClient(Transport::Proxied(client)))
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
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| HeaderValue::from_static("localhost"));
        let tls = if https {
            let mut tls = config.rustls_client_config().map_err(Error::Client)?;
            tls.alpn_protocols = vec![b"http/1.1".to_vec()];
            // One server per client: rustls's default session cache is
            // preallocated for 256 servers, a kilobyte per remote for nothing.
            tls.resumption = rustls::client::Resumption::in_memory_sessions(1);
            let name = config
                .tls_server_name
                .clone()
                .unwrap_or_else(|| host.clone());
            let name =
                ServerName::try_from(name.clone()).map_err(|_| Error::InvalidServerName(name))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(tls)), name))
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
        Ok(Self {
            host,
            port,
            authority,
            tls,
            decorate: BoxService::new(decorate),
            max_age,
            conn: None,
        })
    }

    /// The request as kube would send it: base URL, credentials (which may
    /// run an exec plugin's refresh), extra headers.
    async fn prepare(&mut self, path: &str) -> Result<http::request::Parts, Failure> {
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
        // HTTP/1.1 sends the path and a Host header, not the absolute URL.
        let (mut parts, _) = request.into_parts();
        parts.uri = parts
            .uri
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
        parts.headers.insert(HOST, self.authority.clone());
        Ok(parts)
    }

    /// Sends `parts` on the kept connection, or a new one.
    async fn exchange(&mut self, parts: &http::request::Parts) -> Result<u16, Failure> {
        let make = || {
            let mut request = Request::new(Empty::new());
            *request.uri_mut() = parts.uri.clone();
            *request.headers_mut() = parts.headers.clone();
            request
        };
        // A kept connection may answer long after the remote stopped taking
        // new ones; past its age, the probe checks a new one.
        if self
            .conn
            .as_ref()
            .is_some_and(|c| c.sender.is_closed() || c.opened.elapsed() >= self.max_age)
        {
            self.conn = None;
        }
        if self.conn.is_some() {
            // A kept connection may have died since the last probe; a fresh
            // one answers for the remote, as a pool would retry.
            if let Ok(status) = self.send(make()).await {
                return Ok(status);
            }
        }
        self.conn = Some(self.connect().await?);
        self.send(make()).await
    }

    async fn send(&mut self, request: Request<Empty<Bytes>>) -> Result<u16, Failure> {
        let result = async {
            let conn = self.conn.as_mut().ok_or_else(|| Failure::Transport {
                cause: FailureCause::Reset,
                error: "no connection".to_owned(),
            })?;
            conn.sender
                .ready()
                .await
                .map_err(|err| Failure::transport(&err, FailureCause::Reset))?;
            let response = match conn.sender.send_request(request).await {
                Ok(response) => response,
                // It answered, with more head than is worth reading.
                Err(err) if err.is_parse_too_large() => return Ok((HEAD_TOO_LARGE, false)),
                Err(err) => return Err(Failure::transport(&err, FailureCause::Other)),
            };
            let status = response.status().as_u16();
            let closing = response
                .headers()
                .get(CONNECTION)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
            // Read the (small) body so the connection can be reused; a body
            // that fails mid-way still answered with a status.
            let body = http_body_util::Limited::new(response.into_body(), MAX_BODY);
            let complete = match body.collect().await {
                Ok(_) => true,
                Err(err) => {
                    tracing::debug!(error = %root_cause(err.as_ref()), "probe body not fully read");
                    false
                }
            };
            Ok((status, complete && !closing))
        }
        .await;
        match result {
            Ok((status, keep)) => {
                if !keep {
                    self.conn = None;
                }
                Ok(status)
            }
            Err(failure) => {
                self.conn = None;
                Err(failure)
            }
        }
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
        match &self.tls {
            None => handshake(stream).await,
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|err| Failure::transport(&err, FailureCause::Tls))?;
                handshake(stream).await
            }
        }
    }
}

async fn handshake<T>(stream: T) -> Result<Conn, Failure>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::Builder::new()
        // hyper's adaptive buffer starts at 8 KiB and grows to the most a
        // head may take; as many headers as fit in it, not hyper's 100.
        .max_buf_size(MAX_HEAD)
        .max_headers(MAX_HEAD / 32)
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|err| Failure::transport(&err, FailureCause::Other))?;
    let task = tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(error = %root_cause(&err), "probe connection ended");
        }
    });
    Ok(Conn {
        sender,
        task,
        opened: Instant::now(),
    })
}

/// A probe request with its credentials, ready to send.
enum Prepared {
    Direct(http::request::Parts),
    /// kube's client adds the credentials itself as it sends.
    Proxied(String),
}

impl ProbeClient {
    async fn prepare(&mut self, path: &str) -> Result<Prepared, Failure> {
        match &mut self.0 {
            Transport::Direct(direct) => direct.prepare(path).await.map(Prepared::Direct),
            Transport::Proxied(_) => Ok(Prepared::Proxied(path.to_owned())),
        }
    }

    async fn exchange(&mut self, prepared: &Prepared) -> Result<u16, Failure> {
        match (&mut self.0, prepared) {
            (Transport::Direct(direct), Prepared::Direct(parts)) => direct.exchange(parts).await,
            (Transport::Proxied(client), Prepared::Proxied(path)) => {
                proxied_get(client, path).await
            }
            _ => Err(Failure::Local {
                kind: LocalKind::Other,
                error: "a request prepared for another transport".to_owned(),
            }),
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
                    // The task only ends with the connection, and never panics.
                    let _ = (&mut conn.task).await;
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
/// exchange runs under `timeout` and counts toward the latency.
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
    let local = |kind, error: String| ProbeResult {
        outcome: Outcome::LocalError { kind, error },
        latency: Duration::ZERO,
    };
    let prepared = match tokio::time::timeout(PLUGIN_DEADLINE, client.prepare(path)).await {
        Err(_) => {
            return local(
                LocalKind::Credentials,
                format!(
                    "the credentials were not ready within {PLUGIN_DEADLINE:?}: an exec credential plugin that hangs?"
                ),
            );
        }
        Ok(Err(Failure::Local { kind, error })) => return local(kind, error),
        Ok(Err(Failure::Transport { error, .. })) => return local(LocalKind::Other, error),
        Ok(Ok(prepared)) => prepared,
    };
    let started = Instant::now();
    // Until the request finishes, the connection is in an unknown state.
    let outcome = match tokio::time::timeout(timeout, client.exchange(&prepared)).await {
        Err(_) => {
            client.reset();
            Outcome::Unreachable {
                cause: FailureCause::Timeout,
                error: format!("no answer within {timeout:?}"),
            }
        }
        Ok(Err(Failure::Local { kind, error })) => Outcome::LocalError { kind, error },
        Ok(Err(Failure::Transport { cause, error })) => Outcome::Unreachable { cause, error },
        Ok(Ok(status)) if unreachable_statuses.contains(&status) => Outcome::Unreachable {
            cause: FailureCause::Status,
            error: format!("answered {status}, which unreachableStatuses lists"),
        },
        Ok(Ok(status)) => Outcome::Reachable { status },
    };
    ProbeResult {
        outcome,
        latency: started.elapsed(),
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
    let body = http_body_util::Limited::new(response.into_body(), MAX_BODY);
    if let Err(err) = body.collect().await {
        tracing::debug!(error = %root_cause(err.as_ref()), "probe body not fully read");
    }
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

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
