//! One identity's probe task: its ticks, its client, and each result applied
//! to its state, metrics, logs and transitions.

use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt as _;
use tether_supervisor::panic_message;
use tokio::time::{Instant, Sleep};
use tracing::{Instrument as _, error, info, info_span, warn};

use super::pace::{jittered, on_grid};
use super::{Inner, Shared, Transition};
use crate::classify::{FailureCause, LocalKind, Outcome, ProbeResult, root_cause};
use crate::credentials;
use crate::history::Seen;
use crate::probe::{ProbeClient, probe_client, probe_on};
use crate::{ProbeConfig, Reachability, Result};

/// How long a probe waits for a [`Recheck`] before it counts its failure.
pub(super) const RECHECK_WAIT: Duration = Duration::from_secs(2);

pub(super) fn local_error(kind: LocalKind, error: String) -> ProbeResult {
    ProbeResult {
        outcome: Outcome::LocalError { kind, error },
        latency: Duration::ZERO,
    }
}

/// Runs a probe loop, restarting it after a panic, until its task is
/// aborted.
///
/// Stopped by [`JoinHandle::abort`](tokio::task::JoinHandle::abort), not by
/// a cancellation token: a token's future is polled on every wake of the
/// task, four times a probe: 880 instructions a probe, measured (issue 43),
/// and an abort drops the loop at whichever wait it is in, as a `select!` on
/// the token did.
pub(super) async fn supervise_probe(inner: Arc<Inner>, shared: Arc<Shared>) {
    loop {
        let Err(payload) = AssertUnwindSafe(probe_loop(&inner, &shared))
            .catch_unwind()
            .await;
        let message = panic_message(payload.as_ref());
        error!(host = %shared.host, panic = %message, "probe task panicked; restarting it after one interval");
        inner.metrics.panics.inc();
        shared.lock().panics += 1;
        tokio::time::sleep(inner.config.interval).await;
    }
}

