//! The cycle loop.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{self, BoxStream, Fuse, SelectAll};
use futures_util::{FutureExt as _, Stream, StreamExt as _};
use prometheus::Registry;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::factory::error_chain;
use crate::metrics::Metrics;
use crate::state::{State, Status};
use crate::text::panic_message;
use crate::token::Usage;
use crate::{
    Backoff, BackoffConfig, Cause, CauseKind, CycleToken, Error, ManagerError, ManagerFactory,
    RemoteChange, RemoteSignal, Result, UsedRemotes,
};

/// Settings of the cycle loop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SupervisorConfig {
    /// The wait between cycles. See [`BackoffConfig`] for its defaults.
    pub backoff: BackoffConfig,
    /// A cycle that lived at least this long resets the backoff. Default 60s,
    /// the shim's value: twice the backoff cap, so a remote that is down for
    /// good never resets it.
    pub stable_after: Duration,
    /// How long the manager has to return at shutdown. Default 30s, the
    /// Kubernetes default `terminationGracePeriodSeconds`.
    pub shutdown_grace: Duration,
    /// How often the loop records its heartbeat while it waits. Default 1s.
    /// `/healthz` fails when the heartbeat is older than a few of these.
    pub heartbeat: Duration,
    /// Whether a remote that recovers ends the cycle (or restarts its own
    /// part), so that clients reconnect fresh. Default `true`.
    pub rebuild_on_recovery: bool,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        Self {
            backoff: BackoffConfig::default(),
            stable_after: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(30),
            heartbeat: Duration::from_secs(1),
            rebuild_on_recovery: true,
        }
    }
}

impl SupervisorConfig {
    /// Sets the backoff between cycles.
    #[must_use]
    pub fn with_backoff(mut self, backoff: BackoffConfig) -> Self {
        self.backoff = backoff;
        self
    }

    /// Sets the lifetime after which a cycle counts as stable.
    #[must_use]
    pub fn with_stable_after(mut self, stable_after: Duration) -> Self {
        self.stable_after = stable_after;
        self
    }

    /// Sets the manager's grace period at shutdown.
    #[must_use]
    pub fn with_shutdown_grace(mut self, shutdown_grace: Duration) -> Self {
        self.shutdown_grace = shutdown_grace;
        self
    }

    /// Sets the heartbeat interval.
    #[must_use]
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Sets whether a recovered remote ends the cycle (or restarts its part).
    #[must_use]
    pub fn with_rebuild_on_recovery(mut self, rebuild: bool) -> Self {
        self.rebuild_on_recovery = rebuild;
        self
    }

    /// Checks that the settings are in range.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        self.backoff.validate()?;
        if self.heartbeat.is_zero() {
            return Err(Error::InvalidConfig {
                field: "heartbeat",
                reason: "must be greater than zero".to_owned(),
            });
        }
        Ok(())
    }
}

/// How [`Supervisor::run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ShutdownOutcome {
    /// The manager returned within the grace period, or none was running.
    Clean,
    /// The manager overran the grace period and was dropped.
    GraceExceeded,
}

impl std::fmt::Display for ShutdownOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Clean => "stopped within the grace period",
            Self::GraceExceeded => "the manager overran the grace period and was dropped",
        })
    }
}

/// A cheap, cloneable view of a running supervisor, for the admin server.
#[derive(Debug, Clone)]
pub struct SupervisorHandle {
    state: Arc<State>,
}

impl SupervisorHandle {
    /// The supervisor's state now.
    #[must_use]
    pub fn status(&self) -> Status {
        self.state.snapshot()
    }

    /// Ends the running cycle with `cause`, as new configuration does
    /// (`config_changed`). Returns whether a cycle was running and `cause`
    /// was recorded; between cycles there is nothing to end, since the next
    /// cycle is built from what is current then.
    // Not `#[must_use]`: most callers end the cycle and move on.
    #[allow(clippy::must_use_candidate)]
    pub fn end_cycle(&self, cause: Cause) -> bool {
        self.state.end_cycle(cause)
    }

    /// Resolves once cycle `number`, or a later one, has ended: its manager
    /// has returned.
    pub async fn ended(&self, number: u64) {
        self.state.ended(number).await;
    }
}

