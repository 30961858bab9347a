//! A remote's recent probes, for the status page's strips: a fixed ring of
//! fixed-width buckets over the last [`HISTORY_WINDOW`].
//!
//! Invariants:
//! - the ring holds [`HISTORY_BUCKETS`] buckets of [`BUCKET_WIDTH`] each, so
//!   its size does not depend on the probe interval or the uptime (240 bytes
//!   a remote: four a bucket, its counts saturating at [`MOST_COUNTED`]);
//! - bucket numbers count widths since one epoch for the whole probe set,
//!   so every remote's strip lines up with every other's;
//! - `head` is the newest bucket written; a bucket older than the window is
//!   never read, and the ring clears the buckets it skips as it moves on.

use std::time::Duration;

/// How far back the history reaches.
pub const HISTORY_WINDOW: Duration = Duration::from_secs(15 * 60);

/// The buckets in the window.
pub const HISTORY_BUCKETS: usize = 60;

/// The time one bucket covers: 15 s, so at the default interval of 10 s
/// each holds one or two probes.
pub const BUCKET_WIDTH: Duration = Duration::from_secs(15);

/// The most probes of one kind a bucket counts: more read as this many.
/// At the default interval a bucket holds one or two; the page tells only
/// none from some.
pub const MOST_COUNTED: u8 = 31;

/// The probes that finished within one bucket's time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Probes answered 2xx, at most [`MOST_COUNTED`].
    pub ready: u8,
    /// Probes answered, but not 2xx: reachable, not ready. At most
    /// [`MOST_COUNTED`].
    pub not_ready: u8,
    /// Probes that failed: the remote did not answer. At most
    /// [`MOST_COUNTED`].
    pub failed: u8,
    /// The slowest answer's latency, in milliseconds (65,535 at most).
    pub slowest_ms: u16,
    /// Whether the remote was unreachable (past `failureThreshold`) at any
    /// probe in it: an outage, not a failed probe or two.
    pub lost: bool,
}

impl Bucket {
    /// Whether no probe finished in it.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.ready == 0 && self.not_ready == 0 && self.failed == 0
    }

    /// Whether any probe in it was answered.
    #[must_use]
    pub const fn answered(&self) -> bool {
        self.ready > 0 || self.not_ready > 0
    }
}

/// A remote's last [`HISTORY_WINDOW`]: `buckets[0]` is the oldest, the last
/// is the one filling now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recent {
    /// Oldest first.
    pub buckets: [Bucket; HISTORY_BUCKETS],
    /// How far into the last bucket the present is.
    pub into_last: Duration,
}

impl Default for Recent {
    fn default() -> Self {
        Self {
            buckets: [Bucket::default(); HISTORY_BUCKETS],
            into_last: Duration::ZERO,
        }
    }
}

/// What one probe found, as the history counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    Ready(Duration),
    NotReady(Duration),
    Failed,
}

/// A [`Bucket`] as the ring keeps it, in four bytes where a `Bucket`
/// takes six (each remote keeps 60): its three counts in five bits each
/// (ready, not ready, failed, from the lowest), whether the remote was
/// lost in the top bit, and the slowest answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Packed {
    counts: u16,
    slowest_ms: u16,
}

const READY: u32 = 0;
const NOT_READY: u32 = 5;
const FAILED: u32 = 10;
const LOST: u16 = 1 << 15;

impl Packed {
    fn count(self, at: u32) -> u8 {
        // Five bits: at most 31.
        u8::try_from((self.counts >> at) & u16::from(MOST_COUNTED)).unwrap_or(MOST_COUNTED)
    }

    /// One more probe of the kind counted `at`, saturating.
    fn add(&mut self, at: u32) {
        if self.count(at) < MOST_COUNTED {
            self.counts += 1_u16 << at;
        }
    }

    fn unpacked(self) -> Bucket {
        Bucket {
            ready: self.count(READY),
            not_ready: self.count(NOT_READY),
            failed: self.count(FAILED),
            slowest_ms: self.slowest_ms,
            lost: self.counts & LOST != 0,
        }
    }
}

