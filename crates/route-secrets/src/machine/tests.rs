//! The route state machine without a server: every route state against every input
//! (a table, row by row), and random sequences of inputs against invariants
//! (proptest). The simulator tests in `tests/` only cover the shell.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube_common::Verb;
use kube_common::backoff::BackoffPolicy;
use proptest::prelude::*;

use super::*;
use crate::consumer::{CertificateRef, Holding, HoldingPlan, Holdings};
use crate::route::admission::Admission;
use crate::testing::{LeafSpec, Pki};
use crate::tls::{TlsRejection, TlsValidator, ValidatedTls};

const NS: &str = "ns";

/// Two valid certificates (for two secret versions), and certificates served with a
/// warning in the route's status: an expired one and one not valid yet.
struct Material {
    /// When the material was made: the time every version is handed over at.
    now: Timestamp,
    valid: [Arc<ValidatedTls>; 2],
    expired: Arc<ValidatedTls>,
    not_yet_valid: Arc<ValidatedTls>,
}

fn material() -> &'static Material {
    static MATERIAL: OnceLock<Material> = OnceLock::new();
    MATERIAL.get_or_init(|| {
        let now = Timestamp::now();
        let pki = Pki::new(now);
        let validate = |spec: LeafSpec| {
            let secret = pki.issue(&spec).secret(NS, "s");
            Arc::new(
                TlsValidator::default()
                    .validate_secret(&secret, None, now)
                    .expect("valid fixture"),
            )
        };
        let spec = || LeafSpec::new("r.example", now);
        Material {
            now,
            valid: [validate(spec()), validate(spec())],
            expired: validate(spec().expired(now)),
            not_yet_valid: validate(spec().not_yet_valid(now)),
        }
    })
}

fn invalid() -> TlsRejection {
    TlsRejection::KeyEmpty
}

/// A route in `NS`, created at second `age` (older routes have smaller ages), with
/// uid `uid`.
fn route(name: &str, secret: Option<&str>, host: &str, age: i64, uid: &str) -> Route {
    let mut route = crate::testing::route_with_external_certificate(NS, name, host, "x");
    let tls = route.spec.tls.as_mut().expect("tls");
    match secret {
        Some(secret) => {
            tls.external_certificate.as_mut().expect("reference").name = secret.to_owned()
        }
        None => tls.external_certificate = None,
    }
    route.metadata.uid = Some(uid.to_owned());
    route.metadata.creation_timestamp = Some(Time(
        Timestamp::from_second(1_700_000_000 + age).expect("time"),
    ));
    route
}

fn key(name: &str) -> RouteKey {
    RouteKey::new(NS, name)
}

fn version(
    uid: &str,
    rv: u64,
    validation: Result<Arc<ValidatedTls>, TlsRejection>,
) -> SecretVersion {
    SecretVersion {
        id: Some(SecretVersionId {
            uid: uid.into(),
            resource_version: rv.to_string().into(),
        }),
        validation,
        as_of: material().now,
    }
}

/// The time an hour before `tls`'s dates change, counting the second the date policy
/// adds: a version handed over then is evaluated again an hour later.
fn an_hour_before_expiry(tls: &ValidatedTls) -> Timestamp {
    tls.not_after() - jiff::SignedDuration::from_secs(3600 - 1)
}

/// What a route was told, in short.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Said {
    Admitted,
    Rejected(&'static str),
    Removed,
}

fn said(outcome: &RouteOutcome) -> Said {
    match outcome {
        RouteOutcome::Admitted(_) => Said::Admitted,
        RouteOutcome::Rejected(rejected) => Said::Rejected(rejected.reason.name()),
        RouteOutcome::Removed(_) => Said::Removed,
    }
}

/// The route machine's preparations are a route's: its key and its secret's name.
impl Preparation {
    fn route(&self) -> &RouteKey {
        self.consumer.route().expect("a route's preparation")
    }

    fn secret(&self) -> &str {
        &self.reference.name
    }
}

/// Drives a machine as the shell would, and remembers what it was asked to do.
struct Driver {
    machine: RouteMachine,
    now: Instant,
    /// Registrations held, as the shell's table has them: id → (route, secret).
    held: BTreeMap<RegistrationId, (RouteKey, String)>,
    /// The outstanding network part, if any.
    preparing: Option<Preparation>,
    /// Every outcome, in order.
    outcomes: Vec<RouteOutcome>,
    /// Status records, in order.
    statuses: Vec<(RouteKey, bool, Option<String>)>,
    /// Status entries removed: the route, and whether its copy carried a status.
    cleared: Vec<(RouteKey, bool)>,
    /// The last status record of each route, whole.
    last_status: BTreeMap<RouteKey, Admission>,
    /// Secrets prefetched and not released.
    prefetched: BTreeSet<(String, String)>,
    /// Every prefetch asked for, in order.
    prefetches: Vec<(String, String)>,
    readiness: Readiness,
}

impl Driver {
    fn new() -> Self {
        Self {
            machine: RouteMachine::new(MachineOptions {
                identity: "router".to_owned(),
                hosts: HostPolicy::default(),
                retry: BackoffPolicy::default(),
                denial_recheck_min: Duration::from_millis(800),
                seed: 7,
                validator: crate::tls::TlsValidator::default(),
                router_domain: None,
                record_status: true,
                prefetch_window: crate::machine::PREFETCH_WINDOW,
            }),
            now: Instant::now(),
            held: BTreeMap::new(),
            preparing: None,
            outcomes: Vec::new(),
            statuses: Vec::new(),
            cleared: Vec::new(),
            last_status: BTreeMap::new(),
            prefetched: BTreeSet::new(),
            prefetches: Vec::new(),
            readiness: Readiness::default(),
        }
    }

    /// A driver whose machine fetches secrets `window` queued routes ahead.
    fn with_prefetch_window(window: usize) -> Self {
        let mut d = Self::new();
        d.machine = RouteMachine::new(MachineOptions {
            prefetch_window: window,
            ..d.machine.options.clone()
        });
        d
    }

    fn step(&mut self, input: Input) {
        let effects = self.machine.step(input, self.now);
        for effect in effects {
            match effect {
                Effect::Prefetch(reference) => {
                    let (namespace, secret) =
                        (reference.namespace.to_string(), reference.name.to_string());
                    self.prefetches.push((namespace.clone(), secret.clone()));
                    self.prefetched.insert((namespace, secret));
                }
                Effect::ReleasePrefetched => self.prefetched.clear(),
                Effect::Prepare(preparation) => {
                    assert!(self.preparing.is_none(), "two applies in flight");
                    self.preparing = Some(preparation);
                }
                Effect::Unregister(id) => {
                    assert!(self.held.remove(&id).is_some(), "{id} released twice");
                }
                Effect::Emit(outcome) => self.outcomes.push(*outcome),
                Effect::RecordStatus { route, admission } => {
                    let key = route.key().expect("key");
                    self.last_status.insert(key.clone(), admission.clone());
                    self.statuses
                        .push((key, admission.admitted, admission.reason));
                }
                Effect::ClearStatus { route } => {
                    let key = route.key().expect("key");
                    self.cleared.push((key, route.status.is_some()));
                }
                Effect::Readiness(readiness) => {
                    assert!(readiness.initial_done >= self.readiness.initial_done);
                    assert!(readiness.initial_done <= readiness.initial_routes);
                    self.readiness = readiness;
                }
            }
        }
        // The last progress reported is the machine's progress.
        assert_eq!(self.readiness, self.machine.readiness());
    }

    /// Answers the outstanding preparation with `outcome` (which must be `Ready` for a
    /// registration to be held).
    fn answer(&mut self, outcome: PreparedOutcome) {
        let preparation = self.preparing.take().expect("a preparation is outstanding");
        if let (Some(id), PreparedOutcome::Ready(_)) = (preparation.register, &outcome) {
            self.held.insert(
                id,
                (preparation.route().clone(), preparation.secret().to_owned()),
            );
        }
        self.step(Input::Prepared(Prepared {
            preparation,
            outcome,
        }));
    }

    fn found(&mut self, version: SecretVersion) {
        self.answer(PreparedOutcome::Ready(SecretLookup::Found(version)));
    }

    /// Delivers a secret change to `route`'s current registration.
    fn secret(&mut self, route: &str, change: SecretChange) {
        let registration = self.registration_of(route).expect("registered");
        self.step(Input::Secret {
            consumer: key(route).into(),
            registration,
            change,
        });
    }

    fn registration_of(&self, route: &str) -> Option<RegistrationId> {
        self.held
            .iter()
            .find(|(_, (r, _))| *r == key(route))
            .map(|(id, _)| *id)
    }

    /// When `route`'s next apply is scheduled (a retry, or its certificate's dates).
    fn retry_of(&self, route: &str) -> Option<Instant> {
        self.machine.routes.get(&key(route))?.retry_at
    }

    fn held_by(&self, route: &str) -> usize {
        self.held.values().filter(|(r, _)| *r == key(route)).count()
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.step(Input::Tick);
    }

    fn said_to(&self, route: &str) -> Vec<Said> {
        self.outcomes
            .iter()
            .filter(|o| *o.route() == key(route))
            .map(said)
            .collect()
    }
}

// ---------------------------------------------------------------------------------
// Every state × every input.
// ---------------------------------------------------------------------------------

/// The states a route can be in, each built by a sequence of inputs. Route `r` uses
/// secret `s`; route `h` is another route, used to hold the head of the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Queued behind another route's apply, never applied.
    Pending,
    /// Its apply waits for the network (registering).
    Applying,
    /// Applied without an external certificate: decided from the route alone.
    Local,
    /// Rejected for a bad secret name: nothing held, nothing retried.
    RefusedName,
    /// Denied: nothing held, checked again when the denial expires.
    Denied,
    /// The access check failed: nothing held, retried with backoff.
    Unanswered,
    /// Registered and admitted.
    Serving,
    /// Registered, rejected for its TLS material.
    InvalidMaterial,
    /// Registered; the secret does not exist.
    Missing,
    /// Registered; the secret was deleted after it was seen (which is what a secret
    /// that does not exist is, to the router).
    SecretDeleted,
    /// Registered; the cached secret could not be read: retried with backoff.
    LookupFailed,
    /// Deleted while queued behind another route: its teardown waits.
    Deleting,
}

const STATES: [State; 12] = [
    State::Pending,
    State::Applying,
    State::Local,
    State::RefusedName,
    State::Denied,
    State::Unanswered,
    State::Serving,
    State::InvalidMaterial,
    State::Missing,
    State::SecretDeleted,
    State::LookupFailed,
    State::Deleting,
];

fn r_with(secret: Option<&str>) -> Route {
    route("r", secret, "r.example", 10, "uid-r")
}

/// A driver with route `r` in `state`, and `h` applied and admitted (older than `r`).
fn in_state(state: State) -> Driver {
    let mut d = Driver::new();
    let h = route("h", Some("hs"), "h.example", 1, "uid-h");
    d.step(Input::Listed(vec![h.clone()]));
    d.found(version("uid-hs", 1, Ok(Arc::clone(&material().valid[0]))));
    let hold_head = |d: &mut Driver| {
        // A change to h's secret reference puts h's apply at the head of the queue.
        let mut h = h.clone();
        h.spec.tls.as_mut().expect("tls").external_certificate =
            Some(crate::route::ExternalCertificateReference {
                name: "hs2".to_owned(),
                ..Default::default()
            });
        d.step(Input::Applied(h));
        assert!(d.preparing.is_some());
    };
    let valid = || Ok(Arc::clone(&material().valid[0]));
    match state {
        State::Pending => {
            hold_head(&mut d);
            d.step(Input::Applied(r_with(Some("s"))));
        }
        State::Applying => d.step(Input::Applied(r_with(Some("s")))),
        State::Local => d.step(Input::Applied(r_with(None))),
        State::RefusedName => d.step(Input::Applied(r_with(Some("Not_A_Name")))),
        State::Denied => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.answer(PreparedOutcome::AccessDenied {
                verb: Verb::Get,
                recheck_after: Duration::from_secs(30),
            });
        }
        State::Unanswered => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.answer(PreparedOutcome::AccessUnanswered {
                detail: "500".to_owned(),
            });
        }
        State::Serving => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.found(version("uid-s", 1, valid()));
        }
        State::InvalidMaterial => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.found(version("uid-s", 1, Err(invalid())));
        }
        State::Missing => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.answer(PreparedOutcome::Ready(SecretLookup::NotFound));
        }
        State::SecretDeleted => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.found(version("uid-s", 1, valid()));
            d.secret("r", SecretChange::Deleted);
        }
        State::LookupFailed => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.answer(PreparedOutcome::Ready(SecretLookup::Failed {
                detail: "cache".to_owned(),
            }));
        }
        State::Deleting => {
            d.step(Input::Applied(r_with(Some("s"))));
            d.found(version("uid-s", 1, valid()));
            hold_head(&mut d);
            d.step(Input::Deleted(r_with(Some("s"))));
        }
    }
    d
}