/// Resolves when `gate` holds `false`; never without a gate.
async fn closed(gate: Option<&mut watch::Receiver<bool>>) {
    match gate {
        None => std::future::pending().await,
        Some(gate) => {
            // A dropped sender leaves the last value.
            let _ = gate.wait_for(|open| !open).await;
        }
    }
}

/// What reaches the loop from outside, besides the gate: a remote's
/// reachability, or the end of the running cycle for a cause the caller
/// names (its plan changed).
#[derive(Debug)]
enum Input {
    Signal(RemoteSignal),
    End(Cause),
    /// The remotes the manager uses changed, for this cause.
    Remotes(Cause),
}

/// Every source of inputs, merged.
type Signals = Fuse<SelectAll<BoxStream<'static, Input>>>;

/// The gate cycles are built behind, and the cause that ends a cycle when it
/// closes.
struct Gate {
    open: watch::Receiver<bool>,
    closed: Box<dyn Fn() -> Cause + Send + Sync>,
}

/// Builds a manager once per cycle and rebuilds it, with backoff, whenever a
/// cycle ends, until the root token is cancelled.
pub struct Supervisor<F> {
    factory: F,
    config: SupervisorConfig,
    state: Arc<State>,
    signals: Vec<BoxStream<'static, Input>>,
    gate: Option<Gate>,
}

impl<F> std::fmt::Debug for Supervisor<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("config", &self.config)
            .field("signal_sources", &self.signals.len())
            .finish_non_exhaustive()
    }
}

/// How a cycle's run ended, as the loop needs to know it.
enum CycleEnd {
    /// The manager returned; build the next cycle.
    Returned,
    /// Root was cancelled; stop, reporting whether the grace was kept.
    Shutdown(ShutdownOutcome),
}

impl<F: ManagerFactory> Supervisor<F> {
    /// A supervisor for `factory`, with its metrics registered in `registry`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `config` is out of range, and
    /// [`Error::RegisterMetrics`] if the metrics' names are already taken in
    /// `registry`.
    pub fn new(factory: F, config: SupervisorConfig, registry: &Registry) -> Result<Self> {
        config.validate()?;
        let metrics = Metrics::register(registry).map_err(Error::RegisterMetrics)?;
        Ok(Self {
            factory,
            config,
            state: Arc::new(State::new(metrics)),
            signals: Vec::new(),
            gate: None,
        })
    }

    /// Builds cycles only while `gate` holds `true`: a leader election's
    /// verdict. While it is `false`, no cycle runs and the loop waits (the
    /// phase is `Standby`). When it turns `false` during a cycle, the cycle
    /// ends with `leadership_lost` at once, whatever the manager does.
    #[must_use]
    pub fn build_while(self, gate: watch::Receiver<bool>) -> Self {
        self.build_while_ending_with(gate, || Cause::LeadershipLost)
    }

    /// As [`build_while`](Self::build_while), but a cycle the gate ends gets
    /// the cause `closed` gives when it closes, rather than
    /// `leadership_lost`: a replica whose share of the remotes went to none
    /// ends its cycle with `shard_changed`.
    #[must_use]
    pub fn build_while_ending_with(
        mut self,
        gate: watch::Receiver<bool>,
        closed: impl Fn() -> Cause + Send + Sync + 'static,
    ) -> Self {
        self.gate = Some(Gate {
            open: gate,
            closed: Box::new(closed),
        });
        self
    }

    /// Ends cycles on `signals`: a remote lost or recovered, or signals
    /// dropped by a source that fell behind.
    ///
    /// A signal counts for the cycle running when the loop takes it; signals
    /// that arrive between cycles are dropped, so a remote that is already
    /// down when a cycle starts does not end that cycle again. For a remote
    /// the cycle uses (see [`ManagerFactory::remotes`]):
    ///
    /// - a loss ends the cycle (`remote_lost`), or, for a remote that
    ///   restarts alone, stops only its scope;
    /// - a recovery ends the cycle (`remote_recovered`) if
    ///   `rebuild_on_recovery` is set; a remote whose scope was stopped
    ///   starts again either way;
    /// - dropped signals end the cycle (`transitions_missed`): any of them
    ///   may have been a loss.
    ///
    /// Signals between cycles still count toward which remotes are lost,
    /// for a manager that [waits for them](ManagerFactory::waits_for_lost_remotes).
    ///
    /// May be called more than once; the sources are merged.
    #[must_use]
    pub fn end_cycles_on(
        mut self,
        signals: impl Stream<Item = RemoteSignal> + Send + 'static,
    ) -> Self {
        self.signals.push(signals.map(Input::Signal).boxed());
        self
    }

