//! The shell around the route state machine ([`crate::machine`]): it feeds the
//! machine route events, network results, secret changes and ticks, and performs the
//! effects the machine returns (prefetch, access checks, registrations, outcomes,
//! status writes). It decides nothing itself.
//!
//! ```text
//! route watch ──RouteEvent──▶ RoutePipeline::run ──Input──▶ RouteMachine::step
//!                                   ▲    │                         │
//!       secret events (TaggedSink) ─┘    └◀──────── Effect ────────┘
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
use std::sync::{Arc, Mutex, PoisonError};

use futures::future::{BoxFuture, OptionFuture};
use futures::{FutureExt, Stream, StreamExt};
use jiff::Timestamp;
use kube_common::backoff::BackoffPolicy;
use secret_monitor::{MonitorErrorKind, ObjectEvent, ObjectKey, TaggedSink};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info};

use crate::api::access::AccessChecker;
use crate::api::manager::{SecretManager, SecretRegistration};
use crate::api::route_watch::{RouteEvent, RouteWatchError};
use crate::api::status_writer::StatusWriter;
use crate::machine::dates::validation_holds;
pub use crate::machine::{AdmittedRoute, HostPolicy, Readiness, RejectedRoute, RouteOutcome, Sni};
use crate::machine::{
    Effect, Input, MachineOptions, Preparation, Prepared, PreparedOutcome, RegistrationId,
    RouteMachine, SecretChange, SecretLookup, SecretVersion, SecretVersionId,
};
use crate::route::RouteKey;
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
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            validator: TlsValidator::default(),
            identity: "the router".to_owned(),
            retry: BackoffPolicy::default(),
            hosts: HostPolicy::default(),
        }
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

/// Why the pipeline stopped before its route events ended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PipelineError {
    /// The route watch was refused for good (e.g. an invalid label selector).
    #[error(transparent)]
    RouteWatch(#[from] RouteWatchError),
}

