//! The route pipeline's decisions, as a pure state machine: route events, network
//! results, secret changes and the passing of time in; effects (start this watch,
//! check that access, tell the consumer this) out. No I/O, no clock, no tokio: the
//! caller passes the time in, and [`api::pipeline`](crate::api::pipeline) performs the
//! effects. The shape is kube-runtime's `watcher`: a state plus a step function, driven
//! by a thin shell.
//!
//! # Order, and why start-up is still one round trip
//!
//! Routes are applied one at a time, in order (the initial set oldest first), as a
//! router's controller applies them: a route's outcome is decided only after every
//! route queued before it. Applying a route with an external certificate needs the
//! network (an access check, the secret's first sync); only the route at the head of
//! the queue waits for it ([`Effect::Prepare`]). So that this costs one round trip for
//! any number of routes, the machine looks ahead: the secrets of the next
//! [`MachineOptions::prefetch_window`] queued routes have their watch and access
//! question started ([`Effect::Prefetch`], [`lookahead`]); by the time the queue
//! reaches a route, the answers are usually there. While the head waits, secret
//! changes of routes already applied are still handled.
//!
//! # What happens to a route
//!
//! * Added, or modified with another secret: the old registration is released, the new
//!   secret checked (name, access, existence, TLS material) and registered.
//! * Modified with the same secret: re-checked (access, the cached secret). A copy that
//!   changes nothing but status is ignored, so the router's own status writes do not
//!   loop back.
//! * Deleted: its registration is released and [`RouteOutcome::Removed`] sent (when the
//!   consumer had been told anything).
//! * Without an external certificate (no TLS, passthrough, edge or reencrypt with an
//!   inline certificate or none): any registration is released and the route decided
//!   from itself, with the router's extended validation of its `spec.tls`.
//! * Its secret changes: re-evaluated. Deleted: rejected as a secret that does not
//!   exist, and the registration kept so that a re-creation re-admits the route. What is
//!   said follows from the state, never from history, so that any router computes the
//!   same for the same cluster.
//! * Admitted with a certificate that is not valid yet or will expire: applied again
//!   when that changes ([`dates`]), so that its status message follows the dates.
//! * A missing or invalid secret is rejected but stays registered, so fixing the secret
//!   admits the route. Transient failures are retried along
//!   [`kube_common::backoff`]; a denial is checked again when it stops being trusted.
//!
//! The machine is the one owner of "which consumer holds which registration on which
//! reference" ([`crate::consumer`]: a route holds one, on its external certificate's
//! secret): the shell keeps registrations by [`RegistrationId`] only, and the secret
//! manager not at all.

mod claims;
pub mod dates;
mod effects;
mod inputs;
mod lookahead;
mod outcome;
mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::hash::{NameMap, NameSet};

use claims::{Claim, HostClaims};
pub use effects::{Effect, Preparation, RegistrationId};
pub use inputs::{
    Input, Prepared, PreparedOutcome, SecretChange, SecretLookup, SecretVersion, SecretVersionId,
};
use lookahead::Lookahead;
pub use outcome::{
    AdmittedRoute, CertificateSource, Readiness, RejectedRoute, RouteCertificate, RouteOutcome, Sni,
};
use state::{
    ApplyQueue, Jitter, RouteCopy, RouteEntry, RouteState, SecretSeen, Stand, Startup, Told,
};

use crate::consumer::{ConsumerKey, Holding, Holdings};
use crate::reason::{AdmissionProblem, Reason, ValidationProblem};
use crate::route::{Route, RouteKey, TlsTermination, validate_secret_name};
use crate::tls::{TlsConfigProblem, TlsRejection, TlsValidator, ValidatedTls};

/// The certificate a route is served with: `tls`, followed by the route's own
/// `spec.tls.caCertificate` when it has one, as the router writes it.
fn with_route_ca(tls: Arc<ValidatedTls>, ca_certificate: Option<&str>) -> Arc<ValidatedTls> {
    match ca_certificate.filter(|ca| !ca.is_empty()) {
        Some(ca) => Arc::new(tls.with_ca_certificate(ca)),
        None => tls,
    }
}

/// Which hosts the router admits, as the router's host admission options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostPolicy {
    /// Admit routes with `spec.wildcardPolicy: Subdomain` (served for `*.<domain>`);
    /// rejected `RouteNotAdmitted` otherwise (the router's
    /// `ROUTER_ALLOW_WILDCARD_ROUTES`).
    pub allow_wildcard_routes: bool,
    /// Let routes of any namespace claim a host (with different paths); by default a
    /// host belongs to the namespace of its oldest route (the router's
    /// `ROUTER_DISABLE_NAMESPACE_OWNERSHIP_CHECK`).
    pub disable_namespace_ownership_check: bool,
}

