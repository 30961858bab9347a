//! One Lease as this replica reads it and writes it: the claim type, the
//! record written, and the loop that keeps a claim. Leader election and
//! sharding share all three, so a rule about Leases lives here once.
//!
//! Invariants:
//! - **One clock.** Every expiry is on this replica's monotonic clock. A
//!   claim read from a Lease lasts `leaseDurationSeconds`, exactly as read,
//!   from the moment this replica saw the record *change*; the record's own
//!   timestamps are never compared with this clock.
//! - **Not seen is not dead.** A Lease this replica has seen vanish while
//!   its holder's claim was current may still be held by that holder, and
//!   one it has never read by someone unknown: for a full lease duration
//!   from when this replica saw it absent. (Only a Lease that vanished after
//!   its claim lapsed or was released is free at once.) Reads are points in
//!   time: a Lease may have come and gone between two of them, so absence
//!   is never proof that no one held it.
//! - **Released is free.** A record with no holder was written by a holder
//!   that let go after its manager stopped: free at once, as client-go's
//!   `ReleaseOnCancel` makes it.
//! - **Ours is what we wrote.** A record that names this replica's identity
//!   but carries a `renewTime` this process never sent was written by
//!   another process under the same identity (a twin, or this replica's
//!   previous life): its claim is another holder's, never ours.
//! - **The fence.** This replica's own claim expires `renewDeadline` after
//!   it *sent* the last write that succeeded, before any other replica can
//!   see that write expire (`leaseDuration` after it saw it, which is
//!   later), whatever the apiserver answers or fails to answer.
//! - **Whole seconds.** A duration is written as the configured whole
//!   seconds, and the fence is computed from the same value.

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;

use crate::config::{LeaderElectionSpec, WholeSeconds};

/// The longest holder identity kept: Kubernetes names are at most 253
/// characters. A longer holder is shown cut, and matches no identity.
pub(crate) const MAX_HOLDER: usize = 253;

/// Who holds a Lease, and until when on this replica's monotonic clock, as
/// kubert's `Claim`. An empty holder with an expiry to come is someone this
/// replica cannot name (a Lease it has not seen): not free until then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The holder's identity, cut to [`MAX_HOLDER`] and escaped; empty when
    /// none is known.
    pub holder: String,
    /// When the claim lapses, on this replica's clock.
    pub expiry: Instant,
}

impl Claim {
    /// Whether the claim still holds.
    #[must_use]
    pub(crate) fn is_current(&self) -> bool {
        Instant::now() < self.expiry
    }
}

/// A holder identity as read, fit to keep and show: control characters
/// escaped, and cut to [`MAX_HOLDER`] characters (marked with `…`, so it
/// equals no valid identity).
#[must_use]
pub(crate) fn shown_holder(holder: &str) -> String {
    tether_supervisor::printable(holder, MAX_HOLDER).into_owned()
}

/// What a read of one Lease says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sighting {
    /// The claim it makes.
    pub(crate) claim: Claim,
    /// Whether the record is this process's own latest write.
    pub(crate) ours: bool,
    /// Whether the record names this replica's identity but another process
    /// wrote it.
    pub(crate) twin: bool,
}

/// What of a record decides whether it changed, kept small: a holder may be
/// long.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: String,
    holder_len: usize,
    duration: Option<i32>,
    acquired: Option<jiff::Timestamp>,
    renewed: Option<jiff::Timestamp>,
    transitions: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        let holder = spec.holder_identity.as_deref().unwrap_or("");
        Self {
            holder: shown_holder(holder),
            holder_len: holder.len(),
            duration: spec.lease_duration_seconds,
            acquired: spec.acquire_time.as_ref().map(|t| t.0),
            renewed: spec.renew_time.as_ref().map(|t| t.0),
            transitions: spec.lease_transitions,
        }
    }
}

/// What this replica has seen of one Lease over time, and the `renewTime`s
/// this process sent to it.
#[derive(Debug)]
pub(crate) struct Observer {
    /// This replica's own lease duration: how long an unknown holder may
    /// hold a Lease it has not seen.
    own: Duration,
    /// The longest lease duration read from this Lease.
    read: Duration,
    /// The record last seen (`None`: absent), and the claim it made when
    /// this replica saw it change.
    last: Option<(Option<Record>, Claim)>,
    /// The `renewTime`s this process sent, newest last; a few, since a
    /// write whose answer was lost may still have landed.
    sent: VecDeque<jiff::Timestamp>,
    /// The newest of them seen in a record: kept however many writes fail
    /// after it, so that this process never takes its own record for a
    /// twin's once more than a few renewals have failed (an apiserver down
    /// for a few retry periods, or renewals that lose races).
    landed: Option<jiff::Timestamp>,
}

