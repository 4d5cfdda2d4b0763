//! Conformance: one list of scenarios, run by the same router client (secret-monitor's
//! per-secret watches plus one rules review per namespace) against kube-sim and against
//! a real kube-apiserver + etcd (testenv), comparing what each server accounted:
//!
//! - `apiserver_request_total` from both servers' `/metrics` (kube-sim serves it in the
//!   same names and labels), for the resources the scenarios touch; a watch still open
//!   is taken from `apiserver_longrunning_requests`, as the real server counts a watch
//!   only when it ends;
//! - the router's own requests by verb, resource and code: the real server's audit log
//!   against kube-sim's request log (these include the 403s that metrics leave out).
//!
//! Tolerance: every count must be equal, except where it depends on how fast each
//! server answers, and there the test states its bound (see [`Tolerance`]):
//! - WatchList off: how many streaming lists were already in flight when the first
//!   422 came back — at least one on each server, at most one per secret; the LISTs and
//!   WATCHes of the fallback are exact.
//! - Small APF budget: how many tries a burst gets refused — both servers must refuse
//!   some (all from `workload-low`'s queues), their totals within a factor of 10 of each
//!   other; which requests and which reasons is shown, not compared; every review and
//!   watch that finally succeeded is exact. kube-sim is given the real server's measured
//!   service time (its latency), as it otherwise answers a thousand times faster.
//!
//! The scenarios: start-up of routes with secrets, rotation, deletion, a denied secret,
//! a server with WatchList off, a server with a small APF budget. The figures are
//! printed (`--nocapture`) and recorded in docs/SIMULATOR.md.
//!
//! Answers are compared too, byte for byte: the router's refusals (403s for get, list
//! and watch with and without field selectors, at namespace and cluster scope, for
//! writes and for a non-resource path) and its access reviews' `status`; the 422 of a
//! streaming list with WatchList off; the single ERROR event of a streaming list on
//! storage without watch progress (kube-apiserver on etcd 3.4, `/usr/bin/etcd`).
//!
//! Services and EndpointSlices, as a router reads them: created objects with the
//! server's defaults and allocations, the router's cluster-wide list (all, by label, by
//! name), its watch from that list (events and generations), and the refusals of
//! invalid objects and of what the router may not do, byte for byte.
//!
//! Watch ends: a per-secret watch that allows bookmarks gets one at the latest
//! resourceVersion just before its `timeoutSeconds` when anything changed since it
//! started (none without bookmarks, none when the timeout leaves no room, none when
//! nothing changed), so that its renewal resumes from there.
//!
//! Leases, as one status writer among replicas uses them: create, create again,
//! update without a resourceVersion, renewal, a stale take-over, the follower's watch,
//! validation and decoding errors, create-on-update and a namespace without grant,
//! each answer compared with what differs between servers (uid, versions, times of
//! creation, managed fields) taken out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent};
use kube_sim::{
    FlowControlConfig, GenerateSpec, GeneratedCluster, ROUTER_USER, ServerFeatures, SimConfig,
    Simulator,
};
use secret_monitor::{MonitorOptions, ObjectEvent, ObjectKey, Registration, SecretMonitor};
use serde_json::{Value, json};
use testenv::{ControlPlane, ControlPlaneOptions, Installer, Metrics};

/// The resources whose request counts are compared.
const RESOURCES: &[&str] = &[
    "secrets",
    "selfsubjectrulesreviews",
    "selfsubjectaccessreviews",
    "routes",
];

/// One of the two servers under comparison.
enum Server {
    Sim(Simulator),
    Real(Box<ControlPlane>),
}

impl Server {
    /// A real control plane started with `options`.
    async fn real(options: ControlPlaneOptions) -> Server {
        Server::Real(Box::new(ControlPlane::start_with(options).await.unwrap()))
    }

    /// A simulator started with `config`.
    async fn sim(config: SimConfig) -> Server {
        Server::Sim(common::start_with(config).await)
    }

    fn name(&self) -> &'static str {
        match self {
            Server::Sim(_) => "kube-sim",
            Server::Real(_) => "kube-apiserver",
        }
    }

    async fn client(&self, context: &str) -> kube::Client {
        match self {
            Server::Sim(sim) => sim.client(context).await.unwrap(),
            Server::Real(cp) => cp.client(context).await.unwrap(),
        }
    }

    /// A client for `context` without kube's retries of 429s, to see refusals as they
    /// are sent.
    async fn client_without_retries(&self, context: &str) -> kube::Client {
        let mut config = match self {
            Server::Sim(sim) => sim.client_config(context).await.unwrap(),
            Server::Real(cp) => kube::Config::from_custom_kubeconfig(
                cp.kubeconfig().clone(),
                &kube::config::KubeConfigOptions {
                    context: Some(context.to_string()),
                    ..Default::default()
                },
            )
            .await
            .unwrap(),
        };
        config.default_retry = false;
        kube::Client::try_from(config).unwrap()
    }

    async fn generate(&self, spec: &GenerateSpec) -> GeneratedCluster {
        match self {
            Server::Sim(sim) => sim.generate(spec).unwrap(),
            Server::Real(cp) => Installer::new(cp.admin_client().await.unwrap())
                .generate(spec)
                .await
                .unwrap(),
        }
    }

    async fn metrics(&self) -> Metrics {
        match self {
            Server::Real(cp) => cp.metrics().await.unwrap(),
            Server::Sim(_) => {
                let admin = self.client("admin").await;
                let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
                Metrics::parse(&admin.request_text(request).await.unwrap())
            }
        }
    }

    /// The router's requests so far: (verb, resource[/subresource], code) → count.
    fn router_requests(&self) -> BTreeMap<(String, String, u16), usize> {
        match self {
            Server::Real(cp) => cp.audit().unwrap().summary(ROUTER_USER),
            Server::Sim(sim) => {
                let mut summary = BTreeMap::new();
                for r in sim
                    .request_log()
                    .into_iter()
                    .filter(|r| r.user == ROUTER_USER)
                {
                    *summary
                        .entry((r.verb.to_string(), r.resource.clone(), r.code))
                        .or_insert(0) += 1;
                }
                summary
            }
        }
    }
}

/// What one server accounted for one phase of a scenario: series name → count.
type Accounting = BTreeMap<String, f64>;

/// Both servers' views of a phase, taken before and after it.
struct Snapshot {
    metrics: Metrics,
    router: BTreeMap<(String, String, u16), usize>,
}

async fn snapshot(server: &Server) -> Snapshot {
    Snapshot {
        metrics: server.metrics().await,
        router: server.router_requests(),
    }
}

/// The phase's accounting: metric deltas of the compared resources (watches started
/// = ended + still open) and the router's requests.
async fn accounting_since(server: &Server, before: &Snapshot) -> Accounting {
    let after = snapshot(server).await;
    let delta = after.metrics.since(&before.metrics);
    let mut out = Accounting::new();
    for sample in delta.samples("apiserver_request_total") {
        if !sample.label("system_client").is_empty()
            || !RESOURCES.contains(&sample.label("resource"))
        {
            continue;
        }
        let verb = sample.label("verb");
        let key = if verb == "WATCH" {
            format!(
                "metrics WATCH-started {} {} {}",
                sample.label("resource"),
                sample.label("scope"),
                sample.label("code")
            )
        } else {
            format!(
                "metrics {verb} {} {} {}",
                sample.label("resource"),
                sample.label("scope"),
                sample.label("code")
            )
        };
        *out.entry(key).or_default() += sample.value;
    }
    for sample in delta.samples("apiserver_flowcontrol_rejected_requests_total") {
        let key = format!(
            "metrics APF-rejected {} {} {}",
            sample.label("flow_schema"),
            sample.label("priority_level"),
            sample.label("reason")
        );
        *out.entry(key).or_default() += sample.value;
    }
    for sample in delta.samples("apiserver_longrunning_requests") {
        if RESOURCES.contains(&sample.label("resource")) && sample.label("verb") == "WATCH" {
            // Code 200: a watch is long-running only once it streams.
            let key = format!(
                "metrics WATCH-started {} {} 200",
                sample.label("resource"),
                sample.label("scope")
            );
            *out.entry(key).or_default() += sample.value;
        }
    }
    for ((verb, resource, code), count) in &after.router {
        let earlier = before
            .router
            .get(&(verb.clone(), resource.clone(), *code))
            .copied()
            .unwrap_or(0);
        if *count > earlier {
            *out.entry(format!("router {verb} {resource} {code}"))
                .or_default() += (count - earlier) as f64;
        }
    }
    // Totals of the refusals, whatever refused request and reason they were.
    let refused: f64 = out
        .iter()
        .filter(|(k, _)| k.starts_with("router ") && k.ends_with(" 429"))
        .map(|(_, v)| v)
        .sum();
    let rejected: f64 = out
        .iter()
        .filter(|(k, _)| k.starts_with("metrics APF-rejected "))
        .map(|(_, v)| v)
        .sum();
    out.insert(
        "total router requests refused with 429".to_string(),
        refused,
    );
    out.insert("total APF rejections".to_string(), rejected);
    out.retain(|_, v| *v != 0.0);
    out
}