    /// Ends the running cycle with each cause `ends` yields: what the
    /// manager should run changed (`config_changed`, `shard_changed`).
    ///
    /// As with [`end_cycles_on`](Self::end_cycles_on), a cause that arrives
    /// between cycles is dropped: the next cycle is built from what is
    /// current then. So the stream's source must make the change visible
    /// to the factory before it yields the cause. A cycle that already
    /// ends keeps its first cause; one that waits for lost remotes ends
    /// without starting its manager.
    ///
    /// May be called more than once; the sources are merged.
    #[must_use]
    pub fn end_cycles_with(mut self, ends: impl Stream<Item = Cause> + Send + 'static) -> Self {
        self.signals.push(ends.map(Input::End).boxed());
        self
    }

    /// Makes the running cycle follow the remotes its manager uses, at each
    /// cause `changes` yields: a remote added, removed or read anew
    /// (`config_changed`), or this replica's share moved (`shard_changed`).
    ///
    /// For a manager that [takes remote changes](ManagerFactory::takes_remote_changes),
    /// the loop asks [`ManagerFactory::remotes`] again and changes only the
    /// scopes that differ: the cycle runs on, and each change is logged,
    /// counted in `tether_remote_changes_total` and kept in
    /// [`Status::remote_changes`]. Any other manager's cycle ends with the
    /// cause, as with [`end_cycles_with`](Self::end_cycles_with); so does
    /// one whose remote's loss now costs something else.
    ///
    /// As there, a change between cycles is dropped, and the stream's
    /// source must make it visible to the factory before it yields.
    ///
    /// May be called more than once; the sources are merged.
    #[must_use]
    pub fn change_remotes_on(
        mut self,
        changes: impl Stream<Item = Cause> + Send + 'static,
    ) -> Self {
        self.signals.push(changes.map(Input::Remotes).boxed());
        self
    }

    /// A view of this supervisor's state that outlives [`run`](Self::run).
    #[must_use]
    pub fn handle(&self) -> SupervisorHandle {
        SupervisorHandle {
            state: Arc::clone(&self.state),
        }
    }

    /// Runs cycles until `root` is cancelled.
    ///
    /// Each cycle gets a fresh child token of `root`. After a cycle ends, for
    /// any cause but shutdown, the loop waits a backoff and builds again. When
    /// `root` is cancelled, the running manager has `shutdown_grace` to
    /// return; a wait in progress is cut short.
    ///
    /// # Cancellation safety
    ///
    /// Not meant to be dropped: cancel `root` instead and await the outcome.
    /// Dropping the future drops the running manager's future with it.
    pub async fn run(self, root: CancellationToken) -> ShutdownOutcome {
        let Self {
            factory,
            config,
            state,
            signals,
            gate,
        } = self;
        let mut signals = stream::select_all(signals).fuse();
        Looper {
            factory,
            config,
            state,
            gate,
        }
        .cycles(&root, &mut signals)
        .instrument(info_span!("supervisor"))
        .await
    }
}

/// The running loop: a supervisor without its signal sources, which it
/// polls from its own task.
struct Looper<F> {
    factory: F,
    config: SupervisorConfig,
    state: Arc<State>,
    gate: Option<Gate>,
}