/// How many of this process's `renewTime`s are remembered.
const SENT_KEPT: usize = 4;

impl Observer {
    /// An observer for a replica whose own lease duration is `own`.
    pub(crate) fn new(own: WholeSeconds) -> Self {
        Self {
            own: own.duration(),
            read: own.duration(),
            last: None,
            sent: VecDeque::with_capacity(SENT_KEPT),
            landed: None,
        }
    }

    /// Records that this process is about to write `renewed` as the Lease's
    /// `renewTime`.
    pub(crate) fn sending(&mut self, renewed: &MicroTime) {
        if self.sent.len() == SENT_KEPT {
            self.sent.pop_front();
        }
        self.sent.push_back(renewed.0);
    }

    /// The claim of the record as last seen, if any was read.
    pub(crate) fn claim(&self) -> Option<&Claim> {
        self.last.as_ref().map(|(_, claim)| claim)
    }

    /// Records what a read of the Lease found (`None`: it does not exist),
    /// for a replica whose identity is `me`, and says what it means.
    pub(crate) fn observe(&mut self, spec: Option<&LeaseSpec>, me: &str) -> Sighting {
        let now = Instant::now();
        let record = spec.map(Record::of);
        let changed = self.last.as_ref().is_none_or(|(seen, _)| *seen != record);
        if changed {
            let claim = match (&record, &self.last) {
                (Some(record), _) => {
                    let read = record
                        .duration
                        .and_then(|d| u64::try_from(d).ok())
                        .filter(|d| *d > 0)
                        .map_or(self.own, Duration::from_secs);
                    self.read = self.read.max(read);
                    if record.holder.is_empty() {
                        // Released: free at once.
                        Claim {
                            holder: String::new(),
                            expiry: now,
                        }
                    } else {
                        Claim {
                            holder: record.holder.clone(),
                            expiry: now + read,
                        }
                    }
                }
                // Gone after its claim lapsed or was released: nobody.
                (None, Some((Some(_), before))) if !before.is_current() => Claim {
                    holder: String::new(),
                    expiry: now,
                },
                // Gone while held: its holder may hold it still.
                (None, Some((Some(_), before))) => Claim {
                    holder: before.holder.clone(),
                    expiry: now + self.read.max(self.own),
                },
                // Never seen: someone unknown may hold it.
                (None, _) => Claim {
                    holder: String::new(),
                    expiry: now + self.read.max(self.own),
                },
            };
            self.last = Some((record, claim));
        }
        let (record, claim) = self.last.as_ref().expect("set above");
        let names_me = record
            .as_ref()
            .is_some_and(|r| r.holder_len == me.len() && r.holder == me);
        let renewed = record.as_ref().and_then(|r| r.renewed);
        let ours =
            names_me && renewed.is_some_and(|t| self.landed == Some(t) || self.sent.contains(&t));
        if ours {
            self.landed = renewed;
        }
        Sighting {
            claim: claim.clone(),
            ours,
            twin: names_me && !ours,
        }
    }
}

/// The time a record is written at: the wire's precision (microseconds),
/// so that what is read back compares equal to what was sent.
pub(crate) fn micro_now() -> MicroTime {
    let now = jiff::Timestamp::now();
    let micros = now.as_microsecond();
    MicroTime(jiff::Timestamp::from_microsecond(micros).unwrap_or(now))
}

/// The record that makes `me` the holder, as client-go writes it: renewed
/// if `old` is already this process's (`ours`), else acquired, which counts
/// a transition if another held it.
pub(crate) fn holding(
    old: Option<&LeaseSpec>,
    ours: bool,
    me: &str,
    duration: WholeSeconds,
    now: &MicroTime,
) -> LeaseSpec {
    let existed = old.is_some();
    let old = old.cloned().unwrap_or_default();
    let transitions = old.lease_transitions.unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(me.to_owned()),
        lease_duration_seconds: Some(duration.wire()),
        acquire_time: if ours {
            old.acquire_time.clone()
        } else {
            Some(now.clone())
        },
        renew_time: Some(now.clone()),
        // As client-go: a new Lease starts at 0; any change of holder, from
        // none included, counts one.
        lease_transitions: Some(match (existed, ours) {
            (false, _) => 0,
            (true, true) => transitions,
            (true, false) => transitions + 1,
        }),
        ..old
    }
}