/// How far kube-sim's count of a series may be from the real server's.
#[derive(Debug, Clone, Copy)]
enum Tolerance {
    /// Equal.
    Exact,
    /// Shown, not compared: how refusals split among requests and reasons is timing;
    /// their total is compared.
    Shown,
    /// Both at least one, and within `factor` of each other (timing decides how many).
    Both { factor: f64 },
    /// Both within `low..=high` (timing decides where).
    Between { low: f64, high: f64 },
}

/// Compares a phase, printing both servers' figures; panics naming every series out
/// of tolerance.
fn compare(
    phase: &str,
    sim: &Accounting,
    real: &Accounting,
    tolerance: impl Fn(&str) -> Tolerance,
) {
    let keys: BTreeSet<&String> = sim.keys().chain(real.keys()).collect();
    let mut off = Vec::new();
    eprintln!(
        "\n{phase}\n  {:<62} {:>9} {:>15}",
        "series", "kube-sim", "kube-apiserver"
    );
    for key in keys {
        let (s, r) = (
            sim.get(key).copied().unwrap_or(0.0),
            real.get(key).copied().unwrap_or(0.0),
        );
        let within = match tolerance(key) {
            Tolerance::Exact => s == r,
            Tolerance::Shown => true,
            Tolerance::Both { factor } => {
                s >= 1.0 && r >= 1.0 && s <= r * factor && r <= s * factor
            }
            Tolerance::Between { low, high } => {
                (low..=high).contains(&s) && (low..=high).contains(&r)
            }
        };
        eprintln!(
            "  {key:<62} {s:>9} {r:>15}{}",
            if within { "" } else { "   <- out of tolerance" }
        );
        if !within {
            off.push(format!(
                "{key}: kube-sim {s}, kube-apiserver {r} ({:?})",
                tolerance(key)
            ));
        }
    }
    assert!(
        off.is_empty(),
        "{phase}: kube-sim differs from kube-apiserver:\n{}",
        off.join("\n")
    );
}

/// The router model: a secret monitor (the project's per-secret watches) and one
/// SelfSubjectRulesReview per namespace.
struct Router {
    client: kube::Client,
    monitor: SecretMonitor,
}

impl Router {
    async fn new(server: &Server) -> Router {
        let client = server.client("router").await;
        let options = MonitorOptions {
            // Generous: a phase ends when every secret synced, not at a deadline.
            sync_timeout: Duration::from_secs(300),
            first_sync_attempts: 100,
            ..MonitorOptions::default()
        };
        Router {
            monitor: SecretMonitor::with_options(client.clone(), options),
            client,
        }
    }

    async fn review_namespaces(&self, namespaces: &[String]) {
        let reviews: Api<SelfSubjectRulesReview> = Api::all(self.client.clone());
        for namespace in namespaces {
            let review = SelfSubjectRulesReview {
                spec: SelfSubjectRulesReviewSpec {
                    namespace: Some(namespace.clone()),
                },
                ..Default::default()
            };
            reviews
                .create(&PostParams::default(), &review)
                .await
                .unwrap();
        }
    }

    /// Asks, for every secret at once, whether the router may get, list and watch it
    /// (a SelfSubjectAccessReview each: the router's `self-review` access check).
    /// kube's client retries what is refused with 429, after its Retry-After.
    async fn review_each_secret(&self, secrets: &[(String, String)]) {
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let asks = secrets.iter().flat_map(|(namespace, name)| {
            ["get", "list", "watch"].map(|verb| SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        namespace: Some(namespace.clone()),
                        verb: Some(verb.to_string()),
                        resource: Some("secrets".to_string()),
                        name: Some(name.clone()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            })
        });
        let answers = join_all(asks.map(|review| {
            let reviews = reviews.clone();
            async move { reviews.create(&PostParams::default(), &review).await }
        }))
        .await;
        for answer in answers {
            let allowed = answer.unwrap().status.is_some_and(|s| s.allowed);
            assert!(allowed, "the router may read its secrets");
        }
    }

    /// Registers every secret at once; returns the registrations by key.
    async fn watch_all(
        &self,
        secrets: &[(String, String)],
    ) -> BTreeMap<(String, String), Registration<Secret>> {
        let registrations = join_all(secrets.iter().map(|(ns, name)| {
            self.monitor
                .add_handler(ObjectKey::new(ns.as_str(), name.as_str()))
        }))
        .await;
        secrets
            .iter()
            .cloned()
            .zip(registrations)
            .map(|(key, registration)| {
                let registration =
                    registration.unwrap_or_else(|e| panic!("{key:?} did not sync: {e}"));
                (key, registration)
            })
            .collect()
    }
}

/// Waits for the next event of each registration, which must match `expected`.
async fn next_events(
    registrations: &mut BTreeMap<(String, String), Registration<Secret>>,
    keys: &[(String, String)],
    expected: impl Fn(&ObjectEvent<Secret>) -> bool,
) {
    for key in keys {
        let registration = registrations.get_mut(key).unwrap();
        loop {
            let event = tokio::time::timeout(common::PATIENCE, registration.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no event for {key:?}"))
                .unwrap_or_else(|| panic!("the events of {key:?} ended"));
            // The first event of a handler is the current object.
            if expected(&event) {
                break;
            }
        }
    }
}

fn spec() -> GenerateSpec {
    GenerateSpec::new(40, 4)
}

/// The secret the router was not granted: `not-granted`, next to the others in
/// `namespace`.
const NOT_GRANTED: &str = "not-granted";

/// Creates [`NOT_GRANTED`] in `namespace`, as the admin.
async fn create_not_granted(server: &Server, namespace: &str) {
    let secret = common::opaque_secret(namespace, NOT_GRANTED, &[("k", "v")]);
    Api::<Secret>::namespaced(server.client("admin").await, namespace)
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).unwrap(),
        )
        .await
        .unwrap();
}

