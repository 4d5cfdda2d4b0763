//! The router's external-certificate pipeline: route events in, admitted and rejected
//! routes (with their TLS material) out.
//!
//! # Order, and why start-up is still one round trip
//!
//! Routes are applied one at a time, in order (the initial set oldest first), as a
//! router's controller applies them: a route is admitted or rejected only after every
//! route before it. Applying a route needs its secret's first sync and its access
//! review, one API round trip each. Done one after another that is the reference
//! router's O(N × latency) start-up.
//!
//! So the pipeline looks ahead: the moment a route enters the queue, its secret's watch
//! is started ([`SecretManager::prefetch`]) and its access review requested
//! ([`AccessChecker::prefetch`]). All of them run concurrently while the head of the
//! queue waits for its own; by the time the queue reaches a route, its secret is
//! usually in the cache. Start-up costs about one round trip for any number of routes.
//!
//! While the head waits, secret events of routes already applied are still handled, so
//! a slow secret never delays another route's certificate rotation.
//!
//! # What happens to a route
//!
//! * Added, or modified with another secret: the old secret is released, the new one
//!   checked (name, access, existence, type, TLS material) and registered.
//! * Modified with the same secret: re-validated (access and the cached secret).
//!   Changes to the status alone are ignored, so the router's own status writes do not
//!   loop back.
//! * Deleted, or no external certificate any more: its secret is released and the
//!   route reported [`RouteOutcome::Removed`].
//! * Its secret changes: re-validated. Deleted: rejected with
//!   `ExternalCertificateSecretDeleted`, and the watch is kept so that a re-creation is
//!   noticed and re-admits the route (`ExternalCertificateSecretRecreated`).
//! * A missing or invalid secret is rejected but stays watched, so fixing the secret
//!   admits the route. Transient failures and access denials are retried with backoff.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::{BoxFuture, OptionFuture};
use futures::{FutureExt, Stream, StreamExt};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Secret;
use kube_common::Verb;
use secret_monitor::{MonitorErrorKind, ObjectEvent, ObjectKey, TaggedSink};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tracing::{debug, info};

use crate::api::access::{AccessChecker, AccessDecision, AccessError};
use crate::api::manager::{ManagerError, SecretManager};
use crate::api::route_watch::RouteEvent;
use crate::api::status_writer::StatusWriter;
use crate::reason::{Reason, ValidationProblem};
use crate::route::admission::Admission;
use crate::route::{Route, RouteKey, validate_secret_name};
use crate::tls::{TlsRejection, TlsValidator, TlsWarning, ValidatedTls};

/// Options of a [`RoutePipeline`].
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Checks applied to the TLS material.
    pub validator: TlsValidator,
    /// The router identity, as named in rejection messages.
    pub identity: String,
    /// First delay before a route that failed for a transient reason is tried again.
    pub retry_min: Duration,
    /// Longest delay between such retries.
    pub retry_max: Duration,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            validator: TlsValidator::default(),
            identity: "the router".to_owned(),
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
        }
    }
}

/// A route the router serves, with its TLS material.
#[derive(Clone, Debug)]
pub struct AdmittedRoute {
    /// The route.
    pub route: RouteKey,
    /// `spec.host`.
    pub host: Option<String>,
    /// When the route was created; older routes win host conflicts.
    pub created: Option<Timestamp>,
    /// The secret the material comes from (in the route's namespace).
    pub secret: String,
    /// The validated certificate chain and key.
    pub tls: Arc<ValidatedTls>,
    /// Things to tell people (expiring soon, host not covered).
    pub warnings: Vec<TlsWarning>,
    /// Set when the admission follows a re-created secret.
    pub reason: Option<Reason>,
}

/// A route the router does not serve, and why.
#[derive(Clone, Debug)]
pub struct RejectedRoute {
    /// The route.
    pub route: RouteKey,
    /// `spec.host`.
    pub host: Option<String>,
    /// Why, with a message for people.
    pub reason: Reason,
}

/// What the pipeline decided about a route.
#[derive(Clone, Debug)]
pub enum RouteOutcome {
    /// Serve the route with this material (replaces any earlier material).
    Admitted(AdmittedRoute),
    /// Do not serve the route.
    Rejected(RejectedRoute),
    /// The route is gone, or no longer has an external certificate.
    Removed(RouteKey),
}

