//! Leader election on a Lease, read and written as client-go's
//! `leaderelection` package does, with a fence on this process's own
//! monotonic clock. The claim, the record and the loop are `claim.rs`'s;
//! this module decides what a try does.
//!
//! - Every `retryPeriod` (with up to 20% jitter, as client-go), a replica
//!   reads the Lease. It takes it when no claim on it is current by this
//!   replica's clock ([`Claim`](super::claim::Claim)): released, or lapsed a
//!   full `leaseDuration` after this replica saw it change. The leader
//!   renews it. Writes carry the `resourceVersion` read: of two replicas
//!   that race, one gets `409 Conflict`, a failed try and nothing more.
//! - A Lease that does not exist: the leader whose claim is current
//!   recreates it at once and goes on leading. A replica that saw it vanish
//!   from under another holder waits out that holder's claim. Any other
//!   replica creates it at once (a create fails if another was first), but
//!   leads only a `leaseDuration` after its create was sent: a Lease can
//!   come and go between two reads, so a replica that saw none cannot know
//!   that no one led a moment ago, and that one's fence ends by then.
//! - The fence: a leader stops believing it leads at `renewDeadline` after
//!   it *sent* its last successful write, whatever the apiserver says or
//!   does not say, and the supervisor ends its cycle (`leadership_lost`).
//!   Another replica takes the Lease no sooner than `leaseDuration` after
//!   it saw that same write, so the leader's manager has `leaseDuration -
//!   renewDeadline` to stop, and the config makes the exec manager's grace
//!   fit in it.
//! - Seeing another holder's current claim ends the leadership at once. A
//!   record under this replica's own identity that this process did not
//!   write is another process's (two processes given one identity): it is
//!   reported, and never taken for this replica's own.
//! - At shutdown, after the manager stopped, the leader releases the Lease
//!   as `ReleaseOnCancel` does: no holder, `leaseDurationSeconds: 1`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use prometheus::{IntCounter, IntGauge, Registry};
use tokio::sync::watch;
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub(crate) use super::Error;
use super::claim::{self, Claimant, Lapse, Observer, Releaser, TryError, shown_holder};
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
    /// The holder last seen on the Lease, escaped and cut; empty when free
    /// or unknown.
    pub holder: String,
    /// Whether the Lease names this replica's identity, written by another
    /// process: two processes share one identity.
    pub twin: bool,
    /// While this replica holds a Lease it created but does not lead yet:
    /// how long until it does.
    pub leads_in: Option<Duration>,
    /// Why the last try failed, if it did.
    pub last_error: Option<String>,
    /// Whether the election has stopped because tether shuts down: a
    /// leader that stops so released the Lease, and lost nothing.
    pub stopped: bool,
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
pub(crate) struct Election {
    spec: LeaderElectionSpec,
    leases: Api<Lease>,
    identity: String,
    shared: Arc<Shared>,
    gate: watch::Sender<bool>,
    /// What this replica has seen of the Lease, and what it wrote to it.
    seen: Mutex<Observer>,
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

/// A change of this replica's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// It leads from now on.
    Lead,
    /// It lost the leadership, for this reason: its manager must stop.
    Lost(&'static str),
    /// The election stops at a shutdown, after the manager stopped:
    /// nothing is lost.
    ShuttingDown,
}

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.turn(Turn::Lost("the election stopped"));
    }
}

/// The election as the claim loop drives it.
struct Candidate<'a> {
    election: &'a Election,
    /// Why the last try found the Lease not this replica's.
    why: &'static str,
    /// When this replica, holding a Lease it created, may lead.
    leads_from: Option<Instant>,
    /// The other replica this one last said leads, escaped.
    follows: Option<String>,
}

impl Election {
    /// An election for `spec`, its metrics in `registry`.
    ///
    /// # Errors
    ///
    /// [`Error`] if the Lease's cluster or namespace cannot be found.
    pub(crate) async fn new(spec: LeaderElectionSpec, registry: &Registry) -> Result<Self, Error> {
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
            seen: Mutex::new(Observer::new(spec.lease_duration)),
            spec,
            gate,
        })
    }

    /// A view for the admin server, and the supervisor's gate.
    #[must_use]
    pub(crate) fn handle(&self) -> ElectionHandle {
        ElectionHandle {
            shared: Arc::clone(&self.shared),
            gate: self.gate.subscribe(),
        }
    }

    fn turn(&self, turn: Turn) {
        let leading = turn == Turn::Lead;
        if self.gate.send_replace(leading) == leading {
            return;
        }
        self.shared.leader.set(i64::from(leading));
        self.shared.transitions.inc();
        {
            let mut state = lock(&self.shared.state);
            state.leading = leading;
            state.stopped = turn == Turn::ShuttingDown;
        }
        match turn {
            Turn::Lead => {
                info!(identity = %self.identity, "leading: this replica now runs the manager");
            }
            Turn::ShuttingDown => {
                info!(identity = %self.identity, "stopped leading: tether is shutting down");
            }
            Turn::Lost(why) => {
                warn!(identity = %self.identity, why, "leadership lost: stopping the manager");
            }
        }
    }

    /// Runs until `stop` is cancelled. Then it stops leading (the gate
    /// closes), and the caller releases the Lease after the manager stopped.
    ///
    /// # Cancellation safety
    ///
    /// Cancel `stop` instead of dropping it.
    pub(crate) async fn run(&self, stop: CancellationToken) {
        // However this ends (a panic, the future dropped), the gate closes:
        // a leader whose election no longer runs must not go on leading.
        let _closes = CloseOnDrop(self);
        info!(
            identity = %self.identity,
            lease = %lock(&self.shared.state).lease,
            "leader election: this replica's identity"
        );
        let mut candidate = Candidate {
            election: self,
            why: "",
            leads_from: None,
            follows: None,
        };
        claim::keep(&mut candidate, &self.spec, &stop).await;
        self.turn(Turn::ShuttingDown);
    }

    /// The Lease as it is now, for `tether check`: its holder (escaped,
    /// empty when free), and how long ago it was renewed by the wall clock;
    /// `None` if it does not exist.
    ///
    /// # Errors
    ///
    /// If the Lease cannot be read within `retryPeriod`.
    pub(crate) async fn holder(&self) -> Result<Option<(String, Option<Duration>)>, TryError> {
        let lease = timeout(
            self.spec.retry_period,
            self.leases.get_opt(&self.spec.lease_name),
        )
        .await
        .map_err(|_| TryError::TimedOut)?
        .map_err(TryError::Api)?;
        Ok(lease.map(|lease| {
            let spec = lease.spec.unwrap_or_default();
            let age = spec.renew_time.and_then(|t| {
                let since = jiff::Timestamp::now().duration_since(t.0);
                std::time::Duration::try_from(since).ok()
            });
            (
                shown_holder(spec.holder_identity.as_deref().unwrap_or("")),
                age,
            )
        }))
    }

    /// This replica's identity.
    #[must_use]
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// Releases the Lease if this process holds it, as client-go's
    /// `ReleaseOnCancel`: no holder, `leaseDurationSeconds: 1`, so another
    /// replica takes it at its next try. Call it after the manager stopped.
    pub(crate) async fn release(&self) {
        match claim::release(self.spec.renew_deadline, &mut &*self).await {
            Ok(true) => info!(identity = %self.identity, "released the Lease"),
            Ok(false) => {}
            Err(err) => {
                warn!(error = %err, "could not release the Lease; another replica takes it after leaseDuration");
            }
        }
    }
}

