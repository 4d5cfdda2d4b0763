//! The asynchronous side of the limiter, generic over the lock that guards [`State`] so
//! that the model test can substitute shuttle's (which lets its scheduler preempt at
//! every acquisition). Production uses [`StdLock`].

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::state::{Outcome, State};
use super::{AdaptivePolicy, LimiterSnapshot};
use crate::backoff::Backoff;

/// A mutex over the limiter's state that is only reachable inside a synchronous
/// closure, so that no guard can live across an `.await`.
pub(crate) trait StateLock: Send + Sync + 'static {
    fn new(state: State) -> Self;
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R;
}

/// [`StateLock`] over `std::sync::Mutex`.
#[derive(Debug)]
pub(crate) struct StdLock(std::sync::Mutex<State>);

impl StateLock for StdLock {
    fn new(state: State) -> Self {
        Self(std::sync::Mutex::new(state))
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        // Every critical section leaves the state consistent before anything that
        // can panic, so a poisoned lock is recovered instead of failing every caller.
        let mut state = crate::sync::lock(&self.0);
        f(&mut state)
    }
}

/// Shared by the limiter's clones, its turns and its permits.
#[derive(Debug)]
pub(crate) struct Shared<L> {
    /// Guards the window, the queue, the grants and the counters; only touched inside
    /// `with`, never across an `.await`.
    state: L,
    policy: AdaptivePolicy,
}

pub(crate) struct Limiter<L> {
    shared: Arc<Shared<L>>,
}

impl<L> Clone for Limiter<L> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L: StateLock> Limiter<L> {
    pub(crate) fn new(upper_bound: Option<usize>, policy: AdaptivePolicy) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: L::new(State::new(upper_bound, policy)),
                policy,
            }),
        }
    }

    pub(crate) fn turn(&self) -> Turn<L> {
        let ticket = self.shared.state.with(State::take_ticket);
        Turn {
            shared: Arc::clone(&self.shared),
            ticket,
            not_before: None,
            backoff: None,
        }
    }

    pub(crate) fn snapshot(&self) -> LimiterSnapshot {
        self.shared
            .state
            .with(|state| state.snapshot(Instant::now()))
    }

    #[cfg(test)]
    pub(crate) fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        self.shared.state.with(f)
    }
}

/// A place in line.
pub(crate) struct Turn<L: StateLock> {
    shared: Arc<Shared<L>>,
    ticket: u64,
    not_before: Option<Instant>,
    /// Grows the delay of work refused again and again without a `Retry-After`.
    backoff: Option<Backoff>,
}

impl<L: StateLock> Turn<L> {
    pub(crate) fn retry_at(&self) -> Option<Instant> {
        self.not_before
    }

    pub(crate) async fn acquire(self) -> Permit<L> {
        let poke = Arc::new(Notify::new());
        let Turn {
            shared,
            ticket,
            not_before,
            backoff,
        } = self;
        shared
            .state
            .with(|state| state.enqueue(ticket, not_before, Arc::clone(&poke), Instant::now()));
        // From here until the grant is collected, dropping this future gives the place
        // (or an uncollected grant) back.
        let waiting = Waiting {
            shared: &shared,
            ticket,
        };
        let mut deadline: Option<Instant> = None;
        let generation = loop {
            let timer_fired = match deadline {
                Some(at) => tokio::select! {
                    () = poke.notified() => false,
                    () = tokio::time::sleep_until(at) => true,
                },
                None => {
                    poke.notified().await;
                    false
                }
            };
            let step = shared.state.with(|state| {
                let now = Instant::now();
                if timer_fired {
                    state.timer_fired(ticket, now);
                }
                state
                    .take_grant(ticket)
                    .ok_or_else(|| state.timekeeper_deadline(ticket, now))
            });
            match step {
                Ok(generation) => break generation,
                Err(next) => deadline = next,
            }
        };
        std::mem::forget(waiting);
        Permit {
            shared,
            ticket,
            backoff,
            generation,
            released: false,
        }
    }
}

/// Drop guard of a waiting acquisition.
struct Waiting<'a, L: StateLock> {
    shared: &'a Shared<L>,
    ticket: u64,
}

impl<L: StateLock> Drop for Waiting<'_, L> {
    fn drop(&mut self) {
        let ticket = self.ticket;
        self.shared
            .state
            .with(|state| state.cancel(ticket, Instant::now()));
    }
}

/// The right to send one request.
pub(crate) struct Permit<L: StateLock> {
    shared: Arc<Shared<L>>,
    ticket: u64,
    backoff: Option<Backoff>,
    generation: u64,
    released: bool,
}

impl<L: StateLock> Permit<L> {
    pub(crate) fn succeeded(mut self) {
        self.release(Outcome::Succeeded);
    }

    /// `draw` in `[0, 1]` places the retry within its jitter range.
    pub(crate) fn refused(mut self, retry_after: Option<Duration>, draw: f64) -> Turn<L> {
        let now = Instant::now();
        let mut backoff = self.backoff.take();
        let delay = match retry_after {
            Some(delay) => delay,
            None => backoff
                .get_or_insert_with(|| Backoff::new(self.shared.policy.backoff))
                .next_delay_at(now.into_std(), draw),
        };
        // The server's delay is a minimum: jitter only lengthens it, by up to a tenth,
        // so that refused work does not come back all at the same instant.
        let not_before = now + delay + delay.mul_f64(0.1 * draw.clamp(0.0, 1.0));
        self.release(Outcome::Refused);
        Turn {
            shared: Arc::clone(&self.shared),
            ticket: self.ticket,
            not_before: Some(not_before),
            backoff,
        }
    }

    fn release(&mut self, outcome: Outcome) {
        if self.released {
            return;
        }
        self.released = true;
        let generation = self.generation;
        self.shared
            .state
            .with(|state| state.release(generation, outcome, Instant::now()));
    }
}

impl<L: StateLock> Drop for Permit<L> {
    fn drop(&mut self) {
        self.release(Outcome::Neutral);
    }
}