/// The phases of the default scenario, for one server.
async fn default_scenario(server: &Server) -> Vec<(&'static str, Accounting)> {
    let cluster = server.generate(&spec()).await;
    let secrets = cluster.distinct_secrets();
    let admin = server.client("admin").await;
    let denied_ns = cluster.namespaces[0].clone();
    create_not_granted(server, &denied_ns).await;
    let router = Router::new(server).await;
    let mut phases = Vec::new();

    let before = snapshot(server).await;
    router.review_namespaces(&cluster.namespaces).await;
    let mut registrations = router.watch_all(&secrets).await;
    open_watches(server, secrets.len() as f64).await;
    phases.push((
        "start-up: one rules review per namespace, one watch per secret",
        accounting_since(server, &before).await,
    ));

    let before = snapshot(server).await;
    let rotated: Vec<(String, String)> = secrets.iter().take(10).cloned().collect();
    for (ns, name) in &rotated {
        Api::<Secret>::namespaced(admin.clone(), ns)
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": {"rotation": common::b64("2")}})),
            )
            .await
            .unwrap();
    }
    next_events(&mut registrations, &rotated, |e| match e {
        ObjectEvent::Updated { new, .. } => new
            .data
            .as_ref()
            .is_some_and(|d| d.contains_key("rotation")),
        _ => false,
    })
    .await;
    phases.push((
        "rotation: 10 secrets updated, seen through the open watches",
        accounting_since(server, &before).await,
    ));

    let before = snapshot(server).await;
    let deleted: Vec<(String, String)> = secrets.iter().skip(10).take(5).cloned().collect();
    for (ns, name) in &deleted {
        Api::<Secret>::namespaced(admin.clone(), ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    next_events(&mut registrations, &deleted, |e| {
        matches!(e, ObjectEvent::Deleted(_))
    })
    .await;
    phases.push((
        "deletion: 5 secrets deleted, seen through the open watches",
        accounting_since(server, &before).await,
    ));

    let before = snapshot(server).await;
    let denied = router
        .monitor
        .add_handler(ObjectKey::new(denied_ns.as_str(), NOT_GRANTED))
        .await;
    assert_eq!(
        denied.err().and_then(|e| e.status_code()),
        Some(403),
        "{}",
        server.name()
    );
    phases.push((
        "denied: a secret the router may not read",
        accounting_since(server, &before).await,
    ));
    drop(registrations);
    phases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_rotation_deletion_and_a_denied_secret() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    let on_sim = default_scenario(&sim).await;
    let on_real = default_scenario(&real).await;
    for ((phase, s), (_, r)) in on_sim.iter().zip(&on_real) {
        compare(phase, s, r, |_| Tolerance::Exact);
    }
}

/// Waits until the server has `count` per-secret watches open: a first sync that fell
/// back to LIST + WATCH is done after its LIST, before its WATCH is established.
async fn open_watches(server: &Server, count: f64) {
    let deadline = tokio::time::Instant::now() + common::PATIENCE;
    loop {
        let open = server.metrics().await.sum(
            "apiserver_longrunning_requests",
            &[
                ("verb", "WATCH"),
                ("resource", "secrets"),
                ("scope", "resource"),
            ],
        );
        if open >= count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{}: {open} of {count} watches open",
            server.name()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How the router checks its access at start-up.
#[derive(Clone, Copy)]
enum AccessCheck {
    /// One SelfSubjectRulesReview per namespace.
    RulesPerNamespace,
    /// A SelfSubjectAccessReview per secret and verb, all at once.
    ReviewPerSecret,
}

/// Start-up of `secrets` routes with secrets: access checks, then every watch at once.
/// Returns the accounting and the cluster.
async fn start_up(
    server: &Server,
    secrets: usize,
    check: AccessCheck,
) -> (Accounting, GeneratedCluster) {
    let cluster = server.generate(&GenerateSpec::new(secrets, 4)).await;
    let router = Router::new(server).await;
    let before = snapshot(server).await;
    match check {
        AccessCheck::RulesPerNamespace => router.review_namespaces(&cluster.namespaces).await,
        AccessCheck::ReviewPerSecret => {
            router.review_each_secret(&cluster.distinct_secrets()).await
        }
    }
    let registrations = router.watch_all(&cluster.distinct_secrets()).await;
    assert_eq!(
        registrations.len(),
        secrets,
        "{}: every secret synced",
        server.name()
    );
    (accounting_since(server, &before).await, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_watch_list_off() {
    let real = Server::real(
        ControlPlaneOptions::from_env().apiserver_flag("--feature-gates=WatchList=false"),
    )
    .await;
    let sim = Server::sim(SimConfig {
        features: ServerFeatures {
            watch_list: false,
            ..ServerFeatures::default()
        },
        ..SimConfig::default()
    })
    .await;
    const SECRETS: usize = 40;
    let (s, cluster) = start_up(&sim, SECRETS, AccessCheck::RulesPerNamespace).await;
    let (r, _) = start_up(&real, SECRETS, AccessCheck::RulesPerNamespace).await;
    // The refusal itself, byte for byte.
    assert_same_answers(
        &[&sim, &real],
        &format!("{} (WatchList off)", STREAMING_LIST),
        &streaming_list_path(&cluster.routes[0].namespace, &cluster.routes[0].secret),
    )
    .await;
    // How many streaming lists were in flight when the first 422 came back depends on
    // each side's timing: at least one on each, at most one per secret.
    compare(
        &format!("start-up of {SECRETS} secrets, WatchList off"),
        &s,
        &r,
        |key| {
            if key.ends_with(" 422") {
                Tolerance::Between {
                    low: 1.0,
                    high: SECRETS as f64,
                }
            } else {
                Tolerance::Exact
            }
        },
    );
}

/// The mean time a request of the router's level held its seat on the real server
/// (`apiserver_flowcontrol_request_execution_seconds`), the service time the simulator
/// is given so that the same load meets the same APF model at the same speed.
async fn service_time(server: &Server) -> Duration {
    let metrics = server.metrics().await;
    let filter = [("priority_level", "workload-low")];
    let seconds = metrics.sum(
        "apiserver_flowcontrol_request_execution_seconds_sum",
        &filter,
    );
    let count = metrics.sum(
        "apiserver_flowcontrol_request_execution_seconds_count",
        &filter,
    );
    assert!(
        count > 0.0,
        "the real server executed workload-low requests"
    );
    Duration::from_secs_f64(seconds / count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_a_small_apf_budget() {
    let real = Server::real(
        ControlPlaneOptions::from_env()
            .apiserver_flag("--max-requests-inflight=4")
            .apiserver_flag("--max-mutating-requests-inflight=2"),
    )
    .await;
    // The router's self-review access check: 3 reviews per secret, all at once, then
    // a watch per secret: far more than workload-low's queues hold.
    const SECRETS: usize = 300;
    let (r, _) = start_up(&real, SECRETS, AccessCheck::ReviewPerSecret).await;
    // The simulator answers in microseconds where kube-apiserver takes milliseconds;
    // it is given the real server's measured service time as latency.
    let service = service_time(&real).await;
    eprintln!("kube-apiserver's mean service time in workload-low: {service:?}");
    let sim = Server::sim(SimConfig {
        flow_control: Some(FlowControlConfig {
            max_requests_inflight: 4,
            max_mutating_requests_inflight: 2,
            ..FlowControlConfig::default()
        }),
        latency: kube_sim::LatencyConfig::fixed(service),
        ..SimConfig::default()
    })
    .await;
    let (s, _) = start_up(&sim, SECRETS, AccessCheck::ReviewPerSecret).await;
    // A refusal itself, byte for byte: the first 429 of a burst sent without retries.
    let refused_on_sim = first_refusal(&sim, 3 * SECRETS).await;
    let refused_on_real = first_refusal(&real, 3 * SECRETS).await;
    eprintln!(
        "first refusal of a burst: kube-sim {refused_on_sim:?}, kube-apiserver {refused_on_real:?}"
    );
    assert_eq!(
        refused_on_sim, refused_on_real,
        "a 429 of API Priority and Fairness"
    );
    for (server, accounting) in [(&sim, &s), (&real, &r)] {
        let rejected = server.metrics().await.rejected_by_priority_level();
        assert!(
            rejected.get("workload-low").copied().unwrap_or(0.0) >= 1.0,
            "{}: refused by workload-low: {rejected:?} {accounting:?}",
            server.name()
        );
    }
    // Every review and every secret's watch succeeds on both (exact); how many tries
    // were refused on the way depends on the servers' timing: both must refuse some,
    // within a factor of 10 of each other (which requests and why is shown).
    compare(
        &format!(
            "start-up of {SECRETS} secrets with a review per secret and verb, --max-requests-inflight=4 --max-mutating-requests-inflight=2"
        ),
        &s,
        &r,
        |key| {
            if key.starts_with("total ") {
                Tolerance::Both { factor: 10.0 }
            } else if key.ends_with(" 429") || key.starts_with("metrics APF-rejected") {
                Tolerance::Shown
            } else {
                Tolerance::Exact
            }
        },
    );
}

/// How a server answered one request: its code, content type and body, byte for byte
/// (a streaming answer is read to its end), and whether it said when to retry.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    code: u16,
    content_type: String,
    body: String,
    /// A `Retry-After` header in whole seconds (its value grows with the load, so only
    /// its presence is compared).
    retry_after: bool,
}

async fn ask(
    client: &kube::Client,
    method: http::Method,
    path: &str,
    body: Option<&Value>,
) -> Answer {
    let bytes = body
        .map(|b| serde_json::to_vec(b).unwrap())
        .unwrap_or_default();
    let request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(kube::client::Body::from(bytes))
        .unwrap();
    let response = client.send(request).await.unwrap();
    let code = response.status().as_u16();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let retry_after = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.parse::<u64>().is_ok_and(|seconds| seconds >= 1));
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .unwrap()
        .to_bytes();
    Answer {
        code,
        content_type,
        body: String::from_utf8_lossy(&body).into_owned(),
        retry_after,
    }
}

/// A request of the router's and what of the answer is compared.
struct Probe {
    what: &'static str,
    method: http::Method,
    path: String,
    body: Option<Value>,
    /// Compare the body byte for byte (refusals); otherwise the code only (an answer
    /// carrying resourceVersions and uids, which differ between servers).
    whole_body: bool,
}

/// The refusals the router can meet, for one cluster: the same table on both servers.
fn refusal_probes(namespace: &str, granted: &str) -> Vec<Probe> {
    let secrets = format!("/api/v1/namespaces/{namespace}/secrets");
    let refused = |what, method, path: String, body: Option<Value>| Probe {
        what,
        method,
        path,
        body,
        whole_body: true,
    };
    vec![
        Probe {
            what: "get its own secret",
            method: http::Method::GET,
            path: format!("{secrets}/{granted}"),
            body: None,
            whole_body: false,
        },
        refused(
            "get a secret it was not granted",
            http::Method::GET,
            format!("{secrets}/not-granted"),
            None,
        ),
        refused(
            "get a secret that does not exist",
            http::Method::GET,
            format!("{secrets}/missing"),
            None,
        ),
        refused(
            "list every secret of a namespace",
            http::Method::GET,
            secrets.clone(),
            None,
        ),
        refused(
            "list a secret by name",
            http::Method::GET,
            format!("{secrets}?fieldSelector=metadata.name%3Dnot-granted"),
            None,
        ),
        refused(
            "watch a secret by name",
            http::Method::GET,
            format!("{secrets}?watch=true&fieldSelector=metadata.name%3Dnot-granted"),
            None,
        ),
        refused(
            "watch a secret by name and another field",
            http::Method::GET,
            format!(
                "{secrets}?watch=true&fieldSelector=metadata.name%3D%3Dnot-granted%2Ctype%3DOpaque"
            ),
            None,
        ),
        refused(
            "list secrets by type",
            http::Method::GET,
            format!("{secrets}?fieldSelector=type%3DOpaque"),
            None,
        ),
        refused(
            "list every secret of the cluster",
            http::Method::GET,
            "/api/v1/secrets".to_string(),
            None,
        ),
        refused(
            "watch every secret of the cluster",
            http::Method::GET,
            "/api/v1/secrets?watch=true".to_string(),
            None,
        ),
        refused(
            "delete its own secret",
            http::Method::DELETE,
            format!("{secrets}/{granted}"),
            None,
        ),
        refused(
            "create a secret",
            http::Method::POST,
            secrets.clone(),
            Some(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "new"}})),
        ),
        Probe {
            what: "get its namespace (the router's cluster role allows it)",
            method: http::Method::GET,
            path: format!("/api/v1/namespaces/{namespace}"),
            body: None,
            whole_body: false,
        },
        refused(
            "read the metrics",
            http::Method::GET,
            "/metrics".to_string(),
            None,
        ),
    ]
}

/// The failures a client with every right can meet, for one cluster: the same table
/// on both servers, every answer compared byte for byte.
fn error_probes(namespace: &str, existing: &str) -> Vec<Probe> {
    let secrets = format!("/api/v1/namespaces/{namespace}/secrets");
    let failing = |what, method, path: String, body: Option<Value>| Probe {
        what,
        method,
        path,
        body,
        whole_body: true,
    };
    let secret = |name: &str, resource_version: Option<&str>| {
        let mut secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}});
        if let Some(rv) = resource_version {
            secret["metadata"]["resourceVersion"] = json!(rv);
        }
        Some(secret)
    };
    vec![
        failing(
            "get a secret that does not exist",
            http::Method::GET,
            format!("{secrets}/missing"),
            None,
        ),
        failing(
            "delete a secret that does not exist",
            http::Method::DELETE,
            format!("{secrets}/missing"),
            None,
        ),
        failing(
            "get a route that does not exist",
            http::Method::GET,
            format!("/apis/route.openshift.io/v1/namespaces/{namespace}/routes/missing"),
            None,
        ),
        failing(
            "create a secret that exists",
            http::Method::POST,
            secrets.clone(),
            secret(existing, None),
        ),
        failing(
            "replace a secret from a stale resourceVersion",
            http::Method::PUT,
            format!("{secrets}/{existing}"),
            secret(existing, Some("1")),
        ),
        failing(
            "create a secret with an invalid name",
            http::Method::POST,
            secrets.clone(),
            secret("Not_A_Name", None),
        ),
        failing(
            "list secrets by a field secrets do not have",
            http::Method::GET,
            format!("{secrets}?fieldSelector=spec.host%3Dx"),
            None,
        ),
    ]
}

