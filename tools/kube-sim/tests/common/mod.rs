//! The one support module of kube-sim's integration tests: starting simulators,
//! waiting for a condition (one patience for every test), checking from the request
//! log that an injected fault fired, raw requests, fixtures, and finding kubectl.
#![allow(dead_code)]

pub mod kubectl;

use std::time::Duration;

use base64::Engine as _;
use http::{HeaderMap, Method, Request};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_sim::loadgen::H2Connection;
use kube_sim::{RequestRecord, SimConfig, SimStats, Simulator};
use serde_json::{Value, json};

pub fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

pub async fn start() -> Simulator {
    Simulator::start(SimConfig::default()).await.unwrap()
}

pub async fn start_with(config: SimConfig) -> Simulator {
    Simulator::start(config).await.unwrap()
}

/// A raw request through a kube client: status, headers and JSON body.
pub async fn raw(
    client: &Client,
    method: Method,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> (u16, HeaderMap, Value) {
    let bytes = body
        .map(|b| serde_json::to_vec(&b).unwrap())
        .unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .body(kube::client::Body::from(bytes))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, headers, value)
}

/// A GET through a kube client.
pub async fn get(client: &Client, path: &str) -> (u16, Value) {
    let (s, _, v) = raw(client, Method::GET, path, None, "application/json").await;
    (s, v)
}

/// An admin API call over plain HTTP/2.
pub async fn admin(
    sim: &Simulator,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let conn = H2Connection::connect(sim.addr(), "").await.unwrap();
    let body = body.map(|b| {
        (
            bytes::Bytes::from(serde_json::to_vec(&b).unwrap()),
            "application/json",
        )
    });
    let (status, bytes) = conn.request(method, path, body).await.unwrap();
    (
        status.as_u16(),
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

pub fn opaque_secret(ns: &str, name: &str, pairs: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(b64(v))))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": ns },
        "type": "Opaque",
        "data": data,
    })
}

pub fn tls_secret(ns: &str, name: &str, crt: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name, "namespace": ns },
        "type": "kubernetes.io/tls",
        "data": { "tls.crt": b64(crt), "tls.key": b64("key-bytes") },
    })
}

pub fn route(ns: &str, name: &str, host: &str, secret: &str) -> Value {
    json!({
        "apiVersion": "route.openshift.io/v1", "kind": "Route",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "host": host,
            "to": { "kind": "Service", "name": "svc" },
            "tls": { "termination": "edge", "externalCertificate": { "name": secret } },
        },
    })
}

pub fn route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("route.openshift.io", "v1", "Route"),
        "routes",
    )
}

pub fn routes(client: Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client, ns, &route_resource())
}

pub fn rv_of(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// A kube client without kube's default retries of 429/503/504, for tests that
/// look at those answers themselves.
pub async fn client_without_retries(sim: &Simulator, context: &str) -> Client {
    let mut config = sim.client_config(context).await.unwrap();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

/// How long any test waits for something that should happen. Generous, because the
/// machine is shared: a test fails on a condition that never holds, not on speed.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls `condition` until it holds; panics naming `what` after [`PATIENCE`].
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until the simulator's counters satisfy `condition`.
pub async fn stats_reach(sim: &Simulator, what: &str, condition: impl Fn(&SimStats) -> bool) {
    let mut last = sim.stats();
    eventually(what, || {
        last = sim.stats();
        condition(&last)
    })
    .await;
}

/// The sequence number of the newest request in the log (0 when empty): requests
/// made after this call have a larger one.
pub fn log_mark(sim: &Simulator) -> u64 {
    sim.request_log().last().map_or(0, |r| r.seq)
}

/// Asserts that an injected fault fired: after `mark`, `times` requests of `verb` on
/// `resource` were answered with `code`. Returns those requests.
pub fn assert_fault_fired(
    sim: &Simulator,
    mark: u64,
    verb: &str,
    resource: &str,
    code: u16,
    times: usize,
) -> Vec<RequestRecord> {
    let fired: Vec<RequestRecord> = sim
        .requests_since(mark)
        .into_iter()
        .filter(|r| r.verb == verb && r.resource == resource && r.code == code)
        .collect();
    assert_eq!(
        fired.len(),
        times,
        "expected the fault ({verb} {resource} -> {code}) to fire {times} time(s): {fired:?}"
    );
    fired
}
