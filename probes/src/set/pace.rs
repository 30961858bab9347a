//! When probes run and connect: ticks jittered and moved to a shared grid,
//! and new connections paced across the set.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How many new probe connections may open a second, across every remote,
/// after a burst of [`CONNECT_BURST`]: at 10,000 remotes the first probes
/// take four seconds, not one burst of 10,000 TCP and TLS handshakes that
/// starves the process (and the remotes' load balancers) at once. A kept
/// connection opens once, so the pace only shows at start, after a reload
/// that adds many remotes, and when many connections drop at once.
pub(super) const CONNECTS_PER_SECOND: u32 = 2_500;

/// How many new connections may open at once before the pace applies: a
/// handful of remotes are all probed at once.
pub(super) const CONNECT_BURST: u32 = 250;

/// Spaces out new connections: a generic cell rate algorithm, with every
/// caller given its own slot, so waiting callers open one by one.
#[derive(Debug)]
pub(super) struct Pacer {
    /// When the next connection would be due if none had come early.
    due: Mutex<Instant>,
}

impl Pacer {
    pub(super) fn new() -> Self {
        Self {
            due: Mutex::new(Instant::now()),
        }
    }

    /// When the caller may open its connection: now, unless more than the
    /// burst went ahead within the pace.
    pub(super) fn slot(&self) -> Instant {
        let spacing = Duration::from_secs(1) / CONNECTS_PER_SECOND;
        let now = Instant::now();
        let mut due = self
            .due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let start = (*due).max(now);
        *due = start + spacing;
        // The first of a burst is due at `start`, its last `burst - 1`
        // spacings later.
        (start.checked_sub(spacing * (CONNECT_BURST - 1))).map_or(now, |at| at.max(now))
    }
}

pub(super) fn jittered(interval: Duration, jitter: f64) -> Duration {
    let factor = 1.0 + jitter * (2.0 * fastrand::f64() - 1.0);
    // Whole nanoseconds through a float cast, not `Duration::mul_f64`,
    // whose exact conversion back costs about 50 instructions a probe
    // (issue 43, part 16); a jittered tick has no use for the last bit.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // a factor in [0, 2)
    Duration::from_nanos((interval.as_secs_f64() * 1e9 * factor) as u64)
}

/// How many probes a grid point gathers, where the interval allows: a
/// wake-up of the process costs about 3,000 instructions, shared by the
/// probes it sends (issue 43, part 14), but the answers of one point are
/// read one after another, and each waits on the others' reads: 100 a
/// point at 10,000 remotes put most probes' measured latency past 5 ms.
const PER_POINT: u64 = 20;

/// The widest step of the grid ticks are moved to.
pub(super) const GRID: Duration = Duration::from_millis(100);

/// `at`, moved to the nearest point of a grid that starts at `epoch`. Its
/// step is the time in which [`PER_POINT`] of the set's `tasks` fall due,
/// and at most a tenth of the interval and [`GRID`] (so a tick moves by
/// 50 ms at most): 20 ms at 10,000 remotes every 10 s, 100 ms at 1,000.
/// The process then wakes a few times a second, each wake-up sending a
/// batch of probes whose answers come back together, instead of once or
/// twice per probe. The jitter still spreads the ticks over the grid, and
/// the mean interval is unchanged.
///
/// In whole nanoseconds as `u64` (584 years), not `Duration`s: dividing a
/// `Duration` and taking a `u128` remainder cost about 90 instructions a
/// probe more (issue 43, part 16).
pub(super) fn on_grid(at: Instant, epoch: Instant, interval: Duration, tasks: usize) -> Instant {
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let interval = nanos(interval);
    let tasks = u64::try_from(tasks).unwrap_or(u64::MAX).max(1);
    let step = (interval.saturating_mul(PER_POINT) / tasks)
        .min(interval / 10)
        .min(nanos(GRID))
        .max(1);
    let past = nanos(at.saturating_duration_since(epoch)) % step;
    if past * 2 < step {
        at - Duration::from_nanos(past)
    } else {
        at + Duration::from_nanos(step - past)
    }
}
