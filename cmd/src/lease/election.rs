//! Leader election on a Lease, read and written as client-go's
//! `leaderelection` package does, with a fence on this process's own
//! monotonic clock.
//!
//! - Every `retryPeriod` (with up to 20% jitter, as client-go), a replica
//!   reads the Lease. It takes it if it is free (no holder, or the holder's
//!   claim has not been renewed for `leaseDuration` by this replica's
//!   clock, measured from when it saw the record change), and the leader
//!   renews it. Writes carry the `resourceVersion` read, so of two replicas
//!   that race, one gets `409 Conflict` and stays a follower.
//! - The fence: a leader counts from the moment it *sent* its last
//!   successful renewal. At that moment plus `renewDeadline` it stops
//!   believing it leads, whatever the apiserver says or does not say, and
//!   the supervisor ends its cycle (`leadership_lost`). Another replica
//!   takes the Lease no sooner than `leaseDuration` after it saw that same
//!   renewal, so the leader's manager has `leaseDuration - renewDeadline`
//!   to stop, and the config makes the exec manager's grace fit in it.
//! - Seeing another holder in a renewal ends the leadership at once.
//! - At shutdown, after the manager stopped, the leader releases the Lease
//!   as `ReleaseOnCancel` does: no holder, `leaseDurationSeconds: 1`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use super::Error;
use super::{jittered, micro_now};
use crate::config::LeaderElectionSpec;
use crate::lock;

/// Where this replica stands, for `/status`, `/readyz` and `tether check`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElectionState {
    /// This replica's identity.
    pub identity: String,
    /// `namespace/name` of the Lease.
    pub lease: String,
    /// Whether this replica leads.
    pub leading: bool,
    /// The holder last seen on the Lease; empty when free.
    pub holder: String,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<ElectionState>,
    leader: IntGauge,
    transitions: IntCounter,
}

/// A view of the election, for the admin server and shutdown.
#[derive(Debug, Clone)]
pub struct ElectionHandle {
    shared: Arc<Shared>,
    gate: watch::Receiver<bool>,
}

impl ElectionHandle {
    /// Where this replica stands.
    #[must_use]
    pub fn state(&self) -> ElectionState {
        lock(&self.shared.state).clone()
    }

    /// The gate the supervisor builds cycles behind: `true` while leading.
    #[must_use]
    pub fn gate(&self) -> watch::Receiver<bool> {
        self.gate.clone()
    }
}

/// A running election.
pub struct Election {
    spec: LeaderElectionSpec,
    leases: Api<Lease>,
    identity: String,
    shared: Arc<Shared>,
    gate: watch::Sender<bool>,
}

impl std::fmt::Debug for Election {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Election")
            .field("identity", &self.identity)
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// Closes the gate when dropped.
struct CloseOnDrop<'a>(&'a Election);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.set_leading(false, "the election stopped");
    }
}

/// What one try came to.
enum Attempt {
    /// This replica holds the Lease, renewed by the write sent at the time
    /// given.
    Holding,
    /// Another holder's claim is valid.
    HeldBy(String),
}

impl Election {
    /// An election for `spec`, its metrics in `registry`.
    ///
    /// # Errors
    ///
    /// [`Error`] if the Lease's cluster or namespace cannot be found.
    pub async fn new(spec: LeaderElectionSpec, registry: &Registry) -> Result<Self, Error> {
        let super::Leases {
            api: leases,
            namespace,
            identity,
        } = super::Leases::new(&spec).await?;
        let leader = IntGauge::new(
            "tether_leader",
            "1 while this replica leads; 0 while it stands by.",
        )
        .map_err(Error::Metrics)?;
        let transitions = IntCounter::new(
            "tether_leader_transitions_total",
            "Changes of this replica's role: to leader, or away from it.",
        )
        .map_err(Error::Metrics)?;
        registry
            .register(Box::new(leader.clone()))
            .map_err(Error::Metrics)?;
        registry
            .register(Box::new(transitions.clone()))
            .map_err(Error::Metrics)?;
        let (gate, _) = watch::channel(false);
        Ok(Self {
            leases,
            shared: Arc::new(Shared {
                state: Mutex::new(ElectionState {
                    identity: identity.clone(),
                    lease: format!("{namespace}/{}", spec.lease_name),
                    ..ElectionState::default()
                }),
                leader,
                transitions,
            }),
            identity,
            spec,
            gate,
        })
    }

    /// A view for the admin server, and the supervisor's gate.
    #[must_use]
    pub fn handle(&self) -> ElectionHandle {
        ElectionHandle {
            shared: Arc::clone(&self.shared),
            gate: self.gate.subscribe(),
        }
    }

    fn set_leading(&self, leading: bool, why: &str) {
        if self.gate.send_replace(leading) == leading {
            return;
        }
        self.shared.leader.set(i64::from(leading));
        self.shared.transitions.inc();
        lock(&self.shared.state).leading = leading;
        if leading {
            info!(identity = %self.identity, "leading: this replica now runs the manager");
        } else {
            warn!(identity = %self.identity, why, "leadership lost: stopping the manager");
        }
    }

    fn note(&self, holder: Option<&str>, error: Option<String>) {
        let mut state = lock(&self.shared.state);
        if let Some(holder) = holder {
            holder.clone_into(&mut state.holder);
        }
        state.last_error = error;
    }

