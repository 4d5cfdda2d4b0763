//! End to end against a real control plane: `certwatch run` as a process, talking to a
//! real kube-apiserver + etcd (testenv) as the router's service account, with the real
//! Route CRD (its CEL rules and status subresource), real RBAC and real API Priority and
//! Fairness. Every scenario checks what certwatch did (files, `/metrics`, route status)
//! and what the server saw (its audit log: each of the router's requests, by verb,
//! resource and answer).

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    Certwatch, counted_429s, eventually, eventually_async, expected_bundle, metric_value,
    new_tls_data, read_or_empty, rotate_secret,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_sim::{GenerateSpec, GeneratedCluster};
use route_secrets::route::Route;
use route_secrets::route::admission::{admitted_condition, router_ingress};
use testenv::{AuditLog, ControlPlane, ControlPlaneOptions, Installer, ROUTER_USER};

/// Start-up of this many routes, one secret each, is what the start-up scenarios run.
const STARTUP_ROUTES: usize = 1_000;
/// ... spread over this many namespaces.
const STARTUP_NAMESPACES: usize = 10;

/// How long a start-up against a throttling server may take before the test gives up
/// (the machine is shared; this is a bound on a hang, never a performance check).
const THROTTLED_PATIENCE: Duration = Duration::from_secs(600);

/// Router name in route status.
const ROUTER_NAME: &str = "realcp";

/// A control plane with a generated cluster, and a directory for certwatch.
struct Scenario {
    control_plane: ControlPlane,
    admin: kube::Client,
    cluster: GeneratedCluster,
    temp: tempfile::TempDir,
}

impl Scenario {
    async fn start(options: ControlPlaneOptions, spec: GenerateSpec) -> Self {
        let control_plane = ControlPlane::start_with(options).await.unwrap();
        let admin = control_plane.admin_client().await.unwrap();
        let cluster = Installer::new(admin.clone()).generate(&spec).await.unwrap();
        Self {
            control_plane,
            admin,
            cluster,
            temp: tempfile::tempdir().unwrap(),
        }
    }

    fn cert_dir(&self) -> PathBuf {
        self.temp.path().join("certs")
    }

    /// `certwatch run` as the router (the kubeconfig's current context).
    fn certwatch(&self, args: &[&str]) -> Certwatch {
        Certwatch::start(
            self.control_plane.kubeconfig_path(),
            &self.cert_dir(),
            &self.temp.path().join("certwatch.log"),
            args,
        )
    }

    fn audit(&self) -> AuditLog {
        self.control_plane.audit().unwrap()
    }

    /// Every generated route's bundle holds its secret's chain and key.
    async fn assert_every_bundle_written(&self) {
        let secrets: BTreeMap<(String, String), Secret> = Api::<Secret>::all(self.admin.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|secret| {
                let key = (
                    secret.metadata.namespace.clone().unwrap_or_default(),
                    secret.metadata.name.clone().unwrap_or_default(),
                );
                (key, secret)
            })
            .collect();
        let cert_dir = self.cert_dir();
        for route in &self.cluster.routes {
            let secret = &secrets[&(route.namespace.clone(), route.secret.clone())];
            let path = bundle(&cert_dir, &route.namespace, &route.route);
            assert_eq!(
                read_or_empty(&path),
                expected_bundle(secret),
                "{}",
                path.display()
            );
        }
    }
}

fn bundle(cert_dir: &Path, namespace: &str, route: &str) -> PathBuf {
    cert_dir.join(format!("{namespace}:{route}.pem"))
}

