//! The limiter's behaviour on tokio's paused clock: time only moves when a test
//! advances it, so every assertion is about counts and order, never about how fast the
//! machine is.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{AdaptiveLimiter, AdaptivePolicy, Attempt, Permit, Turn, is_overload_status};

/// Lets spawned tasks run until they all wait (the clock does not move: auto-advance
/// only happens when every task is idle, and the tests hold no timers then).
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Spawns an acquisition of `turn` that pushes `label` to `order` once granted and
/// hands the permit back.
fn spawn_acquire(
    turn: Turn,
    label: &'static str,
    order: &Arc<Mutex<Vec<&'static str>>>,
) -> JoinHandle<Permit> {
    let order = Arc::clone(order);
    tokio::spawn(async move {
        let permit = turn.acquire().await;
        order.lock().unwrap().push(label);
        permit
    })
}

#[tokio::test(start_paused = true)]
async fn a_healthy_burst_starts_all_at_once_up_to_the_bound() {
    let limiter = AdaptiveLimiter::new(Some(8));
    let mut permits = Vec::new();
    for _ in 0..8 {
        permits.push(limiter.acquire().await);
    }
    let order = Arc::new(Mutex::new(Vec::new()));
    let ninth = spawn_acquire(limiter.turn(), "ninth", &order);
    settle().await;
    assert!(order.lock().unwrap().is_empty(), "the bound is 8");
    assert_eq!(limiter.snapshot().waiting, 1);
    permits.pop().unwrap().succeeded();
    let _ninth = ninth.await.unwrap();
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.window, snapshot.in_flight, snapshot.started),
        (Some(8), 8, 9)
    );
    assert!(!snapshot.throttled);
}

#[tokio::test(start_paused = true)]
async fn unbounded_until_something_is_refused() {
    let limiter = AdaptiveLimiter::new(None);
    let mut permits = Vec::new();
    for _ in 0..1000 {
        permits.push(limiter.acquire().await);
    }
    assert_eq!(limiter.snapshot().window, None);
    let _turn = permits.pop().unwrap().refused(None);
    // Half of the 1000 in flight, then at most the 999 the server took.
    assert_eq!(limiter.snapshot().window, Some(500));
}

#[tokio::test(start_paused = true)]
async fn permits_are_granted_in_the_order_places_were_taken() {
    let limiter = AdaptiveLimiter::new(Some(1));
    let holder = limiter.acquire().await;
    let turns: Vec<Turn> = (0..4).map(|_| limiter.turn()).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let labels = ["first", "second", "third", "fourth"];
    // Acquired in reverse: order still follows the places.
    let mut tasks = Vec::new();
    for (turn, label) in turns.into_iter().zip(labels).rev() {
        tasks.push(spawn_acquire(turn, label, &order));
        settle().await;
    }
    drop(holder);
    for granted in 1..=4 {
        settle().await;
        // One at a time (the bound is 1): free the slot of whoever holds it.
        assert_eq!(order.lock().unwrap().len(), granted);
        let index = tasks.iter().position(|task| task.is_finished()).unwrap();
        tasks.remove(index).await.unwrap().succeeded();
    }
    assert_eq!(*order.lock().unwrap(), labels);
}

#[tokio::test(start_paused = true)]
async fn refusals_halve_the_window_then_cut_it_to_what_the_server_accepted() {
    let limiter = AdaptiveLimiter::new(Some(10));
    let mut permits: Vec<Permit> = Vec::new();
    for _ in 0..10 {
        permits.push(limiter.acquire().await);
    }
    // The first refusal of the round halves the flight of 10.
    let _retry = permits.pop().unwrap().refused(None);
    assert_eq!(limiter.snapshot().window, Some(5));
    // Five more of the same round refused: the server took 4 of the 10.
    let _retries: Vec<Turn> = (0..5)
        .map(|_| permits.pop().unwrap().refused(None))
        .collect();
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.window, snapshot.refused, snapshot.decreases),
        (Some(4), 6, 1)
    );
    // Successes of the round sent before the decrease teach nothing.
    for permit in permits.drain(..) {
        permit.succeeded();
    }
    assert_eq!(limiter.snapshot().window, Some(4));
}

