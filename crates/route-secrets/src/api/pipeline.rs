//! The shell around the route state machine ([`crate::machine`]): it feeds the
//! machine route events, network results, secret changes and ticks, and performs the
//! effects the machine returns (prefetch, access checks, registrations, outcomes,
//! status writes). It decides nothing itself.
//!
//! ```text
//! route watch ──RouteEvent──▶ RoutePipeline::run ──Input──▶ RouteMachine::step
//!                                   ▲    │                         │
//!  secret changes (SecretMailbox) ──┘    └◀──────── Effect ────────┘
//!       prepared (access check, registration, cached secret)
//!       ticks (retries)
//! effects: Prefetch → SecretManager::prefetch_then + AccessChecker::prefetch
//!          Prepare  → AccessChecker::check, SecretManager::register, cache read
//!          Unregister → drop the SecretRegistration
//!          Emit / Readiness → the daemon's channels; RecordStatus → StatusWriter
//! ```
//!
//! The shell validates each secret version it hands the machine (the machine is pure
//! and gets the validation as data), sharing one validation per secret version among
//! the routes that use it and with the prefetch tasks, which validate ahead of the
//! queue on other threads.

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex, OnceLock};

use futures::future::{BoxFuture, OptionFuture};
use futures::{FutureExt, Stream, StreamExt};
use jiff::Timestamp;
use kube_common::backoff::BackoffPolicy;
use kube_common::hash::NameMap;
use kube_common::time::sleep_until;
use secret_monitor::{MonitorErrorKind, ObjectKey};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use crate::api::access::AccessChecker;
use crate::api::mailbox::{Change, SecretMailbox, Tag};
use crate::api::manager::{SecretManager, SecretRegistration};
use crate::api::route_watch::{RouteEvent, RouteWatchError};
use crate::api::status_writer::StatusWriter;
use crate::machine::dates::validation_holds;
pub use crate::machine::{AdmittedRoute, HostPolicy, Readiness, RejectedRoute, RouteOutcome, Sni};
use crate::machine::{
    Effect, Input, MachineOptions, PREFETCH_WINDOW, Preparation, Prepared, PreparedOutcome,
    RegistrationId, RouteMachine, SecretChange, SecretLookup, SecretVersion, SecretVersionId,
};
use crate::tls::{TlsRejection, TlsSecret, TlsValidator, ValidatedTls};

/// Options of a [`RoutePipeline`].
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    /// Checks applied to the TLS material.
    pub validator: TlsValidator,
    /// The router identity, as named in rejection messages.
    pub identity: String,
    /// Delays between retries of a route that failed for a transient reason.
    pub retry: BackoffPolicy,
    /// Which hosts are admitted (wildcard routes, namespace ownership of hosts).
    pub hosts: HostPolicy,
    /// How many outcomes wait at most for the consumer ([`OUTCOME_QUEUE`]).
    pub outcome_queue: usize,
    /// The router's domain, for routes with `spec.subdomain` and no `spec.host`.
    pub router_domain: Option<String>,
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            validator: TlsValidator::default(),
            identity: "the router".to_owned(),
            retry: BackoffPolicy::default(),
            hosts: HostPolicy::default(),
            outcome_queue: OUTCOME_QUEUE,
            router_domain: None,
        }
    }
}

/// How many outcomes wait at most for the consumer: a start-up's outcomes are taken in
/// batches of about this size while the consumer writes the previous batch.
pub const OUTCOME_QUEUE: usize = 1024;

/// What the pipeline produces, for the daemon to consume.
#[derive(Debug)]
pub struct PipelineOutputs {
    /// Every outcome, in the order decided, at most
    /// [`PipelineOptions::outcome_queue`] waiting.
    pub outcomes: mpsc::Receiver<RouteOutcome>,
    /// Start-up progress.
    pub readiness: watch::Receiver<Readiness>,
}

/// Why the pipeline stopped before its route events ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The route watch was refused for good (e.g. an invalid label selector).
    #[error(transparent)]
    RouteWatch(#[from] RouteWatchError),
}

/// What the pipeline's loop was woken by.
enum Received {
    /// An input that takes no turn (a network result, a tick).
    Input(Input),
    /// A route event.
    Route(Input),
    /// A secret change waits in the mailbox.
    Secret,
}

/// The pipeline. Build it with [`RoutePipeline::new`], drive it with
/// [`RoutePipeline::run`].
pub struct RoutePipeline {
    machine: RouteMachine,
    /// The API side: registrations, access checks, status writes.
    manager: SecretManager,
    access: AccessChecker,
    status: Option<StatusWriter>,
    /// Registrations the machine holds, by id (the machine knows whose they are).
    registrations: HashMap<RegistrationId, SecretRegistration>,
    validations: Validations,
    /// The consumer's side.
    outcomes: mpsc::Sender<RouteOutcome>,
    readiness: watch::Sender<Readiness>,
    /// Where registrations deliver their secret events.
    mailbox: SecretMailbox,
}