impl RouteOutcome {
    /// The route concerned.
    pub fn route(&self) -> &RouteKey {
        match self {
            Self::Admitted(admitted) => &admitted.route,
            Self::Rejected(rejected) => &rejected.route,
            Self::Removed(route) => route,
        }
    }
}

/// Start-up progress: ready once every route of the first listing has an outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Whether the first listing of routes has arrived.
    pub listed: bool,
    /// Routes in the first listing.
    pub initial_routes: usize,
    /// How many of them have been admitted, rejected, or found to need nothing.
    pub initial_done: usize,
}

impl Readiness {
    /// Whether every route present at start-up has been admitted or rejected.
    pub fn is_ready(&self) -> bool {
        self.listed && self.initial_done >= self.initial_routes
    }
}

/// What the pipeline produces, for the daemon to consume.
#[derive(Debug)]
pub struct PipelineOutputs {
    /// Every outcome, in the order decided.
    pub outcomes: mpsc::UnboundedReceiver<RouteOutcome>,
    /// Start-up progress.
    pub readiness: watch::Receiver<Readiness>,
}

/// Tags a secret event with the route and registration it belongs to, so that events
/// of a registration the route has since dropped are ignored.
type SecretTag = (RouteKey, u64);

/// The pipeline. Build it with [`RoutePipeline::new`], drive it with
/// [`RoutePipeline::run`].
pub struct RoutePipeline {
    manager: SecretManager,
    access: AccessChecker,
    status: Option<StatusWriter>,
    options: PipelineOptions,
    outcomes: mpsc::UnboundedSender<RouteOutcome>,
    readiness: watch::Sender<Readiness>,
    secret_events: mpsc::UnboundedSender<(SecretTag, ObjectEvent<Secret>)>,
    secret_receiver: mpsc::UnboundedReceiver<(SecretTag, ObjectEvent<Secret>)>,

    /// The latest copy of every route, as the route watch reported it.
    known: HashMap<RouteKey, Arc<Route>>,
    /// Routes waiting to be applied, in order, each at most once.
    queue: VecDeque<RouteKey>,
    queued: HashSet<RouteKey>,
    /// Queued routes to re-apply even though their spec did not change (retries).
    forced: HashSet<RouteKey>,
    /// What has been applied, per route.
    routes: HashMap<RouteKey, RouteState>,
    /// Routes of the first listing still without an outcome.
    initial_pending: Option<HashSet<RouteKey>>,
    /// Scheduled retries, by due time.
    retries: BTreeMap<(Instant, u64), RouteKey>,
    next_id: u64,
    /// Whether prefetch holds exist that should be released once the queue drains.
    prefetching: bool,
    /// Secrets validated by their prefetch tasks, ahead of the queue.
    prevalidated: Prevalidated,
}

/// TLS validations done on prefetch tasks (in parallel, while the queue waits for the
/// network), by secret. The lock guards the map only; validation happens outside it.
type Prevalidated = Arc<Mutex<HashMap<ObjectKey, Prevalidation>>>;

/// The outcome of validating one version of a secret, without a host.
struct Prevalidation {
    /// `(uid, resourceVersion)` of the secret validated.
    version: (String, String),
    result: Result<Arc<ValidatedTls>, TlsRejection>,
}

struct RouteState {
    /// The route as last applied. A route event with the same spec changed nothing the
    /// router cares about (e.g. the router's own status write).
    route: Arc<Route>,
    registration: Option<Registration>,
    /// `(uid, resourceVersion)` of the secret state last evaluated.
    seen: Option<(String, String)>,
    /// The secret was deleted; its re-creation is reported as such.
    secret_deleted: bool,
    /// What the consumer was last told.
    emitted: Option<Emitted>,
    /// Consecutive transient failures, for the retry backoff.
    attempts: u32,
}

struct Registration {
    secret: String,
    id: u64,
}

/// A summary of an outcome, to avoid telling the consumer the same thing twice.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Emitted {
    Admitted {
        fingerprint: [u8; 32],
        host: Option<String>,
        warnings: Vec<String>,
    },
    Rejected {
        reason: &'static str,
        message: String,
    },
}

