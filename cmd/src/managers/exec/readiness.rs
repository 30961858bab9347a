//! The process's readiness check: an HTTP GET on 127.0.0.1.

use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::time::timeout;

use crate::config::ReadinessSpec;

/// One readiness check: any 2xx within `spec.timeout`.
pub(super) async fn check(spec: &ReadinessSpec) -> bool {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", spec.port))
            .await
            .ok()?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .ok()?;
        tokio::spawn(connection);
        let request = http::Request::get(spec.path.as_str())
            .header(http::header::HOST, format!("127.0.0.1:{}", spec.port))
            .body(Empty::<bytes::Bytes>::new())
            .ok()?;
        let response = sender.send_request(request).await.ok()?;
        Some(response.status().is_success())
    };
    timeout(spec.timeout, attempt)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}