/// The record a holder writes when it lets go, as client-go's
/// `ReleaseOnCancel`: no holder, `leaseDurationSeconds: 1`.
pub(crate) fn released(old: &LeaseSpec, now: &MicroTime) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        acquire_time: Some(now.clone()),
        renew_time: Some(now.clone()),
        ..old.clone()
    }
}

/// Why a release did not happen: the others take the Lease after
/// `leaseDuration` instead of at once.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReleaseFailed {
    #[error(transparent)]
    Api(kube::Error),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
}

/// The pause between two tries of a release that failed in transport: not
/// a busy loop against an apiserver that is down.
const RELEASE_PAUSE: Duration = Duration::from_millis(50);

/// A holder that can let its Lease go.
pub(crate) trait Releaser {
    /// One try: writes the Lease with no holder if this process holds it,
    /// and answers whether it did.
    fn release_once(&mut self) -> impl Future<Output = Result<bool, kube::Error>> + Send;
}

/// Tries `releaser` for up to `within` (a holder's `renewDeadline`: a
/// release that takes that long still beats the others waiting out
/// `leaseDuration`). A transport failure (a pooled connection that no
/// longer works: `SendRequest`) is tried again on a new connection, since
/// the client itself never retries; any other error is the answer.
pub(crate) async fn release(
    within: Duration,
    releaser: &mut impl Releaser,
) -> Result<bool, ReleaseFailed> {
    let tries = async {
        loop {
            match releaser.release_once().await {
                Err(kube::Error::Service(err)) => {
                    tracing::warn!(error = %err, "releasing the Lease failed in transport; trying again");
                    tokio::time::sleep(RELEASE_PAUSE).await;
                }
                done => return done.map_err(ReleaseFailed::Api),
            }
        }
    };
    timeout(within, tries)
        .await
        .unwrap_or(Err(ReleaseFailed::TimedOut(within)))
}

/// The jittered wait before the next try: `period` to 1.2 × `period`, as
/// client-go's `JitterFactor`.
fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 + 0.2 * fastrand::f64())
}

/// Why this replica's claim ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lapse {
    /// No write succeeded within `renewDeadline`: the fence.
    Fence,
    /// A try found the claim is not this replica's.
    Lost,
}

/// Why one try at a Lease failed. A claim stands until its fence.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TryError {
    /// Another write came between this replica's read and its write.
    #[error(
        "{lease} changed between this replica's read and its write (409 Conflict); it reads it again at the next {turn}"
    )]
    Conflict {
        /// Which Lease, in words.
        lease: &'static str,
        /// What the next try is called.
        turn: &'static str,
    },
    /// The apiserver answered with an error, or could not be reached.
    #[error("{}", tether_supervisor::error_chain(.0))]
    Api(kube::Error),
    /// No answer within `retryPeriod`.
    #[error("the Leases' apiserver did not answer within retryPeriod")]
    TimedOut,
}

impl TryError {
    /// `err` from a read or a write of `lease` (in words), tried again at
    /// the next `turn`.
    pub(crate) fn of(err: kube::Error, lease: &'static str, turn: &'static str) -> Self {
        match err {
            kube::Error::Api(status) if status.code == 409 => Self::Conflict { lease, turn },
            other => Self::Api(other),
        }
    }
}

/// One party to a Lease, as [`keep`] drives it.
pub(crate) trait Claimant {
    /// One try: `Ok(Some(sent))` when a write that holds this replica's
    /// claim succeeded, sent at `sent`; `Ok(None)` when this replica does
    /// not hold it; `Err` with why the try failed (a claim stands until its
    /// fence). `fence` is when this replica's claim lapses, if it has one.
    fn attempt(
        &mut self,
        fence: Option<Instant>,
    ) -> impl Future<Output = Result<Option<Instant>, TryError>> + Send;

    /// This replica's claim is over.
    fn lapsed(&mut self, why: Lapse);

    /// How the last try went: `None` if it succeeded.
    fn note(&mut self, error: Option<&TryError>);
}

