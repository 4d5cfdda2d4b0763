//! The concurrency limit (queue, 429 + Retry-After, in-flight semantics of watches),
//! every fault, the admin API over HTTP, and manifest seeding.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use http::Method;
use kube_sim::loadgen::H2Connection;
use kube_sim::{
    FailRule, INITIAL_EVENTS_END, LatencyConfig, LimitsConfig, OutageMode, SimConfig, Simulator,
};
use serde_json::{Value, json};

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
    stats_reach(&sim, "one in flight", |s| s.inflight == 1).await;
    let c2 = client.clone();
    let second = tokio::spawn(async move { get(&c2, "/api/v1/namespaces/default/secrets").await });
    stats_reach(&sim, "one queued", |s| s.peak_queued == 1).await;
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
    stats_reach(&sim, "the queued list to be in flight", |s| {
        s.inflight == 1 && s.requests_total >= 3
    })
    .await;
    second.abort();
    stats_reach(&sim, "nothing in flight", |s| s.inflight == 0).await;
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
    stats_reach(
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
    stats_reach(&sim, "the delayed watch in flight", |s| s.inflight == 1).await;
    assert_eq!(sim.stats().open_watches, 0);
    assert!(!pending.is_finished());
    pending.abort();
    stats_reach(&sim, "nothing in flight", |s| s.inflight == 0).await;
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

/// One fail rule, the requests sent after it, and the code each must get.
struct FailCase {
    what: &'static str,
    rule: FailRule,
    requests: &'static [(&'static str, u16)],
    /// How often the rule fires (requests answered with its code).
    fires: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_rules_match_verb_resource_namespace_and_name() {
    let sim = start().await;
    for ns in ["default", "kube-system"] {
        sim.store()
            .create("secrets", opaque_secret(ns, "a", &[]))
            .unwrap();
    }
    let client = client_without_retries(&sim, "admin").await;
    let cases = [
        FailCase {
            what: "a get in one namespace, for one name, twice",
            rule: FailRule {
                namespace: Some("default".into()),
                name: Some("a".into()),
                ..FailRule::new("get", "secrets", 503, 2)
            },
            requests: &[
                ("/api/v1/namespaces/kube-system/secrets/a", 200),
                ("/api/v1/namespaces/default/secrets/a", 503),
                ("/api/v1/namespaces/default/secrets/a", 503),
                ("/api/v1/namespaces/default/secrets/a", 200),
            ],
            fires: 2,
        },
        FailCase {
            what: "a list by the name in its metadata.name field selector",
            rule: FailRule {
                name: Some("a".into()),
                ..FailRule::new("list", "secrets", 500, 1)
            },
            requests: &[
                ("/api/v1/namespaces/default/secrets", 200),
                (
                    "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Da",
                    500,
                ),
                (
                    "/api/v1/namespaces/default/secrets?fieldSelector=metadata.name%3Da",
                    200,
                ),
            ],
            fires: 1,
        },
        FailCase {
            what: "a watch",
            rule: FailRule::new("watch", "secrets", 410, 1),
            requests: &[
                (
                    "/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1",
                    410,
                ),
                (
                    "/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1",
                    200,
                ),
            ],
            fires: 1,
        },
        FailCase {
            what: "any verb on any resource, discovery included",
            rule: FailRule::new("*", "*", 500, 1),
            requests: &[("/version", 500), ("/version", 200)],
            fires: 1,
        },
    ];
    for case in cases {
        let mark = log_mark(&sim);
        let (verb, resource, code) = (
            case.rule.verb.clone(),
            case.rule.resource.clone(),
            case.rule.code,
        );
        sim.faults().fail_next(case.rule);
        for (path, want) in case.requests {
            let (got, headers, status) =
                raw(&client, Method::GET, path, None, "application/json").await;
            assert_eq!(got, *want, "{}: GET {path}: {status}", case.what);
            if got == 503 {
                assert!(headers.contains_key("retry-after"), "{}", case.what);
                assert_eq!(status["reason"], "ServiceUnavailable", "{}", case.what);
            }
        }
        let fired: Vec<_> = sim
            .requests_since(mark)
            .into_iter()
            .filter(|r| {
                r.code == code
                    && (verb == "*" || r.verb == verb.as_str())
                    && (resource == "*" || r.resource == resource)
            })
            .collect();
        assert_eq!(fired.len(), case.fires, "{}: {fired:?}", case.what);
        assert!(
            sim.faults().state().fail_rules.is_empty(),
            "{}: rule used up",
            case.what
        );
    }
    // clear() removes pending rules: nothing fires after it.
    sim.faults().fail_next(FailRule::new("*", "*", 500, 10));
    assert_eq!(sim.faults().state().fail_rules.len(), 1);
    sim.faults().clear();
    let mark = log_mark(&sim);
    let (code, _) = get(&client, "/api/v1/namespaces/default/secrets/a").await;
    assert_eq!(code, 200);
    assert_fault_fired(&sim, mark, "get", "secrets", 500, 0);
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
    let events_before = sim.stats().watch_events_sent;
    let pending_event = tokio::spawn(async move { open.next_event().await });
    let c = client.clone();
    let requests_before = sim.stats().requests_total;
    let hung = tokio::spawn(async move { get(&c, "/api/v1/namespaces/default/secrets").await });
    // The server has the request (it is counted on arrival) and holds it.
    stats_reach(&sim, "the server to receive the request", |s| {
        s.requests_total > requests_before
    })
    .await;
    assert!(!hung.is_finished(), "no answer during a hang");
    assert_eq!(
        sim.stats().watch_events_sent,
        events_before,
        "no event sent"
    );
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

/// One admin API call, the code it must get, and what must hold afterwards (on the
/// answer and on the simulator).
struct AdminCase {
    method: Method,
    path: &'static str,
    body: Option<Value>,
    code: u16,
    then: fn(&Simulator, &Value),
}

fn admin_case(
    method: Method,
    path: &'static str,
    body: Option<Value>,
    code: u16,
    then: fn(&Simulator, &Value),
) -> AdminCase {
    AdminCase {
        method,
        path,
        body,
        code,
        then,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_over_http() {
    let sim = start().await;
    let cases = [
        admin_case(Method::GET, "/sim", None, 200, |_, index| {
            assert!(index["endpoints"].as_array().unwrap().len() >= 14)
        }),
        admin_case(
            Method::PUT,
            "/sim/latency",
            Some(json!({"default": "5ms", "per_verb": {"list": "7ms"}})),
            200,
            |_, latency| assert_eq!(latency["per_verb"]["list"], "7ms"),
        ),
        admin_case(Method::GET, "/sim/latency", None, 200, |_, latency| {
            assert_eq!(latency["default"], "5ms")
        }),
        admin_case(Method::PUT, "/sim/latency", Some(json!({})), 200, |_, _| {}),
        admin_case(
            Method::PUT,
            "/sim/latency",
            Some(json!({"default": "fast"})),
            400,
            |_, err| assert!(err["error"].as_str().unwrap().contains("invalid duration")),
        ),
        admin_case(
            Method::PUT,
            "/sim/latency",
            Some(json!({"per_verb": {"fetch": "1s"}})),
            400,
            |_, err| assert!(err["error"].as_str().unwrap().contains("fetch")),
        ),
        admin_case(
            Method::PUT,
            "/sim/limits",
            Some(json!({"max_inflight": 7, "queue_len": 3, "retry_after": "2s"})),
            200,
            |_, limits| assert_eq!(limits["max_inflight"], 7),
        ),
        admin_case(
            Method::PUT,
            "/sim/limits",
            Some(json!({"max_inflight": null})),
            200,
            |_, limits| assert_eq!(limits["max_inflight"], Value::Null),
        ),
        admin_case(
            Method::POST,
            "/sim/faults/fail",
            Some(json!({"verb": "get", "resource": "secrets", "code": 500})),
            200,
            |sim, _| assert_eq!(sim.faults().state().fail_rules[0].count, 1),
        ),
        admin_case(
            Method::POST,
            "/sim/faults/fail",
            Some(json!({"verb": "fetch", "resource": "secrets", "code": 500})),
            400,
            |sim, _| assert_eq!(sim.faults().state().fail_rules.len(), 1),
        ),
        admin_case(
            Method::POST,
            "/sim/faults/fail",
            Some(json!({"verb": "get", "resource": "secrets", "code": 99})),
            400,
            |_, _| {},
        ),
        admin_case(
            Method::PUT,
            "/sim/faults/close-after",
            Some(json!({"events": 3})),
            200,
            |sim, _| assert_eq!(sim.faults().state().close_watches_after, Some(3)),
        ),
        admin_case(
            Method::POST,
            "/sim/faults/outage",
            Some(json!({"duration": "1h", "mode": "hang"})),
            200,
            |sim, _| assert_eq!(sim.faults().state().outage, Some(OutageMode::Hang)),
        ),
        admin_case(Method::DELETE, "/sim/faults", None, 200, |_, cleared| {
            assert_eq!(cleared["fail_rules"], json!([]));
            assert_eq!(cleared["outage"], Value::Null);
            assert_eq!(cleared["close_watches_after"], Value::Null);
        }),
        admin_case(
            Method::POST,
            "/sim/faults/close-watches",
            None,
            200,
            |_, closed| assert_eq!(closed["closed"], 0),
        ),
        admin_case(
            Method::POST,
            "/sim/faults/compact",
            None,
            200,
            |sim, compacted| {
                assert_eq!(
                    compacted["resourceVersion"],
                    sim.store().resource_version().to_string()
                )
            },
        ),
        admin_case(
            Method::POST,
            "/sim/generate",
            Some(json!({"routes": 4, "namespaces": 2, "secrets": 2})),
            200,
            |sim, generated| {
                assert_eq!(generated["routes"].as_array().unwrap().len(), 4);
                assert!(
                    generated["ca_pem"]
                        .as_str()
                        .unwrap()
                        .contains("BEGIN CERTIFICATE")
                );
                assert_eq!(sim.store().list("routes", "").len(), 4);
            },
        ),
        admin_case(Method::POST, "/sim/stats/reset", None, 200, |sim, _| {
            assert_eq!(sim.stats().requests_total, 0)
        }),
        admin_case(Method::GET, "/sim/nope", None, 404, |_, _| {}),
        admin_case(Method::DELETE, "/sim/stats", None, 405, |_, _| {}),
    ];
    for case in cases {
        let (code, answer) = admin(&sim, case.method.clone(), case.path, case.body.clone()).await;
        assert_eq!(
            code, case.code,
            "{} {} {:?}: {answer}",
            case.method, case.path, case.body
        );
        (case.then)(&sim, &answer);
    }

    // Seeding takes YAML, not JSON.
    let conn = H2Connection::connect(sim.addr(), "").await.unwrap();
    let manifests = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: seeded\n  namespace: team\nstringData:\n  a: b\n---\napiVersion: route.openshift.io/v1\nkind: Route\nmetadata:\n  name: r\n  namespace: team\nspec:\n  host: r.example.com\n  to:\n    kind: Service\n    name: app\n";
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

    // The request log, read after a mark.
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
