//! The one test support module of route-secrets' simulator tests: a pipeline wired as
//! the daemon wires it, waiting (on events where there are events, by polling where
//! only the simulator's counters tell), and fixtures for routes, secrets and grants.
//!
//! Every wait has the same patience ([`PATIENCE`]) and fails with what it waited for
//! and what it saw instead.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use kube_common::backoff::BackoffPolicy;
use kube_sim::{LatencyConfig, RequestRecord, SimConfig, Simulator};
use route_secrets::api::access::{AccessChecker, AccessOptions, AccessPolicy};
use route_secrets::api::manager::{SecretManager, TlsSecretMonitor};
use route_secrets::api::pipeline::{
    AdmittedRoute, PipelineError, PipelineOptions, Readiness, RejectedRoute, RouteOutcome,
    RoutePipeline,
};
use route_secrets::api::route_watch::route_events_with_backoff;
use route_secrets::api::status_writer::StatusWriter;
use route_secrets::reason::Reason;
use route_secrets::route::admission::{RouterIdentity, admitted_condition, router_ingress};
use route_secrets::route::{Route, RouteIngressCondition, RouteKey};
use secret_monitor::MonitorOptions;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub const ROUTER_NAME: &str = "default";
/// How long any wait waits before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(90);
/// How often [`eventually`] looks again.
const POLL: Duration = Duration::from_millis(10);

/// Waits until `condition` holds, looking every few milliseconds: for state that
/// announces no event (the simulator's counters and request log).
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Awaits `future`, failing the test after [`PATIENCE`].
pub async fn within_patience<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
}

pub async fn sim_with_latency(latency: Duration) -> Simulator {
    Simulator::start(SimConfig {
        latency: LatencyConfig::fixed(latency),
        ..SimConfig::default()
    })
    .await
    .expect("simulator starts")
}

/// A client of `context` (`router`, `admin`) over the pooled HTTP/2 client.
pub async fn client(sim: &Simulator, context: &str) -> kube::Client {
    let config = sim.client_config(context).await.expect("client config");
    kube_h2::build_client(config, kube_h2::ClientOptions::default())
        .expect("pooled client")
        .client()
}

/// Requests in the simulator's log matching `verb` and `resource`.
pub fn requests(sim: &Simulator, verb: &str, resource: &str) -> Vec<RequestRecord> {
    sim.request_log()
        .into_iter()
        .filter(|r| r.verb == verb && r.resource == resource)
        .collect()
}

/// How many requests matching `verb` and `resource` were answered with `code`.
pub fn answered(sim: &Simulator, verb: &str, resource: &str, code: u16) -> usize {
    requests(sim, verb, resource)
        .iter()
        .filter(|r| r.code == code)
        .count()
}

/// Retries fast, so that faults pass quickly in tests; the shape is the production one.
pub fn quick_retries() -> BackoffPolicy {
    BackoffPolicy::default().with_bounds(Duration::from_millis(50), Duration::from_millis(400))
}

