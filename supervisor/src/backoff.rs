//! The wait between cycles.
//!
//! `backon` supplies the un-jittered exponential sequence
//! `d_k = min(initial·factor^k, max)`. Its own jitter is not used: it only ever
//! adds, up to +100%, and it cannot be reset. Instead [`Backoff`] applies a
//! symmetric jitter, so that every wait lies within
//! `[d_k·(1−jitter), d_k·(1+jitter)]` and never exceeds `max·(1+jitter)`, and
//! [`Backoff::reset`] rebuilds backon's iterator after a stable cycle.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

use crate::{Error, Result};

/// Settings of the backoff between cycles.
///
/// The defaults are the values a Go multi-cluster shim ran in production
/// for this same job (rebuilding a manager after a lost remote): initial 1s,
/// factor 2, jitter 0.2, cap 30s. They reach the cap after five failures,
/// and a manager that fails at once every time is rebuilt every 24–36s, not
/// in a storm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffConfig {
    /// The first wait. Default 1s.
    pub initial: Duration,
    /// The cap on the un-jittered wait. Default 30s.
    pub max: Duration,
    /// The growth per consecutive short cycle. Default 2.0; at least 1.
    pub factor: f64,
    /// The relative jitter, in `[0, 1)`. Default 0.2.
    pub jitter: f64,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 0.2,
        }
    }
}

impl BackoffConfig {
    /// Sets the first wait.
    #[must_use]
    pub fn with_initial(mut self, initial: Duration) -> Self {
        self.initial = initial;
        self
    }

    /// Sets the cap on the un-jittered wait.
    #[must_use]
    pub fn with_max(mut self, max: Duration) -> Self {
        self.max = max;
        self
    }

    /// Sets the growth factor.
    #[must_use]
    pub fn with_factor(mut self, factor: f64) -> Self {
        self.factor = factor;
        self
    }

    /// Sets the relative jitter.
    #[must_use]
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// Checks that the settings describe a backoff.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the field (`backoff.initial`,
    /// `backoff.max`, `backoff.factor`, `backoff.jitter`) that is out of range.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field, reason: &str| {
            Err(Error::InvalidConfig {
                field,
                reason: reason.to_owned(),
            })
        };
        if self.initial.is_zero() {
            return invalid("backoff.initial", "must be greater than zero");
        }
        if self.max < self.initial {
            return invalid("backoff.max", "must be at least backoff.initial");
        }
        if !(self.factor.is_finite() && self.factor >= 1.0) {
            return invalid("backoff.factor", "must be a number of at least 1.0");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return invalid("backoff.jitter", "must be in [0, 1)");
        }
        Ok(())
    }
}

/// The backoff state across cycles: the next wait, with symmetric jitter.
#[derive(Debug)]
pub struct Backoff {
    config: BackoffConfig,
    base: ExponentialBackoff,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A backoff that starts at `config.initial`, with a random jitter seed.
    #[must_use]
    pub fn new(config: BackoffConfig) -> Self {
        Self::with_rng(config, fastrand::Rng::new())
    }

    /// A backoff whose jitter is reproducible from `seed`.
    #[must_use]
    pub fn with_seed(config: BackoffConfig, seed: u64) -> Self {
        Self::with_rng(config, fastrand::Rng::with_seed(seed))
    }

    fn with_rng(config: BackoffConfig, rng: fastrand::Rng) -> Self {
        Self {
            config,
            base: base_sequence(&config),
            rng,
        }
    }

    /// Starts the sequence again from `config.initial`.
    pub fn reset(&mut self) {
        self.base = base_sequence(&self.config);
    }

    /// The next wait, within `±jitter` of the un-jittered delay.
    ///
    /// # Panics
    ///
    /// Never: the base sequence is built without a limit on tries or on total
    /// delay, so backon always yields a next delay.
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .base
            .next()
            .expect("the base sequence is unbounded: built without max times or total delay");
        // Uniform in [1 - jitter, 1 + jitter).
        let scale = 1.0 + self.config.jitter * (2.0 * self.rng.f64() - 1.0);
        base.mul_f64(scale)
    }
}