impl<F: ManagerFactory> Looper<F> {
    async fn cycles(&self, root: &CancellationToken, signals: &mut Signals) -> ShutdownOutcome {
        let mut backoff = Backoff::new(self.config.backoff);
        // The remotes lost now, as the signals say.
        let mut lost = BTreeSet::new();
        for number in 1.. {
            if root.is_cancelled() || !self.until_open(root).await {
                break;
            }
            // What was signalled before this cycle is not news to it.
            while let Some(Some(input)) = signals.next().now_or_never() {
                between_cycles(&mut lost, &input);
            }
            let cycle = CycleToken::with_state(number, root, Some(Arc::clone(&self.state)));
            let started = Instant::now();
            // Registered before the factory is asked for its remotes, so an
            // `end_cycle` that follows a change the factory might not have
            // seen reaches this cycle.
            self.state.cycle_started(&cycle, started);
            let used = self.factory.remotes();
            cycle.use_remotes(&used);
            self.state.remotes_used(&used);
            info!(cycle = number, "cycle starting");

            let end = self
                .run_cycle(&cycle, root, signals, &mut lost)
                .instrument(info_span!("cycle", cycle = number))
                .await;
            let ended = Instant::now();
            let lifetime = ended - started;
            let cause = cycle
                .cause()
                .cloned()
                .expect("run_cycle cancels the cycle with a cause on every path");

            if let CycleEnd::Shutdown(outcome) = end {
                self.state.cycle_ended(&cause, ended, None);
                info!(cycle = number, %cause, ?lifetime, %outcome, "cycle ended; supervisor stopping");
                self.state.stopped();
                return outcome;
            }

            if lifetime >= self.config.stable_after || cause.kind() == CauseKind::LeadershipLost {
                backoff.reset();
            }
            let wait = backoff.next_delay();
            self.state.cycle_ended(&cause, ended, Some(wait));
            info!(cycle = number, %cause, ?lifetime, next_backoff = ?wait, "cycle ended");

            let waited = self
                .beat_while(async {
                    let sleep = tokio::time::sleep(wait);
                    tokio::pin!(sleep);
                    loop {
                        tokio::select! {
                            () = &mut sleep => return true,
                            () = root.cancelled() => return false,
                            Some(input) = signals.next() => between_cycles(&mut lost, &input),
                        }
                    }
                })
                .await;
            if !waited {
                info!("shutdown during backoff; supervisor stopping");
                break;
            }
        }
        self.state.stopped();
        ShutdownOutcome::Clean
    }

    /// Waits until the gate is open (at once without one), beating the
    /// heartbeat; `false` if `root` was cancelled first.
    async fn until_open(&self, root: &CancellationToken) -> bool {
        let Some(gate) = &self.gate else {
            return true;
        };
        let mut gate = gate.open.clone();
        if *gate.borrow_and_update() {
            return true;
        }
        self.state.standby();
        // The election or the sharding says why, and who leads.
        debug!("waiting: the gate is closed (this replica does not lead, or holds no remote)");
        self.beat_while(async {
            loop {
                tokio::select! {
                    () = root.cancelled() => return false,
                    changed = gate.changed() => {
                        // A closed gate never opens again.
                        if changed.is_err() {
                            root.cancelled().await;
                            return false;
                        }
                        if *gate.borrow_and_update() {
                            return true;
                        }
                    }
                }
            }
        })
        .await
    }

    /// The lost remotes whose loss would end `cycle`, if its manager waits
    /// for them ([`ManagerFactory::waits_for_lost_remotes`]).
    fn awaited(&self, cycle: &CycleToken, lost: &BTreeSet<String>) -> Vec<String> {
        if !self.factory.waits_for_lost_remotes() {
            return Vec::new();
        }
        lost.iter()
            .filter(|remote| matches!(cycle.usage(remote), Usage::EndsCycle))
            .cloned()
            .collect()
    }