/// What a SelfSubjectAccessReview answered: its `status`, whole.
async fn review_status(client: &kube::Client, namespace: &str, verb: &str, name: &str) -> Value {
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {
            "namespace": namespace, "verb": verb, "resource": "secrets", "name": name,
        }},
    });
    let answer = ask(
        client,
        http::Method::POST,
        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
        Some(&review),
    )
    .await;
    assert_eq!(answer.code, 201, "{}", answer.body);
    let value: Value = serde_json::from_str(&answer.body).unwrap();
    value["status"].clone()
}

/// The router's refusals and access reviews on one server: what → answer.
async fn refusals(server: &Server) -> Vec<(String, Answer)> {
    let cluster = server.generate(&GenerateSpec::new(4, 2)).await;
    let route = &cluster.routes[0];
    let (namespace, granted) = (route.namespace.as_str(), route.secret.as_str());
    create_not_granted(server, namespace).await;
    let router = server.client("router").await;
    let mut answers = Vec::new();
    for probe in refusal_probes(namespace, granted) {
        let mut answer = ask(&router, probe.method, &probe.path, probe.body.as_ref()).await;
        if !probe.whole_body {
            answer.body.clear();
        }
        answers.push((probe.what.to_string(), answer));
    }
    let admin = server.client("admin").await;
    for probe in error_probes(namespace, granted) {
        let answer = ask(&admin, probe.method, &probe.path, probe.body.as_ref()).await;
        answers.push((format!("admin: {}", probe.what), answer));
    }
    for (verb, name) in [("get", granted), ("watch", granted), ("get", NOT_GRANTED)] {
        let status = review_status(&router, namespace, verb, name).await;
        answers.push((
            format!("review: may it {verb} {name}"),
            Answer {
                code: 201,
                content_type: String::new(),
                body: status.to_string(),
                retry_after: false,
            },
        ));
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_reviews_read_as_kube_apiserver_writes_them() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    let on_sim = refusals(&sim).await;
    let on_real = refusals(&real).await;
    let mut differ = Vec::new();
    for ((what, s), (_, r)) in on_sim.iter().zip(&on_real) {
        eprintln!(
            "{what}: {} {} {}",
            r.code,
            r.content_type,
            r.body.trim_end()
        );
        if s != r {
            differ.push(format!(
                "{what}:\n  kube-sim:       {s:?}\n  kube-apiserver: {r:?}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "kube-sim answers differently:\n{}",
        differ.join("\n")
    );
}

/// What the router's first sync of a secret asks when it can: a streaming list.
const STREAMING_LIST: &str = "a streaming list of one secret";

/// A streaming list of one secret, as kube-runtime's watcher asks for it.
fn streaming_list_path(namespace: &str, name: &str) -> String {
    format!(
        "/api/v1/namespaces/{namespace}/secrets?watch=true&sendInitialEvents=true\
         &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true\
         &fieldSelector=metadata.name%3D{name}&timeoutSeconds=10"
    )
}

/// Asks every server `path` as the router; their answers must be the same, byte for
/// byte.
async fn assert_same_answers(servers: &[&Server], what: &str, path: &str) {
    let mut answers = Vec::new();
    for server in servers {
        let router = server.client("router").await;
        answers.push((
            server.name(),
            ask(&router, http::Method::GET, path, None).await,
        ));
    }
    for (name, answer) in &answers {
        eprintln!("{what} on {name}: {answer:?}");
    }
    let (first_name, first) = &answers[0];
    for (name, answer) in &answers[1..] {
        assert_eq!(
            first, answer,
            "{what}: {first_name} and {name} answer differently"
        );
    }
}

/// The etcd of older clusters (Debian's `etcd-server`, 3.4), without
/// RequestWatchProgress.
const ETCD_WITHOUT_WATCH_PROGRESS: &str = "/usr/bin/etcd";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_storage_has_no_watch_progress() {
    assert!(
        std::path::Path::new(ETCD_WITHOUT_WATCH_PROGRESS).exists(),
        "this test runs kube-apiserver on etcd 3.4 at {ETCD_WITHOUT_WATCH_PROGRESS}: \
         install it (Debian/Ubuntu: apt-get install etcd-server)"
    );
    let real =
        Server::real(ControlPlaneOptions::from_env().etcd_bin(ETCD_WITHOUT_WATCH_PROGRESS)).await;
    let sim = Server::sim(SimConfig {
        features: ServerFeatures {
            watch_progress: false,
            ..ServerFeatures::default()
        },
        ..SimConfig::default()
    })
    .await;
    let spec = GenerateSpec::new(2, 1);
    let cluster = sim.generate(&spec).await;
    real.generate(&spec).await;
    let route = &cluster.routes[0];
    // 200 and one ERROR event carrying a 500 Status, then the end.
    assert_same_answers(
        &[&sim, &real],
        &format!("{STREAMING_LIST} (storage without watch progress)"),
        &streaming_list_path(&route.namespace, &route.secret),
    )
    .await;
}

/// The first 429 of bursts of `count` access reviews the router sends at once without
/// retries; panics when the server refused none in [`BURSTS`] bursts. (Whether one
/// burst overflows the queues depends on how fast the client's connections open, so
/// the burst is repeated rather than sized for the slowest case.)
async fn first_refusal(server: &Server, count: usize) -> Answer {
    let router = server.client_without_retries("router").await;
    let review = json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "get", "resource": "secrets"}},
    });
    let mut codes: BTreeMap<u16, usize> = BTreeMap::new();
    for _ in 0..BURSTS {
        let answers = join_all((0..count).map(|_| {
            ask(
                &router,
                http::Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                Some(&review),
            )
        }))
        .await;
        for answer in &answers {
            *codes.entry(answer.code).or_default() += 1;
        }
        if let Some(refused) = answers.into_iter().find(|answer| answer.code == 429) {
            return refused;
        }
    }
    panic!(
        "{}: no 429 in {BURSTS} bursts of {count}: {codes:?}",
        server.name()
    )
}

