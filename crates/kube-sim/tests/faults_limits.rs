//! The concurrency limit (queue, 429 + Retry-After, in-flight semantics of watches),
//! every fault, the admin API over HTTP, and manifest seeding.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use http::Method;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube_sim::loadgen::H2Connection;
use kube_sim::{
    FailRule, INITIAL_EVENTS_END, LatencyConfig, LimitsConfig, OutageMode, SimConfig, Simulator,
};
use serde_json::{Value, json};

async fn wait_for(sim: &Simulator, what: &str, pred: impl Fn(&kube_sim::SimStats) -> bool) {
    for _ in 0..2000 {
        if pred(&sim.stats()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}: {:?}", sim.stats());
}

fn limited(max: usize, queue: usize) -> SimConfig {
    SimConfig {
        limits: LimitsConfig {
            max_inflight: Some(max),
            queue_len: queue,
            retry_after: Duration::from_secs(3),
        },
        ..SimConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_limit_queues_then_rejects_with_retry_after() {
    let sim = start_with(limited(1, 1)).await;
    // Lists take "forever", so the first is in flight and the second waits.
    sim.set_latency(LatencyConfig {
        per_verb: BTreeMap::from([(kube_common::Verb::List, Duration::from_secs(3600))]),
        ..LatencyConfig::default()
    });
    let client = client_without_retries(&sim, "admin").await;
    let c1 = client.clone();
    let first = tokio::spawn(async move { get(&c1, "/api/v1/namespaces/default/secrets").await });
    wait_for(&sim, "one in flight", |s| s.inflight == 1).await;
    let c2 = client.clone();
    let second = tokio::spawn(async move { get(&c2, "/api/v1/namespaces/default/secrets").await });
    wait_for(&sim, "one queued", |s| s.peak_queued == 1).await;
    // The queue is full: 429 TooManyRequests with Retry-After.
    let (code, headers, st) = raw(
        &client,
        Method::GET,
        "/api/v1/namespaces/default/secrets/x",
        None,
        "application/json",
    )
    .await;
    assert_eq!(code, 429);
    assert_eq!(headers["retry-after"], "3");
    assert_eq!(st["reason"], "TooManyRequests");
    assert_eq!(st["details"]["retryAfterSeconds"], 3);
    let stats = sim.stats();
    assert_eq!(
        (stats.rejected_429, stats.peak_inflight, stats.inflight),
        (1, 1, 1)
    );
    assert_eq!(
        stats.requests["get"]["secrets"], 1,
        "rejected requests are counted"
    );
    assert_eq!(stats.responses["429"], 1);
    // Cancelling the in-flight request hands its slot to the queued one.
    first.abort();
    wait_for(&sim, "the queued list to be in flight", |s| {
        s.inflight == 1 && s.requests_total >= 3
    })
    .await;
    second.abort();
    wait_for(&sim, "nothing in flight", |s| s.inflight == 0).await;
    sim.set_latency(LatencyConfig::default());
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(code, 200);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_watches_are_not_in_flight_but_streaming_lists_are_until_their_bookmark() {
    let sim = start_with(limited(1, 0)).await;
    let token = sim.token("admin").unwrap();
    let client = client_without_retries(&sim, "admin").await;
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    // A list-then-watch style watch leaves the in-flight count with its headers.
    let _idle = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&resourceVersion=0")
        .await
        .unwrap();
    assert_eq!(sim.stats().inflight, 0);
    assert_eq!(sim.stats().open_watches, 1);
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(code, 200, "an idle watch does not take the only slot");

    // A streaming list whose initial events exceed the client's flow-control window
    // stays in flight until the initial-events-end bookmark goes out.
    let payload = "p".repeat(2000);
    for i in 0..100 {
        sim.store()
            .create(
                "secrets",
                opaque_secret("default", &format!("big{i}"), &[("p", &payload)]),
            )
            .unwrap();
    }
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let (h2c, h2conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(h2conn);
    let mut h2c = h2c.ready().await.unwrap();
    let req = http::Request::builder()
        .uri(format!("http://{}/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true", sim.addr()))
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
    let (resp, _) = h2c.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(sim.stats().inflight, 1, "still sending initial events");
    let (code, headers, _) = raw(
        &client,
        Method::GET,
        "/api/v1/namespaces/default/secrets/big0",
        None,
        "application/json",
    )
    .await;
    assert_eq!(code, 429);
    assert_eq!(headers["retry-after"], "3");
    // Drain the initial events up to the bookmark.
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut added = 0;
    'outer: while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        let _ = body.flow_control().release_capacity(chunk.len());
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            let ev: Value = serde_json::from_slice(&line).unwrap();
            match ev["type"].as_str().unwrap() {
                "ADDED" => added += 1,
                "BOOKMARK" => {
                    assert_eq!(
                        ev["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
                        "true"
                    );
                    break 'outer;
                }
                other => panic!("unexpected {other}"),
            }
        }
    }
    assert_eq!(added, 100);
    wait_for(
        &sim,
        "the streaming list to leave the in-flight count",
        |s| s.inflight == 0,
    )
    .await;
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/big0").await;
    assert_eq!(code, 200);
    assert_eq!(sim.stats().open_watches, 2);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_is_applied_while_in_flight() {
    let sim = start().await;
    sim.set_latency(LatencyConfig {
        per_verb: BTreeMap::from([(kube_common::Verb::Watch, Duration::from_secs(3600))]),
        ..LatencyConfig::default()
    });
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    // The watch's headers are held back by its latency: it is in flight, not open.
    let pending = tokio::spawn(async move {
        conn.watch("/api/v1/namespaces/default/secrets?watch=true")
            .await
            .map(|_| ())
    });
    wait_for(&sim, "the delayed watch in flight", |s| s.inflight == 1).await;
    assert_eq!(sim.stats().open_watches, 0);
    assert!(!pending.is_finished());
    pending.abort();
    wait_for(&sim, "nothing in flight", |s| s.inflight == 0).await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_faults_close_now_and_after_k_events() {
    let sim = start().await;
    for i in 0..3 {
        sim.store()
            .create("secrets", opaque_secret("default", &format!("f{i}"), &[]))
            .unwrap();
    }
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&resourceVersion=0")
        .await
        .unwrap();
    for _ in 0..3 {
        w.next_event().await.unwrap();
    }
    assert_eq!(sim.faults().close_all_watches(), 1);
    assert!(w.next_event().await.is_none(), "closed");

    sim.faults().close_watches_after(Some(2));
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&resourceVersion=0")
        .await
        .unwrap();
    assert!(w.next_event().await.is_some());
    assert!(w.next_event().await.is_some());
    assert!(w.next_event().await.is_none(), "closed after two events");
    sim.faults().close_watches_after(None);
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&resourceVersion=0")
        .await
        .unwrap();
    for _ in 0..3 {
        w.next_event().await.unwrap();
    }
    sim.store()
        .create("secrets", opaque_secret("default", "f3", &[]))
        .unwrap();
    assert_eq!(
        w.next_event().await.unwrap()["object"]["metadata"]["name"],
        "f3"
    );
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_rules_match_verb_resource_namespace_and_name() {
    let sim = start().await;
    sim.store()
        .create("secrets", opaque_secret("default", "a", &[]))
        .unwrap();
    sim.store()
        .create("secrets", opaque_secret("kube-system", "a", &[]))
        .unwrap();
    let client = client_without_retries(&sim, "admin").await;
    sim.faults().fail_next(FailRule {
        namespace: Some("default".into()),
        name: Some("a".into()),
        ..FailRule::new("get", "secrets", 503, 2)
    });
    let (code, _) = get(&client, "/api/v1/namespaces/kube-system/secrets/a").await;
    assert_eq!(code, 200, "other namespace unaffected");
    let (code, headers, st) = raw(
        &client,
        Method::GET,
        "/api/v1/namespaces/default/secrets/a",
        None,
        "application/json",
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    assert!(headers.contains_key("retry-after"));
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/a").await;
    assert_eq!(code, 503);
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/a").await;
    assert_eq!(code, 200, "only the next two");
    // List/watch rules match the metadata.name field selector too.
    sim.faults().fail_next(FailRule {
        name: Some("a".into()),
        ..FailRule::new("list", "secrets", 500, 1)
    });
    let api: Api<Secret> = Api::namespaced(client.clone(), "default");
    let err = api
        .list(&ListParams::default().fields("metadata.name=a"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 500),
        "{err:?}"
    );
    // clear() removes pending rules.
    sim.faults().fail_next(FailRule::new("*", "*", 500, 10));
    assert_eq!(sim.faults().state().fail_rules.len(), 1);
    sim.faults().clear();
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/a").await;
    assert_eq!(code, 200);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_refuse_and_hang() {
    let sim = start().await;
    let client = client_without_retries(&sim, "admin").await;
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(code, 200);
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true")
        .await
        .unwrap();

    sim.faults()
        .outage(Duration::from_secs(3600), OutageMode::Refuse);
    assert!(
        w.next_event().await.is_none(),
        "open connections are closed"
    );
    let req = http::Request::get("/api/v1/namespaces/default/secrets")
        .body(kube::client::Body::empty())
        .unwrap();
    assert!(
        client.send(req).await.is_err(),
        "new connections are refused"
    );
    let refused = match H2Connection::connect(sim.addr(), &token).await {
        Err(_) => true,
        Ok(c) => c.request(Method::GET, "/version", None).await.is_err(),
    };
    assert!(refused, "HTTP/2 connections are refused too");
    sim.faults().clear();
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(code, 200, "served again after the outage");

    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let rv = sim.store().resource_version();
    let mut open = conn
        .watch(&format!(
            "/api/v1/namespaces/default/secrets?watch=true&resourceVersion={rv}"
        ))
        .await
        .unwrap();
    sim.faults()
        .outage(Duration::from_secs(3600), OutageMode::Hang);
    sim.store()
        .create("secrets", opaque_secret("default", "during-hang", &[]))
        .unwrap();
    let pending_event = tokio::spawn(async move { open.next_event().await });
    let c = client.clone();
    let hung = tokio::spawn(async move { get(&c, "/api/v1/namespaces/default/secrets").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!hung.is_finished(), "no answer during a hang");
    assert!(
        !pending_event.is_finished(),
        "open watches deliver nothing during a hang"
    );
    assert_eq!(sim.faults().state().outage, Some(OutageMode::Hang));
    sim.faults().clear();
    assert_eq!(hung.await.unwrap().0, 200, "answered once the hang ends");
    let event = pending_event.await.unwrap().unwrap();
    assert_eq!(event["object"]["metadata"]["name"], "during-hang");
    // An outage ends by itself after its duration.
    sim.faults()
        .outage(Duration::from_millis(50), OutageMode::Hang);
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets").await;
    assert_eq!(code, 200);
    assert_eq!(sim.faults().state().outage, None);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_over_http() {
    let sim = start().await;
    let (code, index) = admin(&sim, Method::GET, "/sim", None).await;
    assert_eq!(code, 200);
    assert!(index["endpoints"].as_array().unwrap().len() >= 14);

    let (code, lat) = admin(
        &sim,
        Method::PUT,
        "/sim/latency",
        Some(json!({"default": "5ms", "per_verb": {"list": "7ms"}})),
    )
    .await;
    assert_eq!((code, lat["per_verb"]["list"].as_str()), (200, Some("7ms")));
    let (_, lat) = admin(&sim, Method::GET, "/sim/latency", None).await;
    assert_eq!(lat["default"], "5ms");
    admin(&sim, Method::PUT, "/sim/latency", Some(json!({}))).await;

    let (code, limits) = admin(
        &sim,
        Method::PUT,
        "/sim/limits",
        Some(json!({"max_inflight": 7, "queue_len": 3, "retry_after": "2s"})),
    )
    .await;
    assert_eq!((code, limits["max_inflight"].as_u64()), (200, Some(7)));
    admin(
        &sim,
        Method::PUT,
        "/sim/limits",
        Some(json!({"max_inflight": null})),
    )
    .await;

    let (code, _) = admin(
        &sim,
        Method::POST,
        "/sim/faults/fail",
        Some(json!({"verb": "get", "resource": "secrets", "code": 500})),
    )
    .await;
    assert_eq!(code, 200);
    let (_, state) = admin(&sim, Method::GET, "/sim/faults", None).await;
    assert_eq!(state["fail_rules"][0]["count"], 1);
    let (code, _) = admin(
        &sim,
        Method::PUT,
        "/sim/faults/close-after",
        Some(json!({"events": 3})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(sim.faults().state().close_watches_after, Some(3));
    let (code, _) = admin(
        &sim,
        Method::POST,
        "/sim/faults/outage",
        Some(json!({"duration": "1h", "mode": "hang"})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(sim.faults().state().outage, Some(OutageMode::Hang));
    let (code, cleared) = admin(&sim, Method::DELETE, "/sim/faults", None).await;
    assert_eq!(code, 200);
    assert_eq!(cleared["fail_rules"], json!([]));
    assert_eq!(cleared["outage"], Value::Null);
    assert_eq!(cleared["close_watches_after"], Value::Null);
    let (_, closed) = admin(&sim, Method::POST, "/sim/faults/close-watches", None).await;
    assert_eq!(closed["closed"], 0);
    let (_, compacted) = admin(&sim, Method::POST, "/sim/faults/compact", None).await;
    assert_eq!(
        compacted["resourceVersion"],
        sim.store().resource_version().to_string()
    );

    // Seeding and generation over HTTP.
    let conn = H2Connection::connect(sim.addr(), "").await.unwrap();
    let manifests = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: seeded\n  namespace: team\nstringData:\n  a: b\n---\napiVersion: route.openshift.io/v1\nkind: Route\nmetadata:\n  name: r\n  namespace: team\nspec:\n  host: r.example.com\n";
    let (status, body) = conn
        .request(
            Method::POST,
            "/sim/seed",
            Some((bytes::Bytes::from(manifests), "application/yaml")),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert!(sim.store().get("routes", "team", "r").is_some());
    let (code, generated) = admin(
        &sim,
        Method::POST,
        "/sim/generate",
        Some(json!({"routes": 4, "namespaces": 2, "secrets": 2})),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(generated["routes"].as_array().unwrap().len(), 4);
    assert!(
        generated["ca_pem"]
            .as_str()
            .unwrap()
            .contains("BEGIN CERTIFICATE")
    );

    // The request log and stats reset.
    let client = client_without_retries(&sim, "admin").await;
    let (code, _) = get(&client, "/api/v1/namespaces/team/secrets/seeded").await;
    assert_eq!(code, 200);
    let (_, all) = admin(&sim, Method::GET, "/sim/requests", None).await;
    let last_seq = all.as_array().unwrap().last().unwrap()["seq"]
        .as_u64()
        .unwrap();
    get(&client, "/api/v1/namespaces/team/secrets/seeded").await;
    let (_, newer) = admin(
        &sim,
        Method::GET,
        &format!("/sim/requests?since={last_seq}"),
        None,
    )
    .await;
    assert_eq!(newer.as_array().unwrap().len(), 1);
    assert_eq!(newer[0]["name"], "seeded");
    let (code, _) = admin(&sim, Method::POST, "/sim/stats/reset", None).await;
    assert_eq!(code, 200);
    assert_eq!(sim.stats().requests_total, 0);

    let (code, _) = admin(&sim, Method::GET, "/sim/nope", None).await;
    assert_eq!(code, 404);
    let (code, _) = admin(&sim, Method::DELETE, "/sim/stats", None).await;
    assert_eq!(code, 405);
    let (code, err) = admin(
        &sim,
        Method::PUT,
        "/sim/latency",
        Some(json!({"default": "fast"})),
    )
    .await;
    assert_eq!(code, 400);
    assert!(err["error"].as_str().unwrap().contains("invalid duration"));
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_load_multi_document_and_lists() {
    let sim = start().await;
    let text = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: shop
  labels: {tier: front}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Secret
  metadata: {name: one, namespace: shop}
  type: kubernetes.io/tls
  data: {tls.crt: Y3J0, tls.key: a2V5}
- apiVersion: rbac.authorization.k8s.io/v1
  kind: Role
  metadata: {name: reader, namespace: shop}
  rules: [{apiGroups: [""], resources: [secrets], verbs: [get], resourceNames: [one]}]
---
{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nons"}, "stringData": {"a": "b"}}
"#;
    assert_eq!(sim.load_manifests(text).unwrap(), 4);
    assert_eq!(
        sim.store().get("namespaces", "", "shop").unwrap()["metadata"]["labels"]["tier"],
        "front"
    );
    assert!(
        sim.store().get("secrets", "default", "nons").is_some(),
        "no namespace: default"
    );
    // Loading again replaces (no AlreadyExists).
    assert_eq!(sim.load_manifests(text).unwrap(), 4);
    // Errors name the document.
    let err = sim.load_manifests("apiVersion: v1\nkind: Secret\nmetadata: {name: ok}\n---\napiVersion: v9\nkind: Widget\nmetadata: {name: w}\n").unwrap_err();
    assert!(err.to_string().starts_with("manifest document 1:"), "{err}");
    let err = sim
        .load_manifests("apiVersion: v1\nkind: Secret\nmetadata: {name: bad, namespace: shop}\ntype: kubernetes.io/tls\ndata: {}\n")
        .unwrap_err();
    assert!(
        err.to_string().contains("data[tls.crt]: Required value"),
        "{err}"
    );
    sim.shutdown().await;
}
