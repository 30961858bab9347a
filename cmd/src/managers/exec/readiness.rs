//! The process's readiness: an HTTP GET on 127.0.0.1, every period, and
//! the rule that turns the checks into "ready".

use std::future::Future;

use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::time::{Instant, sleep_until, timeout};

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

/// The process's readiness as its checks found it. Without a check the
/// process is ready once started. With one, it is ready from the first
/// check that passes, and not ready again only after `failure_threshold`
/// failures in a row; the next check is one period after the last one
/// ended.
pub(super) struct Readiness<'a> {
    spec: Option<&'a ReadinessSpec>,
    ready: bool,
    failures: u32,
    next: Instant,
}

impl<'a> Readiness<'a> {
    pub(super) fn new(spec: Option<&'a ReadinessSpec>) -> Self {
        Self {
            spec,
            ready: spec.is_none(),
            failures: 0,
            next: Instant::now(),
        }
    }

    pub(super) fn ready(&self) -> bool {
        self.ready
    }

    /// Waits for the next check's time and runs it with `check` (the real
    /// one is [`check`]); without a check, never returns. Cancel-safe: a
    /// check cut short runs again at the next call, at once.
    pub(super) async fn next<F>(&mut self, check: impl FnOnce(&'a ReadinessSpec) -> F)
    where
        F: Future<Output = bool>,
    {
        let Some(spec) = self.spec else {
            return std::future::pending().await;
        };
        sleep_until(self.next).await;
        let passed = check(spec).await;
        self.next = Instant::now() + spec.period;
        if passed {
            self.failures = 0;
            self.ready = true;
        } else {
            self.failures += 1;
            if self.failures >= spec.failure_threshold {
                self.ready = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use super::*;

    fn spec() -> ReadinessSpec {
        ReadinessSpec {
            port: 1,
            path: "/".to_owned(),
            period: Duration::from_millis(200),
            timeout: Duration::from_secs(1),
            failure_threshold: 3,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_check_the_process_is_ready_at_once_and_never_checked() {
        let mut readiness = Readiness::new(None);
        assert!(readiness.ready());
        let called = Cell::new(false);
        let waited = timeout(
            Duration::from_secs(3600),
            readiness.next(async |_| {
                called.set(true);
                true
            }),
        )
        .await;
        assert!(waited.is_err(), "next returned without a check");
        assert!(!called.get(), "a check ran without a spec");
        assert!(readiness.ready());
    }

    /// Each check takes 50 ms; the results are scripted. Ready from the
    /// first pass; once ready, two failures in a row are not enough, the
    /// third is; a pass in between starts the count again.
    #[tokio::test(start_paused = true)]
    async fn ready_from_the_first_pass_and_down_only_after_the_threshold_in_a_row() {
        let spec = spec();
        let mut readiness = Readiness::new(Some(&spec));
        let start = Instant::now();
        let script = [
            false, false, false, false, true, false, false, true, false, false, false, true,
        ];
        let mut seen = Vec::new();
        let mut started = Vec::new();
        for passes in script {
            readiness
                .next(async |_| {
                    started.push(start.elapsed().as_millis());
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    passes
                })
                .await;
            seen.push(readiness.ready());
        }
        assert_eq!(
            seen,
            [
                false, false, false, false, true, true, true, true, true, true, false, true
            ],
            "ready after each check"
        );
        let expected: Vec<u128> = (0..12).map(|i| i * 250).collect();
        assert_eq!(
            started, expected,
            "the first check at once, each next one a period after the last ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_cut_short_runs_again_at_once_and_counts_once() {
        let spec = spec();
        let mut readiness = Readiness::new(Some(&spec));
        let start = Instant::now();
        let cut = timeout(
            Duration::from_millis(10),
            readiness.next(async |_| {
                tokio::time::sleep(Duration::from_secs(1)).await;
                true
            }),
        )
        .await;
        assert!(cut.is_err());
        assert!(!readiness.ready(), "a check cut short counted");
        let mut at = None;
        readiness
            .next(async |_| {
                at = Some(start.elapsed());
                true
            })
            .await;
        assert_eq!(at, Some(Duration::from_millis(10)), "ran again at once");
        assert!(readiness.ready());
    }
}
