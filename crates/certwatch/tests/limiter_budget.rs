//! The adaptive limiter (`kube_common::adaptive`) against a real server with a tiny
//! budget: kube-sim at 4 seats without a queue answers 429 at once to every request
//! beyond 4 in flight. A burst of 300 secret reads through one limiter must all be
//! answered, with the refusals within the budget's bound (a quarter of the requests
//! needed plus the first window), and every refusal the server sent seen by the
//! limiter. Counts from `/sim/stats` and the limiter, never from a clock.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::SimProcess;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_common::adaptive::AdaptiveLimiter;

const SECRETS: usize = 300;
const NAMESPACES: usize = 3;

fn sim_count(sim: &SimProcess, key: &str) -> u64 {
    let (status, body) = sim.admin("GET", "/sim/stats", "");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    stats[key].as_u64().unwrap_or(0)
}

/// certwatch's client (no retry layer underneath) as the router identity.
async fn router_client(sim: &SimProcess) -> kube::Client {
    let kubeconfig = Kubeconfig::read_from(&sim.kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &KubeConfigOptions {
            context: Some("router".to_owned()),
            ..KubeConfigOptions::default()
        },
    )
    .await
    .unwrap();
    kube_h2::build_client(config, kube_h2::ClientOptions::default())
        .unwrap()
        .client()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_through_four_seats_converges_within_the_bound() {
    burst_through_four_seats(Some(32)).await;
}

/// Without an upper bound the first window is the whole burst: up to 296 of the first
/// 300 may be refused (how many depends on how fast the burst goes out), and then the
/// window has learnt the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unbounded_burst_through_four_seats_converges_within_the_bound() {
    burst_through_four_seats(None).await;
}

async fn burst_through_four_seats(upper_bound: Option<usize>) {
    let first_window = upper_bound.unwrap_or(SECRETS);
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::four_seats_without_a_queue(temp.path(), SECRETS, NAMESPACES);
    let client = router_client(&sim).await;
    // Who holds which secret, from the admin's view (before the counters are reset).
    let admin = sim.client("admin").await;
    let secrets: Vec<(String, String)> = Api::<Secret>::all(admin)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|secret| secret.type_.as_deref() == Some("kubernetes.io/tls"))
        .map(|secret| {
            (
                secret.metadata.namespace.unwrap(),
                secret.metadata.name.unwrap(),
            )
        })
        .collect();
    assert_eq!(secrets.len(), SECRETS);
    let (status, _) = sim.admin("POST", "/sim/stats/reset", "");
    assert_eq!(status, 200);

    let limiter = AdaptiveLimiter::new(upper_bound);
    let tasks: Vec<_> = secrets
        .into_iter()
        .map(|(namespace, name)| {
            let api: Api<Secret> = Api::namespaced(client.clone(), &namespace);
            let limiter = limiter.clone();
            let name = Arc::new(name);
            tokio::spawn(async move {
                limiter
                    .send(20, |_| {
                        let (api, name) = (api.clone(), Arc::clone(&name));
                        async move { api.get(&name).await }
                    })
                    .await
            })
        })
        .collect();
    let mut answered = 0;
    for task in tasks {
        if task.await.unwrap().is_ok() {
            answered += 1;
        }
    }
    let rejected = sim_count(&sim, "rejected_429");
    let total = sim_count(&sim, "requests_total");
    let snapshot = limiter.snapshot();
    eprintln!(
        "4 seats, no queue: {answered}/{SECRETS} answered, {total} requests, {rejected} answered 429, \
         limiter {snapshot:?}"
    );
    assert_eq!(answered, SECRETS, "every read answered");
    assert_eq!(
        snapshot.refused, rejected,
        "the limiter saw every 429 the server sent"
    );
    assert_eq!(total, SECRETS as u64 + rejected, "nothing else was sent");
    let bound = SECRETS / 4 + first_window;
    assert!(
        rejected as usize <= bound,
        "{rejected} refused; bound {bound} (a quarter of {SECRETS} plus the first window of {first_window})"
    );
    assert!(snapshot.window.unwrap() < first_window, "{snapshot:?}");
}