fn base_sequence(config: &BackoffConfig) -> ExponentialBackoff {
    // backon takes the factor as f32; factors are small numbers like 2.0, so
    // the truncation costs nothing the contract's tolerance does not cover.
    #[allow(clippy::cast_possible_truncation)]
    let factor = config.factor as f32;
    ExponentialBuilder::new()
        .with_min_delay(config.initial)
        .with_max_delay(config.max)
        .with_factor(factor)
        // Without this, backon stops after 3 tries.
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secs(delays: &[Duration]) -> Vec<f64> {
        delays.iter().map(Duration::as_secs_f64).collect()
    }

    #[test]
    fn without_jitter_the_defaults_double_up_to_the_cap() {
        let mut backoff = Backoff::new(BackoffConfig::default().with_jitter(0.0));
        let delays: Vec<_> = (0..8).map(|_| backoff.next_delay()).collect();
        assert_eq!(secs(&delays), [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]);
    }

    #[test]
    fn reset_starts_from_initial_again() {
        let mut backoff = Backoff::new(BackoffConfig::default().with_jitter(0.0));
        for _ in 0..4 {
            backoff.next_delay();
        }
        backoff.reset();
        assert_eq!(backoff.next_delay(), Duration::from_secs(1));
        assert_eq!(backoff.next_delay(), Duration::from_secs(2));
    }

    #[test]
    fn a_factor_too_large_for_backons_f32_saturates_at_the_cap() {
        for factor in [1e300, 3.5e38, 1e10] {
            let config = BackoffConfig::default()
                .with_factor(factor)
                .with_jitter(0.0);
            assert!(config.validate().is_ok());
            let mut backoff = Backoff::new(config);
            let waits: Vec<_> = (0..6).map(|_| backoff.next_delay()).collect();
            assert_eq!(waits[0], config.initial, "{factor}");
            assert!(
                waits[1..].iter().all(|w| *w == config.max),
                "{factor}: {waits:?}"
            );
        }
    }

    #[test]
    fn jitter_goes_both_ways() {
        let config = BackoffConfig::default();
        let mut below = 0;
        let mut above = 0;
        for seed in 0..200 {
            let first = Backoff::with_seed(config, seed).next_delay();
            if first < config.initial {
                below += 1;
            } else if first > config.initial {
                above += 1;
            }
        }
        assert!(below > 50 && above > 50, "below {below}, above {above}");
    }

    #[test]
    fn validate_names_the_bad_field() {
        let cases = [
            (
                BackoffConfig::default().with_initial(Duration::ZERO),
                "backoff.initial",
            ),
            (
                BackoffConfig::default().with_max(Duration::from_millis(10)),
                "backoff.max",
            ),
            (BackoffConfig::default().with_factor(0.5), "backoff.factor"),
            (
                BackoffConfig::default().with_factor(f64::NAN),
                "backoff.factor",
            ),
            (BackoffConfig::default().with_jitter(1.0), "backoff.jitter"),
            (BackoffConfig::default().with_jitter(-0.1), "backoff.jitter"),
        ];
        for (config, field) in cases {
            match config.validate() {
                Err(Error::InvalidConfig { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{config:?}: expected an error on {field}, got {other:?}"),
            }
        }
        assert!(BackoffConfig::default().validate().is_ok());
    }

    fn config_strategy() -> impl Strategy<Value = BackoffConfig> {
        (1u64..10_000, 1u64..1_000, 1.0f64..4.0, 0.0f64..0.99).prop_map(
            |(initial_ms, cap_multiple, factor, jitter)| BackoffConfig {
                initial: Duration::from_millis(initial_ms),
                max: Duration::from_millis(initial_ms * cap_multiple),
                factor,
                jitter,
            },
        )
    }

    proptest! {
        /// The contract: each wait lies within ±jitter of
        /// `d = min(initial·factor^k, max)` and never exceeds `max·(1+jitter)`.
        /// The tolerance covers backon's f32 arithmetic and nanosecond rounding.
        #[test]
        fn every_wait_lies_within_jitter_of_the_capped_exponential(
            config in config_strategy(),
            seed in any::<u64>(),
            resets in proptest::collection::vec(0usize..30, 0..3),
        ) {
            const TOLERANCE: f64 = 1e-5;
            let mut backoff = Backoff::with_seed(config, seed);
            let initial = config.initial.as_secs_f64();
            let max = config.max.as_secs_f64();
            let mut runs = resets.clone();
            runs.push(30);
            for run in runs {
                for k in 0..run {
                    let exponent = i32::try_from(k).expect("k < 30");
                    let d = (initial * config.factor.powi(exponent)).min(max);
                    let wait = backoff.next_delay().as_secs_f64();
                    prop_assert!(
                        wait >= d * (1.0 - config.jitter) * (1.0 - TOLERANCE),
                        "k={k}: wait {wait} below {d}·(1−{})", config.jitter
                    );
                    prop_assert!(
                        wait <= d * (1.0 + config.jitter) * (1.0 + TOLERANCE),
                        "k={k}: wait {wait} above {d}·(1+{})", config.jitter
                    );
                    prop_assert!(wait <= max * (1.0 + config.jitter) * (1.0 + TOLERANCE));
                }
                backoff.reset();
            }
        }
    }
}
