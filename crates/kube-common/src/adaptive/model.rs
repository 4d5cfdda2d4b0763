//! Model checking of the permit accounting with shuttle.
//!
//! The limiter is the production code instantiated with shuttle's mutex, so that the
//! scheduler can preempt at every lock acquisition and every `.await`. Workers take a
//! place, wait, hold a permit and end it as a success, a refusal or a plain drop, while
//! the main task cancels some of them at a point the scheduler picks (before they wait,
//! while they wait, or after the grant but before they collect it). Whatever the
//! interleaving: no more permits are out than the upper bound, every worker that is not
//! cancelled gets one (a lost wake-up shows up as a shuttle deadlock), and at the end
//! nothing is in flight or waiting.

use std::sync::Arc;

use shuttle::future::{self, JoinHandle};
use shuttle::rand::{Rng, thread_rng};
use shuttle::sync::Mutex;

use super::AdaptivePolicy;
use super::core::{Limiter, StateLock};
use super::state::State;

struct ShuttleLock(Mutex<State>);

impl StateLock for ShuttleLock {
    fn new(state: State) -> Self {
        Self(Mutex::new(state))
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = f(&mut state);
        state.check_accounting();
        result
    }
}

const UPPER_BOUND: usize = 2;
const WORKERS: usize = 4;

/// Permits held by workers right now, and the most ever held at once.
#[derive(Default)]
struct Held {
    now: usize,
    peak: usize,
}

/// One permit counted in [`Held`] until dropped (a worker cancelled while holding its
/// permit drops both together).
struct Holding(Arc<Mutex<Held>>);

impl Holding {
    fn new(held: Arc<Mutex<Held>>) -> Self {
        {
            let mut counts = held.lock().unwrap();
            counts.now += 1;
            counts.peak = counts.peak.max(counts.now);
        }
        Self(held)
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.0.lock().unwrap().now -= 1;
    }
}

async fn work(limiter: Limiter<ShuttleLock>, held: Arc<Mutex<Held>>) {
    let turn = limiter.turn();
    future::yield_now().await;
    let permit = turn.acquire().await;
    let holding = Holding::new(held);
    future::yield_now().await;
    // Uncounted before the permit goes back, so the count never lags the limiter's.
    drop(holding);
    match thread_rng().gen_range(0..3) {
        0 => permit.succeeded(),
        // Refused work is given up here: re-queued work waits on a timer, which the
        // paused-clock tests cover.
        1 => drop(permit.refused(None, 0.5)),
        _ => drop(permit),
    }
}

fn model() {
    future::block_on(async {
        let limiter = Limiter::<ShuttleLock>::new(Some(UPPER_BOUND), AdaptivePolicy::default());
        let held = Arc::new(Mutex::new(Held::default()));
        let workers: Vec<JoinHandle<()>> = (0..WORKERS)
            .map(|_| future::spawn(work(limiter.clone(), Arc::clone(&held))))
            .collect();
        let mut cancelled = Vec::new();
        for (index, worker) in workers.iter().enumerate() {
            if thread_rng().gen_bool(0.25) {
                future::yield_now().await;
                worker.abort();
                cancelled.push(index);
            }
        }
        for (index, worker) in workers.into_iter().enumerate() {
            let finished = worker.await;
            assert!(
                finished.is_ok() || cancelled.contains(&index),
                "worker {index} never got a permit"
            );
        }
        let peak = held.lock().unwrap().peak;
        assert!(peak <= UPPER_BOUND, "{peak} permits out at once");
        limiter.with_state(|state| {
            assert_eq!((state.in_flight(), state.waiting()), (0, 0));
        });
    });
}

#[test]
fn permit_accounting_random_schedules() {
    shuttle::check_random(model, 3_000);
}

#[test]
fn permit_accounting_pct_schedules() {
    shuttle::check_pct(model, 3_000, 3);
}