/// A route whose apply needs the network: an access review and maybe a registration.
struct Plan {
    key: RouteKey,
    secret: String,
    /// A new registration id, when the route must (re-)register.
    register: Option<u64>,
}

/// The network part of applying a route, done.
struct Prepared {
    key: RouteKey,
    secret: String,
    register: Option<u64>,
    access: Result<AccessDecision, AccessError>,
    registered: Option<Result<(), ManagerError>>,
}

impl RoutePipeline {
    /// A pipeline registering secrets with `manager`, checking access with `access`,
    /// and recording outcomes in route status through `status` when given.
    pub fn new(
        manager: SecretManager,
        access: AccessChecker,
        status: Option<StatusWriter>,
        options: PipelineOptions,
    ) -> (Self, PipelineOutputs) {
        let (outcomes, outcome_receiver) = mpsc::unbounded_channel();
        let (readiness, readiness_receiver) = watch::channel(Readiness::default());
        let (secret_events, secret_receiver) = mpsc::unbounded_channel();
        let pipeline = Self {
            manager,
            access,
            status,
            options,
            outcomes,
            readiness,
            secret_events,
            secret_receiver,
            known: HashMap::new(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            forced: HashSet::new(),
            routes: HashMap::new(),
            initial_pending: None,
            retries: BTreeMap::new(),
            next_id: 1,
            prefetching: false,
            prevalidated: Arc::default(),
        };
        let outputs = PipelineOutputs {
            outcomes: outcome_receiver,
            readiness: readiness_receiver,
        };
        (pipeline, outputs)
    }

    /// Applies route events until the stream ends, handling secret events meanwhile.
    pub async fn run(mut self, events: impl Stream<Item = RouteEvent>) {
        let mut events = pin!(events);
        let mut head: Option<BoxFuture<'static, Prepared>> = None;
        loop {
            while head.is_none() {
                let Some(key) = self.queue.pop_front() else {
                    break;
                };
                self.queued.remove(&key);
                let forced = self.forced.remove(&key);
                if let Some(plan) = self.plan(key, forced) {
                    head = Some(self.prepare(plan).boxed());
                }
            }
            if head.is_none() && self.prefetching {
                // Every queued route has registered what it needs: prefetch holds on
                // secrets no route took up can go.
                self.manager.release_prefetched();
                self.prefetched_validations().clear();
                self.prefetching = false;
            }
            let next_retry = self.retries.first_key_value().map(|((at, _), _)| *at);
            tokio::select! {
                biased;
                Some((tag, event)) = self.secret_receiver.recv() => self.on_secret_event(tag, event),
                Some(prepared) = OptionFuture::from(head.as_mut()), if head.is_some() => {
                    head = None;
                    self.finish(prepared);
                }
                event = events.next() => match event {
                    Some(event) => self.on_route_event(event),
                    None => return,
                },
                () = sleep_until(next_retry), if next_retry.is_some() => self.fire_retries(),
            }
        }
    }

    fn on_route_event(&mut self, event: RouteEvent) {
        match event {
            RouteEvent::Listed(routes) => {
                let mut routes: Vec<Arc<Route>> = routes.into_iter().map(Arc::new).collect();
                // Oldest first, as a router applies them (ties by name for determinism).
                routes.sort_by_cached_key(|route| {
                    (
                        route.metadata.creation_timestamp.as_ref().map(|t| t.0),
                        route.key(),
                    )
                });
                let present: HashSet<RouteKey> =
                    routes.iter().filter_map(|route| route.key()).collect();
                let vanished: Vec<RouteKey> = self
                    .known
                    .keys()
                    .filter(|key| !present.contains(*key))
                    .cloned()
                    .collect();
                for key in vanished {
                    self.known.remove(&key);
                    self.enqueue(key);
                }
                for route in routes {
                    self.accept(route);
                }
                if self.initial_pending.is_none() {
                    info!(routes = present.len(), "initial route listing received");
                    self.readiness.send_modify(|readiness| {
                        readiness.listed = true;
                        readiness.initial_routes = present.len();
                    });
                    self.initial_pending = Some(present);
                }
            }
            RouteEvent::Applied(route) => self.accept(Arc::new(route)),
            RouteEvent::Deleted(route) => {
                if let Some(key) = route.key() {
                    self.known.remove(&key);
                    self.enqueue(key);
                }
            }
        }
    }

    /// Records the latest copy of a route, queues it, and starts the network work its
    /// apply will need.
    fn accept(&mut self, route: Arc<Route>) {
        let Some(key) = route.key() else {
            return;
        };
        if let Some(secret) = route.external_certificate_name()
            && validate_secret_name(secret).is_ok()
        {
            let registered = self
                .routes
                .get(&key)
                .and_then(|state| state.registration.as_ref())
                .is_some_and(|registration| registration.secret == secret);
            if !registered {
                let validations = Arc::clone(&self.prevalidated);
                let validator = self.options.validator.clone();
                let secret_key = ObjectKey::new(key.namespace.clone(), secret);
                self.manager
                    .prefetch_then(&key.namespace, secret, move |object| {
                        // Validating here spreads the CPU work of a start-up over the
                        // runtime's threads while the queue's head waits for the network.
                        let Some(version) = version(&object) else {
                            return;
                        };
                        let result = validator
                            .validate_secret(&object, None, Timestamp::now())
                            .map(Arc::new);
                        // The pipeline may have validated this version itself meanwhile:
                        // the first result recorded is the one every route shares.
                        let _recorded =
                            record_validation(&validations, secret_key, version, result);
                    });
                self.access.prefetch(&key.namespace, secret);
                self.prefetching = true;
            }
        }
        self.known.insert(key.clone(), route);
        self.enqueue(key);
    }

    fn enqueue(&mut self, key: RouteKey) {
        if self.queued.insert(key.clone()) {
            self.queue.push_back(key);
        }
    }

    /// Decides what applying the route takes; does everything that needs no network.
    fn plan(&mut self, key: RouteKey, forced: bool) -> Option<Plan> {
        debug!(route = %key, forced, "applying route");
        let Some(route) = self.known.get(&key).cloned() else {
            self.teardown(&key);
            return None;
        };
        let state = self
            .routes
            .entry(key.clone())
            .or_insert_with(|| RouteState {
                route: Arc::clone(&route),
                registration: None,
                seen: None,
                secret_deleted: false,
                emitted: None,
                attempts: 0,
            });
        let unchanged = state.route.spec == route.spec
            && (state.registration.is_some() || state.emitted.is_some());
        state.route = Arc::clone(&route);
        if unchanged && !forced {
            self.mark_done(&key);
            return None;
        }

        let Some(secret) = route.external_certificate_name().map(str::to_owned) else {
            self.release(&key);
            if self
                .routes
                .get(&key)
                .is_some_and(|state| state.emitted.is_some())
            {
                self.emit_removed(&key);
            }
            self.mark_done(&key);
            return None;
        };
        if let Err(error) = validate_secret_name(&secret) {
            self.release(&key);
            self.reject_validation(&key, &secret, ValidationProblem::InvalidSecretName(error));
            return None;
        }
        let inline = route.spec.tls.as_ref().is_some_and(|tls| {
            tls.certificate.as_deref().is_some_and(|c| !c.is_empty()) || tls.key.is_some()
        });
        if inline {
            self.release(&key);
            self.reject_validation(&key, &secret, ValidationProblem::InlineCertificateConflict);
            return None;
        }
        let same_secret = self
            .routes
            .get(&key)
            .and_then(|state| state.registration.as_ref())
            .is_some_and(|registration| registration.secret == secret);
        let register = if same_secret {
            None
        } else {
            self.release(&key);
            self.next_id += 1;
            Some(self.next_id)
        };
        Some(Plan {
            key,
            secret,
            register,
        })
    }

    /// The network part of applying a route: its access review (usually answered from
    /// the cache) and, when needed, its registration (usually joining a prefetched
    /// sync).
    fn prepare(&self, plan: Plan) -> impl Future<Output = Prepared> + Send + 'static {
        let access = self.access.clone();
        let manager = self.manager.clone();
        let sink = self.secret_events.clone();
        async move {
            let Plan {
                key,
                secret,
                register,
            } = plan;
            let decision = access.check(&key.namespace, &secret).await;
            let allowed = decision.as_ref().is_ok_and(AccessDecision::allowed);
            let registered = match register {
                Some(id) if allowed => {
                    let sink = TaggedSink::new((key.clone(), id), sink);
                    Some(manager.register_route(&key, &secret, sink).await)
                }
                _ => None,
            };
            Prepared {
                key,
                secret,
                register,
                access: decision,
                registered,
            }
        }
    }

