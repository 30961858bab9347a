//! An Alertmanager webhook receiver: the person an alert reaches, in the
//! cluster step. It records each notification it is sent (when it
//! arrived, on this process's monotonic clock; its status; each alert's
//! status, labels and annotations) and answers 200.
//!
//! # Invariants
//!
//! - A body over [`MAX_BODY`] is refused (413) and not read further.
//! - A body that is not Alertmanager's webhook JSON is answered 400 and
//!   still recorded, with the status `malformed`, so that a test that
//!   checks what reached the person sees it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::{Error, Result};

/// The largest notification read: Alertmanager's for a few alerts is a
/// few KiB.
const MAX_BODY: usize = 1 << 20;

/// One notification, as it arrived.
#[derive(Debug, Clone)]
pub struct Notification {
    /// When it arrived.
    pub at: Instant,
    /// `firing` or `resolved` (the group's), or `malformed`.
    pub status: String,
    /// Its alerts.
    pub alerts: Vec<Alert>,
}

/// One alert of a notification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alert {
    /// `firing` or `resolved`.
    pub status: String,
    /// Its labels: `alertname`, `remote`, ...
    pub labels: BTreeMap<String, String>,
    /// Its annotations: `summary`, `runbook_url`, ...
    pub annotations: BTreeMap<String, String>,
}

impl Alert {
    /// The label `name`, or "".
    #[must_use]
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }
}

/// A running receiver; dropping it stops it.
#[derive(Debug)]
pub struct AlertWebhook {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Notification>>>,
    task: JoinHandle<()>,
}

fn strings(value: &Value) -> BTreeMap<String, String> {
    value.as_object().map_or_else(BTreeMap::new, |map| {
        map.iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect()
    })
}

/// Alertmanager's webhook body: `{"status": ..., "alerts": [...]}`.
fn parse(body: &[u8], at: Instant) -> Option<Notification> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let alerts = value["alerts"]
        .as_array()?
        .iter()
        .map(|alert| Alert {
            status: alert["status"].as_str().unwrap_or_default().to_owned(),
            labels: strings(&alert["labels"]),
            annotations: strings(&alert["annotations"]),
        })
        .collect();
    Some(Notification {
        at,
        status: value["status"].as_str()?.to_owned(),
        alerts,
    })
}

fn reply(code: u16) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(Bytes::new()))
        .expect("a valid status code")
}

async fn handle(seen: &Mutex<Vec<Notification>>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::POST {
        return reply(405);
    }
    let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
        return reply(413);
    };
    let at = Instant::now();
    let (notification, code) = match parse(&body.to_bytes(), at) {
        Some(notification) => (notification, 200),
        None => (
            Notification {
                at,
                status: "malformed".to_owned(),
                alerts: Vec::new(),
            },
            400,
        ),
    };
    seen.lock().expect("not poisoned").push(notification);
    reply(code)
}

impl AlertWebhook {
    /// Serves on `listener` (from [`TestHost::listen`](crate::TestHost::listen)
    /// or [`Node::listen`](crate::Node::listen)) until dropped. Call it
    /// inside a tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] if the listener cannot be handed to tokio.
    pub fn serve(listener: std::net::TcpListener) -> Result<Self> {
        let addr = listener.local_addr()?;
        let listener = TcpListener::from_std(listener).map_err(Error::Io)?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let seen = Arc::clone(&seen);
            async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let seen = Arc::clone(&seen);
                    tokio::spawn(async move {
                        let service = service_fn(move |req| {
                            let seen = Arc::clone(&seen);
                            async move { Ok::<_, std::convert::Infallible>(handle(&seen, req).await) }
                        });
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
            }
        });
        Ok(Self { addr, seen, task })
    }

    /// The URL to give Alertmanager's `webhook_configs`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}/", self.addr)
    }

    /// Every notification so far, oldest first.
    ///
    /// # Panics
    ///
    /// If a thread panicked while recording one.
    #[must_use]
    pub fn notifications(&self) -> Vec<Notification> {
        self.seen.lock().expect("not poisoned").clone()
    }
}

impl Drop for AlertWebhook {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn records_alertmanagers_notifications_and_marks_what_is_not_one() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let webhook = AlertWebhook::serve(listener).expect("serves");
        let post = |body: &'static str| {
            let addr = webhook.addr;
            async move {
                let mut stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .expect("connects");
                let request = format!(
                    "POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
                    .await
                    .expect("writes");
                let mut answer = String::new();
                tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer)
                    .await
                    .expect("reads");
                answer
            }
        };
        let answer = post(r#"{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"A","remote":"cluster-a"},"annotations":{"runbook_url":"u"}}]}"#).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        let answer = post("not json").await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");

        let seen = webhook.notifications();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].status, "firing");
        assert_eq!(seen[0].alerts[0].label("remote"), "cluster-a");
        assert_eq!(seen[0].alerts[0].annotations["runbook_url"], "u");
        assert_eq!(seen[1].status, "malformed");
    }
}
