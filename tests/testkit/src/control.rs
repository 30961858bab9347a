//! A small HTTP control endpoint, on a port of its own, so that a test can
//! switch the faults of a `fake-apiserver` process.
//!
//! | request | effect |
//! |---|---|
//! | `GET /fault` | the fault in force, as text |
//! | `PUT /fault` with a body like `refuse` or `status=503,all` | switch to it |
//! | `POST /restart` | restart with the same identity |
//! | `POST /recreate` | restart as a recreated cluster |
//! | `GET /kubeconfig` | a kubeconfig for the server as it is now |
//! | `GET /stats` | request counts, open connections and watches, as JSON |

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use crate::{ApiServer, Error, Fault, Restart, Result};

fn reply(code: u16, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .body(Full::new(body.into()))
        .expect("a valid status code")
}

async fn handle(server: ApiServer, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    match (method, path.as_str()) {
        (Method::GET, "/fault") => reply(200, format!("{}\n", server.fault())),
        (Method::PUT, "/fault") => {
            let body = match req.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(err) => return reply(400, format!("reading the body failed: {err}\n")),
            };
            let fault = match String::from_utf8_lossy(&body).parse::<Fault>() {
                Ok(fault) => fault,
                Err(err) => return reply(400, format!("{err}\n")),
            };
            match server.set_fault(fault).await {
                Ok(()) => reply(200, format!("{}\n", server.fault())),
                Err(err) => reply(409, format!("{err}\n")),
            }
        }
        (Method::POST, "/restart" | "/recreate") => {
            let how = if path == "/restart" {
                Restart::SameIdentity
            } else {
                Restart::Recreated
            };
            match server.restart(how).await {
                Ok(()) => reply(200, server.kubeconfig().to_yaml()),
                Err(err) => reply(500, format!("{err}\n")),
            }
        }
        (Method::GET, "/kubeconfig") => reply(200, server.kubeconfig().to_yaml()),
        (Method::GET, "/stats") => {
            let stats = server.stats();
            reply(
                200,
                json!({
                    "requests": stats.requests,
                    "openConnections": stats.open_connections,
                    "connectionsAccepted": stats.connections_accepted,
                    "openWatches": stats.open_watches,
                    "protobufRequests": stats.protobuf_requests,
                    "protobufWatches": stats.protobuf_watches,
                    "resourceVersion": stats.resource_version,
                })
                .to_string(),
            )
        }
        _ => reply(
            404,
            "not found; see GET/PUT /fault, POST /restart, POST /recreate, GET /kubeconfig, GET /stats\n",
        ),
    }
}

/// Serves the control endpoint for `server` on `addr`; returns the bound
/// address and the task serving it.
///
/// # Errors
///
/// [`Error::Bind`] if `addr` is taken.
pub async fn serve_control(
    server: ApiServer,
    addr: SocketAddr,
) -> Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let server = server.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let server = server.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(server, req).await) }
                });
                let _ = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((bound, task))
}