/// Waits until certwatch is ready, for at most `patience`.
async fn wait_ready_within(certwatch: &Certwatch, patience: Duration) {
    let deadline = Instant::now() + patience;
    while !certwatch.is_ready() {
        assert!(
            Instant::now() < deadline,
            "certwatch not ready after {patience:?}:\n{}",
            certwatch.get("/readyz").1
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The router's requests for secrets, as the server answered them.
#[derive(Debug, Default)]
struct SecretRequests {
    /// Every request for a secret (any verb, any answer).
    total: usize,
    /// Of those, answered 429 (API Priority and Fairness).
    throttled: usize,
    /// Count by (verb, streaming list or not, code).
    by_kind: BTreeMap<(String, bool, u16), usize>,
    /// Secrets that got a successful list or watch.
    synced: BTreeSet<(String, String)>,
}

fn secret_requests(audit: &AuditLog) -> SecretRequests {
    let mut requests = SecretRequests::default();
    for request in audit
        .of_user(ROUTER_USER)
        .filter(|request| request.resource.as_deref() == Some("secrets"))
    {
        let code = request.code.unwrap_or(0);
        requests.total += 1;
        if code == 429 {
            requests.throttled += 1;
        }
        *requests
            .by_kind
            .entry((request.verb.clone(), request.is_streaming_list(), code))
            .or_insert(0) += 1;
        if code == 200
            && (request.verb == "list" || request.verb == "watch")
            && let (Some(namespace), Some(name)) = (&request.namespace, &request.name)
        {
            requests.synced.insert((namespace.clone(), name.clone()));
        }
    }
    requests
}

/// Access reviews the router asked for, by resource (`selfsubjectrulesreviews`, ...),
/// answered 201.
fn access_reviews(audit: &AuditLog) -> BTreeMap<String, usize> {
    let mut reviews = BTreeMap::new();
    for request in audit.of_user(ROUTER_USER).filter(|request| {
        request.verb == "create"
            && request.code == Some(201)
            && request.resource.as_deref().is_some_and(|resource| {
                resource.ends_with("accessreviews") || resource.ends_with("rulesreviews")
            })
    }) {
        *reviews
            .entry(request.resource.clone().unwrap_or_default())
            .or_insert(0) += 1;
    }
    reviews
}

fn distinct_secrets(cluster: &GeneratedCluster) -> BTreeSet<(String, String)> {
    cluster.distinct_secrets().into_iter().collect()
}

/// Checks a start-up of the generated cluster: ready, every route admitted, every bundle
/// written, every secret synced, one access review per namespace; returns what the
/// server saw of the secrets.
async fn check_startup(scenario: &Scenario, certwatch: &Certwatch) -> SecretRequests {
    let routes = scenario.cluster.routes.len() as f64;
    let metrics = certwatch.metrics();
    assert_eq!(
        metric_value(&metrics, "certwatch_routes_admitted"),
        Some(routes),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "certwatch_watched_secrets"),
        Some(scenario.cluster.secrets as f64),
        "{metrics}"
    );
    scenario.assert_every_bundle_written().await;
    let audit = scenario.audit();
    let requests = secret_requests(&audit);
    assert_eq!(
        requests.synced,
        distinct_secrets(&scenario.cluster),
        "every secret, and only those, was listed or watched"
    );
    let reviews = access_reviews(&audit);
    // The figures, for whoever reads the output (--nocapture).
    eprintln!(
        "router's secret requests by (verb, streaming, code): {:?}; access reviews: {reviews:?}; all: {:?}",
        requests.by_kind,
        audit.summary(ROUTER_USER)
    );
    assert_eq!(
        reviews,
        BTreeMap::from([(
            "selfsubjectrulesreviews".to_owned(),
            scenario.cluster.namespaces.len()
        )]),
        "one rules review per namespace"
    );
    requests
}

/// Starts a control plane with `options` and the start-up cluster, runs certwatch on it
/// until ready, and checks the start-up ([`check_startup`]).
async fn start_up(options: ControlPlaneOptions) -> (Scenario, Certwatch, SecretRequests) {
    let scenario = Scenario::start(
        options,
        GenerateSpec::new(STARTUP_ROUTES, STARTUP_NAMESPACES),
    )
    .await;
    start_up_on(scenario).await
}

/// Runs certwatch on the scenario until ready and checks the start-up
/// ([`check_startup`]).
async fn start_up_on(scenario: Scenario) -> (Scenario, Certwatch, SecretRequests) {
    let certwatch = scenario.certwatch(&[]);
    wait_ready_within(&certwatch, THROTTLED_PATIENCE).await;
    let requests = check_startup(&scenario, &certwatch).await;
    (scenario, certwatch, requests)
}

/// 1,000 routes on a server with streaming lists: ready with every route admitted and
/// about one request per secret (a streaming list that stays open as the watch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_of_1000_routes_costs_one_request_per_secret() {
    let (scenario, _certwatch, requests) = start_up(ControlPlaneOptions::from_env()).await;
    let secrets = scenario.cluster.secrets;
    let answered = requests.total - requests.throttled;
    assert!(
        answered <= secrets + 100,
        "{answered} secret requests answered (not 429) for {secrets} secrets: {:?}",
        requests.by_kind
    );
    assert_eq!(
        requests
            .by_kind
            .get(&("watch".to_owned(), true, 200))
            .copied(),
        Some(secrets),
        "one streaming list per secret: {:?}",
        requests.by_kind
    );
}

/// A server without streaming lists (WatchList off: 422): certwatch falls back to list
/// + watch for every secret at once, so start-up costs at most 2N + 100 answered requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_without_streaming_lists_costs_at_most_two_requests_per_secret() {
    let (scenario, _certwatch, requests) =
        start_up(ControlPlaneOptions::from_env().apiserver_flag("--feature-gates=WatchList=false"))
            .await;
    let secrets = scenario.cluster.secrets;
    // 429s are the server's load (other control planes of the suite share the machine),
    // paced and counted by the adaptive limiter, not part of this budget.
    let answered = requests.total - requests.throttled;
    assert!(
        answered <= 2 * secrets + 100,
        "{answered} secret requests answered (not 429) for {secrets} secrets (budget 2N + 100): {:?}",
        requests.by_kind
    );
    assert_eq!(
        requests
            .by_kind
            .get(&("list".to_owned(), false, 200))
            .copied(),
        Some(secrets),
        "one list per secret: {:?}",
        requests.by_kind
    );
}

