//! Test plumbing shared by every crate's tests: one bounded poller, one
//! plain HTTP GET, one free port, the median of measurements, and the
//! fuzzers' time budget.
//!
//! Tests of real processes wait with [`poll`], never with a bare sleep
//! standing in for synchronisation: it looks until what it waits for holds,
//! within a bound, and says so either way.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::sync::{Mutex, PoisonError};
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

/// Waits until `check` gives `Some`, looking every [`EVERY`] for at most
/// `within`, and returns what it gave: the one wait every test uses.
///
/// # Panics
///
/// If it never did, naming `what` it waited for and for how long. A test
/// whose subject has logs prints them as it unwinds (the `Tether` of
/// tether's tests does).
pub async fn until<T>(
    what: impl std::fmt::Display,
    within: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    until_every(what, within, EVERY, check).await
}

/// As [`until`], looking every `every`: for a check that costs a process
/// (a `kubectl` call), less often than [`EVERY`].
///
/// # Panics
///
/// If `check` never gave `Some`, naming `what`.
pub async fn until_every<T>(
    what: impl std::fmt::Display,
    within: Duration,
    every: Duration,
    check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    match poll(within, every, check).await {
        Some(value) => value,
        None => panic!(
            "never within {within:?} ({:.1?} waited): {what}",
            started.elapsed()
        ),
    }
}

/// A port free on 127.0.0.1 now, as [`free_port_on`] finds one.
///
/// # Panics
///
/// If no port can be bound on 127.0.0.1.
#[must_use]
pub fn free_port() -> u16 {
    free_port_on(Ipv4Addr::LOCALHOST).expect("a free port on 127.0.0.1")
}

/// The ports [`free_port_on`] hands out: 10000–31999, or the range
/// `TETHER_TEST_PORTS` names (`first-last`), so that test binaries run side
/// by side (`scripts/test`'s lanes) never hand out the same port.
fn port_range() -> std::ops::RangeInclusive<u16> {
    std::env::var("TETHER_TEST_PORTS")
        .ok()
        .and_then(|range| {
            let (first, last) = range.split_once('-')?;
            Some(first.trim().parse().ok()?..=last.trim().parse().ok()?)
        })
        .filter(|range: &std::ops::RangeInclusive<u16>| !range.is_empty())
        .unwrap_or(10_000..=31_999)
}

/// A port free on `ip` now, from [`port_range`]: below the kernel's
/// ephemeral range (32768 and up by default), so no outgoing connection (a
/// busy apiserver opens many to etcd) and no server bound to port 0 can take
/// it before the process it is meant for binds it; and never one this
/// process handed out before, so two processes started together never share
/// one. `None` if none was found.
#[must_use]
pub fn free_port_on(ip: Ipv4Addr) -> Option<u16> {
    static TAKEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    let mut taken = TAKEN.lock().unwrap_or_else(PoisonError::into_inner);
    let range = port_range();
    (0..1000)
        .map(|_| fastrand::u16(range.clone()))
        .find(|port| !taken.contains(port) && std::net::TcpListener::bind((ip, *port)).is_ok())
        .inspect(|port| {
            taken.insert(*port);
        })
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

    #[test]
    fn free_ports_are_never_handed_out_twice_nor_from_the_ephemeral_range() {
        // Ports handed out and not yet bound: the kernel is free to give any
        // of them to port 0 again, and two tethers would then share one.
        let ports: Vec<u16> = (0..2000).map(|_| free_port()).collect();
        let distinct: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        assert!(ports.iter().all(|port| (10_000..32_000).contains(port)));
    }

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
