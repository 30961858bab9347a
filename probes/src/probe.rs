//! One probe: `GET <path>` through a client built for probing.

use std::time::Duration;

use http_body_util::BodyExt as _;
use tokio::time::Instant;

use crate::classify::{FailureCause, Outcome, ProbeResult, classify, root_cause};
use crate::{Error, ProbeConfig, Result};

/// The most of a probe's response body that is read, so the connection can
/// be reused; `/readyz` answers a few bytes.
const MAX_BODY: usize = 64 * 1024;

/// Builds the client a probe uses from a remote's kube configuration.
///
/// kube's defaults do not suit a probe: its retry policy retries a 503 for
/// minutes, and it has no timeouts. This client has `default_retry` off,
/// connect and write timeouts of `probe.timeout`, and a read timeout; every
/// request is also bounded by `probe.timeout` in [`probe_once`].
///
/// The read timeout is twice the interval, not the probe's deadline: it also
/// applies to a pooled connection idling between probes, and a shorter one
/// would kill every connection before its next use, so each probe would pay
/// for a new TCP and TLS handshake. The deadline bounds the probe itself.
///
/// # Errors
///
/// [`Error::Client`] if kube cannot build a client from the configuration
/// (a bad certificate, say).
pub fn probe_client(config: &kube::Config, probe: &ProbeConfig) -> Result<kube::Client> {
    let mut config = config.clone();
    // Userinfo in a server URL authenticates nothing for kube, but the URL
    // ends up in library trace logs; the probe's client never carries it.
    config.cluster_url = without_userinfo(&config.cluster_url);
    config.default_retry = false;
    config.connect_timeout = Some(probe.timeout);
    config.write_timeout = Some(probe.timeout);
    config.read_timeout = Some(probe.interval * 2);
    kube::Client::try_from(config).map_err(Error::Client)
}

/// Sends one `GET path` and classifies what happened, within `timeout`.
///
/// Any HTTP status is a response: reachable, unless listed in
/// `unreachable_statuses`. A transport failure or the deadline is
/// unreachable. A failure before the network (credentials) is local.
///
/// # Cancellation safety
///
/// Cancel safe: dropping the future drops the request.
pub async fn probe_once(
    client: &kube::Client,
    path: &str,
    timeout: Duration,
    unreachable_statuses: &[u16],
) -> ProbeResult {
    let started = Instant::now();
    let outcome = match tokio::time::timeout(timeout, request(client, path)).await {
        Err(_) => Outcome::Unreachable {
            cause: FailureCause::Timeout,
            error: format!("no answer within {timeout:?}"),
        },
        Ok(Err(err)) => classify(&err),
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

async fn request(client: &kube::Client, path: &str) -> Result<u16, kube::Error> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    let response = client.send(request.map(Into::into)).await?;
    let status = response.status().as_u16();
    // Read the (small) body so the pooled connection can be reused; a body
    // that fails mid-way still answered with a status.
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