/// The priority level the throttling scenario puts the router in.
const TIGHT_PRIORITY_LEVEL: &str = "certwatch-test-tight";

/// Puts the router's requests in a priority level of one seat that rejects what it cannot
/// serve at once (no queues), so the router's burst of registrations meets 429s whatever
/// the machine's speed: queued requests (the built-in levels) are only rejected when
/// their wait times out, which a fast server never lets happen.
async fn confine_router_to_rejecting_level(admin: &kube::Client) {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let levels: Api<PriorityLevelConfiguration> = Api::all(admin.clone());
    let level: PriorityLevelConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": TIGHT_PRIORITY_LEVEL},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"}
            }
        }
    }))
    .unwrap();
    levels.create(&PostParams::default(), &level).await.unwrap();
    let schemas: Api<FlowSchema> = Api::all(admin.clone());
    let schema: FlowSchema = serde_json::from_value(serde_json::json!({
        "metadata": {"name": TIGHT_PRIORITY_LEVEL},
        "spec": {
            "priorityLevelConfiguration": {"name": TIGHT_PRIORITY_LEVEL},
            // Before the built-in service-accounts schema (9000) and the others that
            // could match the router.
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "User", "user": {"name": ROUTER_USER}}],
                "resourceRules": [{
                    "verbs": ["*"],
                    "apiGroups": ["*"],
                    "resources": ["*"],
                    "clusterScope": true,
                    "namespaces": ["*"]
                }],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]
            }]
        }
    }))
    .unwrap();
    schemas
        .create(&PostParams::default(), &schema)
        .await
        .unwrap();
    // The server applies new flow-control objects asynchronously: wait until the
    // schema says it found its level.
    eventually_async("the flow schema is in force", || async {
        schemas
            .get(TIGHT_PRIORITY_LEVEL)
            .await
            .ok()
            .and_then(|schema| schema.status)
            .and_then(|status| status.conditions)
            .is_some_and(|conditions| {
                conditions.iter().any(|condition| {
                    condition.type_ == "Dangling" && condition.status.as_deref() == Some("False")
                })
            })
            .then_some(())
    })
    .await;
}

/// A server with a small concurrency budget answers the router's burst with 429s
/// (API Priority and Fairness, a one-seat priority level that rejects rather than
/// queues); certwatch rides them out:
/// every route admitted, and its /metrics counts the 429s the server sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_under_a_small_apf_budget_rides_out_429s() {
    let scenario = Scenario::start(
        ControlPlaneOptions::from_env()
            .apiserver_flag("--max-requests-inflight=4")
            .apiserver_flag("--max-mutating-requests-inflight=2"),
        GenerateSpec::new(STARTUP_ROUTES, STARTUP_NAMESPACES),
    )
    .await;
    confine_router_to_rejecting_level(&scenario.admin).await;
    let (scenario, certwatch, _) = start_up_on(scenario).await;

    let audit = scenario.audit();
    let throttled_by_server = audit
        .of_user(ROUTER_USER)
        .filter(|request| request.code == Some(429))
        .count();
    assert!(
        throttled_by_server > 0,
        "the budget is small enough that the server throttled the router: {:?}",
        audit.summary(ROUTER_USER)
    );
    let server_metrics = scenario.control_plane.metrics().await.unwrap();
    assert!(
        server_metrics
            .rejected_by_priority_level()
            .get(TIGHT_PRIORITY_LEVEL)
            .is_some_and(|rejected| *rejected > 0.0),
        "API Priority and Fairness rejected requests of {TIGHT_PRIORITY_LEVEL}: {:?}",
        server_metrics.rejected_by_priority_level()
    );
    // certwatch counted every 429 it got (by resource, verb and code).
    let metrics = certwatch.metrics();
    assert_eq!(
        counted_429s(&metrics),
        throttled_by_server as u64,
        "certwatch's /metrics counts the 429s the server sent:\n{metrics}"
    );
}

