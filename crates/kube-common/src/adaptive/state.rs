//! The limiter's bookkeeping: the window, the queue of waiters and the counters, as a
//! plain synchronous state machine. Everything here runs under the limiter's lock and
//! never waits; the asynchronous side ([`super::core`]) only moves wake-ups around.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{AdaptivePolicy, LimiterSnapshot};

/// How a permit's request ended, as the window sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The server did the work: the window may grow.
    Succeeded,
    /// The server refused for load (429, 5xx): the window shrinks. The request's
    /// `Retry-After` is its own delay, kept by its re-queued turn.
    Refused,
    /// Nothing to learn about load (403, 404, a cancelled request): the slot is freed.
    Neutral,
}

/// One queued acquisition.
#[derive(Debug)]
struct Waiter {
    /// Re-queued work may not start before this (its jittered retry delay).
    not_before: Option<Instant>,
    /// Wakes the waiting future: for its grant, or to keep the timer (see
    /// [`State::timekeeper`]).
    poke: Arc<Notify>,
}

/// The refusals of one generation of sends: together they estimate how many requests
/// the server takes at once.
#[derive(Clone, Copy, Debug)]
struct Decrease {
    /// The generation whose requests were refused.
    of_generation: u64,
    /// How many requests the server takes at once, as far as the refusals so far tell.
    accepted: usize,
}

/// Counters for metrics; they only grow.
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    started: u64,
    succeeded: u64,
    refused: u64,
    decreases: u64,
}

/// The limiter's state.
#[derive(Debug)]
pub(crate) struct State {
    policy: AdaptivePolicy,
    /// `--max-concurrent-syncs`, or infinity.
    upper: f64,
    /// How many permits may be out at once (fractional: additive increase adds
    /// `1 / window` per success, one permit per window's worth of successes).
    window: f64,
    in_flight: usize,
    /// Queued acquisitions by ticket: a ticket is taken once per piece of work and kept
    /// when the work is refused and re-queued, so order is arrival order.
    waiters: BTreeMap<u64, Waiter>,
    /// Waiters with a `not_before` still to come, by that time (pruned lazily).
    delayed: BTreeSet<(Instant, u64)>,
    /// Tickets granted a permit whose future has not collected it yet, with the
    /// generation they were granted in.
    granted: HashMap<u64, u64>,
    next_ticket: u64,
    /// Bumped by every decrease: a refusal only shrinks the window again when the
    /// refused request was started after the last decrease (once per round trip, as
    /// TCP does), and only successes of the current generation grow it.
    generation: u64,
    decrease: Option<Decrease>,
    /// The in-flight level known to be refused, and when: the window grows freely up
    /// to just below it, and past it only after `policy.probe_after`.
    ceiling: Option<(f64, Instant)>,
    /// The one waiter that sleeps until the next timed event (the end of a
    /// re-queued waiter's delay) and dispatches then; every other waiter only waits for
    /// its grant.
    timekeeper: Option<u64>,
    counters: Counters,
}

impl State {
    pub(crate) fn new(upper_bound: Option<usize>, policy: AdaptivePolicy) -> Self {
        let upper = upper_bound.map_or(f64::INFINITY, |bound| bound.max(1) as f64);
        Self {
            policy,
            upper,
            window: upper,
            in_flight: 0,
            waiters: BTreeMap::new(),
            delayed: BTreeSet::new(),
            granted: HashMap::new(),
            next_ticket: 0,
            generation: 0,
            decrease: None,
            ceiling: None,
            timekeeper: None,
            counters: Counters::default(),
        }
    }

    /// A place in line.
    pub(crate) fn take_ticket(&mut self) -> u64 {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        ticket
    }

    /// Queues `ticket` and grants whatever can be granted now.
    pub(crate) fn enqueue(
        &mut self,
        ticket: u64,
        not_before: Option<Instant>,
        poke: Arc<Notify>,
        now: Instant,
    ) {
        let not_before = not_before.filter(|at| *at > now);
        if let Some(at) = not_before {
            self.delayed.insert((at, ticket));
        }
        self.waiters.insert(ticket, Waiter { not_before, poke });
        self.dispatch(now);
    }

