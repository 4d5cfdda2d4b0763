//! The monitor against the embedded simulator: the reference implementation's
//! scenarios, the concurrency contract, handler semantics and resilience. Every
//! assertion about cost is made from the simulator's request log and watch counts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Secret;
use kube_sim::{FailRule, OutageMode, ServerFeatures, SimConfig};
use secret_monitor::{
    EventHandler, InitialList, MonitorErrorKind, MonitorObserver, MonitorOptions, ObjectEvent,
    ObjectKey, SecretMonitor,
};

/// Latency of the overlap tests: long enough that every registration's request is
/// issued while the first ones are still in flight even on a loaded machine, so the
/// peak in flight measures the monitor's concurrency, not the machine's speed.
const OVERLAP_LATENCY: Duration = Duration::from_secs(1);

fn key(namespace: &str, name: &str) -> ObjectKey {
    ObjectKey::new(namespace, name)
}

// --- The reference implementation's unit-test scenarios ---------------------------

#[tokio::test]
async fn handler_counts_per_key() {
    let sim = sim().await;
    for name in ["a", "b", "c"] {
        put_secret(&sim, "ns", name, name);
    }
    let monitor = monitor(&sim).await;
    let mut handles = Vec::new();
    for name in ["a", "a", "b", "b", "c"] {
        handles.push(monitor.add_handler(key("ns", name)).await.unwrap().handle);
    }
    let keys = monitor.watched_keys();
    let counts: Vec<(String, usize)> = keys
        .iter()
        .map(|(k, s)| (k.name.clone(), s.handlers))
        .collect();
    assert_eq!(counts, [("a".into(), 2), ("b".into(), 2), ("c".into(), 1)]);
    assert!(
        keys.values()
            .all(|status| status.synced && status.exists && status.waiting == 0)
    );
    open_watches_become(&sim, 3).await;

    // Remove some: one of "a"'s handlers and "c"'s only one.
    monitor.remove_handler(&handles[0]).unwrap();
    monitor.remove_handler(&handles[4]).unwrap();
    let counts: Vec<(String, usize)> = monitor
        .watched_keys()
        .iter()
        .map(|(k, s)| (k.name.clone(), s.handlers))
        .collect();
    assert_eq!(counts, [("a".into(), 1), ("b".into(), 2)]);
    open_watches_become(&sim, 2).await;

    // Remove all.
    for handle in [&handles[1], &handles[2], &handles[3]] {
        monitor.remove_handler(handle).unwrap();
    }
    assert!(monitor.watched_keys().is_empty());
    open_watches_become(&sim, 0).await;

    // Removing a handler that is already gone is an error naming it.
    let err = monitor.remove_handler(&handles[4]).unwrap_err();
    assert!(
        matches!(err.kind(), MonitorErrorKind::NotRegistered { .. }) && err.key().name == "c",
        "{err}"
    );
    assert!(err.to_string().contains("ns/c"), "{err}");
}

#[tokio::test]
async fn get_reads_the_cache_without_api_calls() {
    let sim = sim().await;
    put_secret(&sim, "ns", "present", "hello");
    let monitor = monitor(&sim).await;
    let present = monitor.add_handler(key("ns", "present")).await.unwrap();
    let absent = monitor.add_handler(key("ns", "absent")).await.unwrap();

    let before = sim.stats().requests_total;
    for _ in 0..100 {
        assert_eq!(value_of(&monitor.get(&present.handle).unwrap()), "hello");
        let err = monitor.get(&absent.handle).unwrap_err();
        assert!(
            matches!(err.kind(), MonitorErrorKind::NotFound) && err.key().name == "absent",
            "{err}"
        );
    }
    assert_eq!(
        sim.stats().requests_total,
        before,
        "get must not reach the API server"
    );

    monitor.remove_handler(&present.handle).unwrap();
    assert!(matches!(
        monitor.get(&present.handle),
        Err(e) if matches!(e.kind(), MonitorErrorKind::NotRegistered { .. })
    ));
}