    /// Completes a route's apply once its network part is done.
    fn finish(&mut self, prepared: Prepared) {
        let Prepared {
            key,
            secret,
            register,
            access,
            registered,
        } = prepared;
        debug!(route = %key, %secret, ?access, registered = ?registered.as_ref().map(|r| r.is_ok()), "route prepared");
        if let (Some(Ok(())), Some(id)) = (&registered, register)
            && let Some(state) = self.routes.get_mut(&key)
        {
            state.registration = Some(Registration {
                secret: secret.clone(),
                id,
            });
            state.seen = None;
            state.secret_deleted = false;
        }
        // A newer event for the route arrived while this was in flight: it is queued
        // again, and that apply (forced, in case the event changed nothing the plan
        // looks at, such as our own status write) decides with the latest route.
        if self.queued.contains(&key) {
            self.forced.insert(key);
            return;
        }

        match access {
            Err(error) => {
                self.release(&key);
                self.get_failed(
                    &key,
                    secret,
                    format!("cannot verify the router's access: {error}"),
                );
                return;
            }
            Ok(decision) if !decision.allowed() => {
                self.release(&key);
                // Denied means at least one verb is denied; name the first.
                let verb = decision.denied.first().copied().unwrap_or(Verb::Get);
                self.access_denied(&key, &secret, verb);
                return;
            }
            Ok(_) => {}
        }

        match registered {
            None | Some(Ok(())) => {}
            Some(Err(ManagerError::Secret { source, .. }))
                if matches!(source.kind(), MonitorErrorKind::Forbidden { .. }) =>
            {
                let verb = source.verb().unwrap_or(Verb::List);
                self.access_denied(&key, &secret, verb);
                return;
            }
            Some(Err(error)) => {
                self.get_failed(&key, secret, error.to_string());
                return;
            }
        }

        match self.manager.get_secret(&key) {
            Ok(object) => self.evaluate(&key, &object, false),
            Err(ManagerError::Secret { source, .. })
                if matches!(source.kind(), MonitorErrorKind::NotFound) =>
            {
                // Still watched: creating the secret admits the route.
                self.reject_validation(&key, &secret, ValidationProblem::SecretNotFound);
            }
            Err(error) => {
                self.get_failed(&key, secret, error.to_string());
            }
        }
    }