    /// Runs until `stop` is cancelled. Then it stops leading (the gate
    /// closes), and the caller releases the Lease after the manager stopped.
    ///
    /// # Cancellation safety
    ///
    /// Cancel `stop` instead of dropping it.
    pub async fn run(&self, stop: CancellationToken) {
        // However this ends (a panic, the future dropped), the gate closes:
        // a leader whose election no longer runs must not go on leading.
        let _closes = CloseOnDrop(self);
        let spec = &self.spec;
        // The record as last seen, and when this replica saw it change.
        let mut observed: Option<(LeaseSpec, Instant)> = None;
        // When the last successful renewal was sent, while leading.
        let mut renewed: Option<Instant> = None;
        let mut next_try = Instant::now();
        loop {
            let fence = renewed.map(|at| at + spec.renew_deadline);
            tokio::select! {
                () = stop.cancelled() => break,
                () = sleep_until(next_try) => {}
                () = sleep_until(fence.unwrap_or(next_try)), if fence.is_some_and(|f| f < next_try) => {
                    renewed = None;
                    self.set_leading(false, "no renewal succeeded within renewDeadline");
                    continue;
                }
            }
            let sent = Instant::now();
            let attempt = tokio::select! {
                () = stop.cancelled() => break,
                attempt = timeout(spec.retry_period, self.try_acquire_or_renew(&mut observed)) => attempt,
                () = sleep_until(fence.unwrap_or(sent)), if fence.is_some() => {
                    renewed = None;
                    self.set_leading(false, "no renewal succeeded within renewDeadline");
                    next_try = Instant::now() + jittered(spec.retry_period);
                    continue;
                }
            };
            match attempt {
                Ok(Ok(Attempt::Holding)) => {
                    renewed = Some(sent);
                    self.note(Some(&self.identity), None);
                    self.set_leading(true, "");
                }
                Ok(Ok(Attempt::HeldBy(holder))) => {
                    self.note(Some(&holder), None);
                    if renewed.take().is_some() {
                        self.set_leading(false, "another holder took the Lease");
                    }
                }
                Ok(Err(err)) => self.note(None, Some(tether_supervisor::error_chain(&err))),
                Err(_) => self.note(
                    None,
                    Some("the Lease's apiserver did not answer in time".to_owned()),
                ),
            }
            // A leader renews as often as a follower tries, as client-go.
            next_try = Instant::now() + jittered(spec.retry_period);
        }
        self.set_leading(false, "shutting down");
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<(LeaseSpec, Instant)>,
    ) -> Result<Attempt, kube::Error> {
        let spec = &self.spec;
        let now = micro_now();
        let duration = i32::try_from(spec.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.leases.get_opt(&spec.lease_name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(spec.lease_name.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            self.leases.create(&PostParams::default(), &lease).await?;
            return Ok(Attempt::Holding);
        };
        let old = lease.spec.clone().unwrap_or_default();
        if observed.as_ref().is_none_or(|(seen, _)| *seen != old) {
            *observed = Some((old.clone(), Instant::now()));
        }
        let holder = old.holder_identity.clone().unwrap_or_default();
        let observed_at = observed.as_ref().map_or_else(Instant::now, |(_, at)| *at);
        let claim = Duration::from_secs(
            u64::try_from(old.lease_duration_seconds.unwrap_or(duration)).unwrap_or(0),
        );
        let mine = holder == self.identity;
        if !holder.is_empty() && !mine && observed_at + claim > Instant::now() {
            return Ok(Attempt::HeldBy(holder));
        }
        let transitions = old.lease_transitions.unwrap_or(0);
        lease.spec = Some(LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration),
            acquire_time: if mine {
                old.acquire_time.clone()
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if mine { transitions } else { transitions + 1 }),
            ..old
        });
        match self
            .leases
            .replace(&spec.lease_name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Holding),
            // Another replica wrote first: it holds the Lease now.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Attempt::HeldBy(holder)),
            Err(err) => Err(err),
        }
    }

    /// The Lease as it is now, for `tether check`: its holder (empty when
    /// free), and how long ago it was renewed; `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// If the Lease cannot be read within `retryPeriod`.
    pub async fn holder(&self) -> Result<Option<(String, Option<Duration>)>, String> {
        let lease = timeout(
            self.spec.retry_period,
            self.leases.get_opt(&self.spec.lease_name),
        )
        .await
        .map_err(|_| "the Lease's apiserver did not answer in time".to_owned())?
        .map_err(|err| tether_supervisor::error_chain(&err))?;
        Ok(lease.map(|lease| {
            let spec = lease.spec.unwrap_or_default();
            let age = spec.renew_time.and_then(|t| {
                let since = jiff::Timestamp::now().duration_since(t.0);
                std::time::Duration::try_from(since).ok()
            });
            (spec.holder_identity.unwrap_or_default(), age)
        }))
    }

    /// This replica's identity.
    #[must_use]
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Releases the Lease if this replica holds it, as client-go's
    /// `ReleaseOnCancel`: no holder, `leaseDurationSeconds: 1`, so another
    /// replica takes it at its next try. Call it after the manager stopped.
    pub async fn release(&self) {
        let attempt = async {
            let Some(mut lease) = self.leases.get_opt(&self.spec.lease_name).await? else {
                return Ok::<bool, kube::Error>(false);
            };
            let old = lease.spec.clone().unwrap_or_default();
            if old.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            let now = micro_now();
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                ..old
            });
            self.leases
                .replace(&self.spec.lease_name, &PostParams::default(), &lease)
                .await?;
            Ok(true)
        };
        match timeout(self.spec.retry_period, attempt).await {
            Ok(Ok(true)) => info!(identity = %self.identity, "released the Lease"),
            Ok(Ok(false)) => {}
            Ok(Err(err)) => {
                warn!(error = %err, "could not release the Lease; another replica takes it after leaseDuration");
            }
            Err(_) => {
                warn!(
                    "releasing the Lease timed out; another replica takes it after leaseDuration"
                );
            }
        }
    }
}