impl std::fmt::Debug for RoutePipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoutePipeline")
            .field("machine", &self.machine)
            .field("registrations", &self.registrations.len())
            .finish_non_exhaustive()
    }
}

/// The network part of an apply, done: the preparation and the raw results.
struct NetworkResult {
    preparation: Preparation,
    outcome: Result<Option<SecretRegistration>, PreparedOutcome>,
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
        let (outcomes, outcome_receiver) = mpsc::channel(options.outcome_queue.max(1));
        let (readiness, readiness_receiver) = watch::channel(Readiness::default());
        let machine = RouteMachine::new(MachineOptions {
            identity: options.identity,
            hosts: options.hosts,
            denial_recheck_min: options.retry.initial,
            retry: options.retry,
            seed: rand::random(),
            validator: options.validator.clone(),
            router_domain: options.router_domain.clone(),
            // Without a status writer the machine need not keep whole routes.
            record_status: status.is_some(),
            prefetch_window: PREFETCH_WINDOW,
        });
        let pipeline = Self {
            machine,
            manager,
            access,
            status,
            registrations: HashMap::new(),
            validations: Validations::new(options.validator),
            outcomes,
            readiness,
            mailbox: SecretMailbox::default(),
        };
        let outputs = PipelineOutputs {
            outcomes: outcome_receiver,
            readiness: readiness_receiver,
        };
        (pipeline, outputs)
    }

    /// Applies route events until the stream ends (`Ok`) or reports a permanent
    /// failure (`Err`), handling secret events and retries meanwhile.
    ///
    /// What is ready is taken in this order: the network result of the apply at the
    /// head of the queue and due retries (one of each at most), then route events and
    /// secret changes by turns when both wait, so that neither starves the other: a
    /// flood of secret changes delays a route event by one change at most.
    pub async fn run(
        mut self,
        events: impl Stream<Item = RouteEvent>,
    ) -> Result<(), PipelineError> {
        let mut events = pin!(events);
        let mut head: Option<BoxFuture<'static, NetworkResult>> = None;
        let mailbox = self.mailbox.clone();
        // Whose turn it is when a route event and a secret change both wait.
        let mut secrets_turn = false;
        // When this replica starts writing status, every outcome is recorded again.
        let mut leading = self
            .status
            .as_ref()
            .map(|status| status.leadership().subscribe());
        loop {
            let wakeup = self.machine.next_wakeup();
            let received = tokio::select! {
                biased;
                // First: the status writer holds every write from the start of leading
                // until this re-record has gone through.
                () = starts_leading(&mut leading) => Received::Input(Input::RecordAll),
                Some(done) = OptionFuture::from(head.as_mut()), if head.is_some() => {
                    head = None;
                    Received::Input(self.prepared_input(done))
                }
                () = sleep_until(wakeup.map(tokio::time::Instant::from_std)), if wakeup.is_some() => Received::Input(Input::Tick),
                () = mailbox.ready(), if secrets_turn => Received::Secret,
                event = events.next() => match event {
                    Some(RouteEvent::Listed(routes)) => Received::Route(Input::Listed(routes)),
                    Some(RouteEvent::Applied(route)) => Received::Route(Input::Applied(route)),
                    Some(RouteEvent::Deleted(route)) => Received::Route(Input::Deleted(route)),
                    Some(RouteEvent::Failed(error)) => return Err(error.into()),
                    None => return Ok(()),
                },
                () = mailbox.ready(), if !secrets_turn => Received::Secret,
            };
            let inputs = match received {
                Received::Input(input) => vec![input],
                Received::Route(input) => {
                    secrets_turn = true;
                    vec![input]
                }
                Received::Secret => {
                    secrets_turn = false;
                    match mailbox.take() {
                        Some((tag, change)) => self.secret_inputs(tag, change),
                        None => continue,
                    }
                }
            };
            for input in inputs {
                let rerecord = matches!(input, Input::RecordAll);
                let now = tokio::time::Instant::now().into_std();
                for effect in self.machine.step(input, now) {
                    if let Some(network) = self.perform(effect).await {
                        head = Some(network);
                    }
                }
                if rerecord && let Some(status) = &self.status {
                    status.rerecorded().await;
                }
            }
        }
    }

    /// Performs one effect; returns the network part of an apply, to be awaited. An
    /// outcome waits for room in the consumer's queue: a consumer that falls behind
    /// slows the pipeline down (its secret changes wait in the mailbox, one per
    /// registration, and its route events in the watch) instead of piling up outcomes.
    async fn perform(&mut self, effect: Effect) -> Option<BoxFuture<'static, NetworkResult>> {
        match effect {
            Effect::Prefetch(reference) => {
                let validations = self.validations.clone();
                self.manager
                    .prefetch_then(&reference.namespace, &reference.name, move |object| {
                        // Validating here spreads the CPU work of a start-up over the
                        // runtime's threads while the queue's head waits for the network.
                        let _shared = validations.version(&object);
                    });
                self.access.prefetch(&reference.namespace, &reference.name);
            }
            Effect::ReleasePrefetched => {
                // The validations stay: each registration's first change, which may
                // arrive after this, hands over the version already validated.
                self.manager.release_prefetched();
            }
            Effect::Prepare(preparation) => return Some(self.prepare(preparation).boxed()),
            Effect::Unregister(id) => {
                // Dropping the registration releases its hold on the watch.
                self.registrations.remove(&id);
            }
            Effect::Emit(outcome) => {
                debug!(route = %outcome.route(), outcome = outcome_name(&outcome), "route decided");
                // The consumer may be gone (daemon shutting down); nothing to do then.
                let _ = self.outcomes.send(*outcome).await;
            }
            Effect::RecordStatus { route, admission } => {
                if let Some(status) = &self.status {
                    status.record(route, admission).await;
                }
            }
            Effect::ClearStatus { route } => {
                if let Some(status) = &self.status {
                    status.clear(route).await;
                }
            }
            Effect::Readiness(readiness) => {
                if readiness.is_ready() && !self.readiness.borrow().is_ready() {
                    info!(
                        routes = readiness.initial_routes,
                        "every route present at start-up has been admitted or rejected"
                    );
                }
                self.readiness.send_replace(readiness);
            }
        }
        None
    }

    /// The network part of an apply: the access check on the referenced secret (usually
    /// answered from the cache) and, when allowed and asked for, the consumer's
    /// registration on its watch (usually joining a prefetched sync).
    fn prepare(
        &self,
        preparation: Preparation,
    ) -> impl Future<Output = NetworkResult> + Send + 'static {
        let access = self.access.clone();
        let manager = self.manager.clone();
        let mailbox = self.mailbox.clone();
        async move {
            let reference = preparation.reference.clone();
            let outcome = match access.check(&reference.namespace, &reference.name).await {
                Err(error) => Err(PreparedOutcome::AccessUnanswered {
                    detail: error.to_string(),
                }),
                Ok(decision) => match decision.denied.first() {
                    Some(&verb) => Err(PreparedOutcome::AccessDenied {
                        verb,
                        recheck_after: decision.recheck_after,
                    }),
                    None => match preparation.register {
                        None => Ok(None),
                        Some(id) => {
                            let sink = mailbox.sink((preparation.consumer.clone(), id));
                            match manager
                                .register(&reference.namespace, &reference.name, sink)
                                .await
                            {
                                Ok(registration) => Ok(Some(registration)),
                                Err(error) => Err(match error.kind() {
                                    MonitorErrorKind::Forbidden { verb, .. } => {
                                        PreparedOutcome::RegistrationForbidden { verb: *verb }
                                    }
                                    _ => PreparedOutcome::RegistrationFailed {
                                        detail: error.to_string(),
                                    },
                                }),
                            }
                        }
                    },
                },
            };
            NetworkResult {
                preparation,
                outcome,
            }
        }
    }

    /// Keeps a new registration, reads the secret from the cache, and tells the
    /// machine.
    fn prepared_input(&mut self, done: NetworkResult) -> Input {
        let NetworkResult {
            preparation,
            outcome,
        } = done;
        let outcome = match outcome {
            Err(outcome) => outcome,
            Ok(registration) => {
                if let (Some(id), Some(registration)) = (preparation.register, registration) {
                    self.registrations.insert(id, registration);
                }
                PreparedOutcome::Ready(self.lookup(preparation.read))
            }
        };
        Input::Prepared(Prepared {
            preparation,
            outcome,
        })
    }

    /// The secret as registration `id`'s watch cache holds it, validated.
    fn lookup(&self, id: RegistrationId) -> SecretLookup {
        let Some(registration) = self.registrations.get(&id) else {
            return SecretLookup::Failed {
                detail: format!("{id} is not held"),
            };
        };
        match registration.secret() {
            Ok(secret) => SecretLookup::Found(self.validations.version(&secret)),
            Err(error) if matches!(error.kind(), MonitorErrorKind::NotFound) => {
                SecretLookup::NotFound
            }
            Err(error) => SecretLookup::Failed {
                detail: error.to_string(),
            },
        }
    }

    /// The machine's input for a registration's change.
    fn secret_inputs(&self, (consumer, registration): Tag, change: Change) -> Vec<Input> {
        let change = match change {
            Change::Present(object) => SecretChange::Present(self.validations.version(&object)),
            Change::Deleted => {
                // The secret is gone: its validation (and the material it holds) goes
                // with it, so secrets created and deleted under new names leave
                // nothing behind.
                if let Some(held) = self.registrations.get(&registration) {
                    self.validations.forget(held.key());
                }
                SecretChange::Deleted
            }
        };
        vec![Input::Secret {
            consumer,
            registration,
            change,
        }]
    }
}