    fn on_secret_event(&mut self, (key, id): SecretTag, event: ObjectEvent<Secret>) {
        let Some(state) = self.routes.get_mut(&key) else {
            return;
        };
        let Some(registration) = &state.registration else {
            return;
        };
        if registration.id != id {
            return;
        }
        let secret = registration.secret.clone();
        match event {
            ObjectEvent::Added(object) | ObjectEvent::Updated { new: object, .. } => {
                if state.seen.is_some() && state.seen == version(&object) {
                    return;
                }
                let recreated = std::mem::take(&mut state.secret_deleted);
                self.evaluate(&key, &object, recreated);
            }
            ObjectEvent::Deleted(_) => {
                state.seen = None;
                state.secret_deleted = true;
                self.reject(
                    &key,
                    Reason::ExternalCertificateSecretDeleted {
                        route: key.clone(),
                        secret,
                    },
                );
            }
        }
    }

    /// Validates the secret's material for the route and reports the outcome.
    fn evaluate(&mut self, key: &RouteKey, secret: &Secret, recreated: bool) {
        let Some(state) = self.routes.get_mut(key) else {
            return;
        };
        let Some(secret_name) = state.registration.as_ref().map(|r| r.secret.clone()) else {
            return;
        };
        state.seen = version(secret);
        let seen = state.seen.clone();
        let route = Arc::clone(&state.route);
        let host = route.host().map(str::to_owned);
        let validated = self.validation(&key.namespace, &secret_name, secret, seen);
        match validated {
            Ok(tls) => {
                let reason = recreated.then(|| Reason::ExternalCertificateSecretRecreated {
                    route: key.clone(),
                    secret: secret_name.clone(),
                });
                let mut warnings = tls.warnings().to_vec();
                warnings.extend(host.as_deref().and_then(|host| tls.host_warning(host)));
                let admitted = AdmittedRoute {
                    route: key.clone(),
                    host,
                    created: route.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    secret: secret_name,
                    tls,
                    warnings,
                    reason,
                };
                if let Some(state) = self.routes.get_mut(key) {
                    state.attempts = 0;
                }
                self.emit(key, RouteOutcome::Admitted(admitted));
            }
            Err(rejection) => {
                self.reject_validation(key, &secret_name, ValidationProblem::Tls(rejection));
            }
        }
    }