/// A secret event, tagged with the route and registration it was delivered to.
type SecretEvent = ((RouteKey, RegistrationId), ObjectEvent<TlsSecret>);

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
    outcomes: mpsc::UnboundedSender<RouteOutcome>,
    readiness: watch::Sender<Readiness>,
    /// Where registrations deliver their secret events.
    secret_events: mpsc::UnboundedSender<SecretEvent>,
    secret_receiver: mpsc::UnboundedReceiver<SecretEvent>,
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
        let (outcomes, outcome_receiver) = mpsc::unbounded_channel();
        let (readiness, readiness_receiver) = watch::channel(Readiness::default());
        let (secret_events, secret_receiver) = mpsc::unbounded_channel();
        let machine = RouteMachine::new(MachineOptions {
            identity: options.identity,
            hosts: options.hosts,
            denial_recheck_min: options.retry.initial,
            retry: options.retry,
            seed: rand::random(),
            // Without a status writer the machine need not keep whole routes.
            record_status: status.is_some(),
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
            secret_events,
            secret_receiver,
        };
        let outputs = PipelineOutputs {
            outcomes: outcome_receiver,
            readiness: readiness_receiver,
        };
        (pipeline, outputs)
    }

    /// Applies route events until the stream ends (`Ok`) or reports a permanent
    /// failure (`Err`), handling secret events and retries meanwhile.
    pub async fn run(
        mut self,
        events: impl Stream<Item = RouteEvent>,
    ) -> Result<(), PipelineError> {
        let mut events = pin!(events);
        let mut head: Option<BoxFuture<'static, NetworkResult>> = None;
        loop {
            let wakeup = self.machine.next_wakeup();
            let input = tokio::select! {
                biased;
                Some((tag, event)) = self.secret_receiver.recv() => self.secret_input(tag, event),
                Some(done) = OptionFuture::from(head.as_mut()), if head.is_some() => {
                    head = None;
                    self.prepared_input(done)
                }
                event = events.next() => match event {
                    Some(RouteEvent::Listed(routes)) => Input::Listed(routes),
                    Some(RouteEvent::Applied(route)) => Input::Applied(route),
                    Some(RouteEvent::Deleted(route)) => Input::Deleted(route),
                    Some(RouteEvent::Failed(error)) => return Err(error.into()),
                    None => return Ok(()),
                },
                () = sleep_until(wakeup), if wakeup.is_some() => Input::Tick,
            };
            let now = tokio::time::Instant::now().into_std();
            for effect in self.machine.step(input, now) {
                if let Some(network) = self.perform(effect) {
                    head = Some(network);
                }
            }
        }
    }

    /// Performs one effect; returns the network part of an apply, to be awaited.
    fn perform(&mut self, effect: Effect) -> Option<BoxFuture<'static, NetworkResult>> {
        match effect {
            Effect::Prefetch { namespace, secret } => {
                let validations = self.validations.clone();
                self.manager
                    .prefetch_then(&namespace, &secret, move |object| {
                        // Validating here spreads the CPU work of a start-up over the
                        // runtime's threads while the queue's head waits for the network.
                        let _shared = validations.version(&object);
                    });
                self.access.prefetch(&namespace, &secret);
            }
            Effect::ReleasePrefetched => {
                self.manager.release_prefetched();
                self.validations.clear();
            }
            Effect::Prepare(preparation) => return Some(self.prepare(preparation).boxed()),
            Effect::Unregister(id) => {
                // Dropping the registration releases its hold on the watch.
                self.registrations.remove(&id);
            }
            Effect::Emit(outcome) => {
                debug!(route = %outcome.route(), outcome = outcome_name(&outcome), "route decided");
                // The consumer may be gone (daemon shutting down); nothing to do then.
                let _ = self.outcomes.send(*outcome);
            }
            Effect::RecordStatus { route, admission } => {
                if let Some(status) = &self.status {
                    status.record(route, admission);
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

    /// The network part of applying a route: its access check (usually answered from
    /// the cache) and, when allowed and asked for, its registration (usually joining a
    /// prefetched sync).
    fn prepare(
        &self,
        preparation: Preparation,
    ) -> impl Future<Output = NetworkResult> + Send + 'static {
        let access = self.access.clone();
        let manager = self.manager.clone();
        let sink = self.secret_events.clone();
        async move {
            let namespace = preparation.route.namespace.clone();
            let outcome = match access.check(&namespace, &preparation.secret).await {
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
                            let sink = TaggedSink::new((preparation.route.clone(), id), sink);
                            match manager
                                .register(&namespace, &preparation.secret, sink)
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

    fn secret_input(
        &self,
        (route, registration): (RouteKey, RegistrationId),
        event: ObjectEvent<TlsSecret>,
    ) -> Input {
        let change = match event {
            ObjectEvent::Added(object) | ObjectEvent::Updated { new: object, .. } => {
                SecretChange::Present(self.validations.version(&object))
            }
            ObjectEvent::Deleted(_) => SecretChange::Deleted,
        };
        Input::Secret {
            route,
            registration,
            change,
        }
    }
}

/// TLS validations by secret version: each version of a secret is validated once, and
/// every route using it shares the result (and one copy of the material). Prefetch
/// tasks fill it in parallel, ahead of the queue.
#[derive(Clone)]
struct Validations {
    validator: Arc<TlsValidator>,
    /// Guards the latest validated version of each secret. Never held across an
    /// `.await`, nor while validating: only for a lookup or an insert.
    latest: Arc<Mutex<HashMap<ObjectKey, Validation>>>,
}

/// The validation of one version of a secret, without a host.
struct Validation {
    version: SecretVersionId,
    result: Result<Arc<ValidatedTls>, TlsRejection>,
    /// When it was validated: it holds until the certificate becomes valid or expires
    /// ([`validation_holds`]).
    at: Timestamp,
}

impl Validations {
    fn new(validator: TlsValidator) -> Self {
        Self {
            validator: Arc::new(validator),
            latest: Arc::default(),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Validation>> {
        // Every critical section is a single map operation: a poisoned map is intact.
        self.latest.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The validated version of `secret`: the recorded validation of this version
    /// (unless its certificate became valid or expired since), or one made now and
    /// recorded (unless another was recorded meanwhile, which wins).
    fn version(&self, secret: &Arc<TlsSecret>) -> SecretVersion {
        let now = Timestamp::now();
        let id = SecretVersionId::of(secret.as_ref());
        let key = ObjectKey::new(
            secret.namespace().unwrap_or_default(),
            secret.name().unwrap_or_default(),
        );
        let current = |found: &Validation| validation_holds(&found.result, found.at, now);
        let handed_over = |id, validation| SecretVersion {
            id,
            validation,
            as_of: now,
        };
        if let Some(id) = &id
            && let Some(found) = self.map().get(&key)
            && &found.version == id
            && current(found)
        {
            return handed_over(Some(id.clone()), found.result.clone());
        }
        let result = self
            .validator
            .validate_shared_secret(secret, None, now)
            .map(Arc::new);
        let Some(id) = id else {
            return handed_over(None, result);
        };
        let mut latest = self.map();
        let validation = match latest.get(&key) {
            Some(found) if found.version == id && current(found) => found.result.clone(),
            _ => {
                latest.insert(
                    key,
                    Validation {
                        version: id.clone(),
                        result: result.clone(),
                        at: now,
                    },
                );
                result
            }
        };
        handed_over(Some(id), validation)
    }

    fn clear(&self) {
        self.map().clear();
    }
}

fn outcome_name(outcome: &RouteOutcome) -> &'static str {
    match outcome {
        RouteOutcome::Admitted(_) => "admitted",
        RouteOutcome::Rejected(rejected) => rejected.reason.name(),
        RouteOutcome::Removed(_) => "removed",
    }
}

async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}