    /// Collects a grant: the generation the permit was granted in.
    pub(crate) fn take_grant(&mut self, ticket: u64) -> Option<u64> {
        self.granted.remove(&ticket)
    }

    /// A waiting future went away. If it had been granted a permit it never collected,
    /// the slot is freed.
    pub(crate) fn cancel(&mut self, ticket: u64, now: Instant) {
        if let Some(waiter) = self.waiters.remove(&ticket) {
            if let Some(at) = waiter.not_before {
                self.delayed.remove(&(at, ticket));
            }
        } else if self.granted.remove(&ticket).is_some() {
            self.in_flight -= 1;
        }
        if self.timekeeper == Some(ticket) {
            self.timekeeper = None;
        }
        self.dispatch(now);
    }

    /// A permit of `generation` came back.
    pub(crate) fn release(&mut self, generation: u64, outcome: Outcome, now: Instant) {
        let flight = self.in_flight;
        self.in_flight -= 1;
        match outcome {
            Outcome::Succeeded => {
                self.counters.succeeded += 1;
                if generation == self.generation {
                    self.grow(now);
                }
            }
            Outcome::Refused => self.shrink(generation, flight, now),
            Outcome::Neutral => {}
        }
        self.dispatch(now);
    }

    /// Additive increase: one more permit per window's worth of successes, up to just
    /// below the level last refused (until `probe_after` has passed) and the upper
    /// bound.
    fn grow(&mut self, now: Instant) {
        let cap = match self.ceiling {
            Some((level, at)) if now.saturating_duration_since(at) < self.policy.probe_after => {
                (level - 1.0).max(1.0)
            }
            _ => self.upper,
        };
        let grown = (self.window + 1.0 / self.window).min(cap).min(self.upper);
        self.window = self.window.max(grown);
    }

    /// Multiplicative decrease, once per generation: the window becomes a fraction of
    /// what was in flight, and then no more than the server is estimated to accept at
    /// once.
    ///
    /// The estimate: at the first refusal of a generation, everything else then in
    /// flight (as TCP would: the server took those); at each further refusal of the same
    /// generation, no more than what is still in flight after it. A refusal means the
    /// server was full at that moment, so what certwatch still has out then is at least
    /// what the server holds of it at one moment (plus requests not yet read, or
    /// answered and not yet seen). Counting the successes of the whole flight instead
    /// would overshoot when a burst takes longer to send than a round trip: the server
    /// frees and reuses seats during the burst, and succeeds with far more of it than
    /// it holds at once.
    ///
    /// `Retry-After` is not handled here: it is the refused request's own delay
    /// (see [`super::core::Permit::refused`]), as Priority and Fairness means it.
    fn shrink(&mut self, generation: u64, flight: usize, now: Instant) {
        self.counters.refused += 1;
        if flight == 1 {
            // Nothing else of ours was out: the server is full of others' work, which
            // says nothing about how much of ours it holds. Shrinking here would leave
            // one lone refused request (the route list, before anything else can start)
            // holding the window at 1, to grow back additively over hundreds of round
            // trips. The request's own `Retry-After` still delays it.
            return;
        }
        let still_out = self.in_flight;
        if generation == self.generation {
            self.generation += 1;
            self.counters.decreases += 1;
            self.decrease = Some(Decrease {
                of_generation: generation,
                accepted: still_out,
            });
            let reduced = (self.window.min(flight as f64) * self.policy.decrease_factor).floor();
            self.window = reduced.max(1.0);
        } else if let Some(decrease) = self
            .decrease
            .as_mut()
            .filter(|decrease| decrease.of_generation == generation)
        {
            decrease.accepted = decrease.accepted.min(still_out);
        } else {
            // A refusal of a generation older than the last decrease's: that decrease
            // already learnt from its round trip.
            return;
        }
        if let Some(decrease) = self.decrease {
            self.window = self.window.min(decrease.accepted as f64).max(1.0);
            self.ceiling = Some(((decrease.accepted + 1) as f64, now));
        }
    }