/// Probes until its task is aborted: it returns only by a panic.
pub(super) async fn probe_loop(inner: &Inner, shared: &Shared) -> Infallible {
    let config = &inner.config;
    let mut client: Option<(u64, ProbeClient)> = None;
    let mut building = None;
    let mut next = Instant::now();
    // At most one early probe between two regular ticks, whether the kept
    // connection closed or a manager suspected the remote, so that neither
    // can multiply the probes, and two failures a moment apart never count
    // as a sustained outage on their own.
    let mut early = false;
    let mut may_probe_early = true;
    // A suspicion makes the next probe, early or not, use a new connection.
    let mut fresh = false;
    // Made once, not on every probe: each registers a waiter.
    let suspected = shared.suspected.notified();
    tokio::pin!(suspected);
    // One timer for the task's life, reset to each wait: the tick, the
    // connection slot and the probe's deadline. A timer made and dropped
    // for each takes the timer driver's lock twice more a probe.
    let timer = tokio::time::sleep_until(next);
    tokio::pin!(timer);
    loop {
        timer.as_mut().reset(next);
        let closed = async {
            match client.as_mut() {
                Some((_, client)) => client.closed().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = timer.as_mut() => {}
            () = &mut suspected => {
                suspected.set(shared.suspected.notified());
                fresh = true;
                // Once the remote fails, every probe connects anew anyway: a
                // suspicion then changes nothing, and must not hurry the
                // failures toward the threshold.
                let answering = shared.lock().tracker.consecutive_failures() == 0;
                if may_probe_early && answering {
                    next = Instant::now();
                    early = true;
                }
                continue;
            }
            () = closed => {
                // The remote closed the connection kept for probing, as a
                // stopping apiserver does: probe now rather than at the next
                // tick.
                if may_probe_early {
                    next = Instant::now();
                    early = true;
                }
                continue;
            }
        }
        may_probe_early = !early;
        early = false;
        let tick = Instant::now();
        next = on_grid(
            tick + jittered(config.interval, config.jitter),
            inner.created,
            config.interval,
            inner.tasks.load(Ordering::Relaxed),
        );
        let rebuild = {
            let mut state = shared.lock();
            state.last_tick = tick;
            let generation = state.config_generation;
            (client.as_ref().is_none_or(|(g, _)| *g != generation))
                .then(|| (generation, state.config.clone()))
        };
        if let Some((generation, kube_config)) = rebuild {
            // Boxed, as the probe below: the task keeps only what waits
            // between probes.
            let span = info_span!("probe", host = %shared.host);
            let built = Box::pin(build(inner, shared, &mut building, kube_config))
                .instrument(span)
                .await;
            match built {
                Ok(built) => client = Some((generation, built)),
                Err(result) => {
                    record(inner, shared, result, Instant::now());
                    continue;
                }
            }
        }
        let (_, probe_client) = client.as_mut().expect("built above when missing or stale");
        if std::mem::take(&mut fresh) {
            probe_client.reset();
        }
        if probe_client.needs_connection(tick) {
            // The wait is the process's, not the remote's: it comes before
            // the probe's deadline starts.
            timer.as_mut().reset(inner.connects.slot());
            timer.as_mut().await;
        }
        let (result, finished) = probe_boxed(probe_client, config, timer.as_mut()).await;
        let now = if rotation_explains(&result) {
            // Boxed, as the probe: a recheck is rare, and its waits would
            // otherwise size every idle task.
            if Box::pin(rechecked(inner, shared)).await {
                // The files changed under the probe: this failure says
                // nothing of the remote. Probe again, now, with the new
                // settings.
                next = Instant::now();
                continue;
            }
            Instant::now()
        } else {
            finished
        };
        record(inner, shared, result, now);
    }
}

/// One probe, boxed: the task keeps only what waits between probes.
///
/// The box is made first and the probe written into it: boxing the future
/// once made builds it on the stack, then copies all 944 bytes of it
/// (about 120 instructions a probe, issue 43, part 17).
async fn probe_boxed(
    client: &mut ProbeClient,
    config: &ProbeConfig,
    timer: Pin<&mut Sleep>,
) -> (ProbeResult, Instant) {
    let mut probe = Box::pin(None);
    probe.set(Some(probe_on(
        client,
        &config.path,
        config.timeout,
        &config.unreachable_statuses,
        timer,
    )));
    probe.as_mut().as_pin_mut().expect("set above").await
}

/// Whether rotated credentials could explain `result`: a TLS failure (a new
/// CA, an expired client certificate) or a 401 (a rotated token), counted
/// as reachable or, when `unreachableStatuses` lists it, not. A recheck of
/// any listed status is a few `stat` calls: cheaper than telling them apart.
pub(super) fn rotation_explains(result: &ProbeResult) -> bool {
    matches!(
        result.outcome,
        Outcome::Unreachable {
            cause: FailureCause::Tls | FailureCause::Status,
            ..
        } | Outcome::Reachable { status: 401 }
    )
}

/// Asks the [`Recheck`], if any, to re-read the probe's files, waiting at
/// most [`RECHECK_WAIT`]; whether its settings changed meanwhile.
pub(super) async fn rechecked(inner: &Inner, shared: &Shared) -> bool {
    let Some(recheck) = inner.recheck.get() else {
        return false;
    };
    let (generation, names) = {
        let state = shared.lock();
        let names = state.names.iter().map(|s| s.name.clone()).collect();
        (state.config_generation, names)
    };
    let _ = tokio::time::timeout(RECHECK_WAIT, recheck(names)).await;
    shared.lock().config_generation != generation
}

/// Builds a remote's probe client from `kube_config`: the client, or the
/// local error that kept it from being built.
///
/// Building runs the exec credential plugin, if any: off the async workers,
/// under its own deadline. The loop is alive while it waits, and keeps its
/// heartbeat.
pub(super) async fn build(
    inner: &Inner,
    shared: &Shared,
    building: &mut Option<credentials::Pending<Result<ProbeClient>>>,
    kube_config: Arc<kube::Config>,
) -> Result<ProbeClient, ProbeResult> {
    let config = &inner.config;
    let auth = &kube_config.auth_info;
    let built = if auth.exec.is_none() && auth.auth_provider.is_none() {
        // Nothing runs a program or calls out: a certificate and a token
        // file read, built right here rather than on a thread of its own.
        Ok(probe_client(&kube_config, config))
    } else {
        let probe_config = config.clone();
        let building_now =
            credentials::off_workers(building, move || probe_client(&kube_config, &probe_config));
        tokio::pin!(building_now);
        let mut beat = tokio::time::interval(config.interval);
        loop {
            tokio::select! {
                biased;
                built = &mut building_now => break built,
                _ = beat.tick() => shared.lock().last_tick = Instant::now(),
            }
        }
    };
    match built {
        Ok(Ok(built)) => Ok(built),
        Ok(Err(err)) => Err(local_error(LocalKind::of(&err), root_cause(&err))),
        Err(err) => Err(local_error(LocalKind::of(&err), err.to_string())),
    }
}

/// Applies one probe result, come at `now`: state, metrics, logs and
/// transitions.
pub(super) fn record(inner: &Inner, shared: &Shared, result: ProbeResult, now: Instant) {
    let metrics = &inner.metrics;
    let host = shared.host.as_str();
    let mut state = shared.lock();
    state.last_tick = now;
    state.last_probe = Some(SystemTime::now());

    if let Outcome::LocalError { kind, error } = &result.outcome {
        metrics
            .local_errors
            .with_label_values(&[kind.as_str()])
            .inc();
        if state.local_error.as_ref() != Some(error) {
            warn!(remotes = %state.names(), %host, %kind, %error, "cannot probe from here (local error); not counted toward reachability");
        }
        state.local_error = Some(error.clone());
        return;
    }
    if state.local_error.take().is_some() {
        info!(remotes = %state.names(), %host, "probing works again");
    }

    let reachable = matches!(result.outcome, Outcome::Reachable { .. });
    if let Outcome::Unreachable { cause, error } = &result.outcome {
        if state.tracker.state() == Reachability::Unreachable
            && let Some(was) = state.last_cause
            && was != *cause
        {
            info!(remotes = %state.names(), %host, from = %was, to = %cause, %error, "remote apiserver still unreachable; the cause changed");
        }
        state.last_cause = Some(*cause);
        state.last_error = Some(error.clone());
        state.last_failure = state.last_probe;
    }
    let seen = if !reachable {
        Seen::Failed
    } else if result.ready() {
        Seen::Ready(result.latency)
    } else {
        Seen::NotReady(result.latency)
    };
    let from = state.tracker.state();
    let changed = state.tracker.observe(reachable);
    let lost = state.tracker.state() == Reachability::Unreachable;
    state.history.record(now - inner.created, seen, lost);
    let result_state = if reachable {
        Reachability::Reachable
    } else {
        Reachability::Unreachable
    };
    let seconds = result.latency.as_secs_f64();
    for series in &mut state.names {
        series.observe(result_state, seconds);
    }
    state.last = Some(result);
    let Some(to) = changed else {
        return;
    };
    state.last_transition = Some(SystemTime::now());
    let failures = state.tracker.consecutive_failures();
    let error = (to == Reachability::Unreachable)
        .then(|| state.last_error.clone())
        .flatten();
    if to == Reachability::Unreachable {
        warn!(
            remotes = %state.names(), %host, failures,
            cause = %state.last_cause.map_or("unknown", FailureCause::as_str),
            error = error.as_deref().unwrap_or(""),
            "remote apiserver unreachable"
        );
    } else {
        info!(remotes = %state.names(), %host, %from, %to, "remote apiserver reachable");
    }
    for series in &mut state.names {
        series.transition(to);
        // Nobody subscribed is fine.
        let _ = inner.transitions.send(Transition {
            remote: series.name.clone(),
            host: host.to_owned(),
            from,
            to,
            failures,
            error: error.clone(),
        });
    }
}