/// The ring itself.
#[derive(Debug, Clone)]
pub(crate) struct History {
    head: u64,
    ring: [Packed; HISTORY_BUCKETS],
    /// When the failures in a row now began: a loss marks back to there.
    streak_since: Option<Duration>,
}

impl History {
    pub(crate) const fn new() -> Self {
        Self {
            head: 0,
            ring: [Packed {
                counts: 0,
                slowest_ms: 0,
            }; HISTORY_BUCKETS],
            streak_since: None,
        }
    }

    /// The bucket number of `since_epoch`.
    fn number(since_epoch: Duration) -> u64 {
        since_epoch.as_secs() / BUCKET_WIDTH.as_secs()
    }

    /// Counts a probe that finished `since_epoch` after the set's epoch,
    /// and whether the remote was `lost` then.
    pub(crate) fn record(&mut self, since_epoch: Duration, seen: Seen, lost: bool) {
        let number = Self::number(since_epoch);
        if number > self.head {
            // Clear what the ring skips, at most all of it.
            let skipped = (number - self.head).min(HISTORY_BUCKETS as u64);
            for n in (number + 1 - skipped)..=number {
                self.ring[slot(n)] = Packed::default();
            }
            self.head = number;
        } else if self.head - number >= HISTORY_BUCKETS as u64 {
            return;
        }
        if seen == Seen::Failed {
            self.streak_since.get_or_insert(since_epoch);
        }
        if lost {
            // The failures that made the loss belong to the outage too.
            let from = self
                .streak_since
                .map_or(number, Self::number)
                .max(number.saturating_sub(HISTORY_BUCKETS as u64 - 1));
            for n in from..=number {
                self.ring[slot(n)].counts |= LOST;
            }
        }
        if seen != Seen::Failed {
            self.streak_since = None;
        }
        let bucket = &mut self.ring[slot(number)];
        let latency = match seen {
            Seen::Ready(latency) => {
                bucket.add(READY);
                latency
            }
            Seen::NotReady(latency) => {
                bucket.add(NOT_READY);
                latency
            }
            Seen::Failed => {
                bucket.add(FAILED);
                return;
            }
        };
        let ms = u16::try_from(latency.as_millis()).unwrap_or(u16::MAX);
        bucket.slowest_ms = bucket.slowest_ms.max(ms);
    }

    /// Whether a probe failed in the window that ends `since_epoch` after
    /// the epoch.
    pub(crate) fn failed_within(&self, since_epoch: Duration) -> bool {
        let now = Self::number(since_epoch);
        now.saturating_sub(self.head) < HISTORY_BUCKETS as u64
            && (0..HISTORY_BUCKETS as u64)
                .filter_map(|back| self.head.checked_sub(back))
                .filter(|n| now - n < HISTORY_BUCKETS as u64)
                .any(|n| self.ring[slot(n)].count(FAILED) > 0)
    }

    /// The window that ends `since_epoch` after the epoch.
    pub(crate) fn recent(&self, since_epoch: Duration) -> Recent {
        let now = Self::number(since_epoch);
        let mut recent = Recent {
            buckets: [Bucket::default(); HISTORY_BUCKETS],
            into_last: since_epoch.saturating_sub(BUCKET_WIDTH * u32::try_from(now).unwrap_or(0)),
        };
        for (i, out) in recent.buckets.iter_mut().enumerate() {
            // Bucket `i` of the window is `now - (BUCKETS - 1 - i)`.
            let Some(n) = now.checked_sub((HISTORY_BUCKETS - 1 - i) as u64) else {
                continue;
            };
            if n <= self.head && self.head - n < HISTORY_BUCKETS as u64 {
                *out = self.ring[slot(n)].unpacked();
            }
        }
        recent
    }
}