/// A secret rotated, deleted and re-created: the bundle follows, and the route's status
/// (written through the real status subresource) says why. The status writes keep the
/// route's labels, annotations and managed fields, though certwatch keeps no managed
/// fields in its copy of the route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_rotation_deletion_and_recreation() {
    let scenario = Scenario::start(ControlPlaneOptions::from_env(), GenerateSpec::new(4, 2)).await;
    let route = scenario.cluster.routes[0].clone();
    let routes: Api<Route> = Api::namespaced(scenario.admin.clone(), &route.namespace);
    let labelled = routes
        .patch(
            &route.route,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {
                    "labels": {"team": "shop"},
                    "annotations": {"example.com/owner": "shop-team"}
                }
            })),
        )
        .await
        .unwrap();
    let managers = |route: &Route| -> BTreeSet<(String, String)> {
        route
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|entry| entry.subresource.is_none())
            .map(|entry| {
                let manager = entry.manager.clone().unwrap_or_default();
                (manager, entry.operation.clone().unwrap_or_default())
            })
            .collect()
    };
    let spec_managers = managers(&labelled);
    assert!(!spec_managers.is_empty(), "{:?}", labelled.metadata);

    let certwatch = scenario.certwatch(&["--write-status", "--router-name", ROUTER_NAME]);
    wait_ready_within(&certwatch, THROTTLED_PATIENCE).await;
    scenario.assert_every_bundle_written().await;
    wait_for_admission(&routes, &route.route, true, None).await;
    let written = routes.get(&route.route).await.unwrap();
    assert_eq!(written.metadata.labels, labelled.metadata.labels);
    assert_eq!(written.metadata.annotations, labelled.metadata.annotations);
    assert_eq!(managers(&written), spec_managers, "{:?}", written.metadata);
    let cert_dir = scenario.cert_dir();
    let secrets: Api<Secret> = Api::namespaced(scenario.admin.clone(), &route.namespace);
    let path = bundle(&cert_dir, &route.namespace, &route.route);

    // Rotation reaches the bundle.
    let rotated = rotate_secret(
        &scenario.admin,
        &route.namespace,
        &route.secret,
        &route.host,
    )
    .await;
    let expected = expected_bundle(&rotated);
    eventually("the rotated certificate in the bundle", || {
        (read_or_empty(&path) == expected).then_some(())
    })
    .await;

    // Deletion takes the route out, and its status says why.
    secrets
        .delete(&route.secret, &DeleteParams::default())
        .await
        .unwrap();
    eventually("the bundle removed", || (!path.exists()).then_some(())).await;
    wait_for_admission(
        &routes,
        &route.route,
        false,
        Some("ExternalCertificateValidationFailed"),
    )
    .await;

    // Re-creation brings it back, with the new certificate.
    let mut recreated = Secret {
        data: Some(new_tls_data(&route.host)),
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    };
    recreated.metadata.name = Some(route.secret.clone());
    let recreated = secrets
        .create(&PostParams::default(), &recreated)
        .await
        .unwrap();
    let expected = expected_bundle(&recreated);
    eventually("the re-created certificate in the bundle", || {
        (read_or_empty(&path) == expected).then_some(())
    })
    .await;
    wait_for_admission(&routes, &route.route, true, None).await;
    let rewritten = routes.get(&route.route).await.unwrap();
    assert_eq!(rewritten.metadata.labels, labelled.metadata.labels);
    assert_eq!(
        rewritten.metadata.annotations,
        labelled.metadata.annotations
    );
    assert_eq!(
        managers(&rewritten),
        spec_managers,
        "{:?}",
        rewritten.metadata
    );
    assert_status_writes_accepted(&scenario.audit());
}

