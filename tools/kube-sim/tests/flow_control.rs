//! API Priority and Fairness over HTTP: a burst from the router's service account
//! fills its flow's queues in workload-low and is refused as kube-apiserver refuses
//! it, while the exempt admin is never held up; the budget can be set at start, by
//! flags' equivalents, or through the admin API.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use http::Method;
use kube_common::Verb;
use kube_sim::loadgen::H2Connection;
use kube_sim::{FlowControlConfig, GenerateSpec, LatencyConfig, SimConfig};
use serde_json::{Value, json};

/// kube-apiserver started with --max-requests-inflight=4
/// --max-mutating-requests-inflight=2: workload-low has no seat of its own when idle.
fn small_budget() -> FlowControlConfig {
    FlowControlConfig {
        max_requests_inflight: 4,
        max_mutating_requests_inflight: 2,
        queue_wait_limit: Duration::from_secs(60),
        ..FlowControlConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_burst_is_refused_by_its_queues_and_the_admin_is_exempt() {
    const BURST: usize = 1_000;
    let sim = start_with(SimConfig {
        flow_control: Some(small_budget()),
        ..SimConfig::default()
    })
    .await;
    let cluster = sim.generate(&GenerateSpec::new(1, 1)).unwrap();
    let mine = &cluster.routes[0];
    // Requests hold their seat while the server "works".
    sim.set_latency(LatencyConfig {
        per_verb: BTreeMap::from([(Verb::Get, Duration::from_millis(5))]),
        ..LatencyConfig::default()
    });
    let router_token = sim.token("router").unwrap();
    let mut connections = Vec::new();
    for _ in 0..BURST / 100 {
        connections.push(
            H2Connection::connect(sim.addr(), &router_token)
                .await
                .unwrap(),
        );
    }
    let path = format!(
        "/api/v1/namespaces/{}/secrets/{}",
        mine.namespace, mine.secret
    );
    let mark = log_mark(&sim);
    let burst: Vec<_> = (0..BURST)
        .map(|i| {
            let conn = connections[i % connections.len()].clone();
            let path = path.clone();
            tokio::spawn(async move {
                let resp = conn.send(Method::GET, &path, None).await.unwrap();
                let status = resp.status().as_u16();
                let headers = resp.headers().clone();
                let body = http_body_util::BodyExt::collect(resp.into_body())
                    .await
                    .unwrap()
                    .to_bytes();
                (status, headers, body)
            })
        })
        .collect();
    // The admin goes through while the router's queues are full.
    stats_reach(&sim, "the router's flow to be refused", |s| {
        s.rejected_429 > 0
    })
    .await;
    let admin = client_without_retries(&sim, "admin").await;
    for _ in 0..20 {
        assert_eq!(get(&admin, &path).await.0, 200, "the admin is exempt");
    }
    let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
    for task in burst {
        let (status, headers, body) = task.await.unwrap();
        *codes.entry(status).or_default() += 1;
        if status == 429 {
            // Plain text, not a Status; a Retry-After in whole seconds.
            assert_eq!(&body[..], b"Too many requests, please try again later.\n");
            assert_eq!(headers["content-type"], "text/plain; charset=utf-8");
            let retry_after: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=32).contains(&retry_after), "{retry_after}");
        }
    }
    let refused = codes.get(&429).copied().unwrap_or(0);
    assert!(refused > 0, "{codes:?}");
    assert_eq!(
        codes.get(&200).copied().unwrap_or(0) + refused,
        BURST,
        "{codes:?}"
    );

    let stats = sim.stats();
    assert_eq!(stats.rejected_429 as usize, refused);
    let flow = stats.flow_control.clone().unwrap();
    assert_eq!(flow.server_concurrency_limit, 6);
    assert_eq!(
        flow.rejected
            .iter()
            .map(|r| (
                r.flow_schema.as_str(),
                r.priority_level.as_str(),
                r.reason.as_str(),
                r.count as usize
            ))
            .collect::<Vec<_>>(),
        [("service-accounts", "workload-low", "queue-full", refused)]
    );
    let low = &flow.priority_levels["workload-low"];
    // A queue-full refusal means the least loaded queue of the flow's hand of 6 held
    // 50, counting waiting and executing requests (as kube-apiserver's fair queuing
    // does): the queue whose request holds the level's one seat may wait with 49.
    assert!((6 * 50 - 1..=6 * 50).contains(&low.peak_queued), "{low:?}");
    assert_eq!(
        low.peak_seats_in_use, 1,
        "no seat of its own: one at a time"
    );
    assert_eq!(low.dispatched as usize, BURST - refused);
    assert_eq!(flow.priority_levels["exempt"].dispatched, 20);
    // The request log has every refusal, under the router's name.
    let logged = sim
        .requests_since(mark)
        .into_iter()
        .filter(|r| r.code == 429 && r.user == kube_sim::ROUTER_USER)
        .count();
    assert_eq!(logged, refused);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_and_fairness_is_turned_on_and_off_through_the_admin_api() {
    let sim = start().await;
    assert!(sim.stats().flow_control.is_none(), "off by default");
    let (code, body) = admin(&sim, Method::GET, "/sim/flow-control", None).await;
    assert_eq!((code, body), (200, Value::Null));
    let (code, body) = admin(
        &sim,
        Method::PUT,
        "/sim/flow-control",
        Some(json!({"max_requests_inflight": 4, "max_mutating_requests_inflight": 2})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(body["queue_wait_limit"], "15s");
    let flow = sim.stats().flow_control.unwrap();
    assert_eq!(flow.server_concurrency_limit, 6);
    assert_eq!(flow.priority_levels["workload-low"].nominal_limit, 3);
    // Requests now pass through it: the router's land in workload-low.
    let router = client_without_retries(&sim, "router").await;
    assert_eq!(get(&router, "/version").await.0, 200);
    let low = &sim.stats().flow_control.unwrap().priority_levels["workload-low"];
    assert_eq!(low.dispatched, 1);
    let (code, _) = admin(&sim, Method::PUT, "/sim/flow-control", Some(Value::Null)).await;
    assert_eq!(code, 200);
    assert!(sim.stats().flow_control.is_none());
    sim.shutdown().await;
}
