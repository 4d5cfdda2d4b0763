//! One retry policy for every request certwatch repeats.
//!
//! The shape is client-go's reflector backoff (start at 800 ms, double on each
//! failure, cap at 30 s, start over after a healthy period of 2 minutes), with one
//! difference that matters to operators: jitter only ever *shortens* a delay (each
//! delay is drawn from the upper half of its step), so the cap is a real bound. A
//! fault that ends is noticed at most [`BackoffPolicy::max`] later, plus one request.
//!
//! Success does not reset the sequence; time does. A request that fails again right
//! after it "succeeded" (a watch that opens and breaks at once, a server answering
//! 400 to every watch) keeps backing off instead of hammering the server once a
//! second.
//!
//! ```
//! use std::time::{Duration, Instant};
//!
//! use kube_common::backoff::{Backoff, BackoffPolicy};
//!
//! let mut backoff = Backoff::new(BackoffPolicy::default());
//! let start = Instant::now();
//! let first = backoff.next_delay_at(start, 1.0); // no jitter drawn: the full step
//! let second = backoff.next_delay_at(start + first, 1.0);
//! assert_eq!((first, second), (Duration::from_millis(800), Duration::from_millis(1600)));
//! // After a healthy period, the sequence starts over.
//! let later = start + Duration::from_secs(600);
//! assert_eq!(backoff.next_delay_at(later, 1.0), Duration::from_millis(800));
//! ```

use std::time::{Duration, Instant};

/// Marks an HTTP request as a retry of one that failed, so that the transport below can
/// count retries apart from first attempts.
///
/// Whoever retries puts it in the request's extensions
/// (`request.extensions_mut().insert(Retry)`); kube-h2's request accounting reads it.
/// Retries are made where they can be logged and counted, never silently underneath.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retry;

/// How delays between retries grow.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffPolicy {
    /// The first delay.
    pub initial: Duration,
    /// Each delay is the previous one times this.
    pub factor: f64,
    /// No delay is longer than this.
    pub max: Duration,
    /// A delay is drawn uniformly from `[step × (1 − jitter), step]`; 0 means no jitter.
    pub jitter: f64,
    /// A failure this long after the previous one starts the sequence over.
    pub reset_after: Duration,
}

impl Default for BackoffPolicy {
    /// client-go's reflector policy (800 ms doubling to 30 s, reset after 2 min), with
    /// jitter in the upper half of each step.
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            factor: 2.0,
            max: Duration::from_secs(30),
            jitter: 0.5,
            reset_after: Duration::from_secs(120),
        }
    }
}

impl BackoffPolicy {
    /// The same policy with another first delay and cap (e.g. for tests, or for a
    /// retry that must stay within a documented bound).
    pub fn with_bounds(self, initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max: max.max(initial),
            ..self
        }
    }
}

/// The state of one retried request: where in the sequence it is.
#[derive(Clone, Debug)]
pub struct Backoff {
    policy: BackoffPolicy,
    /// The undrawn length of the next delay.
    step: Duration,
    last_failure: Option<Instant>,
}

impl Backoff {
    /// A fresh sequence.
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            step: policy.initial,
            last_failure: None,
        }
    }

    /// The policy.
    pub fn policy(&self) -> &BackoffPolicy {
        &self.policy
    }

    /// The delay before retrying a request that failed now.
    pub fn next_delay(&mut self) -> Duration {
        self.next_delay_at(Instant::now(), rand::random::<f64>())
    }

    /// The delay before retrying a request that failed at `now`, with `draw` (in
    /// `[0, 1]`) choosing where in the jitter range it falls: 1 is the full step.
    /// Deterministic, for tests and models.
    pub fn next_delay_at(&mut self, now: Instant, draw: f64) -> Duration {
        let healthy_since = self
            .last_failure
            .is_some_and(|last| now.saturating_duration_since(last) >= self.policy.reset_after);
        if healthy_since {
            self.step = self.policy.initial;
        }
        self.last_failure = Some(now);
        let step = self.step.min(self.policy.max);
        self.step = step
            .mul_f64(self.policy.factor.max(1.0))
            .min(self.policy.max);
        let jitter = self.policy.jitter.clamp(0.0, 1.0);
        step.mul_f64(1.0 - jitter * (1.0 - draw.clamp(0.0, 1.0)))
    }

    /// Starts the sequence over (a caller that knows the failure was not the
    /// server's, e.g. a configuration change).
    pub fn reset(&mut self) {
        self.step = self.policy.initial;
        self.last_failure = None;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn doubles_to_the_cap_then_stays() {
        let mut backoff = Backoff::new(BackoffPolicy::default());
        let mut now = Instant::now();
        let mut delays = Vec::new();
        for _ in 0..9 {
            let delay = backoff.next_delay_at(now, 1.0);
            delays.push(delay.as_millis());
            now += delay;
        }
        assert_eq!(
            delays,
            [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]
        );
    }

    #[test]
    fn repeated_failures_soon_after_each_other_never_reset() {
        let mut backoff = Backoff::new(BackoffPolicy::default());
        let mut now = Instant::now();
        for _ in 0..20 {
            let delay = backoff.next_delay_at(now, 1.0);
            // The request is retried, "succeeds" for a second, and fails again.
            now += delay + Duration::from_secs(1);
        }
        assert_eq!(backoff.next_delay_at(now, 1.0), Duration::from_secs(30));
    }

    proptest! {
        #[test]
        fn every_delay_is_within_half_a_step_and_the_cap(draws in proptest::collection::vec(0.0f64..=1.0, 1..40)) {
            let policy = BackoffPolicy::default();
            let mut backoff = Backoff::new(policy);
            let mut now = Instant::now();
            let mut step = policy.initial;
            for draw in draws {
                let delay = backoff.next_delay_at(now, draw);
                prop_assert!(delay <= policy.max);
                prop_assert!(delay <= step && delay >= step / 2);
                step = (step * 2).min(policy.max);
                now += delay;
            }
        }
    }
}