/// A running pipeline, its outputs, and what it has said so far.
pub struct Harness {
    pub sim: Simulator,
    pub manager: SecretManager,
    pub access: AccessChecker,
    pub status: Option<StatusWriter>,
    pub outcomes: mpsc::Receiver<RouteOutcome>,
    pub readiness: watch::Receiver<Readiness>,
    /// Every outcome received, in order.
    pub history: Vec<RouteOutcome>,
    /// The latest outcome per route.
    pub latest: BTreeMap<RouteKey, RouteOutcome>,
    admin: kube::Client,
    task: Option<JoinHandle<Result<(), PipelineError>>>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

pub struct HarnessOptions {
    pub write_status: bool,
    pub monitor: MonitorOptions,
    pub pipeline: PipelineOptions,
    pub access: AccessOptions,
    /// The route watch's retry policy.
    pub route_retry: BackoffPolicy,
    /// The route watch's label selector.
    pub route_selector: Option<String>,
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
                retry: quick_retries(),
                ..PipelineOptions::default()
            },
            // Denials are re-checked quickly, so grants made during a test take effect.
            access: AccessOptions {
                policy: AccessPolicy::SelfRules,
                ttl: Duration::from_secs(600),
                denied_ttl: Duration::from_millis(100),
            },
            route_retry: quick_retries(),
            route_selector: None,
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
        let client = client(sim, "router").await;
        let monitor = TlsSecretMonitor::with_options(client.clone(), options.monitor);
        let manager = SecretManager::new(monitor);
        let access = AccessChecker::with_options(client.clone(), options.access);
        let status = options
            .write_status
            .then(|| StatusWriter::spawn(client.clone(), RouterIdentity::new(ROUTER_NAME), 20));
        let (pipeline, outputs) = RoutePipeline::new(
            manager.clone(),
            access.clone(),
            status.clone(),
            options.pipeline,
        );
        let mut config = watcher::Config::default();
        if let Some(selector) = &options.route_selector {
            config = config.labels(selector);
        }
        let events = route_events_with_backoff(
            Api::<Route>::all(client),
            config,
            options.route_retry,
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
            admin: client_for_admin(sim).await,
            task: Some(task),
        }
    }

    fn record(&mut self, outcome: RouteOutcome) {
        self.latest.insert(outcome.route().clone(), outcome.clone());
        self.history.push(outcome);
    }

    fn drain(&mut self) {
        while let Ok(outcome) = self.outcomes.try_recv() {
            self.record(outcome);
        }
    }

    /// Waits, outcome by outcome, until `condition` holds for what was said so far.
    pub async fn until(&mut self, what: &str, condition: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            self.drain();
            if condition(self) {
                return;
            }
            match tokio::time::timeout_at(deadline, self.outcomes.recv()).await {
                Ok(Some(outcome)) => self.record(outcome),
                Ok(None) => panic!("the pipeline stopped while waiting until {what}"),
                Err(_) => panic!(
                    "timed out waiting until {what}; latest outcomes: {:#?}",
                    self.latest
                        .iter()
                        .map(|(k, o)| (k.to_string(), summary(o)))
                        .collect::<Vec<_>>()
                ),
            }
        }
    }

    /// Waits until every route of the start-up set has an outcome, taking the outcomes
    /// meanwhile (the pipeline waits for room in its outcome queue).
    pub async fn ready(&mut self) {
        let mut readiness = self.readiness.clone();
        let wait = async {
            loop {
                if readiness.borrow_and_update().is_ready() {
                    return;
                }
                tokio::select! {
                    changed = readiness.changed() => changed.expect("pipeline running"),
                    Some(outcome) = self.outcomes.recv() => {
                        self.latest.insert(outcome.route().clone(), outcome.clone());
                        self.history.push(outcome);
                    }
                }
            }
        };
        within_patience("the pipeline is ready", wait).await;
        self.drain();
    }

    /// Waits for the pipeline to stop, and returns why.
    pub async fn stopped(&mut self) -> Result<(), PipelineError> {
        let task = self.task.take().expect("pipeline running");
        within_patience("the pipeline stops", task)
            .await
            .expect("pipeline task")
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

    /// Outcomes said about `route`, in order.
    pub fn outcomes_of(&self, route: &RouteKey) -> Vec<String> {
        self.history
            .iter()
            .filter(|o| o.route() == route)
            .map(summary)
            .collect()
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
            h.admitted(route).is_some_and(|a| {
                fingerprint.is_none_or(|f| a.tls().is_some_and(|tls| tls.fingerprint().0 == f))
            })
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

    /// Waits (on the route's watch events) until its status records `admitted` with
    /// `reason` for this router.
    pub async fn until_status(&self, route: &RouteKey, admitted: bool, reason: Option<&str>) {
        let wanted = if admitted { "True" } else { "False" };
        let what = format!("status of {route} records admitted={admitted} reason={reason:?}");
        self.until_condition(route, &what, move |c| {
            c.status.as_str() == wanted && c.reason.as_deref() == reason
        })
        .await;
    }

    /// Waits until the route's status records `Admitted=True` whose message contains
    /// `words`, or has no message when `words` is `None`.
    pub async fn until_admitted_message(&self, route: &RouteKey, words: Option<&str>) {
        let what = format!("status of {route} records Admitted=True with message {words:?}");
        self.until_condition(route, &what, move |c| {
            let message = c.message.as_deref().filter(|m| !m.is_empty());
            c.status.as_str() == "True"
                && match words {
                    Some(words) => message.is_some_and(|m| m.contains(words)),
                    None => message.is_none(),
                }
        })
        .await;
    }

    /// Waits (on the route's watch events) until this router's `Admitted` condition on
    /// the route satisfies `wanted`.
    async fn until_condition(
        &self,
        route: &RouteKey,
        what: &str,
        wanted: impl Fn(&RouteIngressCondition) -> bool,
    ) {
        let api: Api<Route> = Api::namespaced(self.admin.clone(), &route.namespace);
        let recorded = move |object: Option<&Route>| {
            object
                .and_then(|route| router_ingress(route, ROUTER_NAME))
                .and_then(admitted_condition)
                .is_some_and(&wanted)
        };
        within_patience(
            what,
            kube::runtime::wait::await_condition(api, &route.name, recorded),
        )
        .await
        .expect("route watch");
    }

    /// Waits until the simulator holds `expected` open watches on secrets.
    pub async fn until_secret_watches(&self, expected: u64) {
        let sim = &self.sim;
        let what = format!("{expected} secret watches are open");
        eventually(&what, || {
            sim.stats()
                .open_watches_by_resource
                .get("secrets")
                .copied()
                .unwrap_or(0)
                == expected
        })
        .await;
    }

    /// The secrets watched, by name, each with the number of routes registered on it.
    pub fn watched(&self) -> BTreeMap<String, usize> {
        self.manager
            .watched_secrets()
            .into_iter()
            .map(|(key, status)| (key.name, status.handlers))
            .collect()
    }
}

async fn client_for_admin(sim: &Simulator) -> kube::Client {
    sim.client("admin").await.expect("admin client")
}

pub fn summary(outcome: &RouteOutcome) -> String {
    match outcome {
        RouteOutcome::Admitted(a) => match a.tls() {
            Some(tls) => format!("admitted {}", tls.fingerprint().to_hex()),
            None => "admitted without a certificate".to_owned(),
        },
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
    admitted
        .tls()
        .expect("admitted with a certificate")
        .pem_bundle()
        .expose_secret()
        .to_owned()
}

pub fn fingerprint_of_leaf(leaf: &route_secrets::testing::Leaf) -> [u8; 32] {
    route_secrets::tls::Sha256Fingerprint::of(&leaf.leaf_der()).0
}

pub fn shared<T>(value: T) -> Arc<T> {
    Arc::new(value)
}