fn slot(number: u64) -> usize {
    // The remainder is below HISTORY_BUCKETS, which is a usize.
    usize::try_from(number % HISTORY_BUCKETS as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn at(bucket: u64) -> Duration {
        BUCKET_WIDTH * u32::try_from(bucket).expect("small") + Duration::from_secs(1)
    }

    #[test]
    fn a_probe_lands_in_its_bucket_with_its_latency() {
        let mut history = History::new();
        history.record(at(3), Seen::Ready(MS * 12), false);
        history.record(at(3), Seen::Ready(MS * 40), false);
        history.record(at(4), Seen::Failed, false);
        history.record(at(4), Seen::NotReady(MS * 7), false);
        let recent = history.recent(at(4));
        let last = HISTORY_BUCKETS - 1;
        assert_eq!(
            recent.buckets[last - 1],
            Bucket {
                ready: 2,
                not_ready: 0,
                failed: 0,
                slowest_ms: 40,
                lost: false,
            }
        );
        assert_eq!(
            recent.buckets[last],
            Bucket {
                ready: 0,
                not_ready: 1,
                failed: 1,
                slowest_ms: 7,
                lost: false,
            }
        );
        assert!(recent.buckets[..last - 1].iter().all(Bucket::is_empty));
        assert_eq!(recent.into_last, Duration::from_secs(1));
    }

    #[test]
    fn a_loss_marks_every_mark_of_its_failures_and_blips_stay_unmarked() {
        let mut history = History::new();
        // A blip: one failure, then answers.
        history.record(at(1), Seen::Failed, false);
        history.record(at(1), Seen::Ready(MS), false);
        // An outage of 16 s across two marks: failures from mark 3, the
        // loss declared in mark 4, the answer back in mark 4.
        history.record(at(3), Seen::Failed, false);
        history.record(at(4), Seen::Failed, false);
        history.record(at(4), Seen::Failed, true);
        history.record(at(4), Seen::Ready(MS), false);
        history.record(at(5), Seen::Ready(MS), false);
        let recent = history.recent(at(5));
        let last = HISTORY_BUCKETS - 1;
        let marked: Vec<bool> = recent.buckets[last - 4..].iter().map(|b| b.lost).collect();
        assert_eq!(marked, [false, false, true, true, false], "{recent:?}");
    }

    #[test]
    fn the_window_slides_and_forgets_what_fell_out_of_it() {
        let mut history = History::new();
        history.record(at(0), Seen::Failed, false);
        history.record(at(10), Seen::Ready(MS), false);
        assert!(history.failed_within(at(59)));
        // 59 buckets on, bucket 0 is out of the window and bucket 10 in it.
        assert!(!history.failed_within(at(60)));
        let recent = history.recent(at(60));
        assert_eq!(recent.buckets.iter().filter(|b| !b.is_empty()).count(), 1);
        assert_eq!(recent.buckets[10 + HISTORY_BUCKETS - 1 - 60].ready, 1);
        // A write far ahead clears every slot it wraps over.
        history.record(at(10 + 5 * HISTORY_BUCKETS as u64), Seen::Ready(MS), false);
        let recent = history.recent(at(10 + 5 * HISTORY_BUCKETS as u64));
        assert_eq!(recent.buckets.iter().filter(|b| !b.is_empty()).count(), 1);
        // A late write older than the window is dropped, not wrapped onto a
        // newer bucket.
        history.record(at(0), Seen::Failed, false);
        let again = history.recent(at(10 + 5 * HISTORY_BUCKETS as u64));
        assert_eq!(again, recent);
    }

    #[test]
    fn counts_and_latency_saturate() {
        let mut history = History::new();
        for _ in 0..300 {
            history.record(at(1), Seen::Ready(Duration::from_secs(120)), false);
        }
        let bucket = history.recent(at(1)).buckets[HISTORY_BUCKETS - 1];
        assert_eq!(bucket.ready, MOST_COUNTED);
        assert_eq!(
            (bucket.not_ready, bucket.failed),
            (0, 0),
            "no count spills into the next"
        );
        assert!(!bucket.lost);
        assert_eq!(bucket.slowest_ms, u16::MAX);
        // The next bucket: failures past the count, then a loss.
        let next = at(1) + BUCKET_WIDTH;
        for _ in 0..300 {
            history.record(next, Seen::Failed, false);
        }
        history.record(next, Seen::Failed, true);
        let bucket = history.recent(next).buckets[HISTORY_BUCKETS - 1];
        assert_eq!(
            (bucket.ready, bucket.not_ready, bucket.failed, bucket.lost),
            (0, 0, MOST_COUNTED, true)
        );
        assert_eq!(bucket.slowest_ms, 0);
    }
}
