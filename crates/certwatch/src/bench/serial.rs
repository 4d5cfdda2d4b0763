//! The `serial` strategy: a model of the reference router's start-up, to measure the
//! ratio rather than assume it.
//!
//! What the reference does per external-certificate route (openshift/router's route
//! validation and library-go's secret manager and monitor), reproduced request for
//! request:
//!
//! 1. three SubjectAccessReviews for the router's service account (`get`, `list`,
//!    `watch` on the secret's name), one after another;
//! 2. one GET of the secret, to check its type;
//! 3. registration with the secret monitor: under the monitor's global lock, a new
//!    per-secret informer LISTs the secret (`fieldSelector=metadata.name=…`) and the
//!    lock is held until that first sync is done; the informer then WATCHes from the
//!    list's resourceVersion in the background. A secret already monitored (shared by
//!    an earlier route) is joined without a request.
//!
//! Routes are applied one at a time, oldest first, as the router's controller feeds its
//! plugin chain. Each route therefore costs five sequential round trips plus a watch:
//! about six requests.
//!
//! Measuring every route at 1.4 s per request would take hours, so the strategy may
//! stop after a sample of routes (oldest first); the per-route time is reported, and any
//! figure for all routes is labelled as an extrapolation by the caller.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams, WatchParams};
use route_secrets::route::Route;
use route_secrets::tls::TlsValidator;
use secret_monitor::ObjectKey;
use tokio::task::JoinSet;

use super::BenchError;
use super::protocol::{ClientSpec, ErrorLog, ReadyReport};

