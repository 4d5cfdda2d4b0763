//! Start-up at scale: 1,000 routes over 400 secrets (shared), applied one at a time in
//! age order, against a simulator answering every request after 1 s (long enough that
//! a loaded machine issues every request within it). The secrets'
//! watches and access reviews must overlap (the simulator's peak in-flight count),
//! each distinct secret must get exactly one watch, and no secret is fetched with a
//! GET. Asserted from the simulator's request log, not from elapsed time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use kube_sim::GenerateSpec;
use route_secrets::api::pipeline::RouteOutcome;
use route_secrets::route::RouteKey;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_routes_start_in_one_round_of_concurrent_syncs() {
    let sim = sim_with_latency(Duration::from_secs(1)).await;
    let cluster = sim
        .generate(&GenerateSpec {
            secrets: Some(400),
            ..GenerateSpec::new(1_000, 10)
        })
        .unwrap();
    let distinct = cluster.distinct_secrets();
    assert_eq!(distinct.len(), 400);
    sim.reset_stats();
    let first_request = sim.request_log().last().map_or(0, |r| r.seq);

    let mut h = Harness::start(
        &sim,
        HarnessOptions {
            write_status: false,
            ..HarnessOptions::default()
        },
    )
    .await;
    h.ready().await;

    // Every route admitted, in creation order (oldest first), each exactly once.
    let order: Vec<RouteKey> = h.history.iter().map(|o| o.route().clone()).collect();
    let expected: Vec<RouteKey> = cluster
        .routes
        .iter()
        .map(|r| key(&r.namespace, &r.route))
        .collect();
    assert_eq!(
        order, expected,
        "routes applied one at a time, oldest first"
    );
    assert!(
        h.history
            .iter()
            .all(|o| matches!(o, RouteOutcome::Admitted(_)))
    );

    // Each secret's material was validated once, ahead of the queue, and shared by the
    // routes that use it.
    let mut material: BTreeMap<(String, String), std::sync::Arc<route_secrets::tls::ValidatedTls>> =
        BTreeMap::new();
    let mut shared = 0;
    for outcome in &h.history {
        let RouteOutcome::Admitted(admitted) = outcome else {
            continue;
        };
        let secret = (
            admitted.route.namespace.to_string(),
            admitted.secret().expect("from a secret").to_owned(),
        );
        let tls = admitted.tls().expect("a certificate");
        match material.get(&secret) {
            Some(first) => {
                assert!(
                    std::sync::Arc::ptr_eq(first, tls),
                    "{} validated its secret again",
                    admitted.route
                );
                shared += 1;
            }
            None => {
                material.insert(secret, tls.clone());
            }
        }
    }
    assert_eq!((material.len(), shared), (400, 600));

    let requests: Vec<_> = sim
        .request_log()
        .into_iter()
        .filter(|r| r.seq > first_request)
        .collect();
    let mut watches_per_secret: BTreeMap<(String, String), usize> = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.resource == "secrets" && r.verb == "watch")
    {
        *watches_per_secret
            .entry((
                r.namespace.clone().unwrap_or_default(),
                r.name.clone().unwrap_or_default(),
            ))
            .or_default() += 1;
    }
    let expected_watches: BTreeMap<(String, String), usize> =
        distinct.iter().map(|k| (k.clone(), 1)).collect();
    assert_eq!(
        watches_per_secret, expected_watches,
        "exactly one watch per distinct secret"
    );
    let count = |verb: &str, resource: &str| {
        requests
            .iter()
            .filter(|r| r.verb == verb && r.resource == resource)
            .count()
    };
    assert_eq!(count("get", "secrets"), 0, "no secret fetched with a GET");
    assert_eq!(
        count("list", "secrets"),
        0,
        "streaming lists: the watch is the first sync"
    );
    assert_eq!(
        count("create", "selfsubjectrulesreviews"),
        10,
        "one rules review per namespace"
    );
    assert_eq!(
        count("create", "subjectaccessreviews") + count("create", "selfsubjectaccessreviews"),
        0
    );

    // The 400 watches and 10 reviews were in flight together, not one after another.
    let stats = sim.stats();
    assert!(
        stats.peak_inflight >= 350,
        "peak in flight {}",
        stats.peak_inflight
    );
    h.until_secret_watches(400).await;
    assert_eq!(h.manager.watched_secrets().len(), 400);
    assert!(h.manager.watched_secrets().values().all(|s| s.waiting == 0));
}