/// TLS validations by secret version: each version of a secret is validated once, and
/// every route using it shares the result (and one copy of the material). Prefetch
/// tasks fill it in parallel, ahead of the queue.
///
/// A prefetch task and the route's own registration are handed a new secret at the
/// same moment (both are sinks of the same watch), so both ask for its validation at
/// once: the first to ask validates, and the other waits for that result instead of
/// validating the same version a second time.
#[derive(Clone)]
struct Validations {
    validator: Arc<TlsValidator>,
    /// Guards the latest validation of each secret. Never held across an `.await`, nor
    /// while validating: only for a lookup or an insert.
    latest: Arc<Mutex<NameMap<ObjectKey, Validation>>>,
    /// For tests of the sharing: validations made, versions asked for, and how many
    /// asks a validation waits for before it starts (none when 0), so that callers
    /// asking at once overlap whatever the scheduling.
    #[cfg(test)]
    made: Arc<std::sync::atomic::AtomicUsize>,
    #[cfg(test)]
    asked: Arc<std::sync::atomic::AtomicUsize>,
    #[cfg(test)]
    hold_until_asked: Arc<std::sync::atomic::AtomicUsize>,
}

/// The latest validation of one secret: its version, and the result or where it will
/// be.
struct Validation {
    version: SecretVersionId,
    state: ValidationState,
}