/// A route whose secret the router may not read is rejected, with the reason in its
/// status (validated by the CRD's rules); others are admitted; a grant added later
/// admits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_then_granted_with_status_on_the_real_crd() {
    let scenario = Scenario::start(ControlPlaneOptions::from_env(), GenerateSpec::new(6, 2)).await;
    // A namespace with a route and its secret, and no grant for the router.
    let installer = Installer::new(scenario.admin.clone());
    let namespace = "locked";
    installer.namespace(namespace).await.unwrap();
    let host = "shop.locked.apps.example";
    let now = jiff::Timestamp::now();
    let leaf = route_secrets::testing::Pki::new(now)
        .issue(&route_secrets::testing::LeafSpec::new(host, now));
    installer
        .create_all(vec![leaf.secret(namespace, "shop-tls")])
        .await
        .unwrap();
    installer
        .create_all(vec![
            route_secrets::testing::route_with_external_certificate(
                namespace, "shop", host, "shop-tls",
            ),
        ])
        .await
        .unwrap();

    let certwatch = scenario.certwatch(&[
        "--write-status",
        "--router-name",
        ROUTER_NAME,
        "--access-denied-ttl",
        "1s",
    ]);
    wait_ready_within(&certwatch, THROTTLED_PATIENCE).await;
    scenario.assert_every_bundle_written().await;
    let locked_bundle = bundle(&scenario.cert_dir(), namespace, "shop");
    assert!(
        !locked_bundle.exists(),
        "no bundle for a secret the router may not read"
    );

    // Every generated route is Admitted in its status; the locked one is not, and says why.
    for route in &scenario.cluster.routes {
        let routes: Api<Route> = Api::namespaced(scenario.admin.clone(), &route.namespace);
        wait_for_admission(&routes, &route.route, true, None).await;
    }
    let locked_routes: Api<Route> = Api::namespaced(scenario.admin.clone(), namespace);
    wait_for_admission(
        &locked_routes,
        "shop",
        false,
        Some("ExternalCertificateValidationFailed"),
    )
    .await;

    // The grant admits it.
    installer
        .grant_router_secrets(namespace, &["shop-tls"])
        .await
        .unwrap();
    let expected = leaf.data();
    let mut expected_file = expected["tls.crt"].0.clone();
    if !expected_file.ends_with(b"\n") {
        expected_file.push(b'\n');
    }
    expected_file.extend_from_slice(&expected["tls.key"].0);
    eventually("the granted route's bundle", || {
        (read_or_empty(&locked_bundle) == expected_file).then_some(())
    })
    .await;
    wait_for_admission(&locked_routes, "shop", true, None).await;
    assert_status_writes_accepted(&scenario.audit());
}

/// Waits until route `name`'s status for this router says Admitted=`admitted` (with
/// `reason`, when given).
async fn wait_for_admission(routes: &Api<Route>, name: &str, admitted: bool, reason: Option<&str>) {
    let expected_status = if admitted { "True" } else { "False" };
    eventually_async(
        &format!("route {name} Admitted={expected_status} ({reason:?}) in its status"),
        || async {
            let route = routes.get(name).await.ok()?;
            let condition = admitted_condition(router_ingress(&route, ROUTER_NAME)?)?.clone();
            (condition.status.as_str() == expected_status
                && reason.is_none_or(|reason| condition.reason.as_deref() == Some(reason))
                && (admitted || condition.message.as_deref().is_some_and(|m| !m.is_empty())))
            .then_some(())
        },
    )
    .await;
}

/// Every status write of the router went through the status subresource and was
/// accepted (200), or lost a race (409) and was redone: none was refused by the CRD's
/// validation (422) or by RBAC (403).
fn assert_status_writes_accepted(audit: &AuditLog) {
    let writes: Vec<_> = audit
        .of_user(ROUTER_USER)
        .filter(|request| {
            request.resource.as_deref() == Some("routes")
                && request.verb != "list"
                && request.verb != "watch"
        })
        .collect();
    assert!(!writes.is_empty(), "certwatch wrote status");
    for write in &writes {
        assert_eq!(write.subresource.as_deref(), Some("status"), "{write:?}");
        assert!(
            matches!(write.code, Some(200 | 409)),
            "status write refused: {write:?}"
        );
    }
}