    /// The validation of this version of the secret: the one its prefetch task made,
    /// or made now. Either way it is recorded, so that every route using this version
    /// shares one result (and one copy of the material).
    fn validation(
        &self,
        namespace: &str,
        name: &str,
        secret: &Secret,
        version: Option<(String, String)>,
    ) -> Result<Arc<ValidatedTls>, TlsRejection> {
        let key = ObjectKey::new(namespace, name);
        if let Some(version) = &version
            && let Some(found) = self.prefetched_validations().get(&key)
            && &found.version == version
        {
            return found.result.clone();
        }
        let result = self
            .options
            .validator
            .validate_secret(secret, None, Timestamp::now())
            .map(Arc::new);
        match version {
            Some(version) => record_validation(&self.prevalidated, key, version, result),
            None => result,
        }
    }

    fn prefetched_validations(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Prevalidation>> {
        lock(&self.prevalidated)
    }

    /// Rejects the route because the router may not use `verb` on its secret, and
    /// checks again later (a grant may come).
    fn access_denied(&mut self, key: &RouteKey, secret: &str, verb: Verb) {
        let identity = self.options.identity.clone();
        self.reject_validation(
            key,
            secret,
            ValidationProblem::AccessDenied { verb, identity },
        );
        self.schedule_retry(key);
    }

    /// Rejects the route because its secret could not be read or checked, and tries
    /// again later.
    fn get_failed(&mut self, key: &RouteKey, secret: String, detail: String) {
        self.reject(
            key,
            Reason::ExternalCertificateGetFailed {
                route: key.clone(),
                secret,
                detail,
            },
        );
        self.schedule_retry(key);
    }

    fn reject_validation(&mut self, key: &RouteKey, secret: &str, problem: ValidationProblem) {
        self.reject(
            key,
            Reason::ExternalCertificateValidationFailed {
                route: key.clone(),
                secret: secret.to_owned(),
                problem,
            },
        );
    }

    fn reject(&mut self, key: &RouteKey, reason: Reason) {
        let host = self
            .known
            .get(key)
            .and_then(|route| route.host())
            .map(str::to_owned);
        debug!(route = %key, reason = reason.name(), "route rejected: {reason}");
        self.emit(
            key,
            RouteOutcome::Rejected(RejectedRoute {
                route: key.clone(),
                host,
                reason,
            }),
        );
    }

    fn emit_removed(&mut self, key: &RouteKey) {
        if let Some(state) = self.routes.get_mut(key) {
            state.emitted = None;
        }
        // The consumer may be gone (daemon shutting down); nothing to do then.
        let _ = self.outcomes.send(RouteOutcome::Removed(key.clone()));
    }

    /// Sends an outcome unless it repeats the last one, records it in the route's
    /// status, and counts the route as done for readiness.
    fn emit(&mut self, key: &RouteKey, outcome: RouteOutcome) {
        let summary = match &outcome {
            RouteOutcome::Admitted(admitted) => Emitted::Admitted {
                fingerprint: admitted.tls.fingerprint().0,
                host: admitted.host.clone(),
                warnings: admitted.warnings.iter().map(ToString::to_string).collect(),
            },
            RouteOutcome::Rejected(rejected) => Emitted::Rejected {
                reason: rejected.reason.name(),
                message: rejected.reason.to_string(),
            },
            RouteOutcome::Removed(_) => {
                self.emit_removed(key);
                return;
            }
        };
        let admission = match &outcome {
            RouteOutcome::Admitted(AdmittedRoute {
                reason: Some(reason),
                ..
            }) => reason.admission(),
            RouteOutcome::Admitted(_) => Admission::admitted(),
            RouteOutcome::Rejected(rejected) => rejected.reason.admission(),
            RouteOutcome::Removed(_) => return,
        };
        let route = self.routes.get_mut(key).map(|state| {
            let repeated = state.emitted.as_ref() == Some(&summary);
            state.emitted = Some(summary);
            (repeated, Arc::clone(&state.route))
        });
        if let Some((false, route)) = route {
            if let Some(status) = &self.status {
                status.record(route, admission);
            }
            // The consumer may be gone (daemon shutting down); nothing to do then.
            let _ = self.outcomes.send(outcome);
        }
        // Counted as done only after its outcome is sent: a consumer that sees the
        // pipeline ready then has every outcome of the start-up set in its queue.
        self.mark_done(key);
    }

    /// The route was deleted: release its secret and tell the consumer.
    fn teardown(&mut self, key: &RouteKey) {
        self.release(key);
        if let Some(state) = self.routes.remove(key)
            && state.emitted.is_some()
        {
            let _ = self.outcomes.send(RouteOutcome::Removed(key.clone()));
        }
        self.retries.retain(|_, retry| retry != key);
        self.mark_done(key);
    }

    /// Drops the route's registration, if any.
    fn release(&mut self, key: &RouteKey) {
        let Some(state) = self.routes.get_mut(key) else {
            return;
        };
        if state.registration.take().is_some() {
            state.seen = None;
            state.secret_deleted = false;
            if let Err(error) = self.manager.unregister_route(key) {
                debug!(route = %key, %error, "route was not registered");
            }
        }
    }

    fn mark_done(&mut self, key: &RouteKey) {
        let Some(pending) = &mut self.initial_pending else {
            return;
        };
        if pending.remove(key) {
            self.readiness
                .send_modify(|readiness| readiness.initial_done += 1);
            if pending.is_empty() {
                info!("every route present at start-up has been admitted or rejected");
            }
        }
    }

    fn schedule_retry(&mut self, key: &RouteKey) {
        let Some(state) = self.routes.get_mut(key) else {
            return;
        };
        state.attempts = state.attempts.saturating_add(1);
        let exponent = state.attempts.saturating_sub(1).min(16);
        let delay = self
            .options
            .retry_min
            .saturating_mul(1 << exponent)
            .min(self.options.retry_max);
        // Up to a quarter of jitter, so that routes failing together retry apart.
        let jitter = delay.mul_f64(rand::random::<f64>() * 0.25);
        self.retries.retain(|_, retry| retry != key);
        self.next_id += 1;
        self.retries
            .insert((Instant::now() + delay + jitter, self.next_id), key.clone());
    }

    fn fire_retries(&mut self) {
        let now = Instant::now();
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let key = entry.remove();
            self.forced.insert(key.clone());
            self.enqueue(key);
        }
    }
}

/// Records `result` as the validation of `version` of the secret `key`, unless that
/// version already has one; returns the one recorded.
fn record_validation(
    validations: &Mutex<HashMap<ObjectKey, Prevalidation>>,
    key: ObjectKey,
    version: (String, String),
    result: Result<Arc<ValidatedTls>, TlsRejection>,
) -> Result<Arc<ValidatedTls>, TlsRejection> {
    let mut validations = lock(validations);
    match validations.get(&key) {
        Some(found) if found.version == version => found.result.clone(),
        _ => {
            validations.insert(
                key,
                Prevalidation {
                    version,
                    result: result.clone(),
                },
            );
            result
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section is a single map operation: a poisoned map is intact.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `(uid, resourceVersion)` of an object.
fn version(secret: &Secret) -> Option<(String, String)> {
    Some((
        secret.metadata.uid.clone()?,
        secret.metadata.resource_version.clone()?,
    ))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