enum ValidationState {
    /// Being validated now; whoever else asks for this version waits on the cell.
    Pending(Arc<OnceLock<Validated>>),
    /// Validated: the result, held without the cell (one allocation less per secret).
    Done(Validated),
}

/// The validation of one version of a secret, without a host.
#[derive(Clone)]
struct Validated {
    /// The rejection boxed: kept inline it would make every entry of the map (one per
    /// secret, nearly all of them accepted) as large as its largest variant.
    result: Result<Arc<ValidatedTls>, Box<TlsRejection>>,
    /// When it was validated: it holds until the certificate becomes valid or expires
    /// ([`validation_holds`]).
    at: Timestamp,
}

impl Validated {
    /// Whether the result still holds at `now`.
    fn holds(&self, now: Timestamp) -> bool {
        match &self.result {
            Ok(tls) => validation_holds(&Ok(Arc::clone(tls)), self.at, now),
            Err(_) => true,
        }
    }

    fn unboxed(&self) -> Result<Arc<ValidatedTls>, TlsRejection> {
        self.result.clone().map_err(|rejection| *rejection)
    }
}

/// What the map says about a version asked for.
enum Lookup {
    /// Validated, and the result still holds.
    Done(Validated),
    /// To be validated, or being validated, through this cell.
    Cell(Arc<OnceLock<Validated>>),
}

impl Validations {
    fn new(validator: TlsValidator) -> Self {
        Self {
            validator: Arc::new(validator),
            latest: Arc::default(),
            #[cfg(test)]
            made: Arc::default(),
            #[cfg(test)]
            asked: Arc::default(),
            #[cfg(test)]
            hold_until_asked: Arc::default(),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, NameMap<ObjectKey, Validation>> {
        // Every critical section is a single map operation: a poisoned map is intact.
        kube_common::sync::lock(&self.latest)
    }

    fn validate(&self, secret: &Arc<TlsSecret>, now: Timestamp) -> Validated {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering::SeqCst;
            self.made.fetch_add(1, SeqCst);
            let patience = std::time::Instant::now();
            while self.asked.load(SeqCst) < self.hold_until_asked.load(SeqCst)
                && patience.elapsed() < std::time::Duration::from_secs(30)
            {
                std::thread::yield_now();
            }
        }
        Validated {
            result: self
                .validator
                .validate_shared_secret(secret, None, now)
                .map(Arc::new)
                .map_err(Box::new),
            at: now,
        }
    }

    /// Drops what is recorded for the secret `key` (it was deleted). A validation under
    /// way for it still hands its result to those waiting on it.
    fn forget(&self, key: &ObjectKey) {
        self.map().remove(key);
    }

    /// The validated version of `secret`: the recorded validation of this version
    /// (unless its certificate became valid or expired since), the one under way for
    /// this version (waited for), or one made now and recorded.
    fn version(&self, secret: &Arc<TlsSecret>) -> SecretVersion {
        #[cfg(test)]
        self.asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let now = Timestamp::now();
        let handed_over = |id, validation| SecretVersion {
            id,
            validation,
            as_of: now,
        };
        let Some(id) = SecretVersionId::of(secret.as_ref()) else {
            return handed_over(None, self.validate(secret, now).unboxed());
        };
        let key = ObjectKey::new(
            secret.namespace().unwrap_or_default(),
            secret.name().unwrap_or_default(),
        );
        let lookup = {
            let mut latest = self.map();
            let found = latest.get(&key).filter(|found| found.version == id);
            match found.map(|found| &found.state) {
                Some(ValidationState::Done(done)) if done.holds(now) => Lookup::Done(done.clone()),
                Some(ValidationState::Pending(cell)) => Lookup::Cell(Arc::clone(cell)),
                _ => {
                    let cell = Arc::new(OnceLock::new());
                    latest.insert(
                        key.clone(),
                        Validation {
                            version: id.clone(),
                            state: ValidationState::Pending(Arc::clone(&cell)),
                        },
                    );
                    Lookup::Cell(cell)
                }
            }
        };
        let validated = match lookup {
            Lookup::Done(done) => done,
            Lookup::Cell(cell) => {
                // Blocks this thread while another validates the same version: at most
                // one validation's time, which this caller would otherwise spend
                // validating it again itself. A validation that panics leaves the cell
                // empty, and the next caller validates.
                let shared = cell.get_or_init(|| self.validate(secret, now));
                let validated = if shared.holds(now) {
                    shared.clone()
                } else {
                    self.validate(secret, now)
                };
                let mut latest = self.map();
                if let Some(found) = latest.get_mut(&key)
                    && found.version == id
                    && matches!(&found.state, ValidationState::Pending(pending) if Arc::ptr_eq(pending, &cell))
                {
                    found.state = ValidationState::Done(validated.clone());
                }
                validated
            }
        };
        handed_over(Some(id), validated.unboxed())
    }
}

fn outcome_name(outcome: &RouteOutcome) -> &'static str {
    match outcome {
        RouteOutcome::Admitted(_) => "admitted",
        RouteOutcome::Rejected(rejected) => rejected.reason.name(),
        RouteOutcome::Removed(_) => "removed",
    }
}