    /// Runs one manager to its end, and leaves `cycle` cancelled with a cause.
    /// A manager that waits for lost remotes is started only once none is.
    async fn run_cycle(
        &self,
        cycle: &CycleToken,
        root: &CancellationToken,
        signals: &mut Signals,
        lost: &mut BTreeSet<String>,
    ) -> CycleEnd {
        let mut run = pin!(AssertUnwindSafe(self.factory.run(cycle.clone())).catch_unwind());
        let mut gate = self.gate.as_ref().map(|g| g.open.clone());
        let mut waiting = self.awaited(cycle, lost);
        if !waiting.is_empty() {
            info!(remotes = %waiting.join(","), "waiting for lost remotes before starting the manager");
            self.state.holding(&waiting);
        }
        let finished = self
            .beat_while(async {
                loop {
                    tokio::select! {
                        biased;
                        out = &mut run, if waiting.is_empty() => return Finished::Returned(out),
                        () = root.cancelled() => return Finished::Root,
                        () = cycle.cancelled(), if !waiting.is_empty() => return Finished::NeverStarted,
                        // Before the gate: a plan change the caller made
                        // together with closing it names the cause.
                        Some(input) = signals.next() => {
                            let signal = match input {
                                Input::End(cause) => {
                                    end(cycle, cause);
                                    continue;
                                }
                                Input::Remotes(cause) => {
                                    self.change_remotes(cycle, cause);
                                    if !waiting.is_empty() {
                                        waiting = self.awaited(cycle, lost);
                                        self.state.holding(&waiting);
                                    }
                                    continue;
                                }
                                Input::Signal(signal) => signal,
                            };
                            track(lost, &signal);
                            if waiting.is_empty() {
                                self.on_signal(cycle, signal);
                            } else {
                                waiting = self.awaited(cycle, lost);
                                self.state.holding(&waiting);
                                if waiting.is_empty() {
                                    info!(%signal, "no remote is lost: starting the manager");
                                }
                            }
                        }
                        () = closed(gate.as_mut()) => {
                            if let Some(cause) = self.gate.as_ref().map(|g| (g.closed)())
                                && cycle.cancel(cause.clone())
                            {
                                warn!(%cause, "the gate closed: ending the cycle");
                            }
                            gate = None;
                        }
                    }
                }
            })
            .await;

        // A manager that returned because root's cancel reached it is part of
        // the shutdown too, so decide by root, not by which branch won.
        let shutting_down = root.is_cancelled();
        if shutting_down {
            cycle.cancel(Cause::Shutdown);
            self.state.shutting_down();
        }
        let out = if let Finished::Returned(out) = finished {
            Some(out)
        } else if !waiting.is_empty() {
            // Never started: nothing to wait for, and its cause is recorded.
            return if shutting_down {
                CycleEnd::Shutdown(ShutdownOutcome::Clean)
            } else {
                CycleEnd::Returned
            };
        } else {
            let grace = self.config.shutdown_grace;
            info!(?grace, "shutting down; waiting for the manager to return");
            let out = self
                .beat_while(tokio::time::timeout(grace, &mut run))
                .await
                .ok();
            if out.is_none() {
                error!(
                    ?grace,
                    "the manager did not return within the shutdown grace period"
                );
            }
            out
        };
        let returned = out.is_some();
        if let Some(out) = out {
            record_outcome(cycle, out);
        }
        match (shutting_down, returned) {
            (false, _) => CycleEnd::Returned,
            (true, true) => CycleEnd::Shutdown(ShutdownOutcome::Clean),
            (true, false) => CycleEnd::Shutdown(ShutdownOutcome::GraceExceeded),
        }
    }

    /// Makes the running `cycle` follow the remotes its manager uses now,
    /// or ends it for `cause` if the manager cannot take that.
    fn change_remotes(&self, cycle: &CycleToken, cause: Cause) {
        if cycle.is_cancelled() {
            debug!(%cause, "the remotes changed while the cycle ends; dropped");
            return;
        }
        if !self.factory.takes_remote_changes(&cause) {
            return end(cycle, cause);
        }
        let used = self.factory.remotes();
        let UsedRemotes::Only(now) = &used else {
            return end(cycle, cause);
        };
        match cycle.change_remotes(now) {
            Err(remote) => {
                info!(%remote, "what the loss of a remote costs changed");
                end(cycle, cause);
            }
            Ok(changes) => {
                for (remote, change) in &changes {
                    info!(%remote, %change, cause = %cause.kind(), "{}: the remote's part {}; the cycle runs on", cause.in_words(), match change {
                        RemoteChange::Added => "starts",
                        RemoteChange::Removed => "stops",
                        RemoteChange::Rebuilt => "starts anew",
                    });
                }
                self.state.remotes_changed(&changes, cause.kind(), &used);
            }
        }
    }

