//! Building a client off the async workers, under a deadline.
//!
//! kube runs a kubeconfig's exec credential plugin (`aws eks get-token`,
//! `gke-gcloud-auth-plugin`, OIDC helpers) synchronously, inside whatever
//! builds the client, and waits for it without a limit. On an async worker, a
//! plugin that hangs stalls every task on that worker: other remotes' probes,
//! `/healthz`, the signal handlers. So every client build runs on the
//! blocking pool, and its caller waits at most [`PLUGIN_DEADLINE`]: a hung or
//! failed plugin is then a local error of its own remote, and nothing else
//! waits on it.
//!
//! A build that overruns its deadline cannot be stopped (kube owns the
//! plugin's process); it is kept, and the next attempt waits for it again
//! rather than starting another, so a hung plugin holds one thread, not one
//! per try.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a client build, credential plugin included, may take before its
/// remote gets a local error. client-go sets no limit; real plugins answer
/// in about a second (a token from a cloud's metadata or STS endpoint), and
/// ten is enough for a slow one while a hung one is reported within a probe
/// interval at the defaults.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(10);

/// A client build that runs, or ran, on the blocking pool.
#[derive(Debug)]
pub struct Pending<T> {
    task: JoinHandle<T>,
    since: Instant,
}

/// Why a build off the workers gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// It has not finished within the deadline: a credential plugin that
    /// hangs, most likely.
    #[error(
        "building the client, which runs its exec credential plugin, has not finished in {0:?}"
    )]
    Stalled(Duration),
    /// It panicked.
    #[error("building the client panicked")]
    Panicked,
}

/// Runs `build` on the blocking pool, unless a build is already `pending`,
/// and waits for it at most [`PLUGIN_DEADLINE`].
///
/// # Errors
///
/// [`BuildError::Stalled`] if the build has not finished by then; it stays
/// in `pending` for the next call. [`BuildError::Panicked`] if it panicked.
///
/// # Cancellation safety
///
/// Cancel safe: a build in progress stays in `pending`.
pub async fn off_workers<T: Send + 'static>(
    pending: &mut Option<Pending<T>>,
    build: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BuildError> {
    within(PLUGIN_DEADLINE, pending, build).await
}

async fn within<T: Send + 'static>(
    deadline: Duration,
    pending: &mut Option<Pending<T>>,
    build: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BuildError> {
    let running = pending.get_or_insert_with(|| Pending {
        task: tokio::task::spawn_blocking(build),
        since: Instant::now(),
    });
    let outcome = tokio::time::timeout(deadline, &mut running.task).await;
    let since = running.since;
    match outcome {
        Err(_) => Err(BuildError::Stalled(since.elapsed())),
        Ok(done) => {
            *pending = None;
            done.map_err(|_| BuildError::Panicked)
        }
    }
}

/// Runs `build` off the workers once, waiting at most [`PLUGIN_DEADLINE`];
/// an overrunning build is left to finish by itself.
///
/// # Errors
///
/// As [`off_workers`].
pub async fn once_off_workers<T: Send + 'static>(
    build: impl FnOnce() -> T + Send + 'static,
) -> Result<T, BuildError> {
    off_workers(&mut None, build).await
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_hung_build_is_reported_kept_and_never_started_twice() {
        let started = Arc::new(AtomicUsize::new(0));
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = Arc::new(std::sync::Mutex::new(held));
        let build = || {
            let started = Arc::clone(&started);
            let held = Arc::clone(&held);
            move || {
                started.fetch_add(1, Ordering::SeqCst);
                // Blocks this (blocking-pool) thread, as a hung plugin does.
                let _ = held.lock().expect("not poisoned").recv();
                42
            }
        };
        let deadline = Duration::from_millis(100);
        let mut pending = None;
        // The only worker stays free while the build blocks its thread: the
        // deadline's timer fires on it.
        let first = within(deadline, &mut pending, build()).await;
        assert!(
            matches!(first, Err(BuildError::Stalled(d)) if d >= deadline),
            "{first:?}"
        );
        assert!(pending.is_some(), "the stalled build was dropped");
        let again = within(deadline, &mut pending, build()).await;
        assert!(matches!(again, Err(BuildError::Stalled(_))), "{again:?}");
        release.send(()).expect("the build waits");
        assert_eq!(within(deadline, &mut pending, build()).await, Ok(42));
        assert_eq!(started.load(Ordering::SeqCst), 1, "a second build started");
        assert!(pending.is_none());
    }
}
