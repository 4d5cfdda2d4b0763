//! Randomized stress: thousands of registrations, removals, cancellations and secret
//! changes on ~100 keys, with watch faults injected throughout. At the end the
//! simulator's open watches must equal the keys that still have handlers, and every
//! handler must hold the simulator's final object.
//!
//! The seed is printed; set `STRESS_SEED` to replay a run.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use futures::future::join_all;
use kube_sim::{FailRule, LatencyConfig, SimConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use secret_monitor::{HandlerHandle, MonitorErrorKind, MonitorOptions, ObjectKey};

const KEYS: usize = 100;
const ROUNDS: usize = 60;
const OPS_PER_ROUND: usize = 50;

enum Op {
    Add(ObjectKey),
    /// Add, but give up after this many microseconds.
    AddImpatient(ObjectKey, u64),
    Remove(usize),
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_with_faults_converge() {
    let seed = std::env::var("STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("STRESS_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);

    let sim = sim_with(SimConfig {
        latency: LatencyConfig {
            default: Duration::from_millis(2),
            jitter: Duration::from_millis(2),
            ..LatencyConfig::default()
        },
        history_limit: 500,
        ..SimConfig::default()
    })
    .await;
    let monitor = monitor_with(
        &sim,
        MonitorOptions {
            sync_timeout: Duration::from_secs(10),
            ..fast_options()
        },
    )
    .await;
    let name = |i: usize| format!("k{i}");
    for i in 0..KEYS {
        if rng.random_bool(0.7) {
            put_secret(&sim, "ns", &name(i), "v0");
        }
    }

    let mut live: Vec<(HandlerHandle, Follower)> = Vec::new();
    let mut operations = 0usize;
    let mut failed_adds = 0usize;
    for round in 0..ROUNDS {
        // Faults for this round.
        match rng.random_range(0..10) {
            0 => {
                sim.faults().close_all_watches();
            }
            1 => sim
                .faults()
                .close_watches_after(Some(rng.random_range(1..4))),
            2 => sim.faults().close_watches_after(None),
            3 => {
                sim.faults().compact_history();
                sim.faults().close_all_watches();
            }
            4 => {
                let verb = if rng.random_bool(0.5) {
                    "watch"
                } else {
                    "list"
                };
                let code = if rng.random_bool(0.5) { 500 } else { 429 };
                sim.faults().fail_next(FailRule::new(
                    verb,
                    "secrets",
                    code,
                    rng.random_range(1..4),
                ));
            }
            _ => {}
        }

        // Secret changes.
        for _ in 0..rng.random_range(5..20) {
            let key = name(rng.random_range(0..KEYS));
            if rng.random_bool(0.2) {
                let _ = sim.store().delete("secrets", "ns", &key);
            } else {
                put_secret(
                    &sim,
                    "ns",
                    &key,
                    &format!("r{round}-{}", rng.random::<u16>()),
                );
            }
            operations += 1;
        }

        // A batch of concurrent registrations and removals.
        let mut ops = Vec::new();
        for _ in 0..OPS_PER_ROUND {
            let key = ObjectKey::new("ns", name(rng.random_range(0..KEYS)));
            let op = match rng.random_range(0..10) {
                0..=4 => Op::Add(key),
                5 => Op::AddImpatient(key, rng.random_range(0..3_000)),
                _ if !live.is_empty() => Op::Remove(rng.random_range(0..live.len())),
                _ => Op::Add(key),
            };
            ops.push(op);
        }
        let mut removals: BTreeSet<usize> = BTreeSet::new();
        let mut adds = Vec::new();
        for op in ops {
            operations += 1;
            match op {
                Op::Remove(index) => {
                    removals.insert(index);
                }
                Op::Add(key) => adds.push((key, None)),
                Op::AddImpatient(key, micros) => {
                    adds.push((key, Some(Duration::from_micros(micros))))
                }
            }
        }
        // Removals happen concurrently with the batch's registrations.
        let monitor_for_adds = monitor.clone();
        let registering = tokio::spawn(join_all(adds.into_iter().map(move |(key, patience)| {
            let monitor = monitor_for_adds.clone();
            async move {
                match patience {
                    None => Some(monitor.add_handler(key).await),
                    Some(patience) => tokio::time::timeout(patience, monitor.add_handler(key))
                        .await
                        .ok(),
                }
            }
        })));
        for index in removals.into_iter().rev() {
            let (handle, _) = live.swap_remove(index);
            monitor
                .remove_handler(&handle)
                .expect("live handle removes once");
            assert!(matches!(
                monitor.remove_handler(&handle),
                Err(e) if matches!(e.kind(), MonitorErrorKind::NotRegistered { .. })
            ));
        }
        for outcome in registering.await.expect("registrations") {
            match outcome {
                Some(Ok(registration)) => {
                    live.push((registration.handle, Follower::new(registration.events)))
                }
                Some(Err(err)) => {
                    // Only the injected faults may fail a registration.
                    assert!(err.is_transient(), "unexpected failure: {err}");
                    failed_adds += 1;
                }
                None => {} // gave up: must leave nothing behind (checked at the end)
            }
        }
    }
    println!(
        "operations: {operations}, failed registrations: {failed_adds}, live handlers: {}",
        live.len()
    );
    assert!(operations >= 3_000);

    // Calm: no more faults; one last change to every key so all watches must deliver.
    sim.faults().clear();
    for i in 0..KEYS {
        if i % 3 == 0 {
            let _ = sim.store().delete("secrets", "ns", &name(i));
        } else {
            put_secret(&sim, "ns", &name(i), "final");
        }
    }

    let expected: BTreeMap<ObjectKey, usize> =
        live.iter()
            .fold(BTreeMap::new(), |mut counts, (handle, _)| {
                *counts.entry(handle.key().clone()).or_default() += 1;
                counts
            });
    let watched: BTreeMap<ObjectKey, usize> = monitor
        .watched_keys()
        .into_iter()
        .map(|(key, status)| (key, status.handlers))
        .collect();
    assert_eq!(watched, expected, "handler counts per key");
    assert!(
        monitor
            .watched_keys()
            .values()
            .all(|status| status.waiting == 0),
        "no waiter left behind"
    );
    open_watches_become(&sim, expected.len() as u64).await;

    for (handle, follower) in &mut live {
        let what = format!("handler {handle} holds the final object");
        let key = handle.key().clone();
        eventually(&what, || {
            follower.drain();
            let done = matches_store(&sim, &key.namespace, &key.name, follower.state().as_deref());
            async move { done }
        })
        .await;
        // The cache agrees with what the handler was told.
        let cached = monitor.get(handle).ok();
        assert!(matches_store(
            &sim,
            &key.namespace,
            &key.name,
            cached.as_deref()
        ));
    }

    for (handle, _) in &live {
        monitor.remove_handler(handle).unwrap();
    }
    open_watches_become(&sim, 0).await;
}
