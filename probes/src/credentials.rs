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

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;
use std::sync::Once;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a client build, credential plugin included, may take before its
/// remote gets a local error. client-go sets no limit; real plugins answer
/// in about a second (a token from a cloud's metadata or STS endpoint), and
/// ten is enough for a slow one while a hung one is reported within a probe
/// interval at the defaults.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(10);

/// A client build that runs, or ran, on the blocking pool: its result, or
/// the message of the panic that ended it.
#[derive(Debug)]
pub struct Pending<T> {
    task: JoinHandle<Result<T, String>>,
    since: Instant,
}

thread_local! {
    /// Whether this thread is building a client now.
    static BUILDING: Cell<bool> = const { Cell::new(false) };
    /// The message of the panic that ended this thread's build.
    static PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Installs, once, a panic hook that keeps a build's panic quiet: kube
/// panics on a credential an HTTP header cannot carry (a token with a
/// control character, which an exec plugin may print), and a panic hook's
/// message and backtrace on every try would flood the log. The message is
/// kept for the build's error instead; any other panic goes to the hook that
/// was there before.
fn quiet_build_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if BUILDING.get() {
                let message = info
                    .payload()
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| info.payload().downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".to_owned());
                PANIC.set(Some(message));
            } else {
                previous(info);
            }
        }));
    });
}

/// Runs `build` on this (blocking-pool) thread; a panic becomes its
/// message, without a word from the panic hook.
fn guarded<T>(build: impl FnOnce() -> T) -> Result<T, String> {
    BUILDING.set(true);
    let out = std::panic::catch_unwind(AssertUnwindSafe(build));
    BUILDING.set(false);
    out.map_err(|_| PANIC.take().unwrap_or_else(|| "a panic".to_owned()))
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
    /// It panicked (in kube, on a credential it cannot send, most likely);
    /// the panic's message, fit to print.
    #[error("building the client failed inside kube: {0}")]
    Panicked(String),
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
    quiet_build_panics();
    let running = pending.get_or_insert_with(|| Pending {
        task: tokio::task::spawn_blocking(|| guarded(build)),
        since: Instant::now(),
    });
    let outcome = tokio::time::timeout(deadline, &mut running.task).await;
    let since = running.since;
    match outcome {
        Err(_) => Err(BuildError::Stalled(since.elapsed())),
        Ok(done) => {
            *pending = None;
            match done {
                Ok(Ok(value)) => Ok(value),
                Ok(Err(message)) => Err(BuildError::Panicked(
                    tether_supervisor::printable(&message, 512).into_owned(),
                )),
                Err(_) => Err(BuildError::Panicked("the build was cancelled".to_owned())),
            }
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_build_that_panics_is_an_error_with_its_message() {
        let mut pending = None;
        let out: Result<(), _> = within(Duration::from_secs(5), &mut pending, || {
            panic!("token is not valid header: InvalidHeaderValue")
        })
        .await;
        assert_eq!(
            out,
            Err(BuildError::Panicked(
                "token is not valid header: InvalidHeaderValue".to_owned()
            ))
        );
    }
}
