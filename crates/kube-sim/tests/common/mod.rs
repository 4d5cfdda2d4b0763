//! Helpers shared by the integration tests.
#![allow(dead_code)]

use base64::Engine as _;
use http::{HeaderMap, Method, Request};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, Client};
use kube_sim::loadgen::H2Connection;
use kube_sim::{SimConfig, Simulator};
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