/// The inputs a route can meet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// The same route again (e.g. the router's own status write).
    Unchanged,
    /// The route now references secret `t`.
    OtherSecret,
    /// The route no longer has an external certificate.
    NoCertificate,
    /// The route is deleted.
    Delete,
    /// A re-list that still has the route, unchanged.
    RelistWith,
    /// A re-list without the route.
    RelistWithout,
    /// Its secret has a new, valid version.
    SecretValid,
    /// Its secret has a new version with bad material.
    SecretInvalid,
    /// Its secret's current version arrives again.
    SecretSame,
    /// Its secret is deleted.
    SecretGone,
    /// A change delivered to a registration the route no longer holds.
    SecretStale,
    /// A minute passes.
    Minute,
}

const EVENTS: [Event; 12] = [
    Event::Unchanged,
    Event::OtherSecret,
    Event::NoCertificate,
    Event::Delete,
    Event::RelistWith,
    Event::RelistWithout,
    Event::SecretValid,
    Event::SecretInvalid,
    Event::SecretSame,
    Event::SecretGone,
    Event::SecretStale,
    Event::Minute,
];

fn the_route_of(state: State) -> Route {
    match state {
        State::Local => r_with(None),
        State::RefusedName => r_with(Some("Not_A_Name")),
        _ => r_with(Some("s")),
    }
}

/// Applies `event` to route `r` of `d` (built in `state`).
fn meet(d: &mut Driver, state: State, event: Event) {
    let r = the_route_of(state);
    let h = route("h", Some("hs"), "h.example", 1, "uid-h");
    let registration = d.registration_of("r");
    let to_registration = |d: &mut Driver, change: SecretChange| {
        // Delivered to the registration the route holds, or to a past one when it
        // holds none (as a late event would be).
        let registration = registration.unwrap_or(RegistrationId(999));
        d.step(Input::Secret {
            consumer: key("r").into(),
            registration,
            change,
        });
    };
    match event {
        Event::Unchanged => {
            let mut same = r.clone();
            same.metadata.resource_version = Some("status-write".to_owned());
            d.step(Input::Applied(same));
        }
        Event::OtherSecret => d.step(Input::Applied(r_with(Some("t")))),
        Event::NoCertificate => d.step(Input::Applied(r_with(None))),
        Event::Delete => d.step(Input::Deleted(r)),
        Event::RelistWith => d.step(Input::Listed(vec![h, r])),
        Event::RelistWithout => d.step(Input::Listed(vec![h])),
        Event::SecretValid => to_registration(
            d,
            SecretChange::Present(version("uid-s", 2, Ok(Arc::clone(&material().valid[1])))),
        ),
        Event::SecretInvalid => to_registration(
            d,
            SecretChange::Present(version("uid-s", 2, Err(invalid()))),
        ),
        Event::SecretSame => to_registration(
            d,
            SecretChange::Present(version("uid-s", 1, Ok(Arc::clone(&material().valid[0])))),
        ),
        Event::SecretGone => to_registration(d, SecretChange::Deleted),
        Event::SecretStale => d.step(Input::Secret {
            consumer: key("r").into(),
            registration: RegistrationId(999),
            change: SecretChange::Deleted,
        }),
        Event::Minute => d.advance(Duration::from_secs(60)),
    }
}

/// Where route `r` stands, in short.
fn stands(d: &Driver) -> &'static str {
    let m = &d.machine;
    let key = key("r");
    let Some(entry) = m.routes.get(&key) else {
        return "gone";
    };
    if m.head
        .as_ref()
        .is_some_and(|h| *h.preparation.route() == key)
    {
        return "applying";
    }
    if entry.latest.is_none() {
        return "deleting";
    }
    let queued = m.queue.contains(&key);
    match (&entry.state, queued) {
        (_, true) => "queued",
        (RouteState::Pending, false) => "pending",
        (RouteState::Applied { stand, .. }, false) => match stand {
            Stand::Local => "local",
            Stand::Refused if entry.retry_at.is_some() => "refused, retrying",
            Stand::Refused => "refused",
            Stand::Registering => "registering",
            // Admitted: applied again when its certificate's dates change (days away;
            // a retry is seconds away).
            Stand::Registered(_)
                if entry
                    .retry_at
                    .is_some_and(|at| at >= d.now + Duration::from_secs(24 * 3600)) =>
            {
                "admitted, dates watched"
            }
            Stand::Registered(_) if entry.retry_at.is_some() => "registered, retrying",
            Stand::Registered(holdings) => match holdings.iter().next().map(|held| &held.seen) {
                Some(SecretSeen::Pending) => "registered",
                Some(SecretSeen::Missing) => "registered, secret missing",
                Some(SecretSeen::Evaluated(_)) => "registered, evaluated",
                None => "registered with nothing",
            },
        },
    }
}