/// The verbs the reference router checks, in its order.
const VERBS: [&str; 3] = ["get", "list", "watch"];
/// The Kubernetes type of a TLS secret.
const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// Milliseconds since `started`.
fn ms_since(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The reference secret monitor's registry: which secrets have an informer, with the
/// cached object from the informer's first list.
struct ReferenceRegistry {
    /// The model's global lock. It guards the informer map and is, on purpose, held
    /// across each secret's first LIST: that is the reference behaviour being measured
    /// (OCPBUGS-77056). The product never holds a lock across a network wait.
    informers: tokio::sync::Mutex<HashMap<ObjectKey, Option<Arc<Secret>>>>,
    /// The informers' background watches.
    watches: std::sync::Mutex<JoinSet<()>>,
}

/// The reference router's state after start-up; dropping it closes the watches.
pub struct SerialRun {
    _registry: Arc<ReferenceRegistry>,
}

/// Time spent per kind of round trip, summed over the measured routes.
#[derive(Default)]
struct PhaseTotals {
    access_reviews_ms: u64,
    get_ms: u64,
    first_sync_ms: u64,
}

/// Applies routes one at a time, oldest first, as the reference router does, and
/// returns when the sample is done.
pub async fn run(
    client: kube::Client,
    spec: &ClientSpec,
    started: Instant,
    errors: ErrorLog,
) -> Result<(ReadyReport, SerialRun), BenchError> {
    let failed = |message: String| BenchError::Strategy {
        strategy: "serial",
        message,
    };
    let routes_api: Api<Route> = Api::all(client.clone());
    let mut routes = routes_api
        .list(&ListParams::default())
        .await
        .map_err(|e| failed(format!("cannot list routes: {e}")))?
        .items;
    let listed_ms = ms_since(started);
    routes.sort_by_cached_key(|route| {
        (
            route.metadata.creation_timestamp.as_ref().map(|t| t.0),
            route.key(),
        )
    });
    let sample = if spec.serial_routes == 0 {
        routes.len()
    } else {
        spec.serial_routes.min(routes.len())
    };

    let registry = Arc::new(ReferenceRegistry {
        informers: tokio::sync::Mutex::new(HashMap::new()),
        watches: std::sync::Mutex::new(JoinSet::new()),
    });
    let validator = TlsValidator::default();
    let mut totals = PhaseTotals::default();
    let (mut admitted, mut rejected) = (0, 0);
    let routes_started = Instant::now();
    for route in routes.iter().take(sample) {
        match apply_route(&client, &registry, &validator, route, &mut totals, &errors).await {
            Ok(()) => admitted += 1,
            Err(message) => {
                rejected += 1;
                errors.record(message);
            }
        }
    }
    let ready_ms = ms_since(started);
    let per_route_ms = if sample == 0 {
        0.0
    } else {
        routes_started.elapsed().as_secs_f64() * 1000.0 / sample as f64
    };
    let measured_secrets = registry.informers.lock().await.len();

    let mut phases = BTreeMap::new();
    phases.insert("routes_listed".to_owned(), listed_ms);
    phases.insert("access_reviews_total".to_owned(), totals.access_reviews_ms);
    phases.insert("secret_gets_total".to_owned(), totals.get_ms);
    phases.insert("first_syncs_total".to_owned(), totals.first_sync_ms);
    phases.insert("ready".to_owned(), ready_ms);
    Ok((
        ReadyReport {
            ready_ms,
            measured_routes: sample,
            measured_secrets,
            admitted,
            rejected,
            phases,
            per_route_ms: Some(per_route_ms),
        },
        SerialRun {
            _registry: registry,
        },
    ))
}

/// One route, as the reference router applies it. Errors are rejection messages.
async fn apply_route(
    client: &kube::Client,
    registry: &Arc<ReferenceRegistry>,
    validator: &TlsValidator,
    route: &Route,
    totals: &mut PhaseTotals,
    errors: &ErrorLog,
) -> Result<(), String> {
    let key = route
        .key()
        .ok_or_else(|| "a route without namespace or name".to_owned())?;
    let name = route
        .external_certificate_name()
        .ok_or_else(|| format!("route {key} has no external certificate"))?
        .to_owned();
    let namespace = key.namespace.clone();

    // 1. The router's service account must be allowed get, list and watch.
    let phase = Instant::now();
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    for verb in VERBS {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(kube_sim::ROUTER_USER.to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    format!("system:serviceaccounts:{}", kube_sim::ROUTER_NAMESPACE),
                    "system:authenticated".to_owned(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.clone()),
                    verb: Some(verb.to_owned()),
                    group: Some(String::new()),
                    resource: Some("secrets".to_owned()),
                    name: Some(name.clone()),
                    ..ResourceAttributes::default()
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let answer = reviews
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("route {key}: access review ({verb}) failed: {e}"))?;
        if !answer.status.is_some_and(|status| status.allowed) {
            return Err(format!(
                "route {key}: the router may not {verb} secret {name}"
            ));
        }
    }
    totals.access_reviews_ms += elapsed_ms(phase);

    // 2. The secret must exist and be a TLS secret.
    let phase = Instant::now();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets
        .get(&name)
        .await
        .map_err(|e| format!("route {key}: cannot get secret {name}: {e}"))?;
    if secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
        return Err(format!(
            "route {key}: secret {name} is not {TLS_SECRET_TYPE}"
        ));
    }
    totals.get_ms += elapsed_ms(phase);

    // 3. Register with the monitor: first sync under the global lock.
    let phase = Instant::now();
    let object_key = ObjectKey::new(namespace.clone(), name.clone());
    let cached = {
        let mut informers = registry.informers.lock().await;
        match informers.get(&object_key) {
            Some(cached) => cached.clone(),
            None => {
                let selector = format!("metadata.name={name}");
                let list = secrets
                    .list(&ListParams::default().fields(&selector))
                    .await
                    .map_err(|e| format!("route {key}: first sync of secret {name}: {e}"))?;
                let version = list.metadata.resource_version.clone().unwrap_or_default();
                let cached = list.items.into_iter().next().map(Arc::new);
                informers.insert(object_key, cached.clone());
                start_watch(registry, secrets.clone(), selector, version, errors.clone());
                cached
            }
        }
    };
    totals.first_sync_ms += elapsed_ms(phase);

    // The router copies the material from the informer's cache.
    let secret = cached.ok_or_else(|| format!("route {key}: secret {name} is not in the cache"))?;
    validator
        .validate_secret(&secret, route.host(), Timestamp::now())
        .map(drop)
        .map_err(|e| format!("route {key}: secret {name}: {e}"))
}

/// The informer's watch from the first list's resourceVersion, drained in the
/// background until the run is dropped.
fn start_watch(
    registry: &ReferenceRegistry,
    api: Api<Secret>,
    selector: String,
    version: String,
    errors: ErrorLog,
) {
    let mut watches = registry
        .watches
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    watches.spawn(async move {
        let params = WatchParams::default().fields(&selector);
        match api.watch(&params, &version).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    if let Err(error) = event {
                        errors.record(format!("watch {selector} failed: {error}"));
                        return;
                    }
                }
            }
            Err(error) => errors.record(format!("watch {selector} failed: {error}")),
        }
    });
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}
