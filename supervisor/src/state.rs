//! What the supervisor shares with the admin server: a status snapshot kept
//! in step with the metrics.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::{Metrics, RESTART_CAUSES};
use crate::{Cause, CauseKind, CycleToken, OnLoss, RemoteChange, UsedRemotes};

/// Where the supervisor's loop is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No cycle has been built yet.
    Starting,
    /// A cycle's manager is being built or is running.
    Running,
    /// Between cycles, waiting out the backoff.
    BackingOff,
    /// Not allowed to build cycles (another replica leads); waiting.
    Standby,
    /// Shutdown was requested; the last manager is given its grace period.
    ShuttingDown,
    /// The loop has returned.
    Stopped,
}

impl Phase {
    /// The phase in words, as status pages and logs show it.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Running => "running",
            Self::BackingOff => "backing off",
            Self::Standby => "standby",
            Self::ShuttingDown => "shutting down",
            Self::Stopped => "stopped",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How many ended cycles [`Status::recent`] keeps, for the status page's
/// timeline: enough for a rebuild storm to show as one, a few hundred bytes
/// each.
pub const RECENT_CYCLES: usize = 30;

/// A cycle that has ended, as the status page's timeline shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EndedCycle {
    /// Its number.
    pub number: u64,
    /// When it started.
    pub started: Instant,
    /// When it ended.
    pub ended: Instant,
    /// Why it ended.
    pub cause: Cause,
    /// The wait before the next cycle; `None` for the last, at shutdown.
    pub backoff: Option<Duration>,
}

impl EndedCycle {
    /// How long it lived.
    #[must_use]
    pub fn lifetime(&self) -> Duration {
        self.ended - self.started
    }
}

/// How many remote changes [`Status::remote_changes`] keeps.
pub const RECENT_REMOTE_CHANGES: usize = 30;

/// A change of one remote's part that the running cycle took in.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ChangedRemote {
    /// The remote.
    pub remote: String,
    /// What changed.
    pub change: RemoteChange,
    /// Why: `config_changed` or `shard_changed`.
    pub cause: CauseKind,
    /// In which cycle.
    pub cycle: u64,
    /// When.
    pub at: Instant,
}

/// A snapshot of the supervisor, as the admin server shows it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Status {
    /// Where the loop is.
    pub phase: Phase,
    /// The current (or last) cycle's number; 0 before the first.
    pub cycle: u64,
    /// When the current (or last) cycle started.
    pub cycle_started: Option<Instant>,
    /// Whether the current cycle's manager reported itself up.
    pub manager_up: bool,
    /// Since when it has been up, while it is.
    pub up_since: Option<Instant>,
    /// The last [`RECENT_CYCLES`] ended cycles, oldest first.
    pub recent: VecDeque<EndedCycle>,
    /// The wait before the next build, while backing off.
    pub backoff: Option<Duration>,
    /// The last time the loop showed it is not wedged.
    pub heartbeat: Instant,
    /// Ended cycles by cause; every cause is present.
    pub ended: BTreeMap<CauseKind, u64>,
    /// The remotes whose part of the current cycle is stopped alone (lost,
    /// and waiting to recover), sorted by name.
    pub stopped_remotes: Vec<String>,
    /// The lost remotes the current cycle waits for before it starts a
    /// manager that [waits for them](crate::ManagerFactory::waits_for_lost_remotes),
    /// sorted by name; empty once the manager has started.
    pub held_for: Vec<String>,
    /// The last [`RECENT_REMOTE_CHANGES`] changes of one remote's part that
    /// a running cycle took in, oldest first.
    pub remote_changes: VecDeque<ChangedRemote>,
    /// Those changes since the start, by kind; every kind is present.
    pub remote_changed: BTreeMap<RemoteChange, u64>,
}

impl Status {
    /// The last ended cycle.
    #[must_use]
    pub fn last_ended(&self) -> Option<&EndedCycle> {
        self.recent.back()
    }

    /// The cause that ended the last cycle.
    #[must_use]
    pub fn last_cause(&self) -> Option<&Cause> {
        self.last_ended().map(|c| &c.cause)
    }
}