/// `(state, event, what r is told, where r stands after, registrations r holds)`.
type Row = (State, Event, Option<Said>, &'static str, usize);

/// What each state does with each event. Routes waiting behind the head (`Pending`,
/// `Deleting`) only change their queued copy; the head's apply finishes when its
/// network part answers (covered by [`PREPARED`]).
#[rustfmt::skip]
const TABLE: &[Row] = {
    use Event::*;
    use Said::*;
    use State::*;
    // Certificate and key problems are the router's ExtendedValidationFailed.
    const EV: &str = "ExtendedValidationFailed";
    // A deleted secret is a missing one: the router's ExternalCertificateValidationFailed.
    const VF: &str = "ExternalCertificateValidationFailed";
    &[
        (Pending, Unchanged, None, "queued", 0),
        (Pending, OtherSecret, None, "queued", 0),
        (Pending, NoCertificate, None, "queued", 0),
        (Pending, Delete, None, "deleting", 0),
        (Pending, RelistWith, None, "queued", 0),
        (Pending, RelistWithout, None, "deleting", 0),
        (Pending, SecretValid, None, "queued", 0),
        (Pending, SecretInvalid, None, "queued", 0),
        (Pending, SecretSame, None, "queued", 0),
        (Pending, SecretGone, None, "queued", 0),
        (Pending, SecretStale, None, "queued", 0),
        (Pending, Minute, None, "queued", 0),

        (Applying, Unchanged, None, "applying", 0),
        (Applying, OtherSecret, None, "applying", 0),
        (Applying, NoCertificate, None, "applying", 0),
        (Applying, Delete, None, "applying", 0),
        (Applying, RelistWith, None, "applying", 0),
        (Applying, RelistWithout, None, "applying", 0),
        (Applying, SecretValid, None, "applying", 0),
        (Applying, SecretInvalid, None, "applying", 0),
        (Applying, SecretSame, None, "applying", 0),
        (Applying, SecretGone, None, "applying", 0),
        (Applying, SecretStale, None, "applying", 0),
        (Applying, Minute, None, "applying", 0),

        (Local, Unchanged, None, "local", 0),
        (Local, OtherSecret, None, "applying", 0),
        (Local, NoCertificate, None, "local", 0),
        (Local, Delete, Some(Removed), "gone", 0),
        (Local, RelistWith, None, "local", 0),
        (Local, RelistWithout, Some(Removed), "gone", 0),
        (Local, SecretValid, None, "local", 0),
        (Local, SecretInvalid, None, "local", 0),
        (Local, SecretSame, None, "local", 0),
        (Local, SecretGone, None, "local", 0),
        (Local, SecretStale, None, "local", 0),
        (Local, Minute, None, "local", 0),

        (RefusedName, Unchanged, None, "refused", 0),
        (RefusedName, OtherSecret, None, "applying", 0),
        (RefusedName, NoCertificate, Some(Admitted), "local", 0),
        (RefusedName, Delete, Some(Removed), "gone", 0),
        (RefusedName, RelistWith, None, "refused", 0),
        (RefusedName, RelistWithout, Some(Removed), "gone", 0),
        (RefusedName, SecretValid, None, "refused", 0),
        (RefusedName, SecretInvalid, None, "refused", 0),
        (RefusedName, SecretSame, None, "refused", 0),
        (RefusedName, SecretGone, None, "refused", 0),
        (RefusedName, SecretStale, None, "refused", 0),
        (RefusedName, Minute, None, "refused", 0),

        (Denied, Unchanged, None, "refused, retrying", 0),
        (Denied, OtherSecret, None, "applying", 0),
        (Denied, NoCertificate, Some(Admitted), "local", 0),
        (Denied, Delete, Some(Removed), "gone", 0),
        (Denied, RelistWith, None, "refused, retrying", 0),
        (Denied, RelistWithout, Some(Removed), "gone", 0),
        (Denied, SecretValid, None, "refused, retrying", 0),
        (Denied, SecretInvalid, None, "refused, retrying", 0),
        (Denied, SecretSame, None, "refused, retrying", 0),
        (Denied, SecretGone, None, "refused, retrying", 0),
        (Denied, SecretStale, None, "refused, retrying", 0),
        // The denial expired (30 s): checked again, registering anew.
        (Denied, Minute, None, "applying", 0),

        (Unanswered, Unchanged, None, "refused, retrying", 0),
        (Unanswered, OtherSecret, None, "applying", 0),
        (Unanswered, NoCertificate, Some(Admitted), "local", 0),
        (Unanswered, Delete, Some(Removed), "gone", 0),
        (Unanswered, RelistWith, None, "refused, retrying", 0),
        (Unanswered, RelistWithout, Some(Removed), "gone", 0),
        (Unanswered, SecretValid, None, "refused, retrying", 0),
        (Unanswered, SecretInvalid, None, "refused, retrying", 0),
        (Unanswered, SecretSame, None, "refused, retrying", 0),
        (Unanswered, SecretGone, None, "refused, retrying", 0),
        (Unanswered, SecretStale, None, "refused, retrying", 0),
        (Unanswered, Minute, None, "applying", 0),

        (Serving, Unchanged, None, "admitted, dates watched", 1),
        (Serving, OtherSecret, None, "applying", 0),
        (Serving, NoCertificate, Some(Admitted), "local", 0),
        (Serving, Delete, Some(Removed), "gone", 0),
        (Serving, RelistWith, None, "admitted, dates watched", 1),
        (Serving, RelistWithout, Some(Removed), "gone", 0),
        (Serving, SecretValid, Some(Admitted), "admitted, dates watched", 1),
        (Serving, SecretInvalid, Some(Rejected(EV)), "registered, evaluated", 1),
        (Serving, SecretSame, None, "admitted, dates watched", 1),
        (Serving, SecretGone, Some(Rejected(VF)), "registered, secret missing", 1),
        (Serving, SecretStale, None, "admitted, dates watched", 1),
        (Serving, Minute, None, "admitted, dates watched", 1),

        (InvalidMaterial, Unchanged, None, "registered, evaluated", 1),
        (InvalidMaterial, OtherSecret, None, "applying", 0),
        (InvalidMaterial, NoCertificate, Some(Admitted), "local", 0),
        (InvalidMaterial, Delete, Some(Removed), "gone", 0),
        (InvalidMaterial, RelistWith, None, "registered, evaluated", 1),
        (InvalidMaterial, RelistWithout, Some(Removed), "gone", 0),
        (InvalidMaterial, SecretValid, Some(Admitted), "admitted, dates watched", 1),
        // A new version that is invalid in the same way says nothing new.
        (InvalidMaterial, SecretInvalid, None, "registered, evaluated", 1),
        (InvalidMaterial, SecretSame, None, "registered, evaluated", 1),
        (InvalidMaterial, SecretGone, Some(Rejected(VF)), "registered, secret missing", 1),
        (InvalidMaterial, SecretStale, None, "registered, evaluated", 1),
        (InvalidMaterial, Minute, None, "registered, evaluated", 1),

        (Missing, Unchanged, None, "registered, secret missing", 1),
        (Missing, OtherSecret, None, "applying", 0),
        (Missing, NoCertificate, Some(Admitted), "local", 0),
        (Missing, Delete, Some(Removed), "gone", 0),
        (Missing, RelistWith, None, "registered, secret missing", 1),
        (Missing, RelistWithout, Some(Removed), "gone", 0),
        // Created: admitted (a creation, not a re-creation).
        (Missing, SecretValid, Some(Admitted), "admitted, dates watched", 1),
        (Missing, SecretInvalid, Some(Rejected(EV)), "registered, evaluated", 1),
        (Missing, SecretSame, Some(Admitted), "admitted, dates watched", 1),
        // Deleted while missing: the same rejection, not said again.
        (Missing, SecretGone, None, "registered, secret missing", 1),
        (Missing, SecretStale, None, "registered, secret missing", 1),
        (Missing, Minute, None, "registered, secret missing", 1),

        (SecretDeleted, Unchanged, None, "registered, secret missing", 1),
        (SecretDeleted, OtherSecret, None, "applying", 0),
        (SecretDeleted, NoCertificate, Some(Admitted), "local", 0),
        (SecretDeleted, Delete, Some(Removed), "gone", 0),
        (SecretDeleted, RelistWith, None, "registered, secret missing", 1),
        (SecretDeleted, RelistWithout, Some(Removed), "gone", 0),
        // Re-created: admitted as any secret that exists.
        (SecretDeleted, SecretValid, Some(Admitted), "admitted, dates watched", 1),
        (SecretDeleted, SecretInvalid, Some(Rejected(EV)), "registered, evaluated", 1),
        (SecretDeleted, SecretSame, Some(Admitted), "admitted, dates watched", 1),
        (SecretDeleted, SecretGone, None, "registered, secret missing", 1),
        (SecretDeleted, SecretStale, None, "registered, secret missing", 1),
        (SecretDeleted, Minute, None, "registered, secret missing", 1),

        (LookupFailed, Unchanged, None, "registered, retrying", 1),
        (LookupFailed, OtherSecret, None, "applying", 0),
        (LookupFailed, NoCertificate, Some(Admitted), "local", 0),
        (LookupFailed, Delete, Some(Removed), "gone", 0),
        (LookupFailed, RelistWith, None, "registered, retrying", 1),
        (LookupFailed, RelistWithout, Some(Removed), "gone", 0),
        // The secret arrives after all: decided, and the retry is moot.
        (LookupFailed, SecretValid, Some(Admitted), "admitted, dates watched", 1),
        (LookupFailed, SecretInvalid, Some(Rejected(EV)), "registered, evaluated", 1),
        (LookupFailed, SecretSame, Some(Admitted), "admitted, dates watched", 1),
        (LookupFailed, SecretGone, Some(Rejected(VF)), "registered, secret missing", 1),
        (LookupFailed, SecretStale, None, "registered, retrying", 1),
        // The retry re-checks with the registration held: no new registration.
        (LookupFailed, Minute, None, "applying", 1),

        (Deleting, Unchanged, None, "queued", 1),
        (Deleting, OtherSecret, None, "queued", 1),
        (Deleting, NoCertificate, None, "queued", 1),
        (Deleting, Delete, None, "deleting", 1),
        (Deleting, RelistWith, None, "queued", 1),
        (Deleting, RelistWithout, None, "deleting", 1),
        // A deleted route hears nothing more from its secret.
        (Deleting, SecretValid, None, "deleting", 1),
        (Deleting, SecretInvalid, None, "deleting", 1),
        (Deleting, SecretSame, None, "deleting", 1),
        (Deleting, SecretGone, None, "deleting", 1),
        (Deleting, SecretStale, None, "deleting", 1),
        (Deleting, Minute, None, "deleting", 1),
    ]
};

#[test]
fn the_table_covers_every_state_and_event() {
    for state in STATES {
        for event in EVENTS {
            let rows = TABLE
                .iter()
                .filter(|(s, e, ..)| *s == state && *e == event)
                .count();
            assert_eq!(rows, 1, "{state:?} × {event:?}");
        }
    }
}

#[test]
fn every_state_meets_every_event() {
    let mut failures = Vec::new();
    for (state, event, expected_said, expected_stand, expected_held) in TABLE.iter().cloned() {
        let mut d = in_state(state);
        let before = d.outcomes.len();
        meet(&mut d, state, event);
        let told: Vec<Said> = d.outcomes[before..]
            .iter()
            .filter(|o| *o.route() == key("r"))
            .map(said)
            .collect();
        let actual = (told.last().cloned(), stands(&d), d.held_by("r"));
        let expected = (expected_said, expected_stand, expected_held);
        if told.len() > 1 || actual != expected {
            failures.push(format!(
                "{state:?} × {event:?}: expected {expected:?}, got {actual:?} (told {told:?})"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `(name, answer, what r is told, where r stands, registrations held, retry in)`.
type AnswerCase = (
    &'static str,
    PreparedOutcome,
    Said,
    &'static str,
    usize,
    Option<Duration>,
);

/// How the head's apply ends, from each way the network can answer.
#[test]
fn every_network_answer_ends_the_apply() {
    const VF: &str = "ExternalCertificateValidationFailed";
    const GF: &str = "ExternalCertificateGetFailed";
    let valid = || Ok(Arc::clone(&material().valid[0]));
    let cases: Vec<AnswerCase> = vec![
        (
            "found, valid",
            PreparedOutcome::Ready(SecretLookup::Found(version("u", 1, valid()))),
            Said::Admitted,
            "admitted, dates watched",
            1,
            // Valid for 90 days: looked at again after the longest wait.
            Some(dates::DATES_RECHECK_MAX),
        ),
        (
            "found, invalid",
            PreparedOutcome::Ready(SecretLookup::Found(version("u", 1, Err(invalid())))),
            Said::Rejected("ExtendedValidationFailed"),
            "registered, evaluated",
            1,
            None,
        ),
        (
            "not found",
            PreparedOutcome::Ready(SecretLookup::NotFound),
            Said::Rejected(VF),
            "registered, secret missing",
            1,
            None,
        ),
        (
            "cache failed",
            PreparedOutcome::Ready(SecretLookup::Failed { detail: "x".into() }),
            Said::Rejected(GF),
            "registered, retrying",
            1,
            Some(Duration::from_millis(800)),
        ),
        (
            "access denied",
            PreparedOutcome::AccessDenied {
                verb: Verb::Watch,
                recheck_after: Duration::from_secs(25),
            },
            Said::Rejected(VF),
            "refused, retrying",
            0,
            Some(Duration::from_secs(25)),
        ),
        (
            "access denied, answer about to expire",
            PreparedOutcome::AccessDenied {
                verb: Verb::Watch,
                recheck_after: Duration::ZERO,
            },
            Said::Rejected(VF),
            "refused, retrying",
            0,
            Some(Duration::from_millis(800)),
        ),
        (
            "access unanswered",
            PreparedOutcome::AccessUnanswered { detail: "x".into() },
            Said::Rejected(GF),
            "refused, retrying",
            0,
            Some(Duration::from_millis(800)),
        ),
        (
            "watch forbidden",
            PreparedOutcome::RegistrationForbidden { verb: Verb::List },
            Said::Rejected(VF),
            "refused, retrying",
            0,
            Some(Duration::from_millis(800)),
        ),
        (
            "watch failed",
            PreparedOutcome::RegistrationFailed { detail: "x".into() },
            Said::Rejected(GF),
            "refused, retrying",
            0,
            Some(Duration::from_millis(800)),
        ),
    ];
    for (name, answer, expected_said, expected_stand, expected_held, retry) in cases {
        let mut d = in_state(State::Applying);
        let start = d.now;
        d.answer(answer);
        assert_eq!(d.said_to("r").last(), Some(&expected_said), "{name}");
        assert_eq!(stands(&d), expected_stand, "{name}");
        assert_eq!(d.held_by("r"), expected_held, "{name}");
        match retry {
            None => assert_eq!(d.retry_of("r"), None, "{name}"),
            Some(at_most) => {
                let wakeup = d.retry_of("r").expect(name);
                let delay = wakeup - start;
                // Backoff jitter only shortens, to no less than half the step.
                assert!(
                    delay <= at_most && delay >= at_most / 2,
                    "{name}: {delay:?}"
                );
            }
        }
    }
}

#[test]
fn an_apply_overtaken_by_a_newer_event_is_redone_with_the_latest_copy() {
    let mut d = in_state(State::Applying);
    // While r registers with s, r is changed to use t.
    d.step(Input::Applied(r_with(Some("t"))));
    let valid = Ok(Arc::clone(&material().valid[0]));
    d.found(version("u", 1, valid.clone()));
    // Nothing is said about the stale apply; the new one releases s and registers t.
    assert_eq!(d.said_to("r"), vec![]);
    let preparation = d.preparing.clone().expect("re-applied");
    assert_eq!(preparation.secret(), "t");
    assert_eq!(d.held_by("r"), 0, "the registration on s was released");
    d.found(version("ut", 1, valid));
    assert_eq!(d.said_to("r"), vec![Said::Admitted]);
    assert_eq!(
        d.held.values().cloned().collect::<Vec<_>>(),
        [(key("h"), "hs".to_owned()), (key("r"), "t".to_owned())]
    );
}

#[test]
fn a_route_deleted_while_it_registers_is_torn_down_and_holds_nothing() {
    let mut d = in_state(State::Applying);
    d.step(Input::Deleted(r_with(Some("s"))));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(d.said_to("r"), vec![], "never told, so no removal either");
    assert_eq!(d.held_by("r"), 0);
    assert_eq!(stands(&d), "gone");
}

#[test]
fn a_re_created_route_is_told_again_and_gets_its_status() {
    let mut d = in_state(State::Serving);
    let statuses = d.statuses.len();
    let mut again = r_with(Some("s"));
    again.metadata.uid = Some("uid-r-2".to_owned());
    d.step(Input::Applied(again));
    d.found(version("uid-s", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(d.said_to("r"), vec![Said::Admitted, Said::Admitted]);
    assert_eq!(d.statuses.len(), statuses + 1);
}

/// A served route whose backends or router annotations change is told again, with the
/// new routing data; a copy that changes nothing a router reads is not.
#[test]
fn a_routing_change_is_told_again_with_the_new_routing() {
    use crate::route::RouteTargetReference;

    let mut d = in_state(State::Serving);
    let told = |d: &Driver| -> Vec<Vec<(String, u16)>> {
        d.outcomes
            .iter()
            .filter_map(|outcome| match outcome {
                RouteOutcome::Admitted(admitted) => Some(
                    admitted
                        .routing
                        .backends
                        .iter()
                        .map(|b| (b.name.to_string(), b.weight))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    };
    let before = told(&d).len();
    let mut moved = r_with(Some("s"));
    moved.spec.alternate_backends = Some(vec![RouteTargetReference {
        name: "canary".into(),
        weight: Some(10),
        ..RouteTargetReference::default()
    }]);
    d.step(Input::Applied(moved.clone()));
    d.found(version("uid-s", 1, Ok(Arc::clone(&material().valid[0]))));
    let after = told(&d);
    assert_eq!(after.len(), before + 1, "{after:?}");
    assert_eq!(
        after
            .last()
            .unwrap()
            .iter()
            .map(|(n, w)| (n.as_str(), *w))
            .collect::<Vec<_>>(),
        [("r", 1), ("canary", 10)]
    );
    let mut annotated = moved.clone();
    annotated.metadata.annotations = Some(BTreeMap::from([(
        "haproxy.router.openshift.io/balance".to_owned(),
        "leastconn".to_owned(),
    )]));
    d.step(Input::Applied(annotated.clone()));
    d.found(version("uid-s", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(told(&d).len(), before + 2);
    let mut unrelated = annotated;
    unrelated
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("note".to_owned(), "not read by a router".to_owned());
    d.step(Input::Applied(unrelated));
    assert_eq!(told(&d).len(), before + 2);
}

/// An expired or not yet valid certificate is served, as by the router, and the route's
/// status says so next to `Admitted=True`; a renewed certificate clears the message
/// (a status write whose only change is the message).
#[test]
fn a_certificate_served_despite_its_dates_says_so_in_the_status_until_renewed() {
    let mut d = in_state(State::Applying);
    let m = material();
    let status = |d: &Driver| d.last_status.get(&key("r")).cloned().expect("a status");
    d.found(version("uid-s", 1, Ok(Arc::clone(&m.expired))));
    assert_eq!(d.said_to("r"), vec![Said::Admitted]);
    let expired = status(&d);
    assert!(expired.admitted);
    assert_eq!(expired.reason, None, "the router has no reason for this");
    let message = expired.message.expect("a message");
    let not_after = m.expired.not_after().to_string();
    for words in [
        "route ns/r: external certificate secret ns/s",
        &format!("expired at {not_after}"),
        "served anyway (as by the OpenShift router)",
    ] {
        assert!(message.contains(words), "{words:?} in {message:?}");
    }

    let writes = d.statuses.len();
    d.secret(
        "r",
        SecretChange::Present(version("uid-s", 2, Ok(Arc::clone(&m.valid[0])))),
    );
    assert_eq!(d.said_to("r"), vec![Said::Admitted, Said::Admitted]);
    assert_eq!(status(&d), Admission::admitted(), "renewed: no message");
    assert_eq!(d.statuses.len(), writes + 1);

    d.secret(
        "r",
        SecretChange::Present(version("uid-s", 3, Ok(Arc::clone(&m.not_yet_valid)))),
    );
    let not_before = m.not_yet_valid.not_before().to_string();
    let message = status(&d).message.expect("a message");
    assert!(
        message.contains(&format!("not valid before {not_before}")),
        "{message}"
    );

    // Deleted, then re-created with an expired certificate: admitted as any secret that
    // exists, with no reason from its history, and the expiry in the message.
    d.secret("r", SecretChange::Deleted);
    assert_eq!(
        d.said_to("r").last(),
        Some(&Said::Rejected("ExternalCertificateValidationFailed"))
    );
    d.secret(
        "r",
        SecretChange::Present(version("uid-s2", 1, Ok(Arc::clone(&m.expired)))),
    );
    assert_eq!(d.said_to("r").last(), Some(&Said::Admitted));
    let recreated = status(&d);
    assert!(recreated.admitted);
    assert_eq!(recreated.reason, None);
    let message = recreated.message.expect("a message");
    assert!(
        message.contains(&format!("expired at {not_after}")),
        "{message}"
    );
}

/// A served certificate is evaluated again when its dates change (it expires, or
/// becomes valid), with no change to the secret: the status follows the dates.
#[test]
fn a_served_certificate_is_evaluated_again_when_its_dates_change() {
    let mut d = in_state(State::Applying);
    let m = material();
    let hour = Duration::from_secs(3600);
    let mut valid = version("uid-s", 1, Ok(Arc::clone(&m.valid[0])));
    // Handed over an hour (less the second the policy adds) before it expires.
    valid.as_of = an_hour_before_expiry(&m.valid[0]);
    d.found(valid);
    let message = |d: &Driver| d.last_status.get(&key("r")).and_then(|a| a.message.clone());
    assert_eq!(message(&d), None);
    assert_eq!(d.machine.next_wakeup(), Some(d.now + hour));

    d.advance(hour - Duration::from_secs(1));
    assert!(d.preparing.is_none(), "not before the dates change");
    d.advance(Duration::from_secs(1));
    let preparation = d.preparing.clone().expect("applied again");
    assert_eq!(*preparation.route(), key("r"));
    assert_eq!(preparation.register, None, "keeps its registration");
    // The shell validates the same version anew: expired now, and for good.
    d.found(version("uid-s", 1, Ok(Arc::clone(&m.expired))));
    assert_eq!(d.said_to("r"), vec![Said::Admitted, Said::Admitted]);
    let expired = message(&d).expect("a message");
    assert!(expired.contains("expired at"), "{expired}");
    assert_eq!(d.retry_of("r"), None, "expired for good");
    assert_eq!(d.held_by("r"), 1);
}

#[test]
fn start_up_is_ready_once_every_listed_route_is_decided_oldest_first() {
    let mut d = Driver::new();
    let routes = vec![
        route("c", Some("s"), "c.example", 3, "uc"),
        route("a", Some("s"), "a.example", 1, "ua"),
        route("plain", None, "p.example", 0, "up"),
        route("b", Some("t"), "b.example", 2, "ub"),
    ];
    d.step(Input::Listed(routes));
    assert_eq!(
        d.readiness,
        Readiness {
            listed: true,
            initial_routes: 4,
            initial_done: 1,
        },
        "the route without a certificate is decided from itself"
    );
    // Both secrets were prefetched the moment the listing arrived.
    assert_eq!(d.prefetched.len(), 2);
    let valid = || Ok(Arc::clone(&material().valid[0]));
    let mut order = Vec::new();
    while let Some(preparation) = d.preparing.clone() {
        order.push(preparation.route().name.to_string());
        assert!(!d.readiness.is_ready());
        d.found(version(preparation.secret(), 1, valid()));
    }
    assert_eq!(order, ["a", "b", "c"]);
    assert!(d.readiness.is_ready());
    assert!(
        d.prefetched.is_empty(),
        "prefetch holds released once the queue drained"
    );
    // The outcome of each route comes before it is counted.
    let names: Vec<String> = d
        .outcomes
        .iter()
        .map(|o| o.route().name.to_string())
        .collect();
    assert_eq!(names, ["plain", "a", "b", "c"]);
}

#[test]
fn a_denied_route_is_checked_again_when_the_denial_expires_never_later() {
    let mut d = in_state(State::Applying);
    d.answer(PreparedOutcome::AccessDenied {
        verb: Verb::Get,
        recheck_after: Duration::from_secs(30),
    });
    for _ in 0..5 {
        let wakeup = d.machine.next_wakeup().expect("retry scheduled");
        assert_eq!(wakeup - d.now, Duration::from_secs(30));
        d.advance(Duration::from_secs(30));
        d.answer(PreparedOutcome::AccessDenied {
            verb: Verb::Get,
            recheck_after: Duration::from_secs(30),
        });
    }
    // The grant shows at the next check, at most one denial TTL later.
    d.advance(Duration::from_secs(30));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(d.said_to("r").last(), Some(&Said::Admitted));
}

/// A driver whose machine admits routes with `hosts`, with `route` listed.
fn listed_with(hosts: HostPolicy, route: Route) -> Driver {
    let mut d = Driver::new();
    d.machine = RouteMachine::new(MachineOptions {
        hosts,
        ..d.machine.options.clone()
    });
    d.step(Input::Listed(vec![route]));
    d
}

fn wildcard(host: &str) -> Route {
    let mut route = route("r", Some("s"), host, 10, "uid-r");
    route.spec.wildcard_policy = Some(crate::route::WildcardPolicy::Subdomain);
    route
}

fn admitted_sni(d: &Driver) -> Vec<Sni> {
    d.outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            RouteOutcome::Admitted(admitted) => Some(admitted.sni.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_wildcard_route_is_refused_by_default_without_touching_its_secret() {
    let mut d = listed_with(HostPolicy::default(), wildcard("www.shop.example"));
    assert_eq!(d.said_to("r"), vec![Said::Rejected("RouteNotAdmitted")]);
    let RouteOutcome::Rejected(rejected) = &d.outcomes[0] else {
        panic!("rejected");
    };
    assert_eq!(rejected.cause().as_str(), "wildcard");
    assert_eq!(
        d.statuses,
        vec![(key("r"), false, Some("RouteNotAdmitted".to_owned()))]
    );
    // Decided from the route alone: no prefetch, no access check, no registration.
    assert!(d.preparing.is_none());
    assert!(d.prefetched.is_empty());
    assert_eq!(d.held_by("r"), 0);
    assert!(d.readiness.is_ready());
    assert_eq!(d.machine.next_wakeup(), None, "nothing to retry");

    // Made a plain route, it is checked and admitted for its host.
    d.step(Input::Applied(route(
        "r",
        Some("s"),
        "www.shop.example",
        10,
        "uid-r",
    )));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(
        admitted_sni(&d),
        vec![Sni::Host("www.shop.example".to_owned())]
    );
}

/// The checks made on the route alone are the same ahead of the queue and at its
/// apply: a route whose host is not a DNS name, or whose secret name is not a name, is
/// refused without its secret being prefetched, watched or checked.
#[test]
fn a_route_refused_on_its_own_is_never_prefetched() {
    let upper = route("r", Some("s"), "R.example", 10, "uid-r");
    let bad_name = route("b", Some("Not_A_Name"), "b.example", 11, "uid-b");
    let mut d = Driver::new();
    d.step(Input::Listed(vec![upper, bad_name]));
    assert_eq!(d.said_to("r"), vec![Said::Rejected("InvalidHost")]);
    assert_eq!(
        d.said_to("b"),
        vec![Said::Rejected("ExternalCertificateValidationFailed")]
    );
    assert_eq!(d.prefetches, []);
    assert!(d.preparing.is_none());
    assert_eq!(d.held_by("r") + d.held_by("b"), 0);
    assert!(d.readiness.is_ready());
}

/// A route with an external certificate and an inline key (the API allows both) is
/// served with its secret's certificate and key, as the router copies the secret over
/// the inline fields.
#[test]
fn a_secret_replaces_the_inline_fields() {
    let mut both = route("r", Some("s"), "r.example", 10, "uid-r");
    both.spec.tls.as_mut().expect("tls").key = Some("-----BEGIN".to_owned());
    let mut d = Driver::new();
    d.step(Input::Listed(vec![both]));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(d.said_to("r"), vec![Said::Admitted]);
    assert_eq!(d.held_by("r"), 1);
}

#[test]
fn an_allowed_wildcard_route_is_served_for_its_domain() {
    let hosts = HostPolicy {
        allow_wildcard_routes: true,
        ..HostPolicy::default()
    };
    let mut d = listed_with(hosts, wildcard("www.shop.example"));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    let sni = admitted_sni(&d);
    assert_eq!(
        sni,
        vec![Sni::Subdomain {
            domain: "shop.example".to_owned()
        }]
    );

    // Turning the policy off again (same host, same secret) changes what is served:
    // the consumer is told.
    d.step(Input::Applied(route(
        "r",
        Some("s"),
        "www.shop.example",
        10,
        "uid-r",
    )));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(
        admitted_sni(&d)[1],
        Sni::Host("www.shop.example".to_owned())
    );
}

/// A route without a host is rejected as the router rejects it (`NoHostValue`); a
/// wildcard route whose host has no parent domain is admitted but gets no crt-list line.
#[test]
fn a_route_without_a_host_is_rejected_and_a_wildcard_host_without_a_domain_gets_no_line() {
    let allow = HostPolicy {
        allow_wildcard_routes: true,
        ..HostPolicy::default()
    };
    for (hosts, route) in [
        (
            HostPolicy::default(),
            route("r", Some("s"), "", 10, "uid-r"),
        ),
        (allow, wildcard("")),
    ] {
        let d = listed_with(hosts, route);
        assert_eq!(d.said_to("r"), vec![Said::Rejected("NoHostValue")]);
        assert!(d.preparing.is_none(), "nothing to check for it");
    }
    let mut d = listed_with(allow, wildcard("localhost"));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(admitted_sni(&d), vec![Sni::NoHost]);
}

/// A route with `spec.subdomain` and no host is decided at `<subdomain>.<domain>` when
/// the router has a domain, and has no host (`NoHostValue`) without one.
#[test]
fn a_subdomain_route_takes_its_host_from_the_routers_domain() {
    let mut subdomain = route("r", Some("s"), "", 10, "uid-r");
    subdomain.spec.subdomain = Some("shop".to_owned());
    let d = listed_with(HostPolicy::default(), subdomain.clone());
    assert_eq!(d.said_to("r"), vec![Said::Rejected("NoHostValue")]);
    let mut d = Driver::new();
    d.machine = RouteMachine::new(MachineOptions {
        router_domain: Some("apps.example".to_owned()),
        ..d.machine.options.clone()
    });
    d.step(Input::Listed(vec![subdomain]));
    d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(
        admitted_sni(&d),
        vec![Sni::Host("shop.apps.example".to_owned())]
    );
}

/// A route in namespace `ns` claiming `host` (with `path`), created at second `age`.
fn claimant(ns: &str, name: &str, host: &str, path: Option<&str>, age: i64) -> Route {
    let mut route = route(name, Some("s"), host, age, &format!("uid-{ns}-{name}"));
    route.metadata.namespace = Some(ns.to_owned());
    route.spec.path = path.map(str::to_owned);
    route
}

fn said_to_route(d: &Driver, route: &RouteKey) -> Vec<Said> {
    d.outcomes
        .iter()
        .filter(|o| o.route() == route)
        .map(said)
        .collect()
}

/// Answers every apply the machine asks for with a valid secret.
fn settle(d: &mut Driver) {
    let mut answered = 0;
    while d.preparing.is_some() {
        d.found(version("u", 1, Ok(Arc::clone(&material().valid[0]))));
        answered += 1;
        assert!(answered < 100, "the machine keeps asking");
    }
}

#[test]
fn the_oldest_claim_on_a_host_wins_and_the_next_takes_over_when_it_goes() {
    let older = claimant("a", "older", "shop.example", None, 1);
    let younger = claimant("b", "younger", "shop.example", None, 2);
    let (older_key, younger_key) = (older.key().expect("key"), younger.key().expect("key"));
    let mut d = Driver::new();
    // Listed youngest first: the machine orders by age.
    d.step(Input::Listed(vec![younger.clone(), older.clone()]));
    settle(&mut d);
    assert_eq!(said_to_route(&d, &older_key), vec![Said::Admitted]);
    assert_eq!(
        said_to_route(&d, &younger_key),
        vec![Said::Rejected("HostAlreadyClaimed")]
    );
    let RouteOutcome::Rejected(rejected) = d
        .outcomes
        .iter()
        .find(|o| *o.route() == younger_key)
        .expect("told")
    else {
        panic!("rejected");
    };
    let message = rejected.reason.to_string();
    assert!(message.contains("a/older"), "{message}");
    assert_eq!(rejected.cause().as_str(), "host_claimed");
    // The refused claimant holds nothing.
    assert_eq!(
        d.held.values().filter(|(r, _)| *r == younger_key).count(),
        0
    );
    assert!(d.readiness.is_ready());

    // The older route moves to another host: the younger takes over.
    let mut moved = older.clone();
    moved.spec.host = Some("other.example".to_owned());
    d.step(Input::Applied(moved.clone()));
    settle(&mut d);
    assert_eq!(
        said_to_route(&d, &younger_key),
        vec![Said::Rejected("HostAlreadyClaimed"), Said::Admitted]
    );
    // It comes back: it is older, and wins again.
    d.step(Input::Applied(older.clone()));
    settle(&mut d);
    assert_eq!(
        said_to_route(&d, &younger_key).last(),
        Some(&Said::Rejected("HostAlreadyClaimed"))
    );
    assert_eq!(
        d.held.values().filter(|(r, _)| *r == younger_key).count(),
        0
    );
    // Deleted: the younger takes over, after the older's removal.
    d.step(Input::Deleted(older));
    settle(&mut d);
    let tail: Vec<_> = d
        .outcomes
        .iter()
        .rev()
        .take(2)
        .map(|o| (o.route().clone(), said(o)))
        .collect();
    assert_eq!(
        tail,
        vec![
            (younger_key.clone(), Said::Admitted),
            (older_key, Said::Removed)
        ]
    );
}

#[test]
fn paths_share_a_host_within_its_namespace_and_across_only_when_allowed() {
    let routes = || {
        vec![
            claimant("a", "root", "shop.example", None, 1),
            claimant("a", "api", "shop.example", Some("/api"), 2),
            claimant("a", "api-again", "shop.example", Some("/api"), 3),
            claimant("b", "cart", "shop.example", Some("/cart"), 4),
        ]
    };
    let expect = |ownership_check: bool| {
        vec![
            ("root", Said::Admitted),
            ("api", Said::Admitted),
            ("api-again", Said::Rejected("HostAlreadyClaimed")),
            (
                "cart",
                if ownership_check {
                    Said::Rejected("HostAlreadyClaimed")
                } else {
                    Said::Admitted
                },
            ),
        ]
    };
    for disable in [false, true] {
        let mut d = Driver::new();
        d.machine = RouteMachine::new(MachineOptions {
            hosts: HostPolicy {
                disable_namespace_ownership_check: disable,
                ..HostPolicy::default()
            },
            ..d.machine.options.clone()
        });
        let listed = routes();
        let keys: Vec<RouteKey> = listed.iter().map(|r| r.key().expect("key")).collect();
        d.step(Input::Listed(listed));
        settle(&mut d);
        let got: Vec<_> = keys
            .iter()
            .map(|key| {
                let said = said_to_route(&d, key);
                assert_eq!(said.len(), 1, "{key}: {said:?}");
                (&*key.name, said[0].clone())
            })
            .collect();
        assert_eq!(got, expect(!disable), "ownership check disabled: {disable}");
    }
}

#[test]
fn transient_failures_back_off_to_the_policy_cap_and_no_further() {
    let mut d = in_state(State::Applying);
    let mut delays = Vec::new();
    for _ in 0..10 {
        d.answer(PreparedOutcome::AccessUnanswered {
            detail: "503".into(),
        });
        let wakeup = d.machine.next_wakeup().expect("retry scheduled");
        let delay = wakeup - d.now;
        delays.push(delay);
        d.advance(delay);
    }
    let cap = BackoffPolicy::default().max;
    assert!(delays.iter().all(|delay| *delay <= cap), "{delays:?}");
    assert!(delays[9] >= cap / 2, "{delays:?}");
    // Told once, not once per retry.
    assert_eq!(
        d.said_to("r"),
        vec![Said::Rejected("ExternalCertificateGetFailed")]
    );
}

// ---------------------------------------------------------------------------------
// Random sequences against invariants.
// ---------------------------------------------------------------------------------

const ROUTES: [&str; 4] = ["r0", "r1", "r2", "r3"];
const SECRETS: [&str; 3] = ["s0", "s1", "s2"];

#[derive(Clone, Debug)]
enum Action {
    /// Route `route` references `secret` (none: no external certificate).
    Upsert {
        route: usize,
        secret: Option<usize>,
    },
    Delete {
        route: usize,
    },
    /// A re-list holding the routes whose bit is set.
    Relist {
        present: u8,
    },
    /// Secret `secret` gets a new version, valid or not.
    SetSecret {
        secret: usize,
        valid: bool,
    },
    DeleteSecret {
        secret: usize,
    },
    /// Delivers the oldest pending secret event.
    Deliver,
    /// Answers the outstanding apply.
    Answer(Answer),
    /// Time passes.
    Wait {
        seconds: u8,
    },
}

#[derive(Clone, Copy, Debug)]
enum Answer {
    Allowed,
    Denied,
    Unanswered,
    Forbidden,
    Failed,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        4 => (0..ROUTES.len(), proptest::option::weighted(0.85, 0..SECRETS.len()))
            .prop_map(|(route, secret)| Action::Upsert { route, secret }),
        1 => (0..ROUTES.len()).prop_map(|route| Action::Delete { route }),
        1 => any::<u8>().prop_map(|present| Action::Relist { present }),
        2 => (0..SECRETS.len(), proptest::bool::weighted(0.7))
            .prop_map(|(secret, valid)| Action::SetSecret { secret, valid }),
        1 => (0..SECRETS.len()).prop_map(|secret| Action::DeleteSecret { secret }),
        4 => Just(Action::Deliver),
        6 => prop_oneof![
            6 => Just(Answer::Allowed),
            1 => Just(Answer::Denied),
            1 => Just(Answer::Unanswered),
            1 => Just(Answer::Forbidden),
            1 => Just(Answer::Failed),
        ]
        .prop_map(Action::Answer),
        1 => (0u8..90).prop_map(|seconds| Action::Wait { seconds }),
    ]
}

/// The world around the machine: the API server's routes and secrets, and the shell's
/// registrations and undelivered secret events.
struct World {
    d: Driver,
    /// Routes that exist: their secret reference and uid.
    routes: BTreeMap<usize, (Option<usize>, u64)>,
    /// Secrets that exist: version and validity.
    secrets: BTreeMap<usize, (u64, bool)>,
    /// Secret events in flight to registrations.
    events: std::collections::VecDeque<(RouteKey, RegistrationId, SecretChange)>,
    next_version: u64,
    /// The first listing, oldest first.
    initial: Vec<RouteKey>,
    /// Routes deleted and not created again since, with the outcomes said then.
    deleted: BTreeMap<RouteKey, usize>,
    /// Start-up routes changed, deleted or re-listed away before their first outcome:
    /// they lose their place in the start-up order.
    touched: BTreeSet<RouteKey>,
}

impl World {
    fn new(initial: u8, prefetch_window: usize) -> Self {
        let mut world = Self {
            d: Driver::with_prefetch_window(prefetch_window),
            routes: BTreeMap::new(),
            secrets: BTreeMap::from([(0, (1, true)), (1, (2, true))]),
            events: Default::default(),
            next_version: 3,
            initial: Vec::new(),
            deleted: BTreeMap::new(),
            touched: BTreeSet::new(),
        };
        for index in 0..ROUTES.len() {
            if initial & (1 << index) != 0 {
                world.routes.insert(index, (Some(index % SECRETS.len()), 1));
            }
        }
        let listing = world.listing();
        // Oldest first: r0 is the oldest.
        world.initial = world.routes.keys().map(|i| key(ROUTES[*i])).collect();
        world.d.step(Input::Listed(listing));
        world
    }

    fn route(&self, index: usize) -> Route {
        let (secret, uid) = self.routes[&index];
        // Routes are created in index order: r0 is the oldest.
        // Each its own host: host claims have their own tests.
        let host = format!("{}.example", ROUTES[index]);
        route(
            ROUTES[index],
            secret.map(|s| SECRETS[s]),
            &host,
            index as i64,
            &format!("{}-{uid}", ROUTES[index]),
        )
    }

    fn listing(&self) -> Vec<Route> {
        // The API server lists in name order; the machine sorts by age.
        self.routes.keys().rev().map(|i| self.route(*i)).collect()
    }

    fn secret_version(&self, secret: usize) -> Option<SecretVersion> {
        let (version, valid) = *self.secrets.get(&secret)?;
        let material = Self::material_of(version);
        // Valid certificates are handed over an hour before their dates change: the
        // route is applied again then (with the same answer here), among everything
        // else.
        let as_of = an_hour_before_expiry(&material);
        let mut found = self::version(
            SECRETS[secret],
            version,
            if valid { Ok(material) } else { Err(invalid()) },
        );
        found.as_of = as_of;
        Some(found)
    }

    /// The valid material of a secret `version`: one in three is expired.
    fn material_of(version: u64) -> Arc<ValidatedTls> {
        let material = material();
        Arc::clone(match version % 3 {
            2 => &material.expired,
            other => &material.valid[other as usize],
        })
    }

    fn secret_of(name: &str) -> usize {
        SECRETS
            .iter()
            .position(|s| *s == name)
            .expect("known secret")
    }

    /// Sends `change` of `secret` to every registration on it (as the watch would).
    fn broadcast(&mut self, secret: usize, change: &SecretChange) {
        for (id, (route, held)) in &self.d.held {
            if *held == SECRETS[secret] {
                self.events.push_back((route.clone(), *id, change.clone()));
            }
        }
    }

    /// Marks `route` as changed by the test, if it still waits for its first outcome.
    fn touch(&mut self, index: usize) {
        let route = key(ROUTES[index]);
        if !self.d.outcomes.iter().any(|o| *o.route() == route) {
            self.touched.insert(route);
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Upsert { route, secret } => {
                let uid = match self.routes.get(&route) {
                    Some((_, uid)) => *uid,
                    None => self.next_version,
                };
                self.touch(route);
                self.routes.insert(route, (secret, uid));
                self.deleted.remove(&key(ROUTES[route]));
                self.d.step(Input::Applied(self.route(route)));
            }
            Action::Delete { route } => {
                if self.routes.contains_key(&route) {
                    self.touch(route);
                    let gone = self.route(route);
                    self.routes.remove(&route);
                    self.deleted
                        .insert(key(ROUTES[route]), self.d.outcomes.len());
                    self.d.step(Input::Deleted(gone));
                }
            }
            Action::Relist { present } => {
                let before: Vec<usize> = self.routes.keys().copied().collect();
                for index in before {
                    if present & (1 << index) == 0 {
                        self.touch(index);
                        self.routes.remove(&index);
                        self.deleted
                            .insert(key(ROUTES[index]), self.d.outcomes.len());
                    }
                }
                let listing = self.listing();
                self.d.step(Input::Listed(listing));
            }
            Action::SetSecret { secret, valid } => {
                self.secrets.insert(secret, (self.next_version, valid));
                self.next_version += 1;
                if let Some(version) = self.secret_version(secret) {
                    self.broadcast(secret, &SecretChange::Present(version));
                }
            }
            Action::DeleteSecret { secret } => {
                if self.secrets.remove(&secret).is_some() {
                    self.broadcast(secret, &SecretChange::Deleted);
                }
            }
            Action::Deliver => {
                if let Some((route, registration, change)) = self.events.pop_front() {
                    self.d.step(Input::Secret {
                        consumer: route.into(),
                        registration,
                        change,
                    });
                }
            }
            Action::Answer(answer) => {
                let Some(preparation) = self.d.preparing.clone() else {
                    return;
                };
                let secret = Self::secret_of(preparation.secret());
                let outcome = match answer {
                    Answer::Allowed => {
                        let lookup = match self.secret_version(secret) {
                            Some(version) => SecretLookup::Found(version),
                            None => SecretLookup::NotFound,
                        };
                        PreparedOutcome::Ready(lookup)
                    }
                    Answer::Denied => PreparedOutcome::AccessDenied {
                        verb: Verb::List,
                        recheck_after: Duration::from_secs(30),
                    },
                    Answer::Unanswered => PreparedOutcome::AccessUnanswered {
                        detail: "503".into(),
                    },
                    Answer::Forbidden if preparation.register.is_some() => {
                        PreparedOutcome::RegistrationForbidden { verb: Verb::Watch }
                    }
                    Answer::Failed if preparation.register.is_some() => {
                        PreparedOutcome::RegistrationFailed {
                            detail: "500".into(),
                        }
                    }
                    Answer::Forbidden | Answer::Failed => {
                        PreparedOutcome::Ready(SecretLookup::Failed {
                            detail: "cache".into(),
                        })
                    }
                };
                let registers =
                    matches!(outcome, PreparedOutcome::Ready(_)) && preparation.register.is_some();
                self.d.answer(outcome);
                if registers {
                    // A new registration first hears the secret's current state.
                    let id = preparation.register.expect("registering");
                    let change = match self.secret_version(secret) {
                        Some(version) => SecretChange::Present(version),
                        None => SecretChange::Deleted,
                    };
                    if self.d.held.contains_key(&id) && matches!(change, SecretChange::Present(_)) {
                        self.events
                            .push_back((preparation.route().clone(), id, change));
                    }
                }
            }
            Action::Wait { seconds } => self.d.advance(Duration::from_secs(u64::from(seconds))),
        }
    }

    /// Invariants that hold after every step.
    fn check(&self) -> Result<(), TestCaseError> {
        // At most one registration per route, and it is the one the machine records.
        let mut per_route: BTreeMap<&RouteKey, Vec<&String>> = BTreeMap::new();
        for (route, secret) in self.d.held.values() {
            per_route.entry(route).or_default().push(secret);
        }
        for (route, secrets) in &per_route {
            prop_assert!(secrets.len() <= 1, "{route} holds {secrets:?}");
            let head_registers = self
                .d
                .preparing
                .as_ref()
                .is_some_and(|p| p.route() == *route && p.register.is_some());
            if !head_registers {
                prop_assert_eq!(
                    self.d.machine.registered_secret(route),
                    Some(secrets[0].as_str()),
                    "{} holds a registration the machine does not know",
                    route
                );
            }
        }
        prop_assert_eq!(self.d.machine.registered_routes(), self.d.held.len());
        // Nothing queued, nothing in flight: no prefetch hold outlives the queue.
        if self.d.preparing.is_none() {
            prop_assert!(
                self.d.prefetched.is_empty(),
                "prefetch holds kept with the queue drained: {:?}",
                self.d.prefetched
            );
        }
        // No outcome for a deleted route but its removal.
        for (route, since) in &self.deleted {
            let after: Vec<Said> = self.d.outcomes[*since..]
                .iter()
                .filter(|o| o.route() == route)
                .map(said)
                .collect();
            prop_assert!(
                after.iter().all(|s| *s == Said::Removed) && after.len() <= 1,
                "{route} was told {after:?} after its deletion"
            );
        }
        // The first outcomes of the start-up routes come oldest first.
        let mut firsts: Vec<&RouteKey> = Vec::new();
        for outcome in &self.d.outcomes {
            let route = outcome.route();
            if self.initial.contains(route) && !firsts.contains(&route) {
                firsts.push(route);
            }
        }
        let told = firsts.len();
        firsts.retain(|route| !self.touched.contains(*route));
        let mut sorted = firsts.clone();
        sorted.sort_by_key(|route| self.initial.iter().position(|r| r == *route));
        prop_assert_eq!(firsts, sorted, "start-up outcomes out of order");
        // Readiness counts the start-up routes decided: each one told anything is
        // counted, and once ready, every one left as listed has been told.
        let readiness = self.d.machine.readiness();
        prop_assert!(readiness.listed);
        prop_assert_eq!(readiness, self.d.readiness);
        prop_assert_eq!(readiness.initial_routes, self.initial.len());
        prop_assert!(readiness.initial_done <= readiness.initial_routes);
        prop_assert!(readiness.initial_done >= told, "{readiness:?}, {told} told");
        if readiness.is_ready() {
            for route in &self.initial {
                let has_certificate = !self.touched.contains(route);
                let was_told = self.d.outcomes.iter().any(|o| o.route() == route);
                prop_assert!(
                    !has_certificate || was_told,
                    "ready, but {route} was never told"
                );
            }
        }
        Ok(())
    }

    /// Lets everything settle with the network answering yes: deliver every event,
    /// answer every apply, fire every retry.
    fn settle(&mut self) {
        for _ in 0..200 {
            if let Some(event) = self.events.pop_front() {
                let (route, registration, change) = event;
                self.d.step(Input::Secret {
                    consumer: route.into(),
                    registration,
                    change,
                });
            } else if self.d.preparing.is_some() {
                self.act(Action::Answer(Answer::Allowed));
            } else if self.d.machine.next_wakeup().is_some() {
                self.d.advance(Duration::from_secs(600));
            } else {
                return;
            }
        }
    }

    /// After settling, what each route was last told follows from the world.
    fn check_converged(&self) -> Result<(), TestCaseError> {
        prop_assert!(self.d.readiness.is_ready());
        for (index, name) in ROUTES.iter().enumerate() {
            let route = key(name);
            let last = self.d.said_to(name).last().cloned();
            let expected = match self.routes.get(&index) {
                None => {
                    prop_assert!(
                        last.is_none() || last == Some(Said::Removed),
                        "{name}: {last:?}"
                    );
                    prop_assert_eq!(self.d.held_by(name), 0);
                    continue;
                }
                // Decided from the route alone, holding nothing.
                Some((None, _)) => {
                    prop_assert_eq!(self.d.held_by(name), 0);
                    prop_assert_eq!(last, Some(Said::Admitted), "{}", route);
                    continue;
                }
                // What is said follows from the secret as it is now, never from
                // what happened to it.
                Some((Some(secret), _)) => match self.secrets.get(secret) {
                    Some((_, true)) => vec![Said::Admitted],
                    Some((_, false)) => vec![Said::Rejected("ExtendedValidationFailed")],
                    None => vec![Said::Rejected("ExternalCertificateValidationFailed")],
                },
            };
            prop_assert!(
                last.as_ref().is_some_and(|l| expected.contains(l)),
                "{route}: last told {last:?}, expected one of {expected:?}"
            );
            // The status names an expired certificate exactly while it is served.
            if let Some(Some(secret)) = self.routes.get(&index).map(|(secret, _)| *secret)
                && let Some((version, true)) = self.secrets.get(&secret)
            {
                let status = self.d.last_status.get(&route);
                let message = status.and_then(|status| status.message.as_deref());
                let says_expired = message.is_some_and(|m| m.contains("expired at"));
                prop_assert!(
                    status.is_some_and(|status| status.admitted),
                    "{route}: {status:?}"
                );
                prop_assert_eq!(says_expired, version % 3 == 2, "{}: {:?}", route, message);
                if last == Some(Said::Admitted) && version % 3 != 2 {
                    prop_assert_eq!(message, None, "{}", route);
                }
            }
            prop_assert_eq!(self.d.held_by(name), 1, "{} registered once", route);
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_invariants(
        initial in 0u8..16,
        prefetch_window in prop_oneof![Just(crate::machine::PREFETCH_WINDOW), 1usize..4],
        actions in proptest::collection::vec(action(), 0..60),
    ) {
        let mut world = World::new(initial, prefetch_window);
        world.check()?;
        for action in actions {
            world.act(action);
            world.check()?;
        }
        world.settle();
        world.check()?;
        world.check_converged()?;
    }
}

#[test]
fn a_route_entry_stays_small() {
    // The route map's table has a slot per route and up to as many spare slots: every
    // byte of an entry costs about 1.6 bytes per route (26 KB at 10,000 routes).
    // Before the told summary and the backoff were boxed and the secret name shared:
    // 344 bytes.
    let entry = std::mem::size_of::<RouteEntry>();
    let key = std::mem::size_of::<RouteKey>();
    // A registered route's holdings are on the heap (its entry keeps a pointer): one
    // holding per reference.
    let holding = std::mem::size_of::<Holding<SecretSeen>>();
    println!("route entry: {entry} bytes, key: {key} bytes, a holding: {holding} bytes");
    assert!(entry <= 128, "a route entry grew to {entry} bytes");
    assert!(key <= 32, "a route key grew to {key} bytes");
    assert!(holding <= 80, "a holding grew to {holding} bytes");
}

/// With a window of three, the secrets of the next three queued routes are fetched
/// ahead of the head; the others start as the head moves on, in queue order, each
/// before its route is applied.
#[test]
fn secrets_are_fetched_a_window_ahead_of_the_head() {
    let mut d = Driver::with_prefetch_window(3);
    let names: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
    let routes: Vec<Route> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let host = format!("{name}.example");
            route(
                name,
                Some(&format!("s{i}")),
                &host,
                i as i64,
                &format!("uid-{i}"),
            )
        })
        .collect();
    d.step(Input::Listed(routes));
    let fetched =
        |d: &Driver| -> Vec<String> { d.prefetches.iter().map(|(_, s)| s.clone()).collect() };
    // The head (r0) and the three routes queued behind it.
    assert_eq!(fetched(&d), ["s0", "s1", "s2", "s3"]);
    let valid = || Ok(Arc::clone(&material().valid[0]));
    let mut applied = Vec::new();
    while let Some(preparation) = d.preparing.clone() {
        let secret = preparation.secret().to_owned();
        assert!(
            d.prefetched.iter().any(|(_, s)| *s == secret),
            "{secret} fetched before its route is applied"
        );
        applied.push(secret.clone());
        let ahead = fetched(&d).len() - applied.len();
        assert!(ahead <= 3, "{ahead} fetched ahead of the head");
        d.found(version(&secret, 1, valid()));
    }
    assert_eq!(applied.len(), 10);
    // Every secret fetched once, in queue order; the holds released at the end.
    let expected: Vec<String> = (0..10).map(|i| format!("s{i}")).collect();
    assert_eq!(fetched(&d), expected);
    assert!(d.prefetched.is_empty());
    assert!(d.readiness.is_ready());
}

/// A route that reaches the head before its turn in the window came (the routes ahead
/// of it decided without the network, in one step) is applied all the same: the
/// prefetch is an advance, never a condition.
#[test]
fn a_route_ahead_of_its_window_turn_is_applied_by_its_own_prepare() {
    let mut d = Driver::with_prefetch_window(1);
    let mut routes = vec![route("a", Some("sa"), "a.example", 0, "uid-a")];
    for i in 1..6 {
        let name = format!("local{i}");
        let host = format!("{name}.example");
        routes.push(route(&name, None, &host, i, &format!("uid-{i}")));
    }
    routes.push(route("z", Some("sz"), "z.example", 6, "uid-z"));
    d.step(Input::Listed(routes));
    assert_eq!(d.prefetches, [(NS.to_owned(), "sa".to_owned())]);
    let valid = || Ok(Arc::clone(&material().valid[0]));
    d.found(version("sa", 1, valid()));
    // The five routes between were decided in that step; z is the head now.
    let head = d.preparing.clone().expect("z is prepared");
    assert_eq!(head.route(), &key("z"));
    d.found(version("sz", 1, valid()));
    assert!(d.readiness.is_ready());
    assert_eq!(d.outcomes.len(), 7);
    assert!(
        d.prefetched.is_empty(),
        "holds released once the queue drained"
    );
}

/// Routes without certificate material of their own (here: external certificates)
/// share one copy of their TLS fields, and each copy shares its host with its routing
/// data; a route with an inline certificate keeps its own.
#[test]
fn route_copies_share_what_does_not_differ() {
    let a = state::RouteCopy::of(route("a", Some("s"), "a.example", 1, "uid-a"), false);
    let b = state::RouteCopy::of(route("b", Some("t"), "b.example", 2, "uid-b"), false);
    let (tls_a, tls_b) = (a.tls.clone().expect("tls"), b.tls.clone().expect("tls"));
    assert!(Arc::ptr_eq(&tls_a, &tls_b));
    let (host, routed) = (
        a.host.clone().expect("host"),
        a.routing.host.clone().expect("host"),
    );
    assert!(Arc::ptr_eq(&host, &routed));
    assert_eq!(&*host, "a.example");

    let pem = "-----BEGIN CERTIFICATE-----";
    let mut inline = route("c", None, "c.example", 3, "uid-c");
    inline.spec.tls.as_mut().expect("tls").certificate = Some(pem.into());
    let c = state::RouteCopy::of(inline, false);
    let tls_c = c.tls.expect("tls");
    assert!(!Arc::ptr_eq(&tls_a, &tls_c));
    assert_eq!(tls_c.certificate.as_deref(), Some(pem));
    assert_eq!(tls_c.termination, tls_a.termination);
}

#[test]
fn a_kept_object_holds_its_lists_without_spare_room() {
    // As the watch delivers it: JSON with one router's entry, one condition, and one
    // alternate backend (each list read from JSON has room for four).
    let mut json = serde_json::to_value(route("r", Some("s"), "r.example", 1, "uid-1"))
        .expect("route to JSON");
    json["spec"]["alternateBackends"] = serde_json::json!([
        {"kind": "Service", "name": "b", "weight": 1}
    ]);
    json["status"] = serde_json::json!({"ingress": [{
        "host": "r.example",
        "routerName": "default",
        "conditions": [{"type": "Admitted", "status": "True"}]
    }]});
    let read: Route = serde_json::from_str(&json.to_string()).expect("route from JSON");
    let spare = |route: &Route| {
        let ingress = route.status.as_ref().and_then(|s| s.ingress.as_ref());
        let conditions = ingress.and_then(|i| i[0].conditions.as_ref());
        let backends = route.spec.alternate_backends.as_ref();
        [
            ingress.map(|v| v.capacity() - v.len()),
            conditions.map(|v| v.capacity() - v.len()),
            backends.map(|v| v.capacity() - v.len()),
        ]
    };
    assert!(
        spare(&read).iter().any(|room| room.unwrap_or(0) > 0),
        "this serde_json leaves room in a list it reads: {:?}",
        spare(&read)
    );

    // (A clone has no spare room: the copy is made of the object read itself.)
    let expected = read.clone();
    let kept = state::RouteCopy::of(read, true);
    let object = kept.object.as_deref().expect("object kept");
    assert_eq!(spare(object), [Some(0), Some(0), Some(0)]);
    assert_eq!(object.status, expected.status);
    assert_eq!(object.spec, expected.spec);
}

#[test]
fn a_route_copy_keeps_what_the_machine_reads_and_the_object_only_for_status() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    let mut original = route("r", Some("s"), "r.example", 1, "uid-1");
    original.metadata.labels = Some(BTreeMap::from([("shard".into(), "a".into())]));
    original.metadata.annotations = Some(BTreeMap::from([("note".into(), "kept".into())]));
    original.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
        manager: Some("kubectl".into()),
        ..ManagedFieldsEntry::default()
    }]);

    let lean = state::RouteCopy::of(original.clone(), false);
    assert!(lean.object.is_none(), "no status writes: no object kept");
    assert_eq!(lean.uid.as_deref(), Some("uid-1"));
    assert_eq!(lean.host.as_deref(), Some("r.example"));
    assert_eq!(lean.secret.as_deref(), Some("s"));
    assert_eq!(
        lean.created,
        Some(Timestamp::from_second(1_700_000_001).expect("time"))
    );
    assert!(!lean.wildcard_subdomain);
    let tls = lean.tls.as_deref().expect("spec.tls read");
    assert!(tls.certificate.is_none() && tls.key.is_none());

    let kept = state::RouteCopy::of(original.clone(), true);
    let object = kept
        .object
        .as_deref()
        .expect("object kept for the status write");
    assert_eq!(object.metadata.managed_fields, None);
    assert_eq!(object.metadata.labels, original.metadata.labels);
    assert_eq!(object.metadata.annotations, original.metadata.annotations);
    assert_eq!(object.spec, original.spec);

    // Status and metadata changes (the router's own status write) change nothing the
    // machine reads; any spec change does, modelled or not, and so does another uid.
    let mut written = original.clone();
    written.metadata.resource_version = Some("99".into());
    written.status = Some(Default::default());
    assert!(lean.same_object_and_spec(&state::RouteCopy::of(written, false)));
    let mut backend = original.clone();
    backend.spec.to.name = "other".into();
    assert!(!lean.same_object_and_spec(&state::RouteCopy::of(backend, false)));
    let mut unmodelled = original.clone();
    unmodelled
        .spec
        .extra
        .insert("httpHeaders".into(), serde_json::json!({"actions": {}}));
    assert!(!lean.same_object_and_spec(&state::RouteCopy::of(unmodelled, false)));
    let mut recreated = original;
    recreated.metadata.uid = Some("uid-2".into());
    assert!(!lean.same_object_and_spec(&state::RouteCopy::of(recreated, false)));
}

#[test]
fn without_status_writes_nothing_is_recorded_and_outcomes_are_alike() {
    let mut with = Driver::new();
    let mut without = Driver::new();
    without.machine = RouteMachine::new(MachineOptions {
        record_status: false,
        ..without.machine.options.clone()
    });
    for d in [&mut with, &mut without] {
        d.step(Input::Listed(vec![route(
            "r",
            Some("s"),
            "r.example",
            1,
            "u",
        )]));
        d.found(version("s-uid", 1, Ok(Arc::clone(&material().valid[0]))));
    }
    assert_eq!(with.said_to("r"), vec![Said::Admitted]);
    assert_eq!(without.said_to("r"), with.said_to("r"));
    assert_eq!(with.statuses.len(), 1);
    assert!(without.statuses.is_empty());
}

/// A replica elected status writer records every route's outcome again, on the latest
/// copy it holds (one whose status changed since included), and nothing for a route
/// without an outcome.
#[test]
fn record_all_records_every_decided_route_again_on_its_latest_copy() {
    let mut d = in_state(State::Serving);
    let recorded = d.last_status.clone();
    assert_eq!(recorded.len(), 2, "h and r were decided: {recorded:?}");
    // Another replica wrote r's status: a copy that changes only the status.
    let mut written = r_with(Some("s"));
    written.status = Some(crate::route::RouteStatus::default());
    d.step(Input::Applied(written));
    let before = d.statuses.len();
    let effects = d.machine.step(Input::RecordAll, d.now);
    let mut again: Vec<(RouteKey, Admission, bool)> = effects
        .into_iter()
        .filter_map(|effect| match effect {
            Effect::RecordStatus { route, admission } => {
                Some((route.key()?, admission, route.status.is_some()))
            }
            _ => None,
        })
        .collect();
    again.sort_by(|a, b| a.0.cmp(&b.0));
    let keys: Vec<RouteKey> = again.iter().map(|(key, _, _)| key.clone()).collect();
    assert_eq!(keys, recorded.keys().cloned().collect::<Vec<_>>());
    for (key, admission, _) in &again {
        assert_eq!(Some(admission), recorded.get(key), "{key}");
    }
    // r's record carries the latest copy, the one with the other replica's status.
    assert!(
        again
            .iter()
            .any(|(key, _, status)| *key == self::key("r") && *status)
    );
    assert_eq!(d.statuses.len(), before, "nothing else happened");
}

/// A route of `NS` named `name` with `tls` as its `spec.tls` (JSON), and its own host.
fn route_with_tls(name: &str, age: i64, tls: Option<serde_json::Value>) -> Route {
    let mut spec = serde_json::json!({"host": format!("{name}.example"), "to": {"kind": "Service", "name": "app"}});
    if let Some(tls) = tls {
        spec["tls"] = tls;
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": format!("uid-{name}"),
            "creationTimestamp": Timestamp::from_second(1_700_000_000 + age)
                .expect("time")
                .to_string(),
        },
        "spec": spec,
    }))
    .expect("a route")
}

/// Every route kind gets the router's answer, decided from the route alone when it
/// names no secret: no TLS, passthrough, edge with the default certificate, inline
/// certificates (valid, broken, issued by the route's caCertificate or not), and the
/// termination's rules; nothing is registered or prefetched for them.
#[test]
fn routes_without_an_external_certificate_are_decided_from_the_route() {
    let now = Timestamp::now();
    let pki = Pki::new(now);
    let leaf = pki.issue(&LeafSpec::new("inline.example", now));
    let ca = format!("{}{}", pki.intermediate_pem(), pki.root_pem());
    let foreign = Pki::new(now);
    let cases: Vec<(&str, Option<serde_json::Value>, Said, bool)> = vec![
        ("plain", None, Said::Admitted, false),
        (
            "passthrough",
            Some(serde_json::json!({"termination": "passthrough"})),
            Said::Admitted,
            false,
        ),
        (
            "edge",
            Some(serde_json::json!({"termination": "edge"})),
            Said::Admitted,
            false,
        ),
        (
            "inline",
            Some(
                serde_json::json!({"termination": "edge", "certificate": leaf.chain_pem(), "key": leaf.key_pem()}),
            ),
            Said::Admitted,
            true,
        ),
        (
            "inline-with-ca",
            Some(
                serde_json::json!({"termination": "reencrypt", "certificate": leaf.chain_pem(), "key": leaf.key_pem(),
                      "caCertificate": ca, "destinationCACertificate": pki.root_pem()}),
            ),
            Said::Admitted,
            true,
        ),
        (
            "inline-foreign-ca",
            Some(
                serde_json::json!({"termination": "edge", "certificate": leaf.chain_pem(), "key": leaf.key_pem(),
                      "caCertificate": foreign.root_pem()}),
            ),
            Said::Rejected("ExtendedValidationFailed"),
            false,
        ),
        (
            "inline-garbage",
            Some(
                serde_json::json!({"termination": "edge", "certificate": "not PEM", "key": leaf.key_pem()}),
            ),
            Said::Rejected("ExtendedValidationFailed"),
            false,
        ),
        (
            "edge-destination-ca",
            Some(
                serde_json::json!({"termination": "edge", "destinationCACertificate": pki.root_pem()}),
            ),
            Said::Rejected("ExtendedValidationFailed"),
            false,
        ),
        (
            "reencrypt-bad-destination-ca",
            Some(
                serde_json::json!({"termination": "reencrypt", "destinationCACertificate": "not PEM"}),
            ),
            Said::Rejected("ExtendedValidationFailed"),
            false,
        ),
        (
            "passthrough-inline",
            Some(
                serde_json::json!({"termination": "passthrough", "certificate": leaf.chain_pem()}),
            ),
            Said::Rejected("ExtendedValidationFailed"),
            false,
        ),
    ];
    let routes: Vec<Route> = cases
        .iter()
        .enumerate()
        .map(|(age, (name, tls, ..))| route_with_tls(name, age as i64, tls.clone()))
        .collect();
    let mut d = Driver::new();
    d.step(Input::Listed(routes));
    assert!(d.readiness.is_ready(), "every route decided at once");
    assert!(d.preparing.is_none() && d.prefetches.is_empty());
    for (name, _, said, has_certificate) in &cases {
        assert_eq!(d.said_to(name), vec![said.clone()], "{name}");
        assert_eq!(d.held_by(name), 0, "{name}");
        let certificate = d.outcomes.iter().find_map(|outcome| match outcome {
            RouteOutcome::Admitted(admitted) if admitted.route == key(name) => {
                Some(admitted.certificate.clone())
            }
            _ => None,
        });
        if *said == Said::Admitted {
            let certificate = certificate.expect("admitted");
            assert_eq!(certificate.is_some(), *has_certificate, "{name}");
            if let Some(certificate) = certificate {
                assert_eq!(certificate.source, CertificateSource::Inline);
            }
        }
    }
    let garbage = d
        .outcomes
        .iter()
        .find_map(|outcome| match outcome {
            RouteOutcome::Rejected(rejected) if rejected.route == key("inline-garbage") => {
                Some(rejected.clone())
            }
            _ => None,
        })
        .expect("rejected");
    assert_eq!(garbage.cause().as_str(), "bad_pem");
    assert!(
        garbage.reason.to_string().contains("spec.tls.certificate"),
        "{}",
        garbage.reason
    );
}

/// A passthrough route with an external certificate is checked as any route with one
/// (access, existence, type: a missing secret is `ExternalCertificateValidationFailed`),
/// then refused as the router refuses it: passthrough serves no certificate. A
/// caCertificate is checked against the secret's certificate.
#[test]
fn passthrough_with_a_secret_and_a_foreign_ca_are_refused_after_the_secret() {
    let foreign = Pki::new(Timestamp::now());
    let passthrough = route_with_tls(
        "r",
        1,
        Some(
            serde_json::json!({"termination": "passthrough", "externalCertificate": {"name": "s"}}),
        ),
    );
    let mut d = Driver::new();
    d.step(Input::Listed(vec![passthrough.clone()]));
    d.answer(PreparedOutcome::Ready(SecretLookup::NotFound));
    assert_eq!(
        d.said_to("r"),
        vec![Said::Rejected("ExternalCertificateValidationFailed")]
    );
    d.secret(
        "r",
        SecretChange::Present(version("uid-s", 1, Ok(Arc::clone(&material().valid[0])))),
    );
    assert_eq!(
        d.said_to("r").last(),
        Some(&Said::Rejected("ExtendedValidationFailed"))
    );
    assert_eq!(d.held_by("r"), 1, "still watched, as by the router");

    let with_ca = route_with_tls(
        "c",
        2,
        Some(
            serde_json::json!({"termination": "edge", "externalCertificate": {"name": "s"},
                   "caCertificate": foreign.root_pem()}),
        ),
    );
    let mut d = Driver::new();
    d.step(Input::Listed(vec![with_ca]));
    d.found(version("uid-s", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(
        d.said_to("c"),
        vec![Said::Rejected("ExtendedValidationFailed")]
    );
}

/// A route's own caCertificate is served after its certificate, inline or from a
/// secret, as the router appends it to the certificate file it writes.
#[test]
fn the_routes_ca_certificate_is_served_after_its_chain() {
    let now = Timestamp::now();
    let pki = Pki::new(now);
    let leaf = pki.issue(&LeafSpec::new("inline.example", now));
    let ca = format!("{}{}", pki.intermediate_pem(), pki.root_pem());
    let served = |d: &Driver, name: &str| {
        d.outcomes
            .iter()
            .rev()
            .find_map(|outcome| match outcome {
                RouteOutcome::Admitted(admitted) if admitted.route == key(name) => {
                    admitted.certificate.clone()
                }
                _ => None,
            })
            .expect("admitted with a certificate")
            .tls
    };
    let inline = route_with_tls(
        "inline",
        1,
        Some(
            serde_json::json!({"termination": "edge", "certificate": leaf.chain_pem(),
                                "key": leaf.key_pem(), "caCertificate": ca}),
        ),
    );
    let plain_inline = route_with_tls(
        "plain-inline",
        2,
        Some(
            serde_json::json!({"termination": "edge", "certificate": leaf.chain_pem(),
                                "key": leaf.key_pem()}),
        ),
    );
    let mut d = Driver::new();
    d.step(Input::Listed(vec![inline, plain_inline]));
    let with = served(&d, "inline");
    let without = served(&d, "plain-inline");
    assert_eq!(with.chain_len(), without.chain_len() + 2);
    assert!(with.chain_pem().starts_with(without.chain_pem()));
    assert!(
        with.pem_bundle()
            .expose_secret()
            .contains(without.key_pem().expose_secret())
    );
    let appended = &with.chain_pem()[without.chain_pem().len()..];
    assert_eq!(
        appended.matches("-----BEGIN CERTIFICATE-----").count(),
        2,
        "{appended}"
    );
    let root = pki.root_pem();
    let root_line = root.lines().nth(1).expect("a base64 line");
    assert!(appended.contains(root_line), "the root last: {appended}");

    let secret = pki.issue(&LeafSpec::new("r.example", now)).secret(NS, "s");
    let validated = Arc::new(
        TlsValidator::default()
            .validate_secret(&secret, None, now)
            .expect("valid"),
    );
    let external = route_with_tls(
        "external",
        3,
        Some(
            serde_json::json!({"termination": "edge", "externalCertificate": {"name": "s"},
                                "caCertificate": ca}),
        ),
    );
    let mut d = Driver::new();
    d.step(Input::Listed(vec![external]));
    d.found(version("uid-s", 1, Ok(Arc::clone(&validated))));
    assert_eq!(d.said_to("external"), vec![Said::Admitted]);
    let with = served(&d, "external");
    assert_eq!(with.chain_len(), validated.chain_len() + 2);
    assert!(with.chain_pem().starts_with(validated.chain_pem()));
}

/// A wildcard route the router refuses claims no host: a younger route of the same
/// host is admitted, as the router's host admission drops the refused route before its
/// unique-host index sees it.
#[test]
fn a_refused_wildcard_route_claims_no_host() {
    let mut older = route("w", Some("s"), "www.shop.example", 1, "uid-w");
    older.spec.wildcard_policy = Some(crate::route::WildcardPolicy::Subdomain);
    let younger = route("y", Some("s"), "www.shop.example", 2, "uid-y");
    let mut d = Driver::new();
    d.step(Input::Listed(vec![older, younger]));
    d.found(version("uid-s", 1, Ok(Arc::clone(&material().valid[0]))));
    assert_eq!(d.said_to("w"), vec![Said::Rejected("RouteNotAdmitted")]);
    assert_eq!(d.said_to("y"), vec![Said::Admitted]);
}

/// A route that leaves the router's view (deleted, or missing from a new listing: its
/// labels or its namespace's no longer match the selectors) has this router's status
/// entry removed, once, on the latest copy the machine holds.
#[test]
fn a_route_leaving_the_view_has_its_status_entry_cleared_once() {
    let mut d = in_state(State::Serving);
    assert_eq!(d.last_status.len(), 2, "h and r were decided");
    assert!(d.cleared.is_empty());
    // r's status was written since: the latest copy carries it.
    let mut written = r_with(Some("s"));
    written.status = Some(crate::route::RouteStatus::default());
    d.step(Input::Applied(written.clone()));
    d.step(Input::Deleted(written));
    assert_eq!(d.cleared, vec![(key("r"), true)]);
    // h is missing from a new listing (its namespace left the selection).
    d.step(Input::Listed(Vec::new()));
    assert_eq!(d.cleared, vec![(key("r"), true), (key("h"), false)]);
    // Nothing is left to clear.
    d.step(Input::Listed(Vec::new()));
    assert_eq!(d.cleared.len(), 2);
}

/// What a consumer holds is a list of references, each in its own namespace: the
/// bookkeeping finds a holding by registration and by reference, and plans a change of
/// references (keep what is still referenced, register what is new, release what is
/// no longer referenced) whoever the consumer is and however many references it has.
#[test]
fn holdings_are_a_list_of_references_in_any_namespace() {
    let s = CertificateRef::new(NS, "s");
    let t = CertificateRef::new("other", "t");
    let u = CertificateRef::new("other", "u");
    let held = |reference: &CertificateRef, id| Holding {
        reference: reference.clone(),
        registration: RegistrationId(id),
        seen: (),
    };
    let mut holdings = Holdings::new(vec![held(&s, 1), held(&t, 2), held(&s, 3)]);
    // A reference is held once: the later registration replaced the earlier one.
    let ids: Vec<RegistrationId> = holdings.registrations().collect();
    assert_eq!(ids, [RegistrationId(3), RegistrationId(2)]);
    assert_eq!(
        holdings.of_reference(&t).map(|held| held.registration),
        Some(RegistrationId(2))
    );
    assert_eq!(holdings.of_reference(&u), None);
    assert_eq!(holdings.by_registration(RegistrationId(1)), None);
    assert_eq!(
        holdings
            .by_registration_mut(RegistrationId(3))
            .map(|held| held.reference.clone()),
        Some(s.clone())
    );

    // `s` goes, `t` stays (asked for twice), `u` comes.
    assert_eq!(
        holdings.plan(&[t.clone(), u.clone(), t.clone()]),
        HoldingPlan {
            keep: vec![(t.clone(), RegistrationId(2))],
            register: vec![u.clone()],
            release: vec![RegistrationId(3)],
        }
    );
    // The same references: nothing moves. None: everything goes.
    let same = holdings.plan(&[t.clone(), s.clone()]);
    assert_eq!(
        same.keep,
        [
            (t.clone(), RegistrationId(2)),
            (s.clone(), RegistrationId(3))
        ]
    );
    assert!(
        same.register.is_empty() && same.release.is_empty(),
        "{same:?}"
    );
    assert_eq!(
        holdings.plan(&[]).release,
        [RegistrationId(3), RegistrationId(2)]
    );
    // A secret of the same name in another namespace is another reference.
    let elsewhere = CertificateRef::new("other", "s");
    assert_eq!(
        holdings.plan(std::slice::from_ref(&elsewhere)).register,
        [elsewhere]
    );
}

/// Two routes reference one secret: each holds its own registration on it (the shell
/// shares the secret's watch among them), each is told of the secret's change, and a
/// route that goes releases its own registration only.
#[test]
fn routes_on_one_secret_each_hold_a_registration_and_each_is_told() {
    let mut d = Driver::new();
    d.step(Input::Listed(vec![
        route("a", Some("s"), "a.example", 1, "ua"),
        route("b", Some("s"), "b.example", 2, "ub"),
    ]));
    let valid = |i: usize| Ok(Arc::clone(&material().valid[i]));
    assert_eq!(
        d.preparing.as_ref().map(|p| p.reference.clone()),
        Some(CertificateRef::new(NS, "s")),
        "the reference names the secret's namespace"
    );
    d.found(version("us", 1, valid(0)));
    d.found(version("us", 1, valid(0)));
    let (a, b) = (
        d.registration_of("a").expect("a registered"),
        d.registration_of("b").expect("b registered"),
    );
    assert_ne!(a, b);
    assert_eq!(d.machine.registered_secret(&key("a")), Some("s"));
    assert_eq!(d.machine.registered_secret(&key("b")), Some("s"));
    assert_eq!(d.machine.registered_routes(), 2);

    // The secret changes: its watch delivers the change to each registration.
    for route in ["a", "b"] {
        d.secret(route, SecretChange::Present(version("us", 2, valid(1))));
    }
    assert_eq!(d.said_to("a"), [Said::Admitted, Said::Admitted]);
    assert_eq!(d.said_to("b"), [Said::Admitted, Said::Admitted]);

    // `a` goes: its registration is released, `b` keeps its own and is still told.
    d.step(Input::Deleted(route("a", Some("s"), "a.example", 1, "ua")));
    assert_eq!(d.held_by("a"), 0);
    assert_eq!(d.registration_of("b"), Some(b));
    assert_eq!(d.machine.registered_routes(), 1);
    d.secret("b", SecretChange::Deleted);
    assert_eq!(
        d.said_to("b"),
        [
            Said::Admitted,
            Said::Admitted,
            Said::Rejected("ExternalCertificateValidationFailed")
        ]
    );
    assert_eq!(
        d.said_to("a"),
        [Said::Admitted, Said::Admitted, Said::Removed]
    );
}