/// How many bursts [`first_refusal`] sends at most.
const BURSTS: usize = 5;

/// A Service or EndpointSlice as both servers must store it: without what differs by
/// nature (uid, resourceVersion, timestamps, managed fields), the allocated cluster IP
/// and node ports checked to come from the server's ranges and then masked.
fn comparable(mut object: Value) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
        ] {
            meta.remove(field);
        }
    }
    if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
        if let Some(ip) = spec
            .get("clusterIP")
            .and_then(Value::as_str)
            .filter(|ip| *ip != "None")
        {
            let parsed: std::net::Ipv4Addr = ip.parse().unwrap();
            assert_eq!(parsed.octets()[..2], [10, 96], "{ip}");
            assert_eq!(spec["clusterIPs"], json!([ip]));
            spec.insert("clusterIP".into(), json!("<allocated>"));
            spec.insert("clusterIPs".into(), json!(["<allocated>"]));
        }
        for port in spec
            .get_mut("ports")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(n) = port.get("nodePort").and_then(Value::as_i64) {
                assert!((30000..=32767).contains(&n), "{n}");
                port["nodePort"] = json!("<allocated>");
            }
        }
    }
    object
}

/// A list's items, comparable, and nothing else of it. Items lose `apiVersion` and
/// `kind`, which kube-apiserver leaves out of built-in kinds' list items and kube-sim
/// writes (docs/SIMULATOR.md, "What still differs").
fn comparable_items(list: &str) -> Value {
    let list: Value = serde_json::from_str(list).unwrap();
    Value::Array(
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .cloned()
            .map(|mut item| {
                let map = item.as_object_mut().unwrap();
                map.remove("apiVersion");
                map.remove("kind");
                comparable(item)
            })
            .collect(),
    )
}