/// How the machine decides and retries.
#[derive(Clone, Debug, PartialEq)]
pub struct MachineOptions {
    /// Who the router is, as named in rejection messages.
    pub identity: String,
    /// Which hosts are admitted.
    pub hosts: HostPolicy,
    /// Delays between retries of a route that failed for a transient reason (API
    /// errors, refused or failed watches).
    pub retry: BackoffPolicy,
    /// The shortest delay before a denied route is checked again (a denial is checked
    /// again when it stops being trusted, but never sooner than this).
    pub denial_recheck_min: Duration,
    /// Seeds the jitter of retry delays.
    pub seed: u64,
    /// Checks routes' inline certificates and TLS configuration (and, with the same
    /// OpenSSL security level, the shell validates secrets).
    pub validator: TlsValidator,
    /// The router's domain (`ROUTER_DOMAIN`): a route with `spec.subdomain` and no
    /// `spec.host` is decided, and served, as `<subdomain>.<domain>`; without one such
    /// a route has no host (`NoHostValue`).
    pub router_domain: Option<String>,
    /// Record outcomes in route status ([`Effect::RecordStatus`]). The machine then
    /// keeps each route's latest object for that write; without, it keeps only what it
    /// decides with (a tenth of the memory).
    pub record_status: bool,
    /// How many queued routes beyond the head have their secret fetched ahead
    /// ([`Effect::Prefetch`]); the rest start as the head moves on. Wider than what the
    /// head applies in one round trip, narrow enough that the first route's answers
    /// are not read behind every other route's requests.
    pub prefetch_window: usize,
}

/// The default [`MachineOptions::prefetch_window`]: about a round trip of 100 ms at the
/// rate a start-up applies prefetched routes on two cores (~15,000 a second), twice.
pub const PREFETCH_WINDOW: usize = 4096;

impl Default for MachineOptions {
    fn default() -> Self {
        let retry = BackoffPolicy::default();
        Self {
            identity: "the router".to_owned(),
            hosts: HostPolicy::default(),
            denial_recheck_min: retry.initial,
            retry,
            seed: 0,
            validator: TlsValidator::default(),
            router_domain: None,
            record_status: true,
            prefetch_window: PREFETCH_WINDOW,
        }
    }
}

/// The apply at the head of the queue, waiting for its network part.
#[derive(Debug)]
struct InFlight {
    preparation: Preparation,
    /// A newer copy of the route (or its deletion) arrived meanwhile: the apply is
    /// redone with it, before the routes queued behind.
    overtaken: bool,
}

/// The route state machine. Feed it [`Input`]s with [`step`](Self::step) and perform
/// the [`Effect`]s it returns, in order.
#[derive(Debug)]
pub struct RouteMachine {
    options: MachineOptions,
    /// Every route known or still holding something.
    routes: NameMap<RouteKey, RouteEntry>,
    /// Routes waiting to be applied.
    queue: ApplyQueue,
    /// Every route's claim on its host (from its latest copy).
    claims: HostClaims,
    /// The apply waiting for the network, if any.
    head: Option<InFlight>,
    /// Routes of the first listing still without an outcome.
    startup: Startup,
    /// Scheduled retries, by due time (each route at most once; its entry says when).
    retries: BTreeSet<(Instant, RouteKey)>,
    /// The last registration id handed out.
    last_registration: u64,
    /// The secrets fetched ahead of the head, and those waiting for room.
    lookahead: Lookahead,
    jitter: Jitter,
}

impl RouteMachine {
    /// A machine with no routes, waiting for the first listing.
    pub fn new(options: MachineOptions) -> Self {
        Self {
            jitter: Jitter::new(options.seed),
            lookahead: Lookahead::new(options.prefetch_window),
            options,
            routes: Default::default(),
            queue: ApplyQueue::default(),
            claims: HostClaims::default(),
            head: None,
            startup: Startup::default(),
            retries: BTreeSet::new(),
            last_registration: 0,
        }
    }

    /// Handles `input` at time `now` and returns what to do, in order.
    pub fn step(&mut self, input: Input, now: Instant) -> Vec<Effect> {
        let mut effects = Vec::new();
        match input {
            Input::Listed(routes) => self.listed(routes, &mut effects),
            Input::Applied(route) => self.accept(route, &mut effects),
            Input::Deleted(route) => {
                if let Some(key) = route.key() {
                    self.forget(key, &mut effects);
                }
            }
            Input::Prepared(prepared) => self.prepared(prepared, now, &mut effects),
            Input::Secret {
                consumer,
                registration,
                change,
            } => self.secret_changed(consumer, registration, change, now, &mut effects),
            Input::Tick => self.fire_retries(now),
            Input::RecordAll => self.record_all(&mut effects),
        }
        self.advance(&mut effects);
        effects
    }

