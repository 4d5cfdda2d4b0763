//! A pipeline wired as the daemon wires it, against the embedded simulator, with
//! helpers to write routes and secrets and to wait for outcomes.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use kube_sim::{LatencyConfig, SimConfig, Simulator};
use route_secrets::api::access::{AccessChecker, AccessOptions, AccessPolicy};
use route_secrets::api::manager::SecretManager;
use route_secrets::api::pipeline::{
    AdmittedRoute, PipelineOptions, Readiness, RejectedRoute, RouteOutcome, RoutePipeline,
};
use route_secrets::api::route_watch::route_events;
use route_secrets::api::status_writer::StatusWriter;
use route_secrets::reason::Reason;
use route_secrets::route::admission::{RouterIdentity, admitted_condition, router_ingress};
use route_secrets::route::{Route, RouteKey};
use secret_monitor::{MonitorOptions, SecretMonitor};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub const ROUTER_NAME: &str = "default";
pub const PATIENCE: Duration = Duration::from_secs(90);

pub async fn sim_with_latency(latency: Duration) -> Simulator {
    Simulator::start(SimConfig {
        latency: LatencyConfig::fixed(latency),
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts")
}

pub struct Harness {
    pub sim: Simulator,
    pub manager: SecretManager,
    pub access: AccessChecker,
    pub status: Option<StatusWriter>,
    pub outcomes: mpsc::UnboundedReceiver<RouteOutcome>,
    pub readiness: watch::Receiver<Readiness>,
    /// Every outcome received, in order.
    pub history: Vec<RouteOutcome>,
    /// The latest outcome per route.
    pub latest: BTreeMap<RouteKey, RouteOutcome>,
    task: JoinHandle<()>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct HarnessOptions {
    pub write_status: bool,
    pub monitor: MonitorOptions,
    pub pipeline: PipelineOptions,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            write_status: true,
            monitor: MonitorOptions {
                backoff_min: Duration::from_millis(20),
                backoff_max: Duration::from_millis(200),
                ..MonitorOptions::default()
            },
            pipeline: PipelineOptions {
                identity: kube_sim::ROUTER_USER.to_owned(),
                retry_min: Duration::from_millis(100),
                retry_max: Duration::from_secs(1),
                ..PipelineOptions::default()
            },
        }
    }
}

impl Harness {
    /// Starts the pipeline as the router identity, over the pooled HTTP/2 client.
    pub async fn start(sim: &Simulator, options: HarnessOptions) -> Self {
        // RUST_LOG=route_secrets=debug shows what the pipeline decides.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let config = sim.client_config("router").await.expect("router config");
        let client = kube_h2::build_client(config, kube_h2::ClientOptions::default())
            .expect("pooled client")
            .client();
        let monitor = SecretMonitor::with_options(client.clone(), options.monitor);
        let manager = SecretManager::new(monitor);
        // Denials are re-checked quickly, so grants made during a test take effect.
        let access = AccessChecker::with_options(
            client.clone(),
            AccessOptions {
                policy: AccessPolicy::SelfRules,
                ttl: Duration::from_secs(600),
                denied_ttl: Duration::from_millis(100),
            },
        );
        let status = options
            .write_status
            .then(|| StatusWriter::spawn(client.clone(), RouterIdentity::new(ROUTER_NAME), 20));
        let (pipeline, outputs) = RoutePipeline::new(
            manager.clone(),
            access.clone(),
            status.clone(),
            options.pipeline,
        );
        let events = route_events(
            Api::<Route>::all(client),
            watcher::Config::default(),
            |_| {},
        );
        let task = tokio::spawn(pipeline.run(events));
        Self {
            sim: sim.clone(),
            manager,
            access,
            status,
            outcomes: outputs.outcomes,
            readiness: outputs.readiness,
            history: Vec::new(),
            latest: BTreeMap::new(),
            task,
        }
    }

    fn drain(&mut self) {
        while let Ok(outcome) = self.outcomes.try_recv() {
            self.latest.insert(outcome.route().clone(), outcome.clone());
            self.history.push(outcome);
        }
    }

    /// Waits until `condition` holds for the latest outcomes.
    pub async fn until(&mut self, what: &str, condition: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            self.drain();
            if condition(self) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting until {what}; latest outcomes: {:#?}",
                self.latest
                    .iter()
                    .map(|(k, o)| (k.to_string(), summary(o)))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn ready(&mut self) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if self.readiness.borrow().is_ready() {
                self.drain();
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "pipeline never became ready: {:?}",
                *self.readiness.borrow()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn admitted(&self, route: &RouteKey) -> Option<&AdmittedRoute> {
        match self.latest.get(route) {
            Some(RouteOutcome::Admitted(admitted)) => Some(admitted),
            _ => None,
        }
    }

    pub fn rejected(&self, route: &RouteKey) -> Option<&RejectedRoute> {
        match self.latest.get(route) {
            Some(RouteOutcome::Rejected(rejected)) => Some(rejected),
            _ => None,
        }
    }

    pub fn removed(&self, route: &RouteKey) -> bool {
        matches!(self.latest.get(route), Some(RouteOutcome::Removed(_)))
    }

    /// Waits for the route to be admitted with the certificate whose leaf has
    /// `fingerprint` (any certificate when `None`).
    pub async fn until_admitted(
        &mut self,
        route: &RouteKey,
        fingerprint: Option<[u8; 32]>,
    ) -> AdmittedRoute {
        let what = format!("{route} is admitted");
        self.until(&what, |h| {
            h.admitted(route)
                .is_some_and(|a| fingerprint.is_none_or(|f| a.tls.fingerprint().0 == f))
        })
        .await;
        self.admitted(route).cloned().expect("admitted")
    }

    /// Waits for the route to be rejected with the reason called `reason`.
    pub async fn until_rejected(&mut self, route: &RouteKey, reason: &str) -> Reason {
        let what = format!("{route} is rejected with {reason}");
        self.until(&what, |h| {
            h.rejected(route).is_some_and(|r| r.reason.name() == reason)
        })
        .await;
        self.rejected(route).expect("rejected").reason.clone()
    }

    /// Waits until the route's status records `admitted` with `reason` for this router.
    pub async fn until_status(&self, route: &RouteKey, admitted: bool, reason: Option<&str>) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Some(value) =
                self.sim
                    .store()
                    .get("routes", route.namespace.as_str(), &route.name)
            {
                let route_object: Route = serde_json::from_value(value).expect("route");
                let recorded = router_ingress(&route_object, ROUTER_NAME)
                    .and_then(admitted_condition)
                    .is_some_and(|c| {
                        c.status.as_str() == if admitted { "True" } else { "False" }
                            && c.reason.as_deref() == reason
                    });
                if recorded {
                    return;
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "status of {route} never recorded admitted={admitted} reason={reason:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the simulator holds `expected` open watches on secrets.
    pub async fn until_secret_watches(&self, expected: u64) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let open = self
                .sim
                .stats()
                .open_watches_by_resource
                .get("secrets")
                .copied()
                .unwrap_or(0);
            if open == expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{open} secret watches open, expected {expected}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

pub fn summary(outcome: &RouteOutcome) -> String {
    match outcome {
        RouteOutcome::Admitted(a) => format!("admitted {}", a.tls.fingerprint().to_hex()),
        RouteOutcome::Rejected(r) => format!("rejected {}: {}", r.reason.name(), r.reason),
        RouteOutcome::Removed(_) => "removed".to_owned(),
    }
}

pub fn key(namespace: &str, name: &str) -> RouteKey {
    RouteKey::new(namespace, name)
}

pub fn now() -> Timestamp {
    Timestamp::now()
}

/// Writes a route (creating its namespace if needed).
pub fn put_route(sim: &Simulator, route: &Route) -> Value {
    let mut value = serde_json::to_value(route).expect("route to JSON");
    value["apiVersion"] = json!("route.openshift.io/v1");
    value["kind"] = json!("Route");
    sim.store().upsert("routes", value).expect("route written")
}

/// Writes a route the API server would refuse (e.g. an empty secret name), as an older
/// server or a direct etcd write could leave it.
pub fn put_route_unchecked(sim: &Simulator, route: &Route) -> Value {
    let mut value = serde_json::to_value(route).expect("route to JSON");
    value["apiVersion"] = json!("route.openshift.io/v1");
    value["kind"] = json!("Route");
    sim.store().insert_unchecked(value).expect("route written")
}

/// Writes a secret through the simulator's validation (as the API server would).
pub fn put_secret(sim: &Simulator, secret: &Secret) -> Value {
    sim.store()
        .upsert("secrets", secret_json(secret))
        .expect("secret written")
}

/// Writes a secret the API server would refuse (e.g. a TLS secret without tls.key).
pub fn put_secret_unchecked(sim: &Simulator, secret: &Secret) -> Value {
    sim.store()
        .insert_unchecked(secret_json(secret))
        .expect("secret written")
}

fn secret_json(secret: &Secret) -> Value {
    let mut value = serde_json::to_value(secret).expect("secret to JSON");
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("Secret");
    value
}

pub fn delete(sim: &Simulator, resource: &str, namespace: &str, name: &str) {
    sim.store()
        .delete(resource, namespace, name)
        .expect("deleted");
}

/// Grants the router `verbs` on exactly `names` in `namespace`, with a Role of its own
/// (named after `role`), as a cluster admin would.
pub fn grant(sim: &Simulator, namespace: &str, role: &str, verbs: &[&str], names: &[&str]) {
    sim.store()
        .upsert(
            "roles",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": role, "namespace": namespace},
                "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": verbs, "resourceNames": names}],
            }),
        )
        .expect("role");
    sim.store()
        .upsert(
            "rolebindings",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": "openshift-ingress"}],
            }),
        )
        .expect("role binding");
}

/// The PEM bundle a proxy gets for an admitted route.
pub fn bundle(admitted: &AdmittedRoute) -> String {
    admitted.tls.pem_bundle().expose_secret().to_owned()
}

pub fn fingerprint_of_leaf(leaf: &route_secrets::testing::Leaf) -> [u8; 32] {
    route_secrets::tls::Sha256Fingerprint::of(&leaf.leaf_der()).0
}

pub fn shared<T>(value: T) -> Arc<T> {
    Arc::new(value)
}
