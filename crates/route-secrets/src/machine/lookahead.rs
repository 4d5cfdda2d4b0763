//! How far ahead of the queue's head secrets are fetched.
//!
//! A route's secret is fetched (its watch started, its access asked) when the route is
//! queued, so that the head finds the answers there. Fetching every queued route's
//! secret at once makes a start-up of many routes answer its first route only after
//! all of those watches are on their way: the shell's tasks, the connections' writes
//! and the API's replies for 100,000 watches come before the first reply is read.
//! [`Lookahead`] starts the fetches of the next `window` queued routes only; the rest
//! wait here, in queue order, and start as the head moves on. A window wider than what
//! the head applies in one round trip keeps the head from waiting on the network, and
//! the first routes are decided after one round trip, whatever the number of routes.
//!
//! The count is kept from the queue's length: the references waiting here belong to
//! the routes at the back of the queue, in the same order (a route queued again while
//! still queued keeps its place and may leave a second reference here; that only
//! widens the window by one). A prefetch is an advance, never a condition: a route
//! that reaches the head before its turn here came (the routes ahead of it decided
//! without the network in one step) is fetched by its own apply, as every head is.

use std::collections::VecDeque;

use crate::consumer::CertificateRef;

/// The fetches ahead of the head: how many may run, and the references that wait for
/// room.
#[derive(Debug)]
pub(super) struct Lookahead {
    /// How many queued routes (beyond the head) may have their secret fetched.
    window: usize,
    /// References of queued routes whose fetch has not started, in queue order.
    waiting: VecDeque<CertificateRef>,
    /// Whether fetches were started whose holds are still to be released.
    holds: bool,
}

impl Lookahead {
    /// Fetches ahead at most `window` queued routes (at least one).
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            waiting: VecDeque::new(),
            holds: false,
        }
    }

    /// A route referencing `reference` is about to be queued behind `queued` routes:
    /// returns the reference when its fetch starts now; otherwise it waits its turn.
    pub fn queue(&mut self, reference: CertificateRef, queued: usize) -> Option<CertificateRef> {
        if self.waiting.is_empty() && queued < self.window {
            self.holds = true;
            Some(reference)
        } else {
            self.waiting.push_back(reference);
            None
        }
    }

    /// The queue now holds `queued` routes: the references whose turn has come, in
    /// queue order.
    pub fn due(&mut self, queued: usize) -> Vec<CertificateRef> {
        let mut started = Vec::new();
        while !self.waiting.is_empty() && queued.saturating_sub(self.waiting.len()) < self.window {
            if let Some(reference) = self.waiting.pop_front() {
                started.push(reference);
            }
        }
        self.holds |= !started.is_empty();
        started
    }

    /// The queue is empty and nothing is in flight: every queued route has registered
    /// what it needs. Forgets what waits (those routes are applied) and returns whether
    /// holds of fetches no route took up are to be released.
    pub fn drained(&mut self) -> bool {
        self.waiting.clear();
        if self.waiting.capacity() > super::state::KEPT_ROOM {
            self.waiting = VecDeque::new();
        }
        std::mem::take(&mut self.holds)
    }

    /// How many references wait for room.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(name: &str) -> CertificateRef {
        CertificateRef::new("ns", name)
    }

    #[test]
    fn fetches_start_within_the_window_and_follow_the_head() {
        let mut lookahead = Lookahead::new(3);
        let mut queued = 0;
        let mut started = Vec::new();
        for i in 0..10 {
            if let Some(r) = lookahead.queue(reference(&format!("s{i}")), queued) {
                started.push(r);
            }
            queued += 1;
        }
        assert_eq!(started, [reference("s0"), reference("s1"), reference("s2")]);
        assert_eq!(lookahead.waiting(), 7);
        // The head takes s0; three queued routes beyond it may be fetched: s3 starts.
        queued -= 1;
        assert_eq!(lookahead.due(queued), [reference("s3")]);
        assert!(lookahead.due(queued).is_empty());
        // Two more applied at once: two more start, in order.
        queued -= 2;
        assert_eq!(lookahead.due(queued), [reference("s4"), reference("s5")]);
        // A route queued now waits behind those already waiting, even with room.
        assert_eq!(lookahead.queue(reference("late"), queued), None);
        queued += 1;
        queued -= 5;
        assert_eq!(
            lookahead.due(queued),
            [
                reference("s6"),
                reference("s7"),
                reference("s8"),
                reference("s9"),
                reference("late")
            ]
        );
        assert!(lookahead.drained());
        assert!(!lookahead.drained(), "holds are released once");
    }

    #[test]
    fn more_waiting_than_queued_starts_them_all() {
        // A route queued again while queued keeps one place and leaves two references.
        let mut lookahead = Lookahead::new(1);
        assert!(lookahead.queue(reference("a"), 0).is_some());
        assert_eq!(lookahead.queue(reference("b"), 1), None);
        assert_eq!(lookahead.queue(reference("b2"), 2), None);
        assert_eq!(lookahead.due(1), [reference("b"), reference("b2")]);
    }

    #[test]
    fn nothing_fetched_nothing_to_release() {
        let mut lookahead = Lookahead::new(0);
        assert!(!lookahead.drained());
        assert!(
            lookahead.queue(reference("a"), 0).is_some(),
            "the window is at least one"
        );
        assert_eq!(lookahead.queue(reference("b"), 1), None);
        assert!(
            lookahead.drained(),
            "what waits is forgotten, what started is released"
        );
        assert!(lookahead.due(0).is_empty());
    }
}