/// Runs `claimant` every `retryPeriod` (jittered) until `stop`, each try
/// bounded by `retryPeriod`, and keeps its claim: it lapses at
/// `renewDeadline` after the last successful write was sent, even while a
/// try hangs.
///
/// # Cancellation safety
///
/// Cancel `stop` instead of dropping the future.
pub(crate) async fn keep(
    claimant: &mut impl Claimant,
    spec: &LeaderElectionSpec,
    stop: &CancellationToken,
) {
    let mut fence: Option<Instant> = None;
    let mut next = Instant::now();
    loop {
        let early = fence.filter(|f| *f < next);
        tokio::select! {
            () = stop.cancelled() => return,
            () = sleep_until(next) => {}
            () = sleep_until(early.unwrap_or(next)), if early.is_some() => {
                fence = None;
                claimant.lapsed(Lapse::Fence);
                continue;
            }
        }
        next = Instant::now() + jittered(spec.retry_period);
        let attempt = tokio::select! {
            () = stop.cancelled() => return,
            attempt = timeout(spec.retry_period, claimant.attempt(fence)) => attempt,
            () = sleep_until(fence.unwrap_or(next)), if fence.is_some() => {
                fence = None;
                claimant.lapsed(Lapse::Fence);
                continue;
            }
        };
        match attempt {
            Ok(Ok(Some(sent))) => {
                fence = Some(sent + spec.renew_deadline);
                claimant.note(None);
            }
            Ok(Ok(None)) => {
                claimant.note(None);
                if fence.take().is_some() {
                    claimant.lapsed(Lapse::Lost);
                }
            }
            Ok(Err(err)) => claimant.note(Some(&err)),
            Err(_) => claimant.note(Some(&TryError::TimedOut)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "tether-0-abc";

    fn duration(secs: u64) -> WholeSeconds {
        WholeSeconds::new(Duration::from_secs(secs)).expect("whole")
    }

    fn record(holder: &str, secs: i32, renewed: &MicroTime) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.to_owned()),
            lease_duration_seconds: Some(secs),
            renew_time: Some(renewed.clone()),
            ..LeaseSpec::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn another_holders_claim_lasts_the_duration_read_from_when_it_changed() {
        let mut seen = Observer::new(duration(15));
        let t = micro_now();
        let first = seen.observe(Some(&record("other", 3, &t)), ME);
        assert_eq!(first.claim.holder, "other");
        assert!(!first.ours && !first.twin);
        tokio::time::advance(Duration::from_millis(2900)).await;
        // Unchanged: the claim runs from when it was first seen.
        assert!(
            seen.observe(Some(&record("other", 3, &t)), ME)
                .claim
                .is_current()
        );
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(
            !seen
                .observe(Some(&record("other", 3, &t)), ME)
                .claim
                .is_current()
        );
        // Renewed: current again, for the duration read.
        let renewed = seen.observe(Some(&record("other", 3, &micro_now())), ME);
        assert!(renewed.claim.holder == "other" && renewed.claim.is_current());
        assert_eq!(
            renewed.claim.expiry,
            Instant::now() + Duration::from_secs(3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_never_seen_is_held_by_someone_unknown_for_a_full_duration() {
        let mut seen = Observer::new(duration(15));
        let absent = seen.observe(None, ME);
        assert_eq!(absent.claim.holder, "");
        assert!(
            absent.claim.is_current(),
            "a newcomer took a missing Lease at once"
        );
        tokio::time::advance(Duration::from_millis(14_999)).await;
        assert!(seen.observe(None, ME).claim.is_current());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!seen.observe(None, ME).claim.is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_gone_while_held_stays_its_holders_for_the_longest_duration_seen() {
        let mut seen = Observer::new(duration(5));
        seen.observe(Some(&record("other", 20, &micro_now())), ME);
        tokio::time::advance(Duration::from_secs(1)).await;
        let gone = seen.observe(None, ME);
        assert_eq!(gone.claim.holder, "other");
        assert_eq!(gone.claim.expiry, Instant::now() + Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_or_one_gone_after_it_lapsed_is_free_at_once() {
        let mut seen = Observer::new(duration(15));
        seen.observe(Some(&record("other", 3, &micro_now())), ME);
        let released = seen.observe(Some(&record("", 1, &micro_now())), ME);
        assert!(!released.claim.is_current());
        let mut lapsed = Observer::new(duration(15));
        lapsed.observe(Some(&record("other", 3, &micro_now())), ME);
        tokio::time::advance(Duration::from_secs(3)).await;
        assert!(!lapsed.observe(None, ME).claim.is_current());
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_naming_me_is_mine_only_if_this_process_wrote_it() {
        let mut seen = Observer::new(duration(15));
        let theirs = micro_now();
        let twin = seen.observe(Some(&record(ME, 15, &theirs)), ME);
        assert!(twin.twin && !twin.ours, "{twin:?}");
        assert!(twin.claim.is_current(), "a twin's claim is a claim");
        let mine = micro_now();
        seen.sending(&mine);
        let ours = seen.observe(Some(&record(ME, 15, &mine)), ME);
        assert!(ours.ours && !ours.twin, "{ours:?}");
    }

    #[test]
    fn my_record_stays_mine_however_many_renewals_fail_after_it() {
        let mut seen = Observer::new(duration(15));
        let mine = micro_now();
        seen.sending(&mine);
        assert!(seen.observe(Some(&record(ME, 15, &mine)), ME).ours);
        // Renewals that never land (409s, an apiserver down): each is sent,
        // and the record keeps the one that did.
        for _ in 0..3 * SENT_KEPT {
            seen.sending(&micro_now());
            let after = seen.observe(Some(&record(ME, 15, &mine)), ME);
            assert!(after.ours && !after.twin, "{after:?}");
        }
    }

    #[test]
    fn a_holder_past_the_kubernetes_limit_is_cut_and_escaped() {
        let long = "x".repeat(40 << 20);
        let shown = shown_holder(&long);
        assert!(shown.chars().count() <= MAX_HOLDER + 1, "{}", shown.len());
        assert_ne!(shown, "x".repeat(MAX_HOLDER));
        assert_eq!(shown_holder("a\u{1b}[31mb\nc"), "a\\u{1b}[31mb\\nc");
    }

    #[test]
    fn the_written_record_keeps_whole_seconds_and_counts_transitions() {
        let now = micro_now();
        let taken = holding(
            Some(&record("other", 3, &now)),
            false,
            ME,
            duration(7),
            &now,
        );
        assert_eq!(taken.lease_duration_seconds, Some(7));
        assert_eq!(taken.lease_transitions, Some(1));
        let renewed = holding(Some(&taken), true, ME, duration(7), &now);
        assert_eq!(renewed.lease_transitions, Some(1));
        let created = holding(None, false, ME, duration(7), &now);
        assert_eq!(created.lease_transitions, Some(0));
        let freed = released(&renewed, &now);
        assert_eq!(freed.holder_identity.as_deref(), Some(""));
        let after_release = holding(Some(&freed), false, ME, duration(7), &now);
        assert_eq!(
            after_release.lease_transitions,
            Some(2),
            "as client-go counts"
        );
    }

    /// A release that answers with each of `answers` in turn, then hangs.
    struct Answers(VecDeque<Result<bool, kube::Error>>);

    impl Releaser for Answers {
        async fn release_once(&mut self) -> Result<bool, kube::Error> {
            match self.0.pop_front() {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }
    }

    fn transport() -> kube::Error {
        kube::Error::Service(Box::new(std::io::Error::other("SendRequest")))
    }

    fn conflict() -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("conflict", "Conflict").with_code(409),
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_failed_in_transport_is_tried_again_on_a_new_connection() {
        let start = Instant::now();
        let mut answers = Answers(VecDeque::from([
            Err(transport()),
            Err(transport()),
            Ok(true),
        ]));
        let released = release(Duration::from_secs(10), &mut answers).await;
        assert!(matches!(released, Ok(true)), "{released:?}");
        assert!(answers.0.is_empty());
        assert_eq!(
            start.elapsed(),
            2 * RELEASE_PAUSE,
            "one pause after each failure"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn any_other_release_error_is_the_answer_at_once() {
        let mut answers = Answers(VecDeque::from([Err(conflict()), Ok(true)]));
        let released = release(Duration::from_secs(10), &mut answers).await;
        assert!(
            matches!(released, Err(ReleaseFailed::Api(kube::Error::Api(_)))),
            "{released:?}"
        );
        assert_eq!(answers.0.len(), 1, "not tried again");
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_ends_at_its_deadline_whatever_the_apiserver_does() {
        let within = Duration::from_secs(10);
        let start = Instant::now();
        let failing = (0..1_000).map(|_| Err(transport())).collect();
        let released = release(within, &mut Answers(failing)).await;
        assert!(
            matches!(released, Err(ReleaseFailed::TimedOut(_))),
            "{released:?}"
        );
        assert_eq!(start.elapsed(), within);

        let start = Instant::now();
        let released = release(within, &mut Answers(VecDeque::new())).await;
        assert!(
            matches!(released, Err(ReleaseFailed::TimedOut(_))),
            "a hung try: {released:?}"
        );
        assert_eq!(start.elapsed(), within);
    }
}