// --- Concurrency contract ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_register_concurrently() {
    let sim = sim_with_latency(OVERLAP_LATENCY).await;
    for i in 0..500 {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    // List then watch: two requests per key, both of which must overlap across keys.
    // Over the pooled HTTP/2 client the 500 watches share a handful of connections.
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            initial_list: InitialList::ListThenWatch,
            ..MonitorOptions::default()
        },
    )
    .await;
    sim.reset_stats();
    let registrations =
        join_all((0..500).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    assert!(registrations.iter().all(Result::is_ok));
    let stats = sim.stats();
    assert!(
        stats.peak_inflight >= 400,
        "registrations did not overlap: peak in flight {}",
        stats.peak_inflight
    );
    assert_eq!(stats.requests["list"]["secrets"], 500);
    // The first sync ends with the list; each watch starts right after it.
    open_watches_become(&sim, 500).await;
    assert_eq!(sim.stats().requests["watch"]["secrets"], 500);
    let connections = sim.stats().connections;
    assert!(
        connections.h2 <= 7 && connections.h1 == 0,
        "{connections:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_register_concurrently_over_http1() {
    let sim = sim_with_latency(OVERLAP_LATENCY).await;
    for i in 0..100 {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    let monitor = monitor_http1(&sim, MonitorOptions::default()).await;
    sim.reset_stats();
    let registrations =
        join_all((0..100).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    assert!(registrations.iter().all(Result::is_ok));
    let stats = sim.stats();
    assert!(
        stats.peak_inflight >= 80,
        "peak in flight {}",
        stats.peak_inflight
    );
    // kube's own client: one connection per open watch.
    assert!(stats.connections.h1 >= 100, "{:?}", stats.connections);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_registrations_overlap_with_one_request_each() {
    let sim = sim_with_latency(OVERLAP_LATENCY).await;
    for i in 0..200 {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    let monitor = monitor(&sim).await;
    sim.reset_stats();
    let registrations =
        join_all((0..200).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    for registration in &registrations {
        let handle = &registration.as_ref().unwrap().handle;
        assert_eq!(value_of(&monitor.get(handle).unwrap()), "v");
    }
    let stats = sim.stats();
    assert!(
        stats.peak_inflight >= 160,
        "peak in flight {}",
        stats.peak_inflight
    );
    assert_eq!(
        stats.requests_total, 200,
        "one streaming watch per key: {:?}",
        stats.requests
    );
    assert!(sim.request_log().iter().all(|r| r.send_initial_events));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_many_callers_share_one_sync() {
    for initial_list in [InitialList::Streaming, InitialList::ListThenWatch] {
        let sim = sim_with_latency(Duration::from_millis(100)).await;
        put_secret(&sim, "ns", "shared", "v");
        let monitor = monitor_with(
            &sim,
            MonitorOptions {
                initial_list,
                ..MonitorOptions::default()
            },
        )
        .await;
        let registrations =
            join_all((0..100).map(|_| monitor.add_handler(key("ns", "shared")))).await;
        assert!(registrations.iter().all(Result::is_ok));
        // With list-then-watch the first sync ends with the list; the watch follows.
        open_watches_become(&sim, 1).await;
        let requests = requests_for(&sim, "ns", "shared");
        let count = |verb: &str| requests.get(verb).map_or(0, Vec::len);
        match initial_list {
            InitialList::Streaming => {
                assert_eq!((count("list"), count("watch")), (0, 1), "{initial_list:?}");
            }
            InitialList::ListThenWatch => {
                assert_eq!((count("list"), count("watch")), (1, 1), "{initial_list:?}");
            }
        }
        assert_eq!(monitor.watched_keys()[&key("ns", "shared")].handlers, 100);
        open_watches_become(&sim, 1).await;
    }
}

#[tokio::test]
async fn failed_first_sync_fails_all_waiters_and_leaves_nothing() {
    let cases: [(&str, Option<u16>); 3] = [
        ("forbidden", Some(403)),
        ("server error", Some(500)),
        ("timeout", None),
    ];
    for (case, code) in cases {
        let sim = sim_with_latency(Duration::from_millis(50)).await;
        put_secret(&sim, "ns", "s", "v");
        let options = MonitorOptions {
            sync_timeout: Duration::from_millis(500),
            first_sync_attempts: 2,
            ..fast_options()
        };
        let monitor = monitor_with(&sim, options).await;
        match code {
            Some(code) => sim
                .faults()
                .fail_next(FailRule::new("*", "secrets", code, 1_000)),
            None => sim
                .faults()
                .outage(Duration::from_secs(3_600), OutageMode::Hang),
        }
        let outcomes = join_all((0..10).map(|_| monitor.add_handler(key("ns", "s")))).await;
        for outcome in &outcomes {
            let err = outcome.as_ref().unwrap_err();
            assert_eq!(err.key(), &key("ns", "s"), "{case}: {err}");
            match code {
                Some(403) => assert!(
                    matches!(err.kind(), MonitorErrorKind::Forbidden { .. }),
                    "{case}: {err}"
                ),
                Some(code) => assert_eq!(err.status_code(), Some(code), "{case}: {err}"),
                None => assert!(
                    matches!(err.kind(), MonitorErrorKind::SyncTimeout { .. }),
                    "{case}: {err}"
                ),
            }
        }
        // Every waiter got the very same error.
        let first = outcomes[0].as_ref().unwrap_err();
        assert!(
            outcomes.iter().all(|o| o.as_ref().unwrap_err() == first),
            "{case}"
        );
        assert!(
            monitor.watched_keys().is_empty(),
            "{case}: entry left behind"
        );

        sim.faults().clear();
        open_watches_become(&sim, 0).await;
        let seen_before = sim.request_log().len();
        let registration = monitor
            .add_handler(key("ns", "s"))
            .await
            .unwrap_or_else(|e| panic!("{case}: retry failed: {e}"));
        assert_eq!(value_of(&monitor.get(&registration.handle).unwrap()), "v");
        let fresh: Vec<_> = sim
            .request_log()
            .into_iter()
            .skip(seen_before)
            .filter(|r| r.code == 200)
            .collect();
        assert!(
            fresh.iter().any(|r| r.verb == "watch"),
            "{case}: the retry opened a fresh watch"
        );
        open_watches_become(&sim, 1).await;
    }
}

#[tokio::test]
async fn cancelled_waiter_affects_no_one() {
    let sim = sim_with_latency(Duration::from_millis(1_000)).await;
    put_secret(&sim, "ns", "s", "v");
    let monitor = monitor(&sim).await;

    // A caller that gives up while its key syncs, alone: its watch goes away.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        monitor.add_handler(key("ns", "lonely")),
    )
    .await;
    assert!(gave_up.is_err());
    assert!(monitor.watched_keys().is_empty());
    open_watches_become(&sim, 0).await;

    // Several callers; one of them is cancelled mid-wait; the others succeed.
    let patient: Vec<_> = (0..3)
        .map(|_| {
            let monitor = monitor.clone();
            tokio::spawn(async move { monitor.add_handler(key("ns", "s")).await })
        })
        .collect();
    let impatient = {
        let monitor = monitor.clone();
        tokio::spawn(async move { monitor.add_handler(key("ns", "s")).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    impatient.abort();
    assert!(impatient.await.unwrap_err().is_cancelled());
    let mut handles = Vec::new();
    for caller in patient {
        handles.push(caller.await.unwrap().unwrap().handle);
    }
    assert_eq!(monitor.watched_keys()[&key("ns", "s")].handlers, 3);
    assert_eq!(
        monitor.watched_keys()[&key("ns", "s")].waiting,
        0,
        "the cancelled caller left no hold"
    );
    for handle in &handles {
        monitor.remove_handler(handle).unwrap();
    }
    open_watches_become(&sim, 0).await;
}

#[tokio::test]
async fn removal_during_a_pending_sync() {
    let sim = sim_with_latency(Duration::from_millis(200)).await;
    put_secret(&sim, "ns", "s", "v1");
    put_secret(&sim, "ns", "t", "t1");
    let monitor = monitor(&sim).await;
    let first = monitor.add_handler(key("ns", "s")).await.unwrap();

    // The last handler of "s" goes and "s" is registered again at once: the new caller
    // waits for a fresh entry's first sync while the old watch closes.
    monitor.remove_handler(&first.handle).unwrap();
    let pending_s = {
        let monitor = monitor.clone();
        tokio::spawn(async move { monitor.add_handler(key("ns", "s")).await })
    };
    let pending_t = {
        let monitor = monitor.clone();
        tokio::spawn(async move { monitor.add_handler(key("ns", "t")).await })
    };
    eventually("both callers wait", || {
        let keys = monitor.watched_keys();
        let waiting = keys
            .values()
            .filter(|status| status.waiting == 1 && !status.synced)
            .count();
        async move { waiting == 2 }
    })
    .await;
    // Removing the stale handle while "s" syncs again is an error and disturbs nothing.
    assert!(matches!(
        monitor.remove_handler(&first.handle),
        Err(e) if matches!(e.kind(), MonitorErrorKind::NotRegistered { .. })
    ));
    let second = pending_s.await.unwrap().unwrap();
    let third = pending_t.await.unwrap().unwrap();
    assert_eq!(value_of(&monitor.get(&second.handle).unwrap()), "v1");
    open_watches_become(&sim, 2).await;

    // Removing an established handler of "s" while a caller waits for another key.
    put_secret(&sim, "ns", "u", "u1");
    let pending_u = {
        let monitor = monitor.clone();
        tokio::spawn(async move { monitor.add_handler(key("ns", "u")).await })
    };
    monitor.remove_handler(&second.handle).unwrap();
    let fourth = pending_u.await.unwrap().unwrap();
    assert_eq!(value_of(&monitor.get(&fourth.handle).unwrap()), "u1");
    let names: Vec<String> = monitor
        .watched_keys()
        .keys()
        .map(|k| k.name.clone())
        .collect();
    assert_eq!(names, ["t", "u"]);
    open_watches_become(&sim, 2).await;
    monitor.remove_handler(&third.handle).unwrap();
    monitor.remove_handler(&fourth.handle).unwrap();
    open_watches_become(&sim, 0).await;
}

#[tokio::test]
async fn bounded_concurrent_syncs() {
    let sim = sim_with_latency(Duration::from_millis(50)).await;
    for i in 0..40 {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            max_concurrent_syncs: Some(5),
            ..MonitorOptions::default()
        },
    )
    .await;
    sim.reset_stats();
    let registrations =
        join_all((0..40).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    assert!(registrations.iter().all(Result::is_ok));
    let stats = sim.stats();
    assert!(
        stats.peak_inflight <= 5,
        "peak in flight {} above the bound",
        stats.peak_inflight
    );
    assert_eq!(stats.requests_total, 40);
}

#[tokio::test]
async fn falls_back_to_list_then_watch_when_streaming_is_refused() {
    let sim = sim().await;
    put_secret(&sim, "ns", "a", "va");
    put_secret(&sim, "ns", "b", "vb");
    let monitor = monitor(&sim).await;
    // The server refuses the first streaming watch, as a cluster without WatchList does.
    sim.faults()
        .fail_next(FailRule::new("watch", "secrets", 422, 1));
    let a = monitor.add_handler(key("ns", "a")).await.unwrap();
    assert_eq!(value_of(&monitor.get(&a.handle).unwrap()), "va");
    open_watches_become(&sim, 1).await;
    let requests = requests_for(&sim, "ns", "a");
    let watches = &requests["watch"];
    assert_eq!(
        watches.len(),
        2,
        "refused streaming watch, then a plain watch"
    );
    assert!(watches[0].send_initial_events && watches[0].code == 422);
    assert!(!watches[1].send_initial_events);
    assert_eq!(requests["list"].len(), 1);
    // Later keys do not try streaming again.
    monitor.add_handler(key("ns", "b")).await.unwrap();
    open_watches_become(&sim, 2).await;
    let b = requests_for(&sim, "ns", "b");
    assert_eq!((b["list"].len(), b["watch"].len()), (1, 1));
    assert!(!b["watch"][0].send_initial_events);
}

/// Counts the errors the monitor reports.
#[derive(Default)]
struct ErrorCount(AtomicUsize);

impl MonitorObserver for ErrorCount {
    fn watch_error(&self, _key: &ObjectKey, _error: &secret_monitor::MonitorError) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_server_without_watch_progress_turns_streaming_off_for_every_key_at_once() {
    let api = FakeApi::without_watch_progress("k0");
    let errors = Arc::new(ErrorCount::default());
    let monitor = SecretMonitor::with_options(
        api.client.clone(),
        MonitorOptions {
            // A refusal that counted as a failure would fail the sync.
            first_sync_attempts: 1,
            // A key that did not switch would wait for its streaming list until then.
            sync_timeout: Duration::from_secs(20),
            observer: Some(errors.clone()),
            ..fast_options()
        },
    );
    // Nineteen keys wait for streaming lists this server never answers...
    let names: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let waiting: Vec<_> = names[1..]
        .iter()
        .map(|name| {
            let monitor = monitor.clone();
            let key = key("ns", name);
            tokio::spawn(async move { monitor.add_handler(key).await })
        })
        .collect();
    eventually("every streaming list is in flight", || {
        let in_flight = names[1..]
            .iter()
            .filter(|name| api.count(name, "streaming") == 1)
            .count();
        async move { in_flight == 19 }
    })
    .await;
    // ...until one key is refused: then they all list and watch, at once.
    monitor.add_handler(key("ns", "k0")).await.unwrap();
    for registration in waiting {
        let registration = registration.await.unwrap().unwrap();
        assert_eq!(value_of(&monitor.get(&registration.handle).unwrap()), "v");
    }
    eventually("every key watches", || {
        let watching = names.iter().filter(|n| api.count(n, "watch") == 1).count();
        async move { watching == 20 }
    })
    .await;
    for name in &names {
        let requests = (
            api.count(name, "streaming"),
            api.count(name, "list"),
            api.count(name, "watch"),
        );
        assert_eq!(requests, (1, 1, 1), "{name}");
    }
    // The refusal was reported once, by the key that got it; the switch of the others
    // is no error of theirs.
    assert_eq!(errors.0.load(Ordering::SeqCst), 1);

    // A key registered later lists straight away.
    monitor.add_handler(key("ns", "late")).await.unwrap();
    assert_eq!(
        (api.count("late", "streaming"), api.count("late", "list")),
        (0, 1)
    );
}

/// Against the simulator's two kinds of servers without streaming lists (WatchList off:
/// 422; storage without watch progress: 200 and one ERROR event), with every key's
/// streaming list in flight before the first refusal comes back: each key lists and
/// watches once, none fails (one attempt allowed), and the refusal is one error, not
/// one per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_streaming_lists_switch_every_key_in_flight_at_once() {
    for (server, features, refusal_code) in servers_without_streaming_lists() {
        let burst = register_burst(features, None).await;
        let Burst { sim, monitor, .. } = &burst;
        // The fault fired: the server refused streaming lists the way it should.
        assert!(
            !burst.streaming_codes.is_empty()
                && burst
                    .streaming_codes
                    .iter()
                    .all(|code| *code == refusal_code),
            "{server}"
        );
        assert!(burst.streaming_codes.len() <= BURST, "{server}");
        assert_eq!((burst.lists, burst.watches), (BURST, BURST), "{server}");
        assert_eq!(
            burst.errors.0.load(Ordering::SeqCst),
            1,
            "{server}: one refusal reported, not one per key"
        );

        // A key registered later lists straight away.
        put_secret(sim, "ns", "late", "v");
        monitor.add_handler(key("ns", "late")).await.unwrap();
        open_watches_become(sim, BURST as u64 + 1).await;
        let late = requests_for(sim, "ns", "late");
        assert_eq!(late["list"].len(), 1, "{server}");
        assert!(
            late["watch"].iter().all(|r| !r.send_initial_events),
            "{server}"
        );
    }
}

/// A server with 4 seats and no queue (429 for everything beyond): 40 keys registered
/// at once all sync, because the adaptive limiter shrinks its window to what the server
/// takes and re-queues refused first syncs after Retry-After, instead of failing them
/// after a few attempts. The limiter is the caller's, shared: its counters show it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_syncs_converge_on_a_server_with_four_seats_and_no_queue() {
    let sim = sim_with(SimConfig {
        latency: kube_sim::LatencyConfig::fixed(Duration::from_millis(50)),
        limits: kube_sim::LimitsConfig {
            max_inflight: Some(4),
            queue_len: 0,
            retry_after: Duration::from_secs(1),
        },
        ..SimConfig::default()
    })
    .await;
    for i in 0..40 {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    let limiter = kube_common::adaptive::AdaptiveLimiter::new(None);
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            limiter: Some(limiter.clone()),
            first_sync_attempts: 3,
            ..fast_options()
        },
    )
    .await;
    sim.reset_stats();
    let registrations =
        join_all((0..40).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    for registration in registrations {
        let registration = registration.unwrap();
        assert_eq!(value_of(&monitor.get(&registration.handle).unwrap()), "v");
    }
    let stats = sim.stats();
    let snapshot = limiter.snapshot();
    // The server did refuse (the first burst overran its 4 seats)...
    assert!(stats.rejected_429 > 0, "{stats:?}");
    assert!(
        snapshot.refused > 0 && snapshot.decreases > 0,
        "{snapshot:?}"
    );
    // ...and the window came down to what it takes, so refusals stayed a fraction of
    // the burst rather than repeating round after round.
    assert_eq!(snapshot.succeeded, 40, "{snapshot:?}");
    assert!(snapshot.window.is_some_and(|w| w <= 8), "{snapshot:?}");
    assert!(stats.rejected_429 < 80, "{stats:?}");
}

// --- Handler semantics --------------------------------------------------------------

#[tokio::test]
async fn late_handler_gets_current_object_once_then_changes_in_order() {
    let sim = sim().await;
    put_secret(&sim, "ns", "s", "v1");
    let monitor = monitor(&sim).await;
    let early = monitor.add_handler(key("ns", "s")).await.unwrap();
    put_secret(&sim, "ns", "s", "v2");
    let mut early = Follower::new(early.events);
    eventually("the early handler sees v2", || {
        early.drain();
        let done = early.kinds().last().map(String::as_str) == Some("updated:v2");
        async move { done }
    })
    .await;

    let late = monitor.add_handler(key("ns", "s")).await.unwrap();
    let mut late = Follower::new(late.events);
    for v in ["v3", "v4", "v5"] {
        put_secret(&sim, "ns", "s", v);
    }
    delete_secret(&sim, "ns", "s");
    put_secret(&sim, "ns", "s", "v6");
    eventually("both handlers see the re-creation", || {
        early.drain();
        late.drain();
        let done = early.kinds().last().map(String::as_str) == Some("added:v6")
            && late.kinds().last().map(String::as_str) == Some("added:v6");
        async move { done }
    })
    .await;
    assert_eq!(
        early.kinds(),
        [
            "added:v1",
            "updated:v2",
            "updated:v3",
            "updated:v4",
            "updated:v5",
            "deleted",
            "added:v6"
        ]
    );
    assert_eq!(
        late.kinds(),
        [
            "added:v2",
            "updated:v3",
            "updated:v4",
            "updated:v5",
            "deleted",
            "added:v6"
        ]
    );
}

#[tokio::test]
async fn a_slow_handler_blocks_no_one() {
    let sim = sim().await;
    put_secret(&sim, "ns", "s", "v0");
    let monitor = monitor(&sim).await;
    // Never reads its events.
    let _stuck = monitor.add_handler(key("ns", "s")).await.unwrap();

    struct Counting(Arc<AtomicUsize>);
    impl EventHandler<Secret> for Counting {
        fn on_add(&mut self, _: &Arc<Secret>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn on_update(&mut self, _: &Arc<Secret>, _: &Arc<Secret>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn on_delete(&mut self, _: &Arc<Secret>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let seen = Arc::new(AtomicUsize::new(0));
    monitor
        .add_event_handler(key("ns", "s"), Counting(Arc::clone(&seen)))
        .await
        .unwrap();
    for i in 1..=50 {
        put_secret(&sim, "ns", "s", &format!("v{i}"));
    }
    eventually("the live handler sees all 51 events", || {
        let n = seen.load(Ordering::SeqCst);
        async move { n == 51 }
    })
    .await;
}

// --- Resilience ---------------------------------------------------------------------

/// Registers followers on `names`, runs `disrupt` while changing the secrets, and
/// checks that every follower ends on the simulator's final state with the deletion
/// and the re-creation of "gone-and-back" both observed.
async fn survive(disrupt: impl AsyncFn(&kube_sim::Simulator)) {
    let sim = sim().await;
    let names = ["stays", "changes", "deleted", "gone-and-back", "appears"];
    for name in &names[..4] {
        put_secret(&sim, "ns", name, "v1");
    }
    let monitor = monitor_with(&sim, fast_options()).await;
    let mut followers = Vec::new();
    for name in names {
        let registration = monitor.add_handler(key("ns", name)).await.unwrap();
        followers.push((name, Follower::new(registration.events)));
    }

    disrupt(&sim).await;
    put_secret(&sim, "ns", "changes", "v2");
    delete_secret(&sim, "ns", "deleted");
    delete_secret(&sim, "ns", "gone-and-back");
    put_secret(&sim, "ns", "gone-and-back", "v2");
    put_secret(&sim, "ns", "appears", "v1");
    put_secret(&sim, "ns", "changes", "v3");
    sim.faults().clear();

    for (name, follower) in &mut followers {
        let what = format!("{name} converges");
        eventually(&what, || {
            follower.drain();
            let done = matches_store(&sim, "ns", name, follower.state().as_deref());
            async move { done }
        })
        .await;
    }
    let gone_and_back = &followers[3].1;
    let kinds = gone_and_back.kinds();
    let deleted_at = kinds
        .iter()
        .position(|k| k == "deleted")
        .expect("deletion observed");
    assert!(
        kinds[deleted_at + 1..].iter().any(|k| k == "added:v2"),
        "re-creation observed: {kinds:?}"
    );
    assert_eq!(
        followers[0].1.kinds(),
        ["added:v1"],
        "an untouched secret produces no event"
    );
    open_watches_become(&sim, 5).await;
}

#[tokio::test]
async fn survives_dropped_watches() {
    survive(async |sim| {
        assert_eq!(sim.faults().close_all_watches(), 5);
        // And keep dropping them while the changes happen.
        sim.faults().close_watches_after(Some(1));
    })
    .await;
}

#[tokio::test]
async fn survives_expired_history() {
    survive(async |sim| {
        // Watches break and resume from a resourceVersion the server has forgotten.
        sim.faults()
            .fail_next(FailRule::new("watch", "secrets", 500, 5));
        sim.faults().close_all_watches();
        sim.faults().compact_history();
    })
    .await;
}

#[tokio::test]
async fn survives_an_outage() {
    survive(async |sim| {
        sim.faults()
            .outage(Duration::from_millis(800), OutageMode::Refuse);
    })
    .await;
}

#[tokio::test]
async fn rbac_denial_is_a_typed_error_naming_the_verb() {
    let sim = sim_with(SimConfig::default()).await;
    put_secret(&sim, "ns", "granted", "v");
    put_secret(&sim, "ns", "other", "v");
    sim.grant_router_secrets("ns", &["granted"]).unwrap();
    let client = sim.client("router").await.unwrap();
    let monitor = secret_monitor::SecretMonitor::new(client);
    let ok = monitor.add_handler(key("ns", "granted")).await.unwrap();
    assert_eq!(value_of(&monitor.get(&ok.handle).unwrap()), "v");
    let err = monitor.add_handler(key("ns", "other")).await.unwrap_err();
    assert!(
        matches!(
            err.kind(),
            MonitorErrorKind::Forbidden {
                verb: kube_common::Verb::Watch,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("ns/other"), "{err}");
    assert!(monitor.watched_keys().keys().all(|k| k.name == "granted"));
}

#[tokio::test]
async fn events_carry_no_secret_bytes_in_errors() {
    let sim = sim().await;
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            first_sync_attempts: 1,
            ..fast_options()
        },
    )
    .await;
    put_secret(&sim, "ns", "s", "super-secret-value");
    sim.faults()
        .fail_next(FailRule::new("*", "secrets", 500, 1));
    let err = monitor.add_handler(key("ns", "s")).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains("super-secret-value") && !text.contains("c3VwZXItc2VjcmV0LXZhbHVl"));
    // And an event that does arrive is an object, never text.
    let registration = monitor.add_handler(key("ns", "s")).await.unwrap();
    let mut follower = Follower::new(registration.events);
    follower.drain();
    assert!(matches!(
        follower.history.as_slice(),
        [ObjectEvent::Added(_)]
    ));
}

/// With a streaming probe out, first syncs hold their streaming lists until it is
/// answered: against a server without streaming lists (422, or 200 with one ERROR
/// event) the whole burst costs the probe's one refused request plus a list and a
/// watch per key (within 2N + 100, where without the probe every key's streaming list
/// was already in flight); against a server with them, the probe costs one request and
/// every key still syncs with one streaming list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_probe_keeps_a_refusal_to_one_request() {
    let refusing = servers_without_streaming_lists()
        .into_iter()
        .map(|(server, features, code)| (server, features, Some(code)));
    let serving = ("streaming lists served", ServerFeatures::default(), None);
    for (server, features, refusal_code) in refusing.chain([serving]) {
        // The probe asks about an object that does not exist.
        let burst = register_burst(features, Some("no-such-secret")).await;
        let probes = requests_for(&burst.sim, "ns", "no-such-secret");
        assert_eq!(probes["watch"].len(), 1, "{server}: one probe");
        match refusal_code {
            Some(code) => {
                assert_eq!(
                    burst.streaming_codes,
                    [code],
                    "{server}: only the probe streamed"
                );
                assert_eq!((burst.lists, burst.watches), (BURST, BURST), "{server}");
                assert!(burst.total <= 2 * BURST + 100, "{server}: {}", burst.total);
            }
            None => {
                assert_eq!(
                    burst.streaming_codes.len(),
                    BURST + 1,
                    "{server}: the probe and every key"
                );
                assert_eq!((burst.lists, burst.watches), (0, 0), "{server}");
            }
        }
        assert_eq!(
            burst.errors.0.load(Ordering::SeqCst),
            0,
            "{server}: no key failed"
        );
    }
}

/// Keys registered at once by [`register_burst`].
const BURST: usize = 200;

/// The simulator's two kinds of servers without streaming lists, with the code their
/// refusal comes with: WatchList off (422) and storage without watch progress (200 and
/// one ERROR event).
fn servers_without_streaming_lists() -> [(&'static str, ServerFeatures, u16); 2] {
    [
        (
            "WatchList off",
            ServerFeatures {
                watch_list: false,
                ..ServerFeatures::default()
            },
            422,
        ),
        (
            "storage without watch progress",
            ServerFeatures {
                watch_progress: false,
                ..ServerFeatures::default()
            },
            200,
        ),
    ]
}

/// What a burst of registrations cost at the server.
struct Burst {
    sim: kube_sim::Simulator,
    monitor: SecretMonitor,
    errors: Arc<ErrorCount>,
    /// Response codes of the streaming lists, in the order they were logged.
    streaming_codes: Vec<u16>,
    lists: usize,
    watches: usize,
    total: usize,
}

/// [`BURST`] keys registered at once (one attempt each) on a server with `features` at
/// 300 ms, after a streaming probe for `probe` (a secret name in the same namespace)
/// when given; every key synced and its watch open.
async fn register_burst(features: ServerFeatures, probe: Option<&str>) -> Burst {
    let sim = sim_with(SimConfig {
        features,
        latency: kube_sim::LatencyConfig::fixed(Duration::from_millis(300)),
        ..SimConfig::default()
    })
    .await;
    for i in 0..BURST {
        put_secret(&sim, "ns", &format!("s{i}"), "v");
    }
    let errors = Arc::new(ErrorCount::default());
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            first_sync_attempts: 1,
            observer: Some(errors.clone()),
            ..fast_options()
        },
    )
    .await;
    if let Some(name) = probe {
        monitor.probe_streaming("/api/v1/namespaces/ns/secrets", name);
    }
    let registrations =
        join_all((0..BURST).map(|i| monitor.add_handler(key("ns", &format!("s{i}"))))).await;
    for registration in registrations {
        let registration = registration.unwrap_or_else(|e| panic!("{features:?}: {e}"));
        assert_eq!(value_of(&monitor.get(&registration.handle).unwrap()), "v");
    }
    open_watches_become(&sim, BURST as u64).await;
    let log = sim.request_log();
    Burst {
        streaming_codes: log
            .iter()
            .filter(|r| r.send_initial_events)
            .map(|r| r.code)
            .collect(),
        lists: log.iter().filter(|r| r.verb == "list").count(),
        watches: log
            .iter()
            .filter(|r| r.verb == "watch" && !r.send_initial_events)
            .count(),
        total: log.len(),
        sim,
        monitor,
        errors,
    }
}

// --- Transform -------------------------------------------------------------------

/// A secret with metadata and an entry the consumer below never reads.
fn put_annotated_secret(sim: &kube_sim::Simulator, name: &str, value: &str) {
    use base64::Engine;
    let encode = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    sim.store()
        .upsert(
            "secrets",
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": name,
                    "namespace": "ns",
                    "labels": {"team": "shop"},
                    "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"},
                },
                "type": "Opaque",
                "data": {"v": encode(value), "unused": encode("large")},
            }),
        )
        .expect("secret written");
}

/// Keeps only `data.v` and the metadata the watch needs.
fn keep_only_v(secret: &mut Secret) {
    secret.metadata.labels = None;
    secret.metadata.annotations = None;
    if let Some(data) = &mut secret.data {
        data.retain(|entry, _| entry == "v");
    }
}

fn is_slim(secret: &Secret) -> bool {
    secret.metadata.labels.is_none()
        && secret.metadata.annotations.is_none()
        && secret
            .data
            .as_ref()
            .is_some_and(|data| data.keys().eq(["v"]))
        && secret.metadata.uid.is_some()
        && secret.metadata.resource_version.is_some()
}

#[tokio::test]
async fn the_transform_shapes_the_cache_and_every_event() {
    let sim = sim().await;
    put_annotated_secret(&sim, "a", "one");
    let config = sim.client_config("admin").await.expect("admin config");
    let client = kube_h2::build_client(config, kube_h2::ClientOptions::default())
        .expect("pooled client")
        .client();
    let monitor = SecretMonitor::with_transform(client, MonitorOptions::default(), keep_only_v);
    let mut registration = monitor.add_handler(key("ns", "a")).await.unwrap();

    let cached = monitor.get(&registration.handle).unwrap();
    assert!(is_slim(&cached), "{:?}", cached.metadata);
    assert_eq!(value_of(&cached), "one");
    match registration.events.recv().await.unwrap() {
        ObjectEvent::Added(secret) => assert!(is_slim(&secret) && value_of(&secret) == "one"),
        other => panic!("expected Added, got {other:?}"),
    }

    // A change arrives reshaped too, and the cache follows it.
    put_annotated_secret(&sim, "a", "two");
    match registration.events.recv().await.unwrap() {
        ObjectEvent::Updated { old, new } => {
            assert!(is_slim(&old) && is_slim(&new));
            assert_eq!(
                (value_of(&old), value_of(&new)),
                ("one".into(), "two".into())
            );
        }
        other => panic!("expected Updated, got {other:?}"),
    }
    let cached = monitor.get(&registration.handle).unwrap();
    assert!(is_slim(&cached) && value_of(&cached) == "two");

    delete_secret(&sim, "ns", "a");
    match registration.events.recv().await.unwrap() {
        ObjectEvent::Deleted(secret) => assert!(is_slim(&secret)),
        other => panic!("expected Deleted, got {other:?}"),
    }
    // The unchanged monitor keeps everything (the transform is opt-in).
    put_annotated_secret(&sim, "b", "three");
    let plain = monitor_with(&sim, MonitorOptions::default()).await;
    let full = plain.add_handler(key("ns", "b")).await.unwrap();
    let full = plain.get(&full.handle).unwrap();
    assert!(!is_slim(&full) && full.data.as_ref().unwrap().contains_key("unused"));
}