/// The Services and EndpointSlices script on one server: what → what was seen.
async fn services_and_slices(server: &Server) -> Vec<(String, Value)> {
    let admin = server.client("admin").await;
    let router = server.client("router").await;
    let mut seen: Vec<(String, Value)> = Vec::new();
    let namespace = "shop";
    let created = ask(
        &admin,
        http::Method::POST,
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})),
    )
    .await;
    assert_eq!(created.code, 201, "{}", created.body);
    let services = format!("/api/v1/namespaces/{namespace}/services");
    let slices = format!("/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices");
    let mut record = |what: &str, answer: Answer, body: Value| {
        seen.push((what.to_string(), json!({"code": answer.code, "body": body})));
    };
    for (name, spec) in [
        (
            "web",
            json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "https", "port": 443}]}),
        ),
        (
            "edge",
            json!({"type": "NodePort", "ports": [{"port": 80, "targetPort": "http"}]}),
        ),
        (
            "headless",
            json!({"clusterIP": "None", "ports": [{"port": 5000}]}),
        ),
    ] {
        let service = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec});
        let answer = ask(&admin, http::Method::POST, &services, Some(&service)).await;
        let body = serde_json::from_str(&answer.body).unwrap();
        let mut body = comparable(body);
        if name == "headless" {
            assert_eq!(body["spec"]["clusterIP"], "None");
        }
        body["metadata"]["name"] = json!(name);
        record(&format!("create service {name}"), answer, body);
    }
    let slice = |name: &str, service: &str, endpoints: Value| {
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443, "appProtocol": "h2c"}],
            "endpoints": endpoints})
    };
    let ready = |ip: &str, ready: Option<bool>| {
        let mut endpoint = json!({"addresses": [ip],
            "targetRef": {"kind": "Pod", "name": format!("pod-{ip}"), "namespace": namespace}});
        if let Some(ready) = ready {
            endpoint["conditions"] = json!({"ready": ready});
        }
        endpoint
    };
    for (name, service, endpoints) in [
        (
            "web-a",
            "web",
            json!([ready("192.0.2.10", Some(true)), ready("192.0.2.11", None)]),
        ),
        ("web-b", "web", json!([ready("192.0.2.12", Some(false))])),
        ("edge-a", "edge", json!([ready("192.0.2.20", Some(true))])),
    ] {
        let answer = ask(
            &admin,
            http::Method::POST,
            &slices,
            Some(&slice(name, service, endpoints)),
        )
        .await;
        let body = comparable(serde_json::from_str(&answer.body).unwrap());
        record(&format!("create endpointslice {name}"), answer, body);
    }

    // The router's view: one cluster-wide list, by label too, then a watch from it.
    let all = ask(
        &router,
        http::Method::GET,
        "/apis/discovery.k8s.io/v1/endpointslices",
        None,
    )
    .await;
    let list: Value = serde_json::from_str(&all.body).unwrap();
    let from = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    let items = comparable_items(&all.body);
    record("router lists every endpointslice", all, items);
    let by_label = ask(
        &router,
        http::Method::GET,
        "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
        None,
    )
    .await;
    let items = comparable_items(&by_label.body);
    record("router lists the endpointslices of web", by_label, items);
    let by_name = ask(
        &router,
        http::Method::GET,
        &format!("{slices}?fieldSelector=metadata.name%3Dweb-b"),
        None,
    )
    .await;
    let items = comparable_items(&by_name.body);
    record("router lists web-b by name", by_name, items);
    let services_list = ask(&router, http::Method::GET, "/api/v1/services", None).await;
    let mut items = comparable_items(&services_list.body);
    // The real server's own `kubernetes` service in `default` is not the scenario's.
    items
        .as_array_mut()
        .unwrap()
        .retain(|s| s["metadata"]["namespace"] == namespace);
    record("router lists every service", services_list, items);

    let watch = router
        .request_events::<Value>(
            http::Request::get(format!(
                "/apis/discovery.k8s.io/v1/endpointslices?watch=true&resourceVersion={from}&timeoutSeconds=30"
            ))
            .body(Vec::new())
            .unwrap(),
        )
        .await
        .unwrap();
    // Changes: web-a's second endpoint turns not ready, web-b goes, web-c comes; a
    // label-only change of edge-a bumps its generation too.
    let mut web_a = slice(
        "web-a",
        "web",
        json!([
            ready("192.0.2.10", Some(true)),
            ready("192.0.2.11", Some(false))
        ]),
    );
    let current: Value = serde_json::from_str(
        &ask(&admin, http::Method::GET, &format!("{slices}/web-a"), None)
            .await
            .body,
    )
    .unwrap();
    web_a["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    let answer = ask(
        &admin,
        http::Method::PUT,
        &format!("{slices}/web-a"),
        Some(&web_a),
    )
    .await;
    let body = comparable(serde_json::from_str(&answer.body).unwrap());
    record("replace web-a", answer, body);
    let answer = ask(
        &admin,
        http::Method::DELETE,
        &format!("{slices}/web-b"),
        None,
    )
    .await;
    record(
        "delete web-b",
        Answer {
            body: String::new(),
            ..answer
        },
        json!(null),
    );
    let answer = ask(
        &admin,
        http::Method::POST,
        &slices,
        Some(&slice("web-c", "web", json!([ready("192.0.2.13", None)]))),
    )
    .await;
    let body = comparable(serde_json::from_str(&answer.body).unwrap());
    record("create web-c", answer, body);
    let patch = http::Request::patch(format!("{slices}/edge-a"))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&json!({"metadata": {"labels": {"tier": "edge"}}})).unwrap())
        .unwrap();
    let patched: Value = admin.request(patch).await.unwrap();
    record(
        "label edge-a",
        Answer {
            code: 200,
            content_type: String::new(),
            body: String::new(),
            retry_after: false,
        },
        comparable(patched),
    );
    let events: Vec<Value> = watch
        .take(4)
        .map(|event| {
            let (kind, object) = match event.unwrap() {
                WatchEvent::Added(o) => ("ADDED", o),
                WatchEvent::Modified(o) => ("MODIFIED", o),
                WatchEvent::Deleted(o) => ("DELETED", o),
                other => panic!("unexpected event {other:?}"),
            };
            let ready: Option<Vec<Value>> = object["endpoints"]
                .as_array()
                .map(|e| e.iter().map(|e| e["conditions"]["ready"].clone()).collect());
            json!({
                "type": kind,
                "name": object["metadata"]["name"],
                "generation": object["metadata"]["generation"],
                "ready": ready,
            })
        })
        .collect()
        .await;
    record(
        "router's watch from its list",
        Answer {
            code: 200,
            content_type: String::new(),
            body: String::new(),
            retry_after: false,
        },
        Value::Array(events),
    );

    // Refusals and invalid objects, byte for byte.
    for (what, client, method, path, body) in [
        (
            "router gets a service (it may only list and watch)",
            &router,
            http::Method::GET,
            format!("{services}/web"),
            None,
        ),
        (
            "router creates an endpointslice",
            &router,
            http::Method::POST,
            slices.clone(),
            Some(slice("web-d", "web", json!([ready("192.0.2.14", None)]))),
        ),
        (
            "list endpointslices by a field they do not have",
            &admin,
            http::Method::GET,
            "/apis/discovery.k8s.io/v1/endpointslices?fieldSelector=addressType%3DIPv4".to_string(),
            None,
        ),
        (
            "a service without ports",
            &admin,
            http::Method::POST,
            services.clone(),
            Some(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "bad-1", "namespace": namespace}, "spec": {}})),
        ),
        (
            "a service with bad ports and type",
            &admin,
            http::Method::POST,
            services.clone(),
            Some(json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "bad-2", "namespace": namespace},
                "spec": {"type": "Weird", "ports": [
                    {"port": 0, "name": "Bad_Name", "protocol": "XTP", "targetPort": "no_such!"},
                    {"port": 81}]}})),
        ),
        (
            "an endpointslice without address type",
            &admin,
            http::Method::POST,
            slices.clone(),
            Some(
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "bad-3", "namespace": namespace}}),
            ),
        ),
        (
            "an endpointslice with loopback, link-local and malformed addresses",
            &admin,
            http::Method::POST,
            slices.clone(),
            Some(
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "bad-4", "namespace": namespace},
                "addressType": "IPv4",
                "ports": [{"name": "A", "protocol": "XTP"}, {"name": "A"}],
                "endpoints": [{"addresses": ["127.0.0.1"]}, {"addresses": ["0.0.0.0"]},
                    {"addresses": ["169.254.1.1"]}, {"addresses": ["224.0.0.1"]},
                    {"addresses": ["10.0.0.01"]}, {"addresses": ["::1x"]},
                    {"addresses": ["fe80::1"]}, {"addresses": []}]}),
            ),
        ),
    ] {
        let answer = ask(client, method, &path, body.as_ref()).await;
        let body = json!({"content_type": answer.content_type, "text": answer.body});
        record(what, answer, body);
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_and_endpoint_slices_as_kube_apiserver_serves_them() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    // The router identity with the router's cluster role (services and EndpointSlices:
    // list and watch).
    sim.generate(&GenerateSpec::new(1, 1)).await;
    real.generate(&GenerateSpec::new(1, 1)).await;
    let on_sim = services_and_slices(&sim).await;
    let on_real = services_and_slices(&real).await;
    assert_eq!(on_sim.len(), on_real.len());
    let mut differ = Vec::new();
    for ((what, s), (_, r)) in on_sim.iter().zip(&on_real) {
        eprintln!("{what}: {r}");
        if s != r {
            differ.push(format!(
                "{what}:\n  kube-sim:       {s}\n  kube-apiserver: {r}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "kube-sim serves Services and EndpointSlices differently:\n{}",
        differ.join("\n")
    );
}

/// An answer with what differs between any two servers taken out of the objects in it
/// (uid, resourceVersion, creation time, managed fields); a `Status` stays as sent.
fn normalized(answer: &Answer) -> (u16, Value) {
    let mut body: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
    let strip = |object: &mut Value| {
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in [
                "uid",
                "resourceVersion",
                "creationTimestamp",
                "managedFields",
            ] {
                meta.remove(field);
            }
        }
    };
    if body["kind"] == "Status" {
        return (answer.code, Value::String(answer.body.clone()));
    }
    strip(&mut body);
    if let Some(object) = body.get_mut("object") {
        strip(object);
    }
    (answer.code, body)
}

/// The router's Lease traffic on one server, what → normalized answer: create, the
/// conflicts (exists, stale, unconditional), renewals, validation and decoding
/// errors, create-on-update, the watch a follower holds, and a namespace without grant.
async fn lease_answers(server: &Server) -> Vec<(String, (u16, Value))> {
    server.generate(&GenerateSpec::new(2, 1)).await;
    let router = server.client("router").await;
    let leases = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
        kube_sim::ROUTER_NAMESPACE
    );
    let lease = |name: &str, rv: Option<&str>, spec: Value| {
        let mut metadata = json!({"name": name});
        if let Some(rv) = rv {
            metadata["resourceVersion"] = json!(rv);
        }
        json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec})
    };
    let held_at = |holder: &str, renewed: &str| {
        json!({"holderIdentity": holder, "leaseDurationSeconds": 15,
               "acquireTime": "2025-01-01T00:00:00.000001+02:00",
               "renewTime": renewed, "leaseTransitions": 0,
               "strategy": "OldestEmulationVersion"})
    };
    let held = |holder: &str| held_at(holder, "2025-01-01T00:00:01.500000Z");
    let mut answers = Vec::new();
    let mut record = |what: &str, answer: &Answer| {
        answers.push((what.to_owned(), normalized(answer)));
    };
    let named = format!("{leases}/writer");
    record(
        "get a missing lease",
        &ask(&router, http::Method::GET, &named, None).await,
    );
    let created = ask(
        &router,
        http::Method::POST,
        &leases,
        Some(&lease("writer", None, held("a"))),
    )
    .await;
    record("create", &created);
    let created_rv =
        serde_json::from_str::<Value>(&created.body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
    record(
        "create again",
        &ask(
            &router,
            http::Method::POST,
            &leases,
            Some(&lease("writer", None, held("b"))),
        )
        .await,
    );
    record(
        "update without a resourceVersion",
        &ask(
            &router,
            http::Method::PUT,
            &named,
            Some(&lease("writer", None, held("b"))),
        )
        .await,
    );
    // A follower's watch on the lease, from the version it read.
    let watch_path = format!(
        "{leases}?watch=true&fieldSelector=metadata.name%3Dwriter&resourceVersion={created_rv}&timeoutSeconds=30"
    );
    let watch_request = http::Request::get(&watch_path)
        .header("accept", "application/json")
        .body(kube::client::Body::empty())
        .unwrap();
    let watch = router.send(watch_request).await.unwrap();
    let renewed = ask(
        &router,
        http::Method::PUT,
        &named,
        Some(&lease(
            "writer",
            Some(&created_rv),
            held_at("a", "2025-01-01T00:00:03.500000Z"),
        )),
    )
    .await;
    record("renew", &renewed);
    record(
        "take over with the stale version",
        &ask(
            &router,
            http::Method::PUT,
            &named,
            Some(&lease("writer", Some(&created_rv), held("b"))),
        )
        .await,
    );
    let mut body = watch.into_body();
    let mut line = Vec::new();
    while !line.contains(&b'\n') {
        let frame = http_body_util::BodyExt::frame(&mut body)
            .await
            .unwrap()
            .unwrap();
        if let Ok(data) = frame.into_data() {
            line.extend_from_slice(&data);
        }
    }
    let mut event: Value =
        serde_json::from_slice(&line[..line.iter().position(|b| *b == b'\n').unwrap()]).unwrap();
    if let Some(meta) = event["object"]["metadata"].as_object_mut() {
        for field in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
        ] {
            meta.remove(field);
        }
    }
    record(
        "the follower's watch sees the renewal",
        &Answer {
            code: 200,
            content_type: String::new(),
            body: event.to_string(),
            retry_after: false,
        },
    );
    let mut zero = held("a");
    zero["leaseDurationSeconds"] = json!(0);
    zero["leaseTransitions"] = json!(-1);
    let renewed_rv =
        serde_json::from_str::<Value>(&renewed.body).unwrap()["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_owned();
    record(
        "renew with a zero duration",
        &ask(
            &router,
            http::Method::PUT,
            &named,
            Some(&lease("writer", Some(&renewed_rv), zero)),
        )
        .await,
    );
    for (what, time) in [
        ("a time without microseconds", "2025-01-01T00:00:01Z"),
        ("a time with milliseconds", "2025-01-01T00:00:01.123Z"),
        ("a time in month 13", "2025-13-01T00:00:01.000000Z"),
    ] {
        let mut spec = held("a");
        spec["renewTime"] = json!(time);
        record(
            what,
            &ask(
                &router,
                http::Method::POST,
                &leases,
                Some(&lease("other", None, spec)),
            )
            .await,
        );
    }
    let mut mistyped = held("a");
    mistyped["leaseDurationSeconds"] = json!("15");
    record(
        "a duration as a string",
        &ask(
            &router,
            http::Method::POST,
            &leases,
            Some(&lease("other", None, mistyped)),
        )
        .await,
    );
    record(
        "update of a missing lease creates it",
        &ask(
            &router,
            http::Method::PUT,
            &format!("{leases}/fresh"),
            Some(&lease("fresh", Some("12345"), held("c"))),
        )
        .await,
    );
    record(
        "a lease in a namespace without grant",
        &ask(
            &router,
            http::Method::GET,
            "/apis/coordination.k8s.io/v1/namespaces/default/leases/writer",
            None,
        )
        .await,
    );
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_answer_as_kube_apiserver_answers() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    let on_sim = lease_answers(&sim).await;
    let on_real = lease_answers(&real).await;
    assert_eq!(on_sim.len(), on_real.len());
    let mut differ = Vec::new();
    for ((what, s), (_, r)) in on_sim.iter().zip(&on_real) {
        eprintln!("{what}: {} {}", r.0, r.1);
        if s != r {
            differ.push(format!(
                "{what}:\n  kube-sim:       {s:?}\n  kube-apiserver: {r:?}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "kube-sim answers differently:\n{}",
        differ.join("\n")
    );
}

/// An answer to a route's creation, as both servers must give it: the code; for a
/// created route its spec (with the CRD's defaults); for a refusal the Status with its
/// causes sorted (kube-apiserver reports the properties of one schema in map order),
/// and its message only when there is a single cause.
fn comparable_route_answer(answer: &Answer) -> Value {
    let body: Value = serde_json::from_str(&answer.body).unwrap_or(Value::Null);
    if answer.code == 201 {
        return json!({"code": 201, "spec": body["spec"]});
    }
    let mut causes: Vec<Value> = body["details"]["causes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    causes.sort_by_key(|cause| cause.to_string());
    let message = (causes.len() == 1).then(|| body["message"].clone());
    json!({
        "code": answer.code,
        "reason": body["reason"],
        "details": {
            "name": body["details"]["name"],
            "group": body["details"]["group"],
            "kind": body["details"]["kind"],
            "causes": causes,
        },
        "message": message,
    })
}

/// Routes the Route CRD (its schema and CEL rules) accepts or refuses, on one server:
/// case → the answer to its creation.
async fn route_creations(server: &Server) -> Vec<(&'static str, Value)> {
    let admin = server.client("admin").await;
    let namespace = "routes-crd";
    let created = ask(
        &admin,
        http::Method::POST,
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})),
    )
    .await;
    assert_eq!(created.code, 201, "{}", created.body);
    let to = json!({"kind": "Service", "name": "app"});
    let edge_external = json!({"termination": "edge", "externalCertificate": {"name": "s"}});
    let cases: Vec<(&'static str, Value)> = vec![
        // Accepted by the CRD (and decided by the router, which refuses some).
        (
            "passthrough with an external certificate",
            json!({"host": "a.example", "to": to,
            "tls": {"termination": "passthrough", "externalCertificate": {"name": "s"}}}),
        ),
        (
            "edge with an external certificate",
            json!({"host": "b.example", "to": to, "tls": edge_external}),
        ),
        (
            "an inline key beside an external certificate",
            json!({"host": "c.example", "to": to,
            "tls": {"termination": "edge", "key": "k", "externalCertificate": {"name": "s"}}}),
        ),
        (
            "an upper-case host",
            json!({"host": "Upper.example", "to": {"name": "app"}}),
        ),
        (
            "an empty external certificate name",
            json!({"host": "d.example", "to": to,
            "tls": {"termination": "edge", "externalCertificate": {"name": ""}}}),
        ),
        (
            "an external certificate name that is no name",
            json!({"host": "e.example", "to": to,
            "tls": {"termination": "edge", "externalCertificate": {"name": "Not_A_Name"}}}),
        ),
        (
            "an external certificate without a name",
            json!({"host": "f.example", "to": to,
            "tls": {"termination": "edge", "externalCertificate": {}}}),
        ),
        (
            "reencrypt with a destination CA and an external certificate",
            json!({"host": "g.example",
            "to": to, "tls": {"termination": "reencrypt", "destinationCACertificate": "ca",
            "externalCertificate": {"name": "s"}}}),
        ),
        (
            "alternate backends defaulted",
            json!({"host": "h.example", "to": {"name": "app"},
            "alternateBackends": [{"name": "canary", "weight": 10}, {"name": "other"}]}),
        ),
        // Refused by the CEL rules.
        (
            "an empty certificate beside an external certificate",
            json!({"host": "i.example", "to": to,
            "tls": {"termination": "edge", "certificate": "", "externalCertificate": {"name": "s"}}}),
        ),
        (
            "a certificate beside an external certificate",
            json!({"host": "j.example", "to": to,
            "tls": {"termination": "edge", "certificate": "c", "externalCertificate": {"name": "s"}}}),
        ),
        (
            "passthrough allowing plain HTTP",
            json!({"host": "k.example", "to": to,
            "tls": {"termination": "passthrough", "insecureEdgeTerminationPolicy": "Allow"}}),
        ),
        // Refused by the schema.
        (
            "passthrough with a key and a CA",
            json!({"host": "l.example", "to": to,
            "tls": {"termination": "passthrough", "key": "k", "caCertificate": "c"}}),
        ),
        (
            "edge with a destination CA",
            json!({"host": "m.example", "to": to,
            "tls": {"termination": "edge", "destinationCACertificate": "ca"}}),
        ),
        (
            "passthrough with a path",
            json!({"host": "n.example", "path": "/x", "to": to,
            "tls": {"termination": "passthrough"}}),
        ),
        (
            "a wildcard route without a host",
            json!({"to": to, "wildcardPolicy": "Subdomain"}),
        ),
        (
            "a host that is no DNS name",
            json!({"host": "a_b.example", "to": to}),
        ),
        (
            "a path without a slash",
            json!({"host": "o.example", "path": "x", "to": to}),
        ),
        (
            "an unknown termination",
            json!({"host": "p.example", "to": to, "tls": {"termination": "quantum"}}),
        ),
        (
            "no termination",
            json!({"host": "q.example", "to": to, "tls": {}}),
        ),
        (
            "an unknown insecure policy",
            json!({"host": "r.example", "to": to,
            "tls": {"termination": "edge", "insecureEdgeTerminationPolicy": "Sometimes"}}),
        ),
        (
            "an unknown wildcard policy",
            json!({"host": "s.example", "to": to, "wildcardPolicy": "Some"}),
        ),
        ("no target", json!({"host": "t.example"})),
    ];
    let routes = format!("/apis/route.openshift.io/v1/namespaces/{namespace}/routes");
    let mut answers = Vec::new();
    for (index, (what, spec)) in cases.into_iter().enumerate() {
        let body = json!({
            "apiVersion": "route.openshift.io/v1",
            "kind": "Route",
            "metadata": {"name": format!("route-{index}")},
            "spec": spec,
        });
        let answer = ask(&admin, http::Method::POST, &routes, Some(&body)).await;
        answers.push((what, comparable_route_answer(&answer)));
    }
    answers
}

/// kube-sim validates routes as the real Route CRD does (its OpenAPI schema and CEL
/// rules, with kube-apiserver's causes): what it accepts (a passthrough route with an
/// external certificate, upper-case hosts, any external certificate name), what it
/// refuses and how it says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_are_validated_as_the_route_crd_validates_them() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    let on_sim = route_creations(&sim).await;
    let on_real = route_creations(&real).await;
    assert_eq!(on_sim.len(), on_real.len());
    let mut differ = Vec::new();
    for ((what, s), (_, r)) in on_sim.iter().zip(&on_real) {
        eprintln!("{what}: {r}");
        if s != r {
            differ.push(format!(
                "{what}:\n  kube-sim:       {s}\n  kube-apiserver: {r}"
            ));
        }
    }
    assert!(
        differ.is_empty(),
        "kube-sim validates routes differently:\n{}",
        differ.join("\n")
    );
}