#[derive(Debug)]
struct Inner {
    status: Status,
    /// The running cycle, so that [`State::end_cycle`] can reach it.
    current: Option<CycleToken>,
    /// The remotes that have `tether_remote_restarts_total` series.
    restartable: BTreeSet<String>,
}

#[derive(Debug)]
pub(crate) struct State {
    inner: Mutex<Inner>,
    metrics: Metrics,
    /// The number of the last cycle that ended (0: none yet), for those who
    /// wait for one to end.
    ended: tokio::sync::watch::Sender<u64>,
}

impl State {
    pub(crate) fn new(metrics: Metrics) -> Self {
        Self {
            inner: Mutex::new(Inner {
                status: Status {
                    phase: Phase::Starting,
                    cycle: 0,
                    cycle_started: None,
                    manager_up: false,
                    up_since: None,
                    recent: VecDeque::with_capacity(RECENT_CYCLES),
                    backoff: None,
                    heartbeat: Instant::now(),
                    ended: CauseKind::ALL.into_iter().map(|kind| (kind, 0)).collect(),
                    stopped_remotes: Vec::new(),
                    held_for: Vec::new(),
                    remote_changes: VecDeque::with_capacity(RECENT_REMOTE_CHANGES),
                    remote_changed: RemoteChange::ALL.into_iter().map(|c| (c, 0)).collect(),
                },
                current: None,
                restartable: BTreeSet::new(),
            }),
            metrics,
            ended: tokio::sync::watch::Sender::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Nothing panics while holding this lock: every critical section only
        // assigns fields. A poisoned lock still holds a consistent status.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn snapshot(&self) -> Status {
        let inner = self.lock();
        let mut status = inner.status.clone();
        if let Some(cycle) = &inner.current {
            status.stopped_remotes = cycle.stopped_remotes();
        }
        status
    }

    /// Resolves once cycle `number`, or a later one, has ended.
    pub(crate) async fn ended(&self, number: u64) {
        let mut ended = self.ended.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = ended.wait_for(|last| *last >= number).await;
    }

    pub(crate) fn beat(&self) {
        self.lock().status.heartbeat = Instant::now();
    }

    /// Cancels the running cycle with `cause`; returns whether a cycle was
    /// running and `cause` was recorded.
    pub(crate) fn end_cycle(&self, cause: Cause) -> bool {
        let current = self.lock().current.clone();
        current.is_some_and(|cycle| cycle.cancel(cause))
    }

    /// Counts a stop of `remote`'s part alone.
    pub(crate) fn remote_restarted(&self, remote: &str, cause: CauseKind) {
        self.metrics
            .restarts_total
            .with_label_values(&[remote, cause.as_str()])
            .inc();
    }

    /// Records the changes the running cycle took in for `cause`, and
    /// keeps the restart series to `used`, the remotes it uses now.
    pub(crate) fn remotes_changed(
        &self,
        changes: &[(String, RemoteChange)],
        cause: CauseKind,
        used: &UsedRemotes,
    ) {
        if changes.is_empty() {
            return;
        }
        {
            let mut inner = self.lock();
            let status = &mut inner.status;
            let at = Instant::now();
            for (remote, change) in changes {
                if status.remote_changes.len() == RECENT_REMOTE_CHANGES {
                    status.remote_changes.pop_front();
                }
                status.remote_changes.push_back(ChangedRemote {
                    remote: remote.clone(),
                    change: *change,
                    cause,
                    cycle: status.cycle,
                    at,
                });
                *status.remote_changed.entry(*change).or_default() += 1;
                self.metrics
                    .changes_total
                    .with_label_values(&[change.as_str(), cause.as_str()])
                    .inc();
            }
        }
        self.remotes_used(used);
    }

    /// Keeps `tether_remote_restarts_total` to the remotes that can restart
    /// alone in this cycle: theirs start at 0, other remotes' go.
    pub(crate) fn remotes_used(&self, used: &UsedRemotes) {
        let now: BTreeSet<String> = match used {
            UsedRemotes::All => BTreeSet::new(),
            UsedRemotes::Only(remotes) => remotes
                .iter()
                .filter(|r| r.on_loss == OnLoss::RestartAlone)
                .map(|r| r.name.clone())
                .collect(),
        };
        let mut inner = self.lock();
        for gone in inner.restartable.difference(&now) {
            for cause in RESTART_CAUSES {
                let _ = self
                    .metrics
                    .restarts_total
                    .remove_label_values(&[gone, cause.as_str()]);
            }
        }
        for remote in &now {
            for cause in RESTART_CAUSES {
                self.metrics
                    .restarts_total
                    .with_label_values(&[remote, cause.as_str()]);
            }
        }
        inner.restartable = now;
    }

    pub(crate) fn cycle_started(&self, cycle: &CycleToken, at: Instant) {
        let number = cycle.number();
        let mut inner = self.lock();
        inner.current = Some(cycle.clone());
        let status = &mut inner.status;
        status.phase = Phase::Running;
        status.cycle = number;
        status.cycle_started = Some(at);
        status.held_for.clear();
        status.manager_up = false;
        status.up_since = None;
        status.backoff = None;
        status.heartbeat = at;
        self.metrics
            .cycle
            .set(i64::try_from(number).unwrap_or(i64::MAX));
        self.metrics.manager_up.set(0);
        self.metrics.backoff_seconds.set(0.0);
    }

    /// Takes a manager's up report if it is for the current cycle and
    /// `cancelled` is still false under the lock.
    pub(crate) fn set_manager_up(
        &self,
        number: u64,
        up: bool,
        cancelled: impl FnOnce() -> bool,
    ) -> bool {
        let status = &mut self.lock().status;
        if status.cycle != number || status.phase != Phase::Running || (up && cancelled()) {
            return false;
        }
        if up != status.manager_up {
            status.up_since = up.then(Instant::now);
        }
        status.manager_up = up;
        self.metrics.manager_up.set(i64::from(up));
        true
    }

    /// The current cycle holds its manager until `remotes` are back (none:
    /// it has started it).
    pub(crate) fn holding(&self, remotes: &[String]) {
        remotes.clone_into(&mut self.lock().status.held_for);
    }

    pub(crate) fn standby(&self) {
        let status = &mut self.lock().status;
        status.phase = Phase::Standby;
        status.manager_up = false;
        status.up_since = None;
        status.backoff = None;
        self.metrics.manager_up.set(0);
        self.metrics.backoff_seconds.set(0.0);
    }

    pub(crate) fn shutting_down(&self) {
        let status = &mut self.lock().status;
        status.phase = Phase::ShuttingDown;
        status.manager_up = false;
        status.up_since = None;
        self.metrics.manager_up.set(0);
    }

    /// Records the end of the current cycle, and the wait before the next one
    /// (`None` at shutdown).
    pub(crate) fn cycle_ended(&self, cause: &Cause, ended: Instant, next: Option<Duration>) {
        let mut inner = self.lock();
        inner.current = None;
        let status = &mut inner.status;
        status.manager_up = false;
        status.up_since = None;
        status.held_for.clear();
        if status.recent.len() == RECENT_CYCLES {
            status.recent.pop_front();
        }
        status.recent.push_back(EndedCycle {
            number: status.cycle,
            started: status.cycle_started.unwrap_or(ended),
            ended,
            cause: cause.clone(),
            backoff: next,
        });
        *status.ended.entry(cause.kind()).or_default() += 1;
        self.ended.send_replace(status.cycle);
        self.metrics.manager_up.set(0);
        self.metrics
            .cycles_total
            .with_label_values(&[cause.kind().as_str()])
            .inc();
        if let Some(wait) = next {
            status.phase = Phase::BackingOff;
            status.backoff = Some(wait);
            self.metrics.backoff_seconds.set(wait.as_secs_f64());
        }
    }

    pub(crate) fn stopped(&self) {
        let mut inner = self.lock();
        inner.current = None;
        let status = &mut inner.status;
        status.phase = Phase::Stopped;
        status.manager_up = false;
        status.up_since = None;
        status.backoff = None;
        self.metrics.manager_up.set(0);
        self.metrics.backoff_seconds.set(0.0);
    }
}