    /// The window as a permit count.
    fn permits(&self) -> usize {
        if self.window.is_finite() {
            (self.window.floor() as usize).max(1)
        } else {
            usize::MAX
        }
    }

    /// Grants permits, in ticket order, to waiters whose delay has passed, while the
    /// window has room; then makes sure someone wakes for the next timed event.
    pub(crate) fn dispatch(&mut self, now: Instant) {
        while self.in_flight < self.permits() {
            let Some(ticket) = self.first_ready(now) else {
                break;
            };
            let Some(waiter) = self.waiters.remove(&ticket) else {
                break;
            };
            self.in_flight += 1;
            self.counters.started += 1;
            self.granted.insert(ticket, self.generation);
            if self.timekeeper == Some(ticket) {
                self.timekeeper = None;
            }
            waiter.poke.notify_one();
        }
        self.arm_timer(now);
    }

    fn first_ready(&self, now: Instant) -> Option<u64> {
        self.waiters
            .iter()
            .find(|(_, waiter)| waiter.not_before.is_none_or(|at| at <= now))
            .map(|(ticket, _)| *ticket)
    }

    /// The next moment something changes without a permit coming back: the end of a
    /// re-queued waiter's delay.
    fn next_event(&mut self, now: Instant) -> Option<Instant> {
        while let Some(&(at, ticket)) = self.delayed.first() {
            if at > now && self.waiters.contains_key(&ticket) {
                return Some(at);
            }
            self.delayed.pop_first();
        }
        None
    }

    /// Hands the timer to the first waiter if a timed event is pending and nobody
    /// holds it.
    fn arm_timer(&mut self, now: Instant) {
        if self.timekeeper.is_some() || self.next_event(now).is_none() {
            return;
        }
        if let Some((ticket, waiter)) = self.waiters.first_key_value() {
            self.timekeeper = Some(*ticket);
            waiter.poke.notify_one();
        }
    }

    /// What `ticket` should sleep until: the next timed event if it holds the timer.
    pub(crate) fn timekeeper_deadline(&mut self, ticket: u64, now: Instant) -> Option<Instant> {
        if self.timekeeper != Some(ticket) {
            return None;
        }
        let deadline = self.next_event(now);
        if deadline.is_none() {
            self.timekeeper = None;
        }
        deadline
    }

    /// The timekeeper's sleep ended: grant what became grantable, pass the timer on.
    pub(crate) fn timer_fired(&mut self, ticket: u64, now: Instant) {
        if self.timekeeper == Some(ticket) {
            self.timekeeper = None;
        }
        self.dispatch(now);
    }

    pub(crate) fn snapshot(&self, now: Instant) -> LimiterSnapshot {
        // The latest delay still running. Entries before it can be stale (granted or
        // re-queued since), but only with a time already passed: a waiter is granted
        // after its delay, and a cancelled one takes its entry with it.
        let paused_for = self
            .delayed
            .last()
            .filter(|(_, ticket)| self.waiters.contains_key(ticket))
            .map(|(until, _)| until.saturating_duration_since(now))
            .filter(|left| !left.is_zero());
        LimiterSnapshot {
            window: self.window.is_finite().then(|| self.permits()),
            upper_bound: self.upper.is_finite().then_some(self.upper as usize),
            in_flight: self.in_flight,
            waiting: self.waiters.len(),
            paused_for,
            throttled: paused_for.is_some()
                || (!self.waiters.is_empty() && self.window < self.upper),
            started: self.counters.started,
            succeeded: self.counters.succeeded,
            refused: self.counters.refused,
            decreases: self.counters.decreases,
        }
    }

    /// Every counted permit is either in flight or granted and uncollected, never
    /// more than the window allows at grant time (for the model checks).
    #[cfg(test)]
    pub(crate) fn check_accounting(&self) {
        assert!(
            self.granted.len() <= self.in_flight,
            "{} granted but uncollected, {} in flight",
            self.granted.len(),
            self.in_flight
        );
        for ticket in self.granted.keys() {
            assert!(
                !self.waiters.contains_key(ticket),
                "ticket {ticket} both waiting and granted"
            );
        }
    }

    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiters.len()
    }
}