#[tokio::test(start_paused = true)]
async fn the_window_never_falls_below_one() {
    let limiter = AdaptiveLimiter::new(Some(4));
    // Round after round, everything sent is refused: the first round holds 4 permits,
    // every later one the 1 the window has left.
    let mut refused = 0;
    for _ in 0..10 {
        let permits = limiter.snapshot().window.unwrap_or(1).max(1);
        let mut round = Vec::new();
        for _ in 0..permits {
            round.push(limiter.acquire().await);
        }
        for permit in round {
            drop(permit.refused(None));
            refused += 1;
        }
    }
    let snapshot = limiter.snapshot();
    assert_eq!((snapshot.window, snapshot.refused), (Some(1), refused));
    let _permit = limiter.acquire().await;
}

#[tokio::test(start_paused = true)]
async fn retry_after_delays_only_the_refused_request() {
    let limiter = AdaptiveLimiter::new(Some(10));
    let mut permits = Vec::new();
    for _ in 0..4 {
        permits.push(limiter.acquire().await);
    }
    let started = tokio::time::Instant::now();
    let turn = permits.pop().unwrap().refused(Some(Duration::from_secs(1)));
    // Half of the flight of 4; the server still holds the other 3.
    assert_eq!(limiter.snapshot().window, Some(2));
    let order = Arc::new(Mutex::new(Vec::new()));
    let refused = spawn_acquire(turn, "refused", &order);
    settle().await;
    let snapshot = limiter.snapshot();
    assert!(snapshot.throttled);
    assert_eq!(
        snapshot
            .paused_for
            .map(|left| left >= Duration::from_secs(1)),
        Some(true)
    );
    // Two of the three come back: new work starts at once, inside the refused
    // request's Retry-After.
    permits.pop().unwrap().succeeded();
    permits.pop().unwrap().succeeded();
    let new_work = spawn_acquire(limiter.turn(), "new work", &order);
    new_work.await.unwrap().succeeded();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(*order.lock().unwrap(), ["new work"]);
    // The refused request itself waits its Retry-After out, though the window has room.
    tokio::time::sleep(Duration::from_millis(999)).await;
    settle().await;
    assert_eq!(*order.lock().unwrap(), ["new work"]);
    refused.await.unwrap().succeeded();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(limiter.snapshot().paused_for, None);
}

/// A server with `seats` seats that reads one request per millisecond and holds each
/// for `service`, refusing at once (`Retry-After: 1`) a request that finds every seat
/// taken: a burst of more than `service` worth of requests takes longer to arrive than
/// a round trip, and seats are freed and taken again while it arrives.
fn spawn_server(
    seats: usize,
    service: Duration,
) -> (
    tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<bool>>,
    JoinHandle<()>,
) {
    let (requests, mut incoming) =
        tokio::sync::mpsc::unbounded_channel::<tokio::sync::oneshot::Sender<bool>>();
    let server = tokio::spawn(async move {
        let busy = Arc::new(Mutex::new(0_usize));
        while let Some(answer) = incoming.recv().await {
            tokio::time::sleep(Duration::from_millis(1)).await;
            let taken = {
                let mut busy = busy.lock().unwrap();
                let free = *busy < seats;
                if free {
                    *busy += 1;
                }
                free
            };
            if taken {
                let busy = Arc::clone(&busy);
                tokio::spawn(async move {
                    tokio::time::sleep(service).await;
                    *busy.lock().unwrap() -= 1;
                    let _ = answer.send(true);
                });
            } else {
                let _ = answer.send(false);
            }
        }
    });
    (requests, server)
}