    /// Every route's last recorded outcome, again, on its latest copy: the status
    /// writer skips those the status already shows.
    fn record_all(&self, effects: &mut Vec<Effect>) {
        for entry in self.routes.values() {
            let Some(admission) = entry.recorded.as_deref() else {
                continue;
            };
            let copy = entry.latest.as_ref().or_else(|| entry.applied());
            if let Some(route) = copy.and_then(|copy| copy.object.clone()) {
                effects.push(Effect::RecordStatus {
                    route,
                    admission: admission.clone(),
                });
            }
        }
    }

    /// When the next retry is due (send [`Input::Tick`] then), if one is scheduled.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.retries.first().map(|(at, _)| *at)
    }

    /// Start-up progress.
    pub fn readiness(&self) -> Readiness {
        match &self.startup {
            Startup::Unlisted => Readiness::default(),
            Startup::Deciding { initial, undecided } => Readiness {
                listed: true,
                initial_routes: *initial,
                initial_done: initial - undecided.len(),
            },
        }
    }

    /// How many routes hold a registration.
    pub fn registered_routes(&self) -> usize {
        self.routes
            .values()
            .filter(|entry| entry.is_registered())
            .count()
    }

    /// The secret `route` holds a registration on, if any (a route references one).
    pub fn registered_secret(&self, route: &RouteKey) -> Option<&str> {
        let holding = self.routes.get(route)?.holdings()?.iter().next()?;
        Some(&holding.reference.name)
    }

    fn listed(&mut self, routes: Vec<Route>, effects: &mut Vec<Effect>) {
        let mut routes = routes;
        // Oldest first, as a router applies them (ties by name, for determinism).
        routes.sort_by_cached_key(|route| {
            (
                route.metadata.creation_timestamp.as_ref().map(|t| t.0),
                route.key(),
            )
        });
        let present: NameSet<RouteKey> = routes.iter().filter_map(|route| route.key()).collect();
        // Room for the listing at once: grown step by step, the route map (the
        // machine's largest) would hold its old and new tables together at each step.
        let additional = present.len().saturating_sub(self.routes.len());
        self.routes.reserve(additional);
        self.claims.reserve(additional);
        let vanished: Vec<RouteKey> = self
            .routes
            .iter()
            .filter(|(key, entry)| entry.latest.is_some() && !present.contains(*key))
            .map(|(key, _)| key.clone())
            .collect();
        for key in vanished {
            self.forget(key, effects);
        }
        for route in routes {
            self.accept(route, effects);
        }
        if matches!(self.startup, Startup::Unlisted) {
            self.startup = Startup::Deciding {
                initial: present.len(),
                undecided: present,
            };
            effects.push(Effect::Readiness(self.readiness()));
        }
    }

    /// Records the latest copy of a route, queues it, and starts the network work its
    /// apply will need.
    fn accept(&mut self, mut route: Route, effects: &mut Vec<Effect>) {
        let Some(key) = route.key() else {
            return;
        };
        route.apply_router_domain(self.options.router_domain.as_deref());
        let claim = Claim::of(&route);
        let route = Arc::new(RouteCopy::of(route, self.options.record_status));
        // A route the host admission refuses claims nothing: the router's unique-host
        // index never sees it.
        let claim = claim.filter(|_| self.host_admission(&key, &route).is_none());
        self.claim(&key, claim);
        if let Some(reference) = route.reference(&key)
            && self.refusal(&key, &route).is_none()
        {
            let held = self
                .routes
                .get(&key)
                .and_then(RouteEntry::holdings)
                .is_some_and(|held| held.of_reference(&reference).is_some());
            let queued = self.queue.len();
            if !held && let Some(reference) = self.lookahead.queue(reference, queued) {
                effects.push(Effect::Prefetch(reference));
            }
        }
        match self.routes.get_mut(&key) {
            Some(entry) => entry.latest = Some(route),
            None => {
                self.routes.insert(key.clone(), RouteEntry::new(route));
            }
        }
        self.enqueue(key);
    }

    /// Why the router's host admission refuses `route` (the copy of `key`) before
    /// anything else, if it does, in the router's order: a wildcard route it does not
    /// admit, no host, a host that is not a DNS name. Such a route claims no host.
    fn host_admission(&self, key: &RouteKey, route: &RouteCopy) -> Option<Reason> {
        if route.wildcard_subdomain && !self.options.hosts.allow_wildcard_routes {
            return Some(Reason::RouteNotAdmitted {
                route: key.clone(),
                problem: AdmissionProblem::WildcardNotAllowed,
            });
        }
        let Some(host) = route.host.as_deref() else {
            return Some(Reason::NoHostValue { route: key.clone() });
        };
        let labels_valid = host
            .split('.')
            .all(|label| kube_common::name::label(label).is_ok());
        if kube_common::name::subdomain(host).is_err() || !labels_valid {
            return Some(Reason::InvalidHost {
                route: key.clone(),
                host: host.chars().take(253).collect(),
            });
        }
        None
    }

    /// Why `route` (the copy of `key`) is rejected whatever its secret holds, if it is:
    /// the checks made on the route alone, as the router's host admission makes them
    /// before any certificate is looked at ([`host_admission`](Self::host_admission),
    /// then the host's claims), and the secret's name. Such a route registers nothing
    /// and prefetches nothing. A route refused for its host (an older route's) takes
    /// over, applied again, when that route goes or moves.
    fn refusal(&self, key: &RouteKey, route: &RouteCopy) -> Option<Reason> {
        if let Some(reason) = self.host_admission(key, route) {
            return Some(reason);
        }
        if let Some(blocked) = self.claims.blocker(key, self.namespace_ownership()) {
            return Some(Reason::HostAlreadyClaimed {
                route: key.clone(),
                host: blocked.host,
                owner: blocked.owner,
                by_namespace: blocked.by_namespace,
            });
        }
        if let Some(secret) = route.secret.as_deref()
            && let Err(error) = validate_secret_name(secret)
        {
            return Some(Reason::ExternalCertificateValidationFailed {
                route: key.clone(),
                secret: secret.to_owned(),
                problem: ValidationProblem::InvalidSecretName(error),
            });
        }
        None
    }

    /// Decides a route without an external certificate from the route alone, as the
    /// router's extended validation does: its TLS configuration, and its inline
    /// certificate when it has one.
    fn decide_locally(
        &mut self,
        key: &RouteKey,
        route: &Arc<RouteCopy>,
        effects: &mut Vec<Effect>,
    ) {
        self.release(key, effects);
        self.set_stand(key, route, Stand::Local);
        let host = route.host.as_deref().map(str::to_owned);
        let mut warnings = Vec::new();
        let mut certificate = None;
        if let Some(tls) = route.tls.as_deref() {
            let served = match (&tls.termination, tls.certificate.as_deref()) {
                (TlsTermination::Passthrough, _) | (_, None) => None,
                (_, Some(pem)) => match self.options.validator.validate_inline(
                    pem,
                    tls.key.as_deref(),
                    host.as_deref(),
                ) {
                    Ok(validated) => Some(Arc::new(validated)),
                    Err(rejection) => {
                        let problem = TlsConfigProblem::Inline(rejection);
                        let reason = Reason::ExtendedValidationFailed {
                            route: key.clone(),
                            problem,
                        };
                        self.reject(key, reason, effects);
                        return;
                    }
                },
            };
            let leaf = served
                .as_ref()
                .filter(|_| tls.ca_certificate.is_some())
                .and_then(|served| served.leaf_der());
            if let Err(problem) = self
                .options
                .validator
                .check_route_config(&tls.config(false), leaf.as_deref())
            {
                let reason = Reason::ExtendedValidationFailed {
                    route: key.clone(),
                    problem,
                };
                self.reject(key, reason, effects);
                return;
            }
            if let Some(served) = served {
                warnings = served.warnings().to_vec();
                certificate = Some(RouteCertificate {
                    source: CertificateSource::Inline,
                    tls: with_route_ca(served, tls.ca_certificate.as_deref()),
                });
            }
        }
        let admitted = AdmittedRoute {
            route: key.clone(),
            sni: route.sni(),
            host,
            created: route.created,
            certificate,
            warnings,
            routing: Arc::clone(&route.routing),
        };
        self.emit(key, RouteOutcome::Admitted(admitted), effects);
    }

    /// Queues the route's apply; an apply in flight for it is redone instead.
    fn enqueue(&mut self, key: RouteKey) {
        match &mut self.head {
            Some(head) if head.preparation.consumer.route() == Some(&key) => head.overtaken = true,
            _ => self.queue.push(key, false),
        }
    }

    /// The route was deleted: its teardown waits in the queue, in order. From now on
    /// nothing but that teardown speaks for it.
    /// The route left this router's view (deleted, or out of its selection): torn
    /// down, and this router's entry removed from its status when one was recorded.
    fn forget(&mut self, key: RouteKey, effects: &mut Vec<Effect>) {
        if let Some(entry) = self.routes.get_mut(&key) {
            if entry.recorded.take().is_some()
                && let Some(route) = entry.latest.as_ref().and_then(|copy| copy.object.clone())
            {
                effects.push(Effect::ClearStatus { route });
            }
            entry.latest = None;
            self.enqueue(key.clone());
            // Its host is free now: a refused claimant takes over, after the teardown.
            self.claim(&key, None);
        }
    }

    fn namespace_ownership(&self) -> bool {
        !self.options.hosts.disable_namespace_ownership_check
    }

    /// Records the route's claim on its host; routes whose claim was won or lost by
    /// this are applied again (forced: their own copy did not change).
    fn claim(&mut self, key: &RouteKey, claim: Option<(String, Claim)>) {
        let ownership = self.namespace_ownership();
        let host = claim.as_ref().map(|(host, _)| host.as_str());
        let others = self.claims.neighbours(key, host);
        let before: Vec<_> = others
            .iter()
            .map(|other| self.claims.blocker(other, ownership))
            .collect();
        if !self.claims.set(key, claim) {
            return;
        }
        for (other, before) in others.into_iter().zip(before) {
            if self.claims.blocker(&other, ownership) != before {
                self.enqueue_forced(other);
            }
        }
    }

    /// Queues the route's apply even if its copy did not change; an apply in flight
    /// for it is redone instead.
    fn enqueue_forced(&mut self, key: RouteKey) {
        match &mut self.head {
            Some(head) if head.preparation.consumer.route() == Some(&key) => head.overtaken = true,
            _ => self.queue.push(key, true),
        }
    }

    /// Applies queued routes until one needs the network (or the queue is empty).
    fn advance(&mut self, effects: &mut Vec<Effect>) {
        while self.head.is_none() {
            let Some((key, forced)) = self.queue.pop() else {
                break;
            };
            self.apply(key, forced, effects);
        }
        if self.head.is_none() {
            // Every queued route has registered what it needs: prefetch holds on
            // secrets no route took up can go.
            if self.lookahead.drained() {
                effects.push(Effect::ReleasePrefetched);
            }
        } else {
            let due = self.lookahead.due(self.queue.len());
            effects.extend(due.into_iter().map(Effect::Prefetch));
        }
    }

    /// Decides what applying the route takes and does everything that needs no network.
    fn apply(&mut self, key: RouteKey, forced: bool, effects: &mut Vec<Effect>) {
        let Some(entry) = self.routes.get_mut(&key) else {
            return;
        };
        let Some(route) = entry.latest.clone() else {
            self.teardown(&key, effects);
            return;
        };
        let previous = entry.applied().cloned();
        // Deleted and created again under the same name is a new object: applied anew
        // (and, as what it was told names the old object, told anew).
        let unchanged = previous
            .as_ref()
            .is_some_and(|applied| applied.same_object_and_spec(&route))
            && (entry.is_registered() || entry.told.is_some());
        if let RouteState::Applied { route: applied, .. } = &mut entry.state {
            *applied = Arc::clone(&route);
        }
        if unchanged && !forced {
            self.mark_decided(&key, effects);
            return;
        }
        self.cancel_retry(&key);

        if let Some(reason) = self.refusal(&key, &route) {
            self.refuse(&key, &route, effects);
            self.reject(&key, reason, effects);
            return;
        }
        let Some(reference) = route.reference(&key) else {
            self.decide_locally(&key, &route, effects);
            return;
        };

        // A route references one secret: it reads the registration it holds on it, or
        // drops what it holds and registers anew.
        let plan = self
            .routes
            .get(&key)
            .and_then(RouteEntry::holdings)
            .map(|held| held.plan(std::slice::from_ref(&reference)))
            .unwrap_or_default();
        let consumer = ConsumerKey::Route(key.clone());
        let preparation = match plan.keep.first() {
            Some(&(_, read)) => Preparation {
                consumer,
                reference,
                register: None,
                read,
            },
            None => {
                self.release(&key, effects);
                self.set_stand(&key, &route, Stand::Registering);
                self.last_registration += 1;
                let id = RegistrationId(self.last_registration);
                Preparation {
                    consumer,
                    reference,
                    register: Some(id),
                    read: id,
                }
            }
        };
        effects.push(Effect::Prepare(preparation.clone()));
        self.head = Some(InFlight {
            preparation,
            overtaken: false,
        });
    }

    /// Completes the head's apply with what the network said.
    fn prepared(&mut self, prepared: Prepared, now: Instant, effects: &mut Vec<Effect>) {
        let Prepared {
            preparation,
            outcome,
        } = prepared;
        let overtaken = match self.head.take() {
            Some(head) if head.preparation == preparation => head.overtaken,
            other => {
                // Not the apply this machine asked for: keep nothing it registered.
                self.head = other;
                if let (Some(id), PreparedOutcome::Ready(_)) = (preparation.register, &outcome) {
                    effects.push(Effect::Unregister(id));
                }
                return;
            }
        };
        let Preparation {
            consumer: ConsumerKey::Route(key),
            reference,
            register,
            read,
        } = preparation;
        let secret = Arc::clone(&reference.name);
        let Some(route) = self.routes.get(&key).and_then(RouteEntry::applied).cloned() else {
            if let (Some(id), PreparedOutcome::Ready(_)) = (register, &outcome) {
                effects.push(Effect::Unregister(id));
            }
            return;
        };
        if let (Some(id), PreparedOutcome::Ready(_)) = (register, &outcome) {
            // The reference shares the applied copy's secret name (the apply built it
            // from that copy).
            let holding = Holding {
                reference,
                registration: id,
                seen: SecretSeen::Pending,
            };
            self.set_stand(&key, &route, Stand::Registered(Holdings::one(holding)));
        }
        if overtaken {
            // A newer event for the route arrived meanwhile: the apply is redone at
            // once (forced, in case the event changed nothing the apply looks at, such
            // as our own status write) and decides with the latest copy.
            if matches!(
                self.routes.get(&key).map(|entry| &entry.state),
                Some(RouteState::Applied {
                    stand: Stand::Registering,
                    ..
                })
            ) {
                self.set_stand(&key, &route, Stand::Refused);
            }
            self.queue.push_front(key, true);
            return;
        }

        match outcome {
            PreparedOutcome::AccessUnanswered { detail } => {
                self.refuse(&key, &route, effects);
                let detail = format!("cannot verify the router's access: {detail}");
                self.get_failed(&key, &secret, detail, now, effects);
            }
            PreparedOutcome::AccessDenied {
                verb,
                recheck_after,
            } => {
                self.refuse(&key, &route, effects);
                self.access_denied(&key, &secret, verb, effects);
                // Asking again before the denial expires would get the same answer
                // from the cache; asking right then notices a grant as early as
                // possible.
                let delay = recheck_after.max(self.options.denial_recheck_min);
                self.schedule_retry(&key, now + delay);
            }
            PreparedOutcome::RegistrationForbidden { verb } => {
                self.refuse(&key, &route, effects);
                self.access_denied(&key, &secret, verb, effects);
                self.backoff_retry(&key, now);
            }
            PreparedOutcome::RegistrationFailed { detail } => {
                self.refuse(&key, &route, effects);
                self.get_failed(&key, &secret, detail, now, effects);
            }
            PreparedOutcome::Ready(SecretLookup::Found(version)) => {
                self.evaluate(&key, read, version, now, effects);
            }
            PreparedOutcome::Ready(SecretLookup::NotFound) => {
                // Still watched: creating the secret admits the route.
                self.set_seen(&key, read, SecretSeen::Missing);
                let problem = ValidationProblem::SecretNotFound;
                self.reject_validation(&key, &secret, problem, effects);
            }
            PreparedOutcome::Ready(SecretLookup::Failed { detail }) => {
                self.get_failed(&key, &secret, detail, now, effects);
            }
        }
    }

    fn secret_changed(
        &mut self,
        consumer: ConsumerKey,
        id: RegistrationId,
        change: SecretChange,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let ConsumerKey::Route(key) = &consumer;
        let Some(entry) = self.routes.get(key) else {
            return;
        };
        let Some(holding) = entry.holdings().and_then(|held| held.by_registration(id)) else {
            return;
        };
        let redone = self
            .head
            .as_ref()
            .is_some_and(|head| head.preparation.consumer.route() == Some(key) && head.overtaken);
        if redone || self.queue.contains(key) {
            // A newer copy of the route (or its deletion) waits to be applied; that
            // apply reads the secret from the cache (so it must run, even if the copy
            // changes nothing), or tears the route down.
            if !redone {
                self.queue.push(key.clone(), true);
            }
            return;
        }
        let (secret, seen) = (Arc::clone(&holding.reference.name), holding.seen.clone());
        if let SecretChange::Present(version) = &change
            && version.id.is_some()
            && seen == SecretSeen::Evaluated(version.id.clone())
        {
            // Already evaluated: nothing changes, and a retry scheduled then (when the
            // certificate's dates change) still stands.
            return;
        }
        // The secret decides the route now: a retry of a failed read is moot.
        self.cancel_retry(key);
        match change {
            SecretChange::Present(version) => self.evaluate(key, id, version, now, effects),
            SecretChange::Deleted => {
                // Still watched: what the router says of a secret that does not exist.
                self.set_seen(key, id, SecretSeen::Missing);
                let problem = ValidationProblem::SecretNotFound;
                self.reject_validation(key, &secret, problem, effects);
            }
        }
    }

    /// Reports the outcome of a registered route's secret `version`, as delivered to
    /// its registration `id`.
    fn evaluate(
        &mut self,
        key: &RouteKey,
        id: RegistrationId,
        version: SecretVersion,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let Some(entry) = self.routes.get(key) else {
            return;
        };
        let Some(route) = entry.applied().cloned() else {
            return;
        };
        let Some(holding) = entry.holdings().and_then(|held| held.by_registration(id)) else {
            return;
        };
        let secret = holding.reference.name.to_string();
        self.set_seen(key, id, SecretSeen::Evaluated(version.id));
        let tls = match version.validation {
            Ok(tls) => Some(tls),
            // A secret without a certificate: the router copies nothing to serve,
            // validates no certificate, and serves the route with its default one.
            Err(TlsRejection::CertificateEmpty | TlsRejection::CertificateMissing) => None,
            Err(rejection) => {
                let problem = ValidationProblem::Tls(rejection);
                self.reject_validation(key, &secret, problem, effects);
                return;
            }
        };
        // What the route's own TLS configuration allows around the secret's certificate
        // (passthrough serves none; a caCertificate must have issued it), as the
        // router's extended validation checks after it copied the secret in.
        let fields = route.tls.as_deref();
        let leaf = fields
            .filter(|fields| fields.ca_certificate.is_some())
            .and(tls.as_ref())
            .and_then(|tls| tls.leaf_der());
        if let Some(fields) = fields
            && let Err(problem) = self
                .options
                .validator
                .check_route_config(&fields.config(true), leaf.as_deref())
        {
            let reason = Reason::ExtendedValidationFailed {
                route: key.clone(),
                problem,
            };
            self.reject(key, reason, effects);
            return;
        }
        let host = route.host.as_deref().map(str::to_owned);
        let mut warnings = Vec::new();
        let mut dates_change = None;
        if let Some(tls) = &tls {
            // The certificate becomes valid or expires: applied again then, so that the
            // status message follows (the shell validates the version anew).
            dates_change =
                dates::dates_change_in(tls, version.as_of).and_then(|delay| now.checked_add(delay));
            warnings = tls.warnings().to_vec();
            warnings.extend(host.as_deref().and_then(|host| tls.host_warning(host)));
        }
        let admitted = AdmittedRoute {
            route: key.clone(),
            sni: route.sni(),
            host,
            created: route.created,
            certificate: tls.map(|tls| RouteCertificate {
                source: CertificateSource::Secret(secret),
                tls: with_route_ca(tls, fields.and_then(|f| f.ca_certificate.as_deref())),
            }),
            warnings,
            routing: Arc::clone(&route.routing),
        };
        self.emit(key, RouteOutcome::Admitted(admitted), effects);
        if let Some(at) = dates_change {
            self.schedule_retry(key, at);
        }
    }

    fn access_denied(
        &mut self,
        key: &RouteKey,
        secret: &str,
        verb: kube_common::Verb,
        effects: &mut Vec<Effect>,
    ) {
        let identity = self.options.identity.clone();
        let problem = ValidationProblem::AccessDenied { verb, identity };
        self.reject_validation(key, secret, problem, effects);
    }

    /// Rejects the route because its secret could not be read or checked, and tries
    /// again later.
    fn get_failed(
        &mut self,
        key: &RouteKey,
        secret: &str,
        detail: String,
        now: Instant,
        effects: &mut Vec<Effect>,
    ) {
        let reason = Reason::ExternalCertificateGetFailed {
            route: key.clone(),
            secret: secret.to_owned(),
            detail,
        };
        self.reject(key, reason, effects);
        self.backoff_retry(key, now);
    }

    fn reject_validation(
        &mut self,
        key: &RouteKey,
        secret: &str,
        problem: ValidationProblem,
        effects: &mut Vec<Effect>,
    ) {
        let reason = Reason::ExternalCertificateValidationFailed {
            route: key.clone(),
            secret: secret.to_owned(),
            problem,
        };
        self.reject(key, reason, effects);
    }

    fn reject(&mut self, key: &RouteKey, reason: Reason, effects: &mut Vec<Effect>) {
        let host = self
            .routes
            .get(key)
            .and_then(|entry| entry.latest.as_ref())
            .and_then(|route| route.host.as_deref())
            .map(str::to_owned);
        let rejected = RejectedRoute {
            route: key.clone(),
            host,
            reason,
        };
        self.emit(key, RouteOutcome::Rejected(rejected), effects);
    }

    /// Tells the consumer (unless it was told exactly this last), records it in the
    /// route's status, and counts the route as decided.
    fn emit(&mut self, key: &RouteKey, outcome: RouteOutcome, effects: &mut Vec<Effect>) {
        let Some(entry) = self.routes.get_mut(key) else {
            return;
        };
        let object = entry.latest.as_ref().and_then(|route| route.uid.clone());
        // An admission is decided with the copy applied: its host and wildcard policy
        // are the outcome's host and SNI (the policy matters only with a host).
        let applied = entry.applied();
        let host = applied.and_then(|route| route.host.clone());
        let wildcard_subdomain =
            host.is_some() && applied.is_some_and(|route| route.wildcard_subdomain);
        let (summary, admission) = match &outcome {
            RouteOutcome::Admitted(admitted) => (
                Told::Admitted {
                    object,
                    fingerprint: admitted
                        .certificate
                        .as_ref()
                        .map(|certificate| certificate.tls.fingerprint().0),
                    host,
                    wildcard_subdomain,
                    warnings: admitted.warnings.iter().map(ToString::to_string).collect(),
                    routing: Arc::clone(&admitted.routing),
                },
                admitted.admission(),
            ),
            RouteOutcome::Rejected(rejected) => (
                Told::Rejected {
                    object,
                    reason: rejected.reason.name(),
                    message: rejected.reason.to_string(),
                },
                rejected.reason.admission(),
            ),
            // Removals are sent where they happen; they have no status to record.
            RouteOutcome::Removed(_) => return,
        };
        if entry.told.as_deref() != Some(&summary) {
            entry.told = Some(Box::new(summary));
            let copy = entry.latest.as_ref().or_else(|| entry.applied());
            if let Some(route) = copy.and_then(|copy| copy.object.clone()) {
                entry.recorded = Some(Box::new(admission.clone()));
                effects.push(Effect::RecordStatus { route, admission });
            }
            effects.push(Effect::Emit(Box::new(outcome)));
        }
        // Counted as decided only after its outcome: a consumer that sees the pipeline
        // ready then has every outcome of the start-up set in its queue.
        self.mark_decided(key, effects);
    }

    /// The route is deleted and its turn has come: release everything, tell the
    /// consumer, forget it.
    fn teardown(&mut self, key: &RouteKey, effects: &mut Vec<Effect>) {
        self.release(key, effects);
        self.cancel_retry(key);
        if let Some(entry) = self.routes.remove(key)
            && entry.told.is_some()
        {
            effects.push(Effect::Emit(Box::new(RouteOutcome::Removed(key.clone()))));
        }
        self.mark_decided(key, effects);
    }

    /// The route holds nothing now: it was rejected before registering.
    fn refuse(&mut self, key: &RouteKey, route: &Arc<RouteCopy>, effects: &mut Vec<Effect>) {
        self.release(key, effects);
        self.set_stand(key, route, Stand::Refused);
    }

    /// Drops the route's registrations, if it holds any.
    fn release(&mut self, key: &RouteKey, effects: &mut Vec<Effect>) {
        let Some(entry) = self.routes.get_mut(key) else {
            return;
        };
        if let RouteState::Applied { stand, .. } = &mut entry.state
            && matches!(stand, Stand::Registered(_))
            && let Stand::Registered(holdings) = std::mem::replace(stand, Stand::Refused)
        {
            effects.extend(holdings.registrations().map(Effect::Unregister));
        }
    }

    fn set_stand(&mut self, key: &RouteKey, route: &Arc<RouteCopy>, stand: Stand) {
        if let Some(entry) = self.routes.get_mut(key) {
            entry.state = RouteState::Applied {
                route: Arc::clone(route),
                stand,
            };
        }
    }

    /// Records what registration `id` of the route knows of its secret.
    fn set_seen(&mut self, key: &RouteKey, id: RegistrationId, new: SecretSeen) {
        if let Some(RouteEntry {
            state:
                RouteState::Applied {
                    stand: Stand::Registered(holdings),
                    ..
                },
            ..
        }) = self.routes.get_mut(key)
            && let Some(holding) = holdings.by_registration_mut(id)
        {
            holding.seen = new;
        }
    }

    fn mark_decided(&mut self, key: &RouteKey, effects: &mut Vec<Effect>) {
        if let Startup::Deciding { undecided, .. } = &mut self.startup
            && undecided.remove(key)
        {
            effects.push(Effect::Readiness(self.readiness()));
        }
    }

    /// Retries after the route's next backoff delay.
    fn backoff_retry(&mut self, key: &RouteKey, now: Instant) {
        let policy = self.options.retry;
        let draw = self.jitter.draw();
        let Some(entry) = self.routes.get_mut(key) else {
            return;
        };
        let delay = entry
            .backoff
            .get_or_insert_with(|| Box::new(Backoff::new(policy)))
            .next_delay_at(now, draw);
        self.schedule_retry(key, now + delay);
    }

    fn schedule_retry(&mut self, key: &RouteKey, at: Instant) {
        self.cancel_retry(key);
        if let Some(entry) = self.routes.get_mut(key) {
            entry.retry_at = Some(at);
            self.retries.insert((at, key.clone()));
        }
    }

    fn cancel_retry(&mut self, key: &RouteKey) {
        if let Some(at) = self.routes.get_mut(key).and_then(|e| e.retry_at.take()) {
            self.retries.remove(&(at, key.clone()));
        }
    }

    fn fire_retries(&mut self, now: Instant) {
        while let Some(first) = self.retries.first()
            && first.0 <= now
        {
            let Some((_, key)) = self.retries.pop_first() else {
                break;
            };
            if let Some(entry) = self.routes.get_mut(&key) {
                entry.retry_at = None;
            }
            self.queue.push(key, true);
        }
    }
}
