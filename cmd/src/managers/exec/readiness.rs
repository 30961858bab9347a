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

    /// Returns when the next check is due; without a check, never.
    /// Cancel-safe: it only waits.
    pub(super) async fn due(&self) {
        match self.spec {
            Some(_) => sleep_until(self.next).await,
            None => std::future::pending().await,
        }
    }

    /// Runs one check with `check` (the real one is [`check`]) and takes
    /// in its result. A caller runs it to its end, so that a check is never
    /// cut short by what else the caller waits for.
    pub(super) async fn run<F>(&mut self, check: impl FnOnce(&'a ReadinessSpec) -> F)
    where
        F: Future<Output = bool>,
    {
        let Some(spec) = self.spec else {
            return;
        };
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
        let waited = timeout(Duration::from_secs(3600), readiness.due()).await;
        assert!(waited.is_err(), "a check came due without a spec");
        let mut called = false;
        readiness
            .run(async |_| {
                called = true;
                false
            })
            .await;
        assert!(!called, "a check ran without a spec");
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
            readiness.due().await;
            readiness
                .run(async |_| {
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

    /// The exec manager waits for `due` beside the probes' transitions: a
    /// wait cut short leaves the schedule as it was.
    #[tokio::test(start_paused = true)]
    async fn a_wait_cut_short_keeps_the_next_check_where_it_was() {
        let spec = spec();
        let mut readiness = Readiness::new(Some(&spec));
        let start = Instant::now();
        readiness.due().await;
        readiness.run(async |_| true).await;
        for _ in 0..3 {
            let cut = timeout(Duration::from_millis(50), readiness.due()).await;
            assert!(cut.is_err(), "due before its period");
        }
        readiness.due().await;
        assert_eq!(start.elapsed(), spec.period, "due a period after the check");
    }
}