impl Releaser for &Election {
    async fn release_once(&mut self) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.leases.get_opt(&self.spec.lease_name).await? else {
            return Ok(false);
        };
        let old = lease.spec.clone().unwrap_or_default();
        if !lock(&self.seen).observe(Some(&old), &self.identity).ours {
            return Ok(false);
        }
        lease.spec = Some(claim::released(&old, &claim::micro_now()));
        self.leases
            .replace(&self.spec.lease_name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }
}

/// A try's error, a conflict in words.
fn try_error(err: kube::Error) -> TryError {
    TryError::of(err, "the Lease", "try")
}

impl Claimant for Candidate<'_> {
    async fn attempt(&mut self, fence: Option<Instant>) -> Result<Option<Instant>, TryError> {
        let election = self.election;
        let name = &election.spec.lease_name;
        let me = election.identity.as_str();
        let lease = election.leases.get_opt(name).await.map_err(try_error)?;
        let record = lease.as_ref().map(|l| l.spec.clone().unwrap_or_default());
        let sighting = lock(&election.seen).observe(record.as_ref(), me);
        {
            let mut state = lock(&election.shared.state);
            state.holder.clone_from(&sighting.claim.holder);
            if sighting.twin && !state.twin {
                warn!(
                    identity = me,
                    "the Lease names this replica's identity, but another process wrote it: two processes share one identity; this one will not lead while the other's claim holds (give each replica its own leaderElection.identity, or leave it unset)"
                );
            }
            state.twin = sighting.twin;
        }
        let leading = fence.is_some_and(|f| Instant::now() < f);
        // A Lease that does not exist: its leader recreates it at once; a
        // replica that never saw it creates it too, and leads later. One
        // that saw it vanish from under another holder waits that out.
        let vanished_under_me = lease.is_none() && leading;
        let never_seen = lease.is_none() && sighting.claim.holder.is_empty();
        if !sighting.ours && sighting.claim.is_current() && !vanished_under_me && !never_seen {
            self.why = if sighting.twin {
                "another process holds the Lease under this replica's identity"
            } else {
                "another holder's claim on the Lease is current"
            };
            self.leads_from = None;
            lock(&election.shared.state).leads_in = None;
            let leader = claim::shown_holder(&sighting.claim.holder);
            if self.follows.as_ref() != Some(&leader) {
                info!(identity = me, %leader, "standing by: another replica leads");
                self.follows = Some(leader);
            }
            return Ok(None);
        }
        let now = claim::micro_now();
        let spec = claim::holding(
            record.as_ref(),
            sighting.ours,
            me,
            election.spec.lease_duration,
            &now,
        );
        lock(&election.seen).sending(&now);
        let sent = Instant::now();
        let written = match lease {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                election.leases.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                lease.spec = Some(spec);
                election
                    .leases
                    .replace(name, &PostParams::default(), &lease)
                    .await
            }
        };
        written.map_err(try_error)?;
        if record.is_none() && !vanished_under_me {
            self.leads_from = Some(sent + election.spec.lease_duration.duration());
        }
        let now = Instant::now();
        let waiting = self.leads_from.filter(|from| now < *from);
        lock(&election.shared.state).leads_in = waiting.map(|from| from - now);
        if waiting.is_none() {
            self.leads_from = None;
            self.follows = None;
            election.turn(Turn::Lead);
        }
        Ok(Some(sent))
    }

    fn lapsed(&mut self, why: Lapse) {
        let why = match why {
            Lapse::Fence => "no write to the Lease succeeded within renewDeadline",
            Lapse::Lost => self.why,
        };
        self.leads_from = None;
        lock(&self.election.shared.state).leads_in = None;
        self.election.turn(Turn::Lost(why));
    }

    fn note(&mut self, error: Option<&TryError>) {
        lock(&self.election.shared.state).last_error = error.map(ToString::to_string);
    }
}
