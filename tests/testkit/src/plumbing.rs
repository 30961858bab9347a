//! Test plumbing shared by every crate's tests: one bounded poller, one
//! plain HTTP GET, one free port, the median of measurements, and the
//! fuzzers' time budget.
//!
//! Tests of real processes wait with [`poll`], never with a bare sleep
//! standing in for synchronisation: it looks until what it waits for holds,
//! within a bound, and says so either way.

use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

/// How often [`poll`] looks, unless told otherwise: often enough that a
/// measured delay is off by little, seldom enough not to load the machine.
pub const EVERY: Duration = Duration::from_millis(50);

/// Runs `check` every `every` until it gives `Some`, for at most `within`:
/// that value, or `None` if it never came. `check` runs at least once.
pub async fn poll<T>(
    within: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// A port free at the time of asking, on 127.0.0.1.
///
/// # Panics
///
/// If no port can be bound on 127.0.0.1.
#[must_use]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// `GET path` from `addr` over plain HTTP/1.0: the status and the body, or
/// `None` if nothing answered within two seconds.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
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

/// The median and the largest of `samples`.
///
/// # Panics
///
/// If `samples` is empty.
#[must_use]
pub fn median_max<T: PartialOrd + Copy>(mut samples: Vec<T>) -> (T, T) {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (samples[samples.len() / 2], samples[samples.len() - 1])
}

/// How long each fuzzer runs: `FUZZ_SECONDS`, else 5 seconds.
#[must_use]
pub fn fuzz_budget() -> Duration {
    let seconds = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    Duration::from_secs(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_poll_gives_what_came_or_none_at_its_bound() {
        let mut looks = 0;
        let came = poll(Duration::from_secs(1), EVERY, async || {
            looks += 1;
            (looks == 3).then_some(looks)
        })
        .await;
        assert_eq!(came, Some(3));
        let started = Instant::now();
        let never: Option<()> = poll(Duration::from_secs(1), EVERY, async || None).await;
        assert_eq!(never, None);
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert!(started.elapsed() < Duration::from_secs(1) + EVERY * 2);
    }

    #[test]
    fn the_median_is_the_middle_one() {
        assert_eq!(median_max(vec![3, 1, 2]), (2, 3));
        assert_eq!(median_max(vec![0.5, 0.1]), (0.5, 0.5));
    }
}
