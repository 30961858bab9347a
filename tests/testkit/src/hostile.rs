//! Hostile apiservers: each speaks just enough HTTP/1.1 to be taken for an
//! apiserver, and misbehaves in one way, so a test can prove a client
//! survives it. Loopback only; a server stops when dropped.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{Error, Kubeconfig, Result};

/// How a [`HostileServer`] misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hostility {
    /// `/readyz` answers 200; a list answers a body that never ends.
    EndlessList,
    /// `/readyz` answers 200 and a list an empty one; a watch sends one
    /// event that never ends (no line break, ever).
    EndlessWatchEvent,
    /// `/readyz` answers 200 with a head of about this many bytes (load
    /// balancers and proxies add headers); other paths 404.
    HugeHead(usize),
    /// Every answer comes one byte every 100 ms.
    Drip,
    /// Every request is read and never answered.
    Stall,
    /// Every connection gets bytes that are not HTTP, then is closed.
    Garbage,
    /// `/readyz` answers 200; every other path `403` with a `Status` whose
    /// message starts with a line break and a forged log line, then runs
    /// on for 4 MiB.
    ForgedStatus,
}

/// The log line a [`Hostility::ForgedStatus`] message tries to forge.
pub const FORGED_LINE: &str = "2026-01-01T00:00:00.000000Z ERROR tether: FORGED by the remote";

/// A running hostile server.
#[derive(Debug)]
pub struct HostileServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The most of a request head this server reads.
const MAX_HEAD: usize = 64 * 1024;

/// One chunk of an endless body.
const CHUNK: usize = 64 * 1024;

impl HostileServer {
    /// Starts one on `127.0.0.1`, on a port of its own.
    ///
    /// # Errors
    ///
    /// [`Error::Bind`] if no port can be had.
    pub async fn start(hostility: Hostility) -> Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| Error::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, hostility));
            }
        });
        Ok(Self { addr, task })
    }

    /// `http://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig that reaches it, without credentials.
    #[must_use]
    pub fn kubeconfig(&self) -> Kubeconfig {
        Kubeconfig {
            name: "hostile".to_owned(),
            server: self.url(),
            ca_pem: None,
            token: None,
            client_cert: None,
            impersonate: None,
        }
    }
}

/// Reads one request head; its path and query, or `None` when the peer is
/// gone or sent more than [`MAX_HEAD`].
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > MAX_HEAD || stream.read(&mut byte).await.ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    text.split_whitespace().nth(1).map(str::to_owned)
}

fn response(status: &str, content_type: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
}

const CHUNKED_JSON: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";

/// Writes one chunk of chunked encoding.
async fn chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    stream
        .write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .await?;
    stream.write_all(data).await?;
    stream.write_all(b"\r\n").await
}

/// Writes `first`, then `fill` bytes forever, until the peer goes.
async fn endless(stream: &mut TcpStream, first: &str, fill: u8) {
    if stream.write_all(CHUNKED_JSON.as_bytes()).await.is_err()
        || chunk(stream, first.as_bytes()).await.is_err()
    {
        return;
    }
    let filler = vec![fill; CHUNK];
    while chunk(stream, &filler).await.is_ok() {}
}

async fn serve(mut stream: TcpStream, hostility: Hostility) {
    if hostility == Hostility::Garbage {
        let _ = stream
            .write_all(b"\x16\x03\x01 this is not HTTP \xff\xfe\r\n\r\n")
            .await;
        return;
    }
    while let Some(target) = read_head(&mut stream).await {
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        let watch = query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1");
        let ok = response("200 OK", "text/plain", "ok");
        match hostility {
            Hostility::Stall => std::future::pending::<()>().await,
            Hostility::Drip => {
                for byte in ok.as_bytes() {
                    if stream.write_all(&[*byte]).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Hostility::HugeHead(size) => {
                let answer = if path == "/readyz" {
                    let mut head = String::from("HTTP/1.1 200 OK\r\n");
                    let mut i = 0;
                    while head.len() < size {
                        let _ = write!(head, "x-padding-{i}: {}\r\n", "p".repeat(100));
                        i += 1;
                    }
                    head.push_str("content-length: 2\r\n\r\nok");
                    head
                } else {
                    response("404 Not Found", "text/plain", "not found")
                };
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
            Hostility::EndlessList | Hostility::EndlessWatchEvent | Hostility::ForgedStatus
                if path == "/readyz" =>
            {
                if stream.write_all(ok.as_bytes()).await.is_err() {
                    return;
                }
            }
            Hostility::EndlessList => {
                endless(&mut stream, "{\"kind\":\"List\",\"items\":[", b' ').await;
                return;
            }
            Hostility::EndlessWatchEvent if watch => {
                endless(
                    &mut stream,
                    "{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"",
                    b'a',
                )
                .await;
                return;
            }
            Hostility::EndlessWatchEvent => {
                let list = "{\"kind\":\"List\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"1\"},\"items\":[]}";
                if stream
                    .write_all(response("200 OK", "application/json", list).as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Hostility::ForgedStatus => {
                let message = format!("denied\n{FORGED_LINE}\n\u{1b}[2J{}", "x".repeat(4 << 20));
                let status = serde_json::json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": message, "reason": "Forbidden", "code": 403,
                });
                let answer = response("403 Forbidden", "application/json", &status.to_string());
                if stream.write_all(answer.as_bytes()).await.is_err() {
                    return;
                }
            }
            Hostility::Garbage => return,
        }
    }
}
