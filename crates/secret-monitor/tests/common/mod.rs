//! Shared set-up for the monitor's tests against the embedded simulator.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube_sim::{LatencyConfig, RequestRecord, SimConfig, Simulator};
use secret_monitor::{MonitorOptions, ObjectEvent, SecretMonitor};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// How long a test waits for something that should happen within milliseconds. Only a
/// guard against hanging forever: no test asserts on elapsed time.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub async fn sim() -> Simulator {
    sim_with(SimConfig::default()).await
}

pub async fn sim_with_latency(latency: Duration) -> Simulator {
    sim_with(SimConfig {
        latency: LatencyConfig::fixed(latency),
        ..SimConfig::default()
    })
    .await
}

pub async fn sim_with(config: SimConfig) -> Simulator {
    Simulator::start(config).await.expect("simulator starts")
}

pub async fn monitor(sim: &Simulator) -> SecretMonitor {
    monitor_with(sim, MonitorOptions::default()).await
}

/// A monitor as the daemon builds it: the admin identity over the pooled HTTP/2
/// client (watches multiplexed, a few connections).
pub async fn monitor_with(sim: &Simulator, options: MonitorOptions) -> SecretMonitor {
    let config = sim.client_config("admin").await.expect("admin config");
    let client = kube_h2::build_client(config, kube_h2::ClientOptions::default())
        .expect("pooled client")
        .client();
    SecretMonitor::with_options(client, options)
}

/// A monitor on kube's own client (HTTP/1.1: one connection per watch).
pub async fn monitor_http1(sim: &Simulator, options: MonitorOptions) -> SecretMonitor {
    let client = sim.client("admin").await.expect("admin client");
    SecretMonitor::with_options(client, options)
}

/// Options with fast retries, so that tests of faults converge quickly.
pub fn fast_options() -> MonitorOptions {
    MonitorOptions {
        backoff_min: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..MonitorOptions::default()
    }
}

/// Creates or replaces an Opaque secret whose `data.v` is `value`.
pub fn put_secret(sim: &Simulator, namespace: &str, name: &str, value: &str) -> Value {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(value);
    sim.store()
        .upsert(
            "secrets",
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": namespace},
                "type": "Opaque",
                "data": {"v": encoded},
            }),
        )
        .expect("secret written")
}

pub fn delete_secret(sim: &Simulator, namespace: &str, name: &str) {
    sim.store()
        .delete("secrets", namespace, name)
        .expect("secret deleted");
}

/// The value of `data.v` of a secret.
pub fn value_of(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|data| data.get("v"))
        .map(|bytes| String::from_utf8_lossy(&bytes.0).into_owned())
        .unwrap_or_default()
}

/// Requests the simulator logged for one secret name, by verb.
pub fn requests_for(
    sim: &Simulator,
    namespace: &str,
    name: &str,
) -> BTreeMap<String, Vec<RequestRecord>> {
    let mut by_verb: BTreeMap<String, Vec<RequestRecord>> = BTreeMap::new();
    for record in sim.request_log() {
        if record.resource == "secrets"
            && record.namespace.as_deref() == Some(namespace)
            && record.name.as_deref() == Some(name)
        {
            by_verb
                .entry(record.verb.to_string())
                .or_default()
                .push(record);
        }
    }
    by_verb
}

/// Polls `condition` until it holds; panics with `what` after [`PATIENCE`].
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if condition().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the simulator's open watch count is `expected`.
pub async fn open_watches_become(sim: &Simulator, expected: u64) {
    let what = format!("the simulator has {expected} open watches");
    eventually(&what, || async { sim.stats().open_watches == expected }).await;
}

/// Follows one registration's events, keeping the full history and the state it
/// implies.
pub struct Follower {
    pub events: mpsc::UnboundedReceiver<ObjectEvent<Secret>>,
    pub history: Vec<ObjectEvent<Secret>>,
}

impl Follower {
    pub fn new(events: mpsc::UnboundedReceiver<ObjectEvent<Secret>>) -> Self {
        Self {
            events,
            history: Vec::new(),
        }
    }

    /// Takes every event delivered so far.
    pub fn drain(&mut self) {
        while let Ok(event) = self.events.try_recv() {
            self.history.push(event);
        }
    }

    /// The object state the history leads to (`None`: absent).
    pub fn state(&self) -> Option<Arc<Secret>> {
        let mut state = None;
        for event in &self.history {
            state = match event {
                ObjectEvent::Added(object) | ObjectEvent::Updated { new: object, .. } => {
                    Some(Arc::clone(object))
                }
                ObjectEvent::Deleted(_) => None,
            };
        }
        state
    }

    /// Names of the events, e.g. `["added:a", "updated:b", "deleted"]`.
    pub fn kinds(&self) -> Vec<String> {
        self.history
            .iter()
            .map(|event| match event {
                ObjectEvent::Added(object) => format!("added:{}", value_of(object)),
                ObjectEvent::Updated { new, .. } => format!("updated:{}", value_of(new)),
                ObjectEvent::Deleted(_) => "deleted".to_owned(),
            })
            .collect()
    }
}

/// Whether a handler's state matches the simulator's object (same uid and version, or
/// both absent).
pub fn matches_store(sim: &Simulator, namespace: &str, name: &str, state: Option<&Secret>) -> bool {
    let stored = sim.store().get("secrets", namespace, name);
    match (stored, state) {
        (None, None) => true,
        (Some(stored), Some(state)) => {
            stored["metadata"]["uid"].as_str() == state.metadata.uid.as_deref()
                && stored["metadata"]["resourceVersion"].as_str()
                    == state.metadata.resource_version.as_deref()
        }
        _ => false,
    }
}
