//! Helpers shared by the tests that run real processes.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// A port free at the time of asking, on 127.0.0.1.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// `GET path` over HTTP/1.0: the status and the body, or `None` if nothing
/// answered within two seconds.
pub(crate) async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut stream = timeout(Duration::from_secs(2), TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut response = String::new();
    timeout(Duration::from_secs(2), stream.read_to_string(&mut response))
        .await
        .ok()?
        .ok()?;
    let code = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}