    /// Acts on one signal for the running `cycle`. Once the cycle is
    /// cancelled and its manager tears down, signals are as between cycles.
    fn on_signal(&self, cycle: &CycleToken, signal: RemoteSignal) {
        if cycle.is_cancelled() {
            debug!(%signal, "signal while the cycle ends; dropped");
            return;
        }
        let rebuild = self.config.rebuild_on_recovery;
        match signal {
            RemoteSignal::Missed(count) => {
                if cycle.cancel(Cause::TransitionsMissed { count }) {
                    warn!(
                        missed = count,
                        "fell behind the remote signals; ending the cycle, since a loss may be among those missed"
                    );
                }
            }
            RemoteSignal::Lost(remote) => match cycle.usage(&remote) {
                Usage::Unused => {}
                Usage::EndsCycle => {
                    cycle.cancel(Cause::remote_lost(remote));
                }
                Usage::RestartsAlone(scope) => {
                    if scope.stop() {
                        self.state.remote_restarted(&remote, CauseKind::RemoteLost);
                        warn!(%remote, "remote lost: its part of the cycle stops until it is back; the rest runs on");
                    }
                }
            },
            RemoteSignal::Recovered(remote) => match cycle.usage(&remote) {
                Usage::Unused => {}
                Usage::EndsCycle => {
                    if rebuild {
                        cycle.cancel(Cause::remote_recovered(remote));
                    }
                }
                Usage::RestartsAlone(scope) => {
                    if !scope.is_running() {
                        info!(%remote, "remote back: its part of the cycle starts again");
                        scope.start();
                    } else if rebuild {
                        self.state
                            .remote_restarted(&remote, CauseKind::RemoteRecovered);
                        info!(%remote, "remote back: restarting its part of the cycle, so its clients reconnect fresh");
                        scope.start();
                    }
                }
            },
        }
    }

    /// Awaits `work`, recording a heartbeat every `heartbeat` meanwhile.
    ///
    /// The beats run in the loop's own task, so a manager that blocks the
    /// thread stops them, and `/healthz` notices.
    async fn beat_while<T>(&self, work: impl Future<Output = T>) -> T {
        let mut work = pin!(work);
        let mut ticks = tokio::time::interval(self.config.heartbeat);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                out = &mut work => return out,
                _ = ticks.tick() => self.state.beat(),
            }
        }
    }
}

/// How the wait on a cycle's manager ended.
enum Finished<T> {
    /// The manager returned.
    Returned(T),
    /// `root` was cancelled first.
    Root,
    /// The cycle ended while it waited for lost remotes: no manager ran.
    NeverStarted,
}

/// Ends the running `cycle` for `cause`, from outside.
fn end(cycle: &CycleToken, cause: Cause) {
    let words = cause.in_words();
    let kind = cause.kind();
    if cycle.cancel(cause) {
        info!(cause = %kind, "{words}: ending the cycle");
    } else {
        debug!(cause = %kind, "{words}, while the cycle ends; dropped");
    }
}

/// An input that arrives between cycles: a signal counts toward which
/// remotes are lost; an end is dropped, since the next cycle is built from
/// what is current then.
fn between_cycles(lost: &mut BTreeSet<String>, input: &Input) {
    match input {
        Input::Signal(signal) => {
            track(lost, signal);
            debug!(%signal, "signal between cycles; dropped");
        }
        Input::End(cause) => debug!(%cause, "a cycle end between cycles; dropped"),
        Input::Remotes(cause) => debug!(%cause, "a change of remotes between cycles; dropped"),
    }
}

/// Keeps `lost` as the signals say.
fn track(lost: &mut BTreeSet<String>, signal: &RemoteSignal) {
    match signal {
        RemoteSignal::Lost(remote) => {
            lost.insert(remote.clone());
        }
        RemoteSignal::Recovered(remote) => {
            lost.remove(remote);
        }
        // Transitions were missed: which remotes are lost is not known, and
        // a wait for a recovery that was missed would never end.
        RemoteSignal::Missed(_) => lost.clear(),
    }
}

/// Cancels `cycle` with the cause its manager's return implies. When an
/// earlier cause already won, the return is only logged.
fn record_outcome(
    cycle: &CycleToken,
    out: std::thread::Result<std::result::Result<(), ManagerError>>,
) {
    match out {
        Ok(Ok(())) => {
            if cycle.cancel(Cause::ManagerExited) {
                warn!("the manager returned without being cancelled");
            }
        }
        Ok(Err(err)) => {
            let chain = error_chain(&err);
            let error = err.source_chain();
            let cause = match &err {
                ManagerError::BuildFailed(_) => Cause::BuildFailed { error },
                ManagerError::Failed(_) => Cause::ManagerFailed { error },
            };
            let kind = cause.kind();
            if cycle.cancel(cause) {
                warn!(cause = %kind, error = %chain, "the manager ended with an error");
            } else {
                debug!(error = %chain, "the manager returned an error after its cycle was cancelled");
            }
        }
        Err(payload) => {
            let message = panic_message(payload.as_ref());
            error!(panic = %message, "the manager panicked");
            cycle.cancel(Cause::ManagerPanicked { message });
        }
    }
}