/// Returns when this replica starts leading (never without a status writer, or once
/// the election has ended).
async fn starts_leading(leading: &mut Option<watch::Receiver<bool>>) {
    let Some(receiver) = leading.as_mut() else {
        return std::future::pending().await;
    };
    loop {
        if receiver.changed().await.is_err() {
            return std::future::pending().await;
        }
        if *receiver.borrow_and_update() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use futures::channel::mpsc as stream_channel;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use kube_sim::{SimConfig, Simulator};
    use secret_monitor::ObjectEvent;
    use serde_json::json;

    use super::*;
    use crate::api::access::{AccessOptions, AccessPolicy};
    use crate::api::manager::TlsSecretMonitor;
    use crate::consumer::{CertificateRef, ConsumerKey};
    use crate::route::{Route, RouteKey};
    use crate::testing::{LeafSpec, Pki, route_with_external_certificate};

    const NS: &str = "app";
    /// Routes whose secret changes flood the pipeline.
    const FLOODED: usize = 200;
    /// How long any wait waits before the test fails.
    const PATIENCE: Duration = Duration::from_secs(90);

    fn route(name: &str, age: i64) -> Route {
        let mut route =
            route_with_external_certificate(NS, name, &format!("{name}.app.example"), "s");
        route.metadata.uid = Some(format!("uid-{name}"));
        route.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_700_000_000 + age).expect("time"),
        ));
        route
    }

    /// The router may get, list and watch secret `s`.
    fn grant(sim: &Simulator) {
        let store = sim.store();
        store
            .upsert(
                "roles",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "tls", "namespace": NS},
                    "rules": [{"apiGroups": [""], "resources": ["secrets"],
                               "verbs": ["get", "list", "watch"], "resourceNames": ["s"]}],
                }),
            )
            .expect("role");
        store
            .upsert(
                "rolebindings",
                json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "tls", "namespace": NS},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tls"},
                    "subjects": [{"kind": "ServiceAccount", "name": "router", "namespace": "openshift-ingress"}],
                }),
            )
            .expect("role binding");
    }

    /// A pipeline with [`FLOODED`] routes and one more (`extra`) on secret `s`, all
    /// admitted, its outcomes taken; and what floods it.
    struct Flooded {
        /// Keeps the API server up.
        _sim: Simulator,
        mailbox: SecretMailbox,
        routes: stream_channel::UnboundedSender<RouteEvent>,
        outputs: PipelineOutputs,
        task: tokio::task::JoinHandle<Result<(), PipelineError>>,
        extra: Route,
        /// A new version of `s`, with another certificate.
        rotated: Arc<TlsSecret>,
        /// The pipeline's validations (for their counts).
        validations: Validations,
    }

    impl Flooded {
        async fn start(options: PipelineOptions) -> Self {
            let sim = Simulator::start(SimConfig::default())
                .await
                .expect("simulator");
            let now = Timestamp::now();
            let pki = Pki::new(now);
            let mut stored = serde_json::to_value(
                pki.issue(&LeafSpec::new("r.app.example", now))
                    .secret(NS, "s"),
            )
            .expect("secret JSON");
            stored["apiVersion"] = json!("v1");
            stored["kind"] = json!("Secret");
            sim.store().upsert("secrets", stored).expect("secret");
            grant(&sim);

            let client = sim.client("router").await.expect("client");
            let manager = SecretManager::new(TlsSecretMonitor::new(client.clone()));
            let access = AccessChecker::with_options(
                client,
                AccessOptions {
                    policy: AccessPolicy::SelfRules,
                    ttl: Duration::from_secs(600),
                    denied_ttl: Duration::from_secs(600),
                },
            );
            let (pipeline, mut outputs) = RoutePipeline::new(manager, access, None, options);
            let mailbox = pipeline.mailbox.clone();
            let validations = pipeline.validations.clone();
            let (routes, events) = stream_channel::unbounded();
            let task = tokio::spawn(pipeline.run(events));

            // Route i is applied i-th (oldest first) and registers as registration
            // i + 1; `extra` last.
            let mut listed: Vec<Route> = (0..FLOODED)
                .map(|i| route(&format!("r{i:03}"), i as i64))
                .collect();
            let extra = route("extra", FLOODED as i64);
            listed.push(extra.clone());
            routes
                .unbounded_send(RouteEvent::Listed(listed))
                .expect("pipeline running");
            let mut admitted = 0;
            while admitted < FLOODED + 1 {
                let outcome = tokio::time::timeout(PATIENCE, outputs.outcomes.recv())
                    .await
                    .expect("admitted in time")
                    .expect("pipeline running");
                assert!(matches!(outcome, RouteOutcome::Admitted(_)), "{outcome:?}");
                admitted += 1;
            }
            let mut readiness = outputs.readiness.clone();
            tokio::time::timeout(PATIENCE, readiness.wait_for(Readiness::is_ready))
                .await
                .expect("ready in time")
                .expect("pipeline running");

            let mut rotated = pki
                .issue(&LeafSpec::new("r.app.example", now))
                .secret(NS, "s");
            rotated.metadata.uid = Some("uid-s-rotated".to_owned());
            rotated.metadata.resource_version = Some("999999".to_owned());
            Self {
                _sim: sim,
                mailbox,
                routes,
                outputs,
                task,
                extra,
                rotated: Arc::new(TlsSecret::from(&rotated)),
                validations,
            }
        }

        /// Files a change of `s` for every route but `extra`, without waking anyone
        /// (the test's one thread is busy with this).
        fn flood(&self) {
            for i in 0..FLOODED {
                let key = ConsumerKey::Route(RouteKey::new(NS, format!("r{i:03}")));
                self.mailbox.put(
                    (key, RegistrationId(i as u64 + 1)),
                    ObjectEvent::Updated {
                        old: Arc::clone(&self.rotated),
                        new: Arc::clone(&self.rotated),
                    },
                );
            }
            assert_eq!(self.mailbox.len(), FLOODED);
        }

        /// The next `count` outcomes, in short.
        async fn told(&mut self, count: usize) -> Vec<String> {
            let mut told = Vec::new();
            while told.len() < count {
                let outcome = tokio::time::timeout(PATIENCE, self.outputs.outcomes.recv())
                    .await
                    .expect("outcomes in time")
                    .expect("pipeline running");
                told.push(match outcome {
                    RouteOutcome::Admitted(admitted) => format!("admitted {}", admitted.route),
                    RouteOutcome::Rejected(rejected) => format!("rejected {}", rejected.route),
                    RouteOutcome::Removed(route) => format!("removed {route}"),
                });
            }
            told
        }

        async fn stop(self) {
            drop(self.routes);
            self.task
                .await
                .expect("pipeline task")
                .expect("pipeline ends");
        }
    }

    /// Stores `namespace/name` in the simulator, with a new certificate each time.
    fn store_secret(sim: &Simulator, pki: &Pki, now: Timestamp, namespace: &str, name: &str) {
        let mut stored = serde_json::to_value(
            pki.issue(&LeafSpec::new("r.app.example", now))
                .secret(namespace, name),
        )
        .expect("secret JSON");
        stored["apiVersion"] = json!("v1");
        stored["kind"] = json!("Secret");
        sim.store().upsert("secrets", stored).expect("secret");
    }

    /// The changes in the mailbox, once `count` of them arrived: whose they are.
    async fn delivered(mailbox: &SecretMailbox, count: usize) -> BTreeSet<(String, u64)> {
        let mut told = BTreeSet::new();
        while told.len() < count {
            tokio::time::timeout(PATIENCE, mailbox.ready())
                .await
                .expect("changes in time");
            while let Some(((consumer, id), _change)) = mailbox.take() {
                told.insert((consumer.to_string(), id.0));
            }
        }
        told
    }

    /// The registration bookkeeping of the shell speaks of consumers and references,
    /// not of routes and secrets in their namespace: a consumer holds registrations on
    /// two references (one in another namespace); another consumer shares one of them.
    /// The shared secret has one watch; its change reaches each of its registrations,
    /// tagged with its consumer, and no other; releasing one registration keeps the
    /// watch for the other.
    #[tokio::test]
    async fn consumers_of_one_secret_share_its_watch_and_each_is_told() {
        let sim = Simulator::start(SimConfig::default())
            .await
            .expect("simulator");
        let now = Timestamp::now();
        let pki = Pki::new(now);
        store_secret(&sim, &pki, now, NS, "s");
        store_secret(&sim, &pki, now, "other", "t");
        sim.grant_router_secrets(NS, &["s"]).expect("grant");
        sim.grant_router_secrets("other", &["t"]).expect("grant");
        let client = sim.client("router").await.expect("client");
        let manager = SecretManager::new(TlsSecretMonitor::new(client));
        let mailbox = SecretMailbox::default();

        let one = ConsumerKey::Route(RouteKey::new(NS, "one"));
        let two = ConsumerKey::Route(RouteKey::new("other", "two"));
        let shared = CertificateRef::new(NS, "s");
        let own = CertificateRef::new("other", "t");
        let mut held = HashMap::new();
        for (consumer, reference, id) in [(&one, &shared, 1), (&two, &shared, 2), (&two, &own, 3)] {
            let sink = mailbox.sink((consumer.clone(), RegistrationId(id)));
            let registration = manager
                .register(&reference.namespace, &reference.name, sink)
                .await
                .expect("registered");
            held.insert(id, registration);
        }
        let all = |ids: &[(&ConsumerKey, u64)]| -> BTreeSet<(String, u64)> {
            ids.iter()
                .map(|(consumer, id)| (consumer.to_string(), *id))
                .collect()
        };
        // Each registration first hears its secret's current state.
        assert_eq!(
            delivered(&mailbox, 3).await,
            all(&[(&one, 1), (&two, 2), (&two, 3)])
        );
        let watched = manager.watched_secrets();
        assert_eq!(watched.len(), 2, "{watched:?}");
        assert_eq!(watched[&ObjectKey::new(NS, "s")].handlers, 2);
        assert_eq!(watched[&ObjectKey::new("other", "t")].handlers, 1);

        // The shared secret changes: told to both of its registrations, not to `t`'s.
        store_secret(&sim, &pki, now, NS, "s");
        assert_eq!(delivered(&mailbox, 2).await, all(&[(&one, 1), (&two, 2)]));
        assert_eq!(mailbox.len(), 0);

        // One consumer lets go: the watch stays for the other, which is still told.
        drop(held.remove(&1));
        let watched = manager.watched_secrets();
        assert_eq!(watched[&ObjectKey::new(NS, "s")].handlers, 1);
        store_secret(&sim, &pki, now, NS, "s");
        assert_eq!(delivered(&mailbox, 1).await, all(&[(&two, 2)]));

        // The last holder of `s` lets go: its watch closes; `t`'s stays.
        drop(held.remove(&2));
        let watched = manager.watched_secrets();
        assert_eq!(
            watched.keys().cloned().collect::<Vec<_>>(),
            [ObjectKey::new("other", "t")]
        );
        assert_eq!(manager.route_count(), 1);
    }

    /// A flood of secret changes, waiting all at once when a route event arrives: the
    /// route event is handled after one change at most, not after the flood. Order
    /// only: what the consumer is told, in the order decided.
    #[tokio::test]
    async fn a_flood_of_secret_changes_does_not_starve_route_events() {
        let mut flooded = Flooded::start(PipelineOptions::default()).await;
        // Nothing else runs until this test awaits (one thread): the flood and the
        // route event are both waiting when the pipeline wakes.
        flooded.flood();
        flooded
            .routes
            .unbounded_send(RouteEvent::Deleted(flooded.extra.clone()))
            .expect("pipeline running");
        let told = flooded.told(FLOODED + 1).await;
        let removed = told
            .iter()
            .position(|said| *said == format!("removed {NS}/extra"))
            .expect("the route event was handled");
        assert!(removed <= 1, "after {removed} secret changes: {told:?}");
        let flooded_routes = told
            .iter()
            .filter(|said| said.starts_with("admitted"))
            .count();
        assert_eq!(
            flooded_routes, FLOODED,
            "every flooded route re-admitted: {told:?}"
        );
        flooded.stop().await;
    }

    /// A start-up validates the one version of the secret its routes share once: the
    /// prefetch's validation serves every route's apply and, after the prefetch holds
    /// are released, every registration's first change.
    #[tokio::test]
    async fn a_start_up_validates_a_secret_version_once() {
        use std::sync::atomic::Ordering::SeqCst;
        let flooded = Flooded::start(PipelineOptions::default()).await;
        // One ask by the prefetch, then per route one by its apply and one by its
        // registration's first change.
        let asks = 1 + 2 * (FLOODED + 1);
        tokio::time::timeout(PATIENCE, async {
            while flooded.validations.asked.load(SeqCst) < asks {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("every first change handled in time");
        assert_eq!(flooded.validations.made.load(SeqCst), 1);
        flooded.stop().await;
    }

    /// A consumer that takes no outcomes holds the pipeline at its outcome queue's
    /// bound: the rest of the flood waits in the mailbox (one change per registration),
    /// and flows once the consumer takes outcomes again.
    #[tokio::test]
    async fn a_consumer_that_falls_behind_holds_the_pipeline_back() {
        const QUEUE: usize = 8;
        let mut flooded = Flooded::start(PipelineOptions {
            outcome_queue: QUEUE,
            ..PipelineOptions::default()
        })
        .await;
        flooded.flood();
        // Let the pipeline run until it waits for room (one thread: it runs only while
        // this test yields).
        let mut yields = 0;
        while flooded.outputs.outcomes.len() < QUEUE {
            yields += 1;
            assert!(yields < 10_000, "the queue never filled");
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(flooded.outputs.outcomes.len(), QUEUE);
        // The queue's outcomes, and the one waiting to be sent, were taken out.
        assert_eq!(flooded.mailbox.len(), FLOODED - QUEUE - 1);
        let told = flooded.told(FLOODED).await;
        assert!(
            told.iter().all(|said| said.starts_with("admitted")),
            "{told:?}"
        );
        assert_eq!(flooded.mailbox.len(), 0);
        flooded.stop().await;
    }

    /// Secret `name`, at `version`, with a valid certificate.
    fn versioned_secret(pki: &Pki, now: Timestamp, name: &str, version: &str) -> Arc<TlsSecret> {
        let leaf = pki.issue(&LeafSpec::new(&format!("{name}.app.example"), now));
        let metadata = ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(NS.to_owned()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(version.to_owned()),
            ..ObjectMeta::default()
        };
        Arc::new(TlsSecret::new(
            metadata,
            Some(crate::tls::SECRET_TYPE_TLS),
            Some(leaf.chain_pem().into_bytes()),
            Some(leaf.key.pem().into_bytes()),
        ))
    }

    /// A deleted secret's validation is dropped: asked for again (re-created with the
    /// same version, as a restore does), it is validated anew, and the other secrets'
    /// validations stay.
    #[test]
    fn a_deleted_secret_leaves_no_validation_behind() {
        use std::sync::atomic::Ordering::SeqCst;
        let now = Timestamp::now();
        let pki = Pki::new(now);
        let validations = Validations::new(TlsValidator::default());
        let gone = versioned_secret(&pki, now, "gone", "1");
        let kept = versioned_secret(&pki, now, "kept", "1");
        validations.version(&gone).validation.expect("valid");
        validations.version(&kept).validation.expect("valid");
        assert_eq!(validations.map().len(), 2);

        validations.forget(&ObjectKey::new(NS, "gone"));
        assert_eq!(validations.map().len(), 1);
        validations.version(&kept).validation.expect("valid");
        assert_eq!(validations.made.load(SeqCst), 2, "the kept one is recorded");
        validations.version(&gone).validation.expect("valid");
        assert_eq!(validations.made.load(SeqCst), 3, "the deleted one anew");
    }

    /// Several callers (a prefetch task and a route's registration) ask for the same
    /// new version at the same moment: it is validated once, every caller gets that
    /// one result, and a later version is validated again, once.
    #[test]
    fn a_version_asked_for_at_once_is_validated_once() {
        use std::sync::atomic::Ordering::SeqCst;
        const SECRETS: usize = 3;
        const CALLERS: usize = 4;
        let now = Timestamp::now();
        let pki = Pki::new(now);
        let validations = Validations::new(TlsValidator::default());
        // Each validation waits until every caller of its round has asked: without the
        // sharing, every caller would be validating.
        let ask_at_once = |secret: &Arc<TlsSecret>| -> Vec<Arc<ValidatedTls>> {
            validations
                .hold_until_asked
                .store(validations.asked.load(SeqCst) + CALLERS, SeqCst);
            let results: Vec<Arc<ValidatedTls>> = std::thread::scope(|scope| {
                let callers: Vec<_> = (0..CALLERS)
                    .map(|_| {
                        scope.spawn(|| {
                            let version = validations.version(secret);
                            assert_eq!(version.id, SecretVersionId::of(secret.as_ref()));
                            version.validation.expect("a valid secret")
                        })
                    })
                    .collect();
                callers
                    .into_iter()
                    .map(|caller| caller.join().expect("a caller"))
                    .collect()
            });
            validations.hold_until_asked.store(0, SeqCst);
            assert!(
                results.iter().all(|one| Arc::ptr_eq(one, &results[0])),
                "every caller holds the one validation"
            );
            results
        };

        let mut first = Vec::new();
        for index in 0..SECRETS {
            let secret = versioned_secret(&pki, now, &format!("s{index}"), "1");
            first.push(ask_at_once(&secret).remove(0));
            assert_eq!(validations.made.load(SeqCst), index + 1);
            // Asked again: recorded, not validated again.
            let again = validations.version(&secret).validation.expect("valid");
            assert!(Arc::ptr_eq(&again, &first[index]));
            assert_eq!(validations.made.load(SeqCst), index + 1);
        }
        for (index, earlier) in first.iter().enumerate() {
            let secret = versioned_secret(&pki, now, &format!("s{index}"), "2");
            let second = ask_at_once(&secret).remove(0);
            assert_eq!(validations.made.load(SeqCst), SECRETS + index + 1);
            assert!(!Arc::ptr_eq(&second, earlier), "the new version's own");
        }
    }
}