/// One request through `limiter` to the server until it is answered; returns the
/// times it was refused at.
async fn request_until_answered(
    limiter: AdaptiveLimiter,
    server: tokio::sync::mpsc::UnboundedSender<tokio::sync::oneshot::Sender<bool>>,
) -> Vec<tokio::time::Instant> {
    let mut refused_at = Vec::new();
    let mut turn = limiter.turn();
    loop {
        let permit = turn.acquire().await;
        let (answer, answered) = tokio::sync::oneshot::channel();
        server.send(answer).unwrap();
        if answered.await.unwrap() {
            permit.succeeded();
            return refused_at;
        }
        refused_at.push(tokio::time::Instant::now());
        turn = permit.refused(Some(Duration::from_secs(1)));
    }
}

#[tokio::test(start_paused = true)]
async fn a_burst_longer_than_a_round_trip_teaches_what_the_server_holds_at_once() {
    const SEATS: usize = 4;
    let (server, serving) = spawn_server(SEATS, Duration::from_millis(5));
    let limiter = AdaptiveLimiter::new(None);
    let started = tokio::time::Instant::now();
    // 40 requests at once: they take 40 ms to arrive, 8 round trips of 5 ms.
    let first: Vec<_> = (0..40)
        .map(|_| tokio::spawn(request_until_answered(limiter.clone(), server.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let after_burst = limiter.snapshot();
    // Far more of the burst succeeded than the server holds at once (seats were
    // reused while it arrived): counting them as the server's concurrency would
    // overshoot the next round...
    assert!(after_burst.succeeded > 2 * SEATS as u64, "{after_burst:?}");
    // ...what was still out at the burst's last refusal is what it holds.
    assert_eq!(after_burst.window, Some(SEATS));
    // More work arrives while the refused requests wait out their Retry-After, and the
    // refused ones come back with it.
    tokio::time::sleep_until(started + Duration::from_millis(1000)).await;
    let second: Vec<_> = (0..40)
        .map(|_| tokio::spawn(request_until_answered(limiter.clone(), server.clone())))
        .collect();
    let mut refusals = Vec::new();
    for request in first.into_iter().chain(second) {
        refusals.extend(request.await.unwrap());
    }
    drop(server);
    serving.await.unwrap();
    // Every refusal was in the first burst: the next rounds did not overshoot.
    assert_eq!(refusals.len() as u64, after_burst.refused);
    assert!(
        refusals
            .iter()
            .all(|at| *at - started < Duration::from_millis(100)),
        "refused after the first burst: {refusals:?}"
    );
    let snapshot = limiter.snapshot();
    assert_eq!((snapshot.succeeded, snapshot.decreases), (80, 1));
}

#[tokio::test(start_paused = true)]
async fn refused_work_keeps_its_place_in_line() {
    let limiter = AdaptiveLimiter::new(Some(2));
    let refused = limiter.acquire().await;
    let blocker = limiter.acquire().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    // Taken after the refused work's place.
    let later = spawn_acquire(limiter.turn(), "later", &order);
    settle().await;
    let turn = refused.refused(Some(Duration::from_millis(50)));
    // A flight of 2 with one refused: the window is 1, and the blocker holds it.
    assert_eq!(limiter.snapshot().window, Some(1));
    let again = spawn_acquire(turn, "refused", &order);
    tokio::time::sleep(Duration::from_millis(100)).await;
    settle().await;
    assert!(order.lock().unwrap().is_empty());
    blocker.succeeded();
    again.await.unwrap().succeeded();
    later.await.unwrap().succeeded();
    assert_eq!(*order.lock().unwrap(), ["refused", "later"]);
}

#[tokio::test(start_paused = true)]
async fn refused_work_comes_back_spread_out_never_before_retry_after() {
    let limiter = AdaptiveLimiter::new(Some(50));
    let mut permits = Vec::new();
    for _ in 0..50 {
        permits.push(limiter.acquire().await);
    }
    let refused_at = tokio::time::Instant::now();
    let retry_after = Duration::from_secs(1);
    let mut due: Vec<Duration> = permits
        .into_iter()
        .map(|permit| permit.refused(Some(retry_after)))
        .map(|turn| turn.retry_at().unwrap() - refused_at)
        .collect();
    assert!(
        due.iter()
            .all(|delay| *delay >= retry_after && *delay <= retry_after * 11 / 10)
    );
    due.sort();
    due.dedup();
    assert!(
        due.len() > 40,
        "refused work comes back in lock-step: {due:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_without_retry_after_back_off_per_piece_of_work() {
    let limiter = AdaptiveLimiter::new(Some(4));
    let mut turn = limiter.turn();
    let mut delays = Vec::new();
    for _ in 0..4 {
        let permit = turn.acquire().await;
        let refused_at = tokio::time::Instant::now();
        turn = permit.refused(None);
        delays.push(turn.retry_at().unwrap() - refused_at);
    }
    // The backoff policy's steps (800 ms doubling), each drawn within its jitter range.
    for (delay, step_ms) in delays.iter().zip([800u64, 1600, 3200, 6400]) {
        let step = Duration::from_millis(step_ms);
        assert!(*delay >= step / 2 && *delay <= step * 11 / 10, "{delays:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_window_grows_back_below_the_refused_level_and_probes_past_it_later() {
    let policy = AdaptivePolicy::default();
    let limiter = AdaptiveLimiter::with_policy(Some(16), policy);
    let mut permits = Vec::new();
    for _ in 0..8 {
        permits.push(limiter.acquire().await);
    }
    // 8 in flight, 2 refused: the server took 6; the window halves to 4.
    let _retries: Vec<Turn> = (0..2)
        .map(|_| permits.pop().unwrap().refused(None))
        .collect();
    drop(permits);
    assert_eq!(limiter.snapshot().window, Some(4));
    // Additive increase: one permit per window's worth of successes, up to the 6 the
    // server took and no further.
    for _ in 0..100 {
        limiter.acquire().await.succeeded();
    }
    assert_eq!(limiter.snapshot().window, Some(6));
    tokio::time::sleep(policy.probe_after).await;
    // Past it now: 6 successes at 6, then 7 at 7, and 7 more at 8.
    for _ in 0..20 {
        limiter.acquire().await.succeeded();
    }
    assert_eq!(limiter.snapshot().window, Some(8));
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquisition_gives_its_place_and_any_uncollected_permit_back() {
    let limiter = AdaptiveLimiter::new(Some(1));
    let holder = limiter.acquire().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let cancelled_while_waiting = spawn_acquire(limiter.turn(), "cancelled", &order);
    settle().await;
    cancelled_while_waiting.abort();
    settle().await;
    assert_eq!(limiter.snapshot().waiting, 0);

    // Granted, then dropped before the future saw the grant.
    let mut uncollected = Box::pin(limiter.turn().acquire());
    assert!(futures_poll_once(uncollected.as_mut()).await.is_none());
    drop(holder);
    assert_eq!(limiter.snapshot().in_flight, 1);
    drop(uncollected);
    assert_eq!(limiter.snapshot().in_flight, 0);
    let _next = limiter.acquire().await;
    assert!(order.lock().unwrap().is_empty());
}

/// Polls a future once.
async fn futures_poll_once<F: std::future::Future + Unpin>(future: F) -> Option<F::Output> {
    let mut future = future;
    std::future::poll_fn(|context| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(context) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn throttled_while_work_waits_behind_a_reduced_window() {
    let limiter = AdaptiveLimiter::new(Some(4));
    let mut permits = Vec::new();
    for _ in 0..4 {
        permits.push(limiter.acquire().await);
    }
    assert!(!limiter.snapshot().throttled);
    let turn = permits.pop().unwrap().refused(None);
    assert!(!limiter.snapshot().throttled, "nothing is waiting");
    let waiting = tokio::spawn(turn.acquire());
    settle().await;
    assert!(limiter.snapshot().throttled);
    drop(permits);
    tokio::time::sleep(Duration::from_secs(2)).await;
    waiting.await.unwrap().succeeded();
    assert!(!limiter.snapshot().throttled);
}

/// A 429 as kube reports it, with the Status body's `retryAfterSeconds`.
fn too_many_requests(retry_after_seconds: u32) -> kube::Error {
    let mut status = kube::core::Status::failure("Too many requests", "TooManyRequests");
    status.code = 429;
    status.details = Some(kube::core::response::StatusDetails {
        name: String::new(),
        group: String::new(),
        kind: String::new(),
        uid: String::new(),
        causes: Vec::new(),
        retry_after_seconds,
    });
    kube::Error::Api(status.boxed())
}

#[tokio::test(start_paused = true)]
async fn send_re_queues_refused_requests_until_one_is_answered() {
    let limiter = AdaptiveLimiter::new(Some(8));
    let started = tokio::time::Instant::now();
    let mut attempts = 0;
    let mut kinds = Vec::new();
    let answer = limiter
        .send(10, |kind| {
            attempts += 1;
            let attempt = attempts;
            kinds.push(kind);
            async move {
                if attempt <= 2 {
                    Err(too_many_requests(1))
                } else {
                    Ok(attempt)
                }
            }
        })
        .await
        .unwrap();
    assert_eq!(answer, 3);
    assert_eq!(kinds, [Attempt::First, Attempt::Retry, Attempt::Retry]);
    // Each refusal's Retry-After (1 s) passed before the next attempt.
    assert!(started.elapsed() >= Duration::from_secs(2));
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.refused, snapshot.succeeded, snapshot.in_flight),
        (2, 1, 0)
    );
}

#[tokio::test(start_paused = true)]
async fn send_gives_up_after_its_refusals_and_returns_other_errors_at_once() {
    let limiter = AdaptiveLimiter::new(Some(8));
    let mut attempts = 0;
    let refused = limiter
        .send(2, |_| {
            attempts += 1;
            async { Err::<(), _>(too_many_requests(0)) }
        })
        .await;
    assert!(matches!(refused, Err(kube::Error::Api(status)) if status.code == 429));
    assert_eq!(attempts, 3, "the first attempt and two re-queued ones");
    let forbidden = limiter
        .send(2, |_| async {
            let mut status = kube::core::Status::failure("forbidden", "Forbidden");
            status.code = 403;
            Err::<(), _>(kube::Error::Api(status.boxed()))
        })
        .await;
    assert!(matches!(forbidden, Err(kube::Error::Api(status)) if status.code == 403));
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.refused, snapshot.in_flight, snapshot.waiting),
        (3, 0, 0)
    );
}

#[test]
fn overload_statuses() {
    assert!(is_overload_status(429));
    assert!(is_overload_status(503));
    assert!(is_overload_status(500));
    assert!(!is_overload_status(403));
    assert!(!is_overload_status(404));
    assert!(!is_overload_status(200));
}

#[test]
fn only_a_retry_is_marked_as_one() {
    let marked = |attempt: Attempt| {
        attempt
            .mark(http::Request::new(()))
            .extensions()
            .get::<crate::backoff::Retry>()
            .is_some()
    };
    assert!(!marked(Attempt::First));
    assert!(marked(Attempt::Retry));
}

#[tokio::test(start_paused = true)]
async fn a_lone_refused_request_leaves_the_window_as_it_was() {
    let limiter = AdaptiveLimiter::new(None);
    let retry_after = Duration::from_secs(1);
    limiter.acquire().await.refused(Some(retry_after));
    let snapshot = limiter.snapshot();
    assert_eq!(snapshot.window, None, "{snapshot:?}");
    // A burst after it still starts at once.
    let mut permits = Vec::new();
    for _ in 0..200 {
        permits.push(limiter.acquire().await);
    }
    assert_eq!(limiter.snapshot().in_flight, 200);
    drop(permits);

    // With another request of ours out, a refusal does shrink the window.
    let limiter = AdaptiveLimiter::new(None);
    let held = limiter.acquire().await;
    limiter.acquire().await.refused(Some(retry_after));
    assert_eq!(
        limiter.snapshot().window,
        Some(1),
        "{:?}",
        limiter.snapshot()
    );
    held.succeeded();
}