/// The events a per-secret watch from the secret's own resourceVersion gets until the
/// server ends it at its `timeoutSeconds`, for each case (bookmarks allowed or not, the
/// timeout, whether another secret changes once the watch is open): each event's
/// type and whether its resourceVersion is the latest, consecutive equal ones once
/// (kube-apiserver may send its last bookmark twice).
async fn events_before_the_timeout(server: &Server) -> Vec<(String, Vec<String>)> {
    let cluster = server.generate(&GenerateSpec::new(2, 1)).await;
    let (own, other) = (&cluster.routes[0], &cluster.routes[1]);
    let admin = server.client("admin").await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &own.namespace);
    let others: Api<Secret> = Api::namespaced(admin.clone(), &other.namespace);
    let rv = |secret: &Secret| -> u64 {
        secret
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap()
    };
    let own_rv = rv(&secrets.get(&own.secret).await.unwrap());
    let mut latest = own_rv;
    let mut described = Vec::new();
    for (bookmarks, timeout, change) in [
        (true, 4, true),
        (false, 4, true),
        (true, 2, true),
        (true, 4, false),
    ] {
        let path = format!(
            "/api/v1/namespaces/{}/secrets?watch=true&fieldSelector=metadata.name%3D{}\
             &resourceVersion={own_rv}&timeoutSeconds={timeout}{}",
            own.namespace,
            own.secret,
            if bookmarks {
                "&allowWatchBookmarks=true"
            } else {
                ""
            }
        );
        let request = http::Request::get(&path)
            .header("accept", "application/json")
            .body(kube::client::Body::from(Vec::new()))
            .unwrap();
        // The answer's head comes once the watch is registered.
        let response = admin.send(request).await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "{path}");
        if change {
            let changed = others
                .patch(
                    &other.secret,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": {"changed": latest.to_string()}}})),
                )
                .await
                .unwrap();
            latest = rv(&changed);
        }
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap()
            .to_bytes();
        let mut events: Vec<String> = Vec::new();
        for line in String::from_utf8_lossy(&body).lines() {
            if line.trim().is_empty() {
                continue;
            }
            let event: Value = serde_json::from_str(line).unwrap();
            let at: u64 = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            let position = if at >= latest {
                "at or after the latest change"
            } else {
                "before the latest change"
            };
            let line = format!("{} {position}", event["type"].as_str().unwrap());
            if events.last() != Some(&line) {
                events.push(line);
            }
        }
        described.push((
            format!("allowWatchBookmarks={bookmarks} timeoutSeconds={timeout} change={change}"),
            events,
        ));
    }
    described
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_gets_a_bookmark_at_the_latest_version_before_its_timeout() {
    let real = Server::real(ControlPlaneOptions::from_env()).await;
    let sim = Server::sim(SimConfig::default()).await;
    let (on_sim, on_real) = tokio::join!(
        events_before_the_timeout(&sim),
        events_before_the_timeout(&real)
    );
    for (case, events) in &on_real {
        eprintln!("kube-apiserver, {case}: {events:?}");
    }
    assert_eq!(on_sim, on_real, "kube-sim's watches end differently");
    // What the comparison rests on: with bookmarks, room for one and a change since
    // the watch started, the last event is a bookmark that carries that change.
    assert_eq!(on_real[0].1, ["BOOKMARK at or after the latest change"]);
}
