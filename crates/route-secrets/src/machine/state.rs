//! The machine's memory: one entry per route, the apply queue, start-up progress.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use jiff::Timestamp;
use kube_common::backoff::Backoff;
use kube_common::hash::{NameMap, NameSet};

use super::inputs::SecretVersionId;
use super::outcome::Sni;
use crate::consumer::{CertificateRef, Holdings};
use crate::route::admission::Admission;
use crate::route::routing::RouteRouting;
use crate::route::{Route, RouteKey, RouteSpec, TlsConfig, TlsTermination, WildcardPolicy};
use crate::tls::RouteTlsConfig;

/// The machine's copy of one version of a route: what it decides with, and the object
/// itself only when the route's status is written from it.
///
/// A whole `Route` is about 900 bytes before its strings (every struct of it has room
/// for fields it does not model); the machine reads a handful of them.
#[derive(Debug)]
pub(super) struct RouteCopy {
    /// `metadata.uid`: another uid under the same name is another object. Shared with
    /// the told summary.
    pub uid: Option<Arc<str>>,
    /// `metadata.creationTimestamp`: older routes win host conflicts.
    pub created: Option<Timestamp>,
    /// `spec.host`, when set and non-empty.
    pub host: Option<Arc<str>>,
    /// `spec.wildcardPolicy` is `Subdomain`.
    pub wildcard_subdomain: bool,
    /// The secret named by `spec.tls.externalCertificate` ([`Route::external_certificate_name`]),
    /// as written; `None` also when the name is empty (the router then has no external
    /// certificate either).
    pub secret: Option<Arc<str>>,
    /// `spec.tls`, when the route has TLS: its termination and the certificate
    /// fields the router checks.
    pub tls: Option<Arc<TlsFields>>,
    /// Where its traffic goes (shared with every outcome told of this copy).
    pub routing: Arc<RouteRouting>,
    /// A digest of the whole spec: a later copy of the same object with the same
    /// digest changed nothing the router reads (e.g. the router's own status write).
    /// `None` when the spec could not be digested; such a copy never counts as
    /// unchanged.
    pub spec_digest: Option<u64>,
    /// The whole object, without its managed fields, kept for the status write
    /// ([`Effect::RecordStatus`](super::Effect::RecordStatus)) when the machine records
    /// status; `None` otherwise.
    pub object: Option<Arc<Route>>,
}

impl RouteCopy {
    /// The copy of `route`; keeps the object itself when `keep_object`.
    pub fn of(mut route: Route, keep_object: bool) -> Self {
        let tls = route.spec.tls.as_ref();
        let routing = RouteRouting::of(&route);
        let copy = Self {
            uid: route.metadata.uid.as_deref().map(Arc::from),
            created: route.metadata.creation_timestamp.as_ref().map(|t| t.0),
            // The same text as the routing data's host: one allocation for both.
            host: routing.host.clone(),
            wildcard_subdomain: route.spec.wildcard_policy == Some(WildcardPolicy::Subdomain),
            secret: route
                .external_certificate_name()
                .filter(|name| !name.is_empty())
                .map(Arc::from),
            tls: tls.map(TlsFields::shared),
            routing: Arc::new(routing),
            spec_digest: spec_digest(&route.spec, &route),
            object: None,
        };
        if !keep_object {
            return copy;
        }
        // A status update without managed fields leaves the stored ones as they are
        // (the API server's field manager takes the live object's when a request has
        // none), and they are often the largest part of a route.
        route.metadata.managed_fields = None;
        shrink_lists(&mut route);
        Self {
            object: Some(Arc::new(route)),
            ..copy
        }
    }

    /// Whether `self` and `other` are the same object with the same spec.
    pub fn same_object_and_spec(&self, other: &Self) -> bool {
        self.uid == other.uid && self.spec_digest.is_some() && self.spec_digest == other.spec_digest
    }

    /// The secret this copy of route `key` references: its external certificate, in
    /// the route's namespace (shared strings: nothing is allocated).
    pub fn reference(&self, key: &RouteKey) -> Option<CertificateRef> {
        self.secret.as_ref().map(|name| CertificateRef {
            namespace: Arc::clone(&key.namespace),
            name: Arc::clone(name),
        })
    }

    /// The server names an admission of this copy is served for.
    pub fn sni(&self) -> Sni {
        Sni::for_host(self.host.as_deref(), self.wildcard_subdomain)
    }
}

/// Gives back the room deserializing left spare in the lists a kept object holds: a
/// list read from JSON has room for four entries from its first, and a routed route's
/// status is one router's entry with one condition; kept for every route, that spare
/// room would be about 0.8 KiB a route.
fn shrink_lists(route: &mut Route) {
    if let Some(backends) = route.spec.alternate_backends.as_mut() {
        backends.shrink_to_fit();
    }
    if let Some(ingress) = route
        .status
        .as_mut()
        .and_then(|status| status.ingress.as_mut())
    {
        ingress.shrink_to_fit();
        for entry in ingress.iter_mut() {
            if let Some(conditions) = entry.conditions.as_mut() {
                conditions.shrink_to_fit();
            }
        }
    }
}

/// What the router reads of a route's `spec.tls`: the termination, and the certificate
/// fields (empty ones as absent). The key is never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct TlsFields {
    pub termination: TlsTermination,
    pub certificate: Option<String>,
    pub key: Option<String>,
    pub ca_certificate: Option<String>,
    pub destination_ca_certificate: Option<String>,
}

impl TlsFields {
    fn of(tls: &TlsConfig) -> Self {
        let given = |value: &Option<String>| value.clone().filter(|text| !text.is_empty());
        Self {
            termination: tls.termination.clone(),
            certificate: given(&tls.certificate),
            key: given(&tls.key),
            ca_certificate: given(&tls.ca_certificate),
            destination_ca_certificate: given(&tls.destination_ca_certificate),
        }
    }

    /// The fields of `tls`, shared: a route without certificate material of its own (an
    /// external certificate, passthrough, or the default certificate) has fields that
    /// differ only by termination, and every such route shares one copy of them.
    fn shared(tls: &TlsConfig) -> Arc<Self> {
        static BARE: std::sync::OnceLock<[Arc<TlsFields>; 3]> = std::sync::OnceLock::new();
        let fields = Self::of(tls);
        let bare = fields.certificate.is_none()
            && fields.key.is_none()
            && fields.ca_certificate.is_none()
            && fields.destination_ca_certificate.is_none();
        let index = match fields.termination {
            TlsTermination::Edge => 0,
            TlsTermination::Passthrough => 1,
            TlsTermination::Reencrypt => 2,
            TlsTermination::Other(_) => return Arc::new(fields),
        };
        if !bare {
            return Arc::new(fields);
        }
        let shared = BARE.get_or_init(|| {
            [
                TlsTermination::Edge,
                TlsTermination::Passthrough,
                TlsTermination::Reencrypt,
            ]
            .map(|termination| {
                Arc::new(Self {
                    termination,
                    certificate: None,
                    key: None,
                    ca_certificate: None,
                    destination_ca_certificate: None,
                })
            })
        });
        Arc::clone(&shared[index])
    }

    /// The fields as the validator reads them, for a route with (`external`) or without
    /// an external certificate.
    pub fn config(&self, external: bool) -> RouteTlsConfig<'_> {
        RouteTlsConfig {
            termination: &self.termination,
            external_certificate: external,
            certificate: self.certificate.as_deref(),
            key: self.key.as_deref(),
            ca_certificate: self.ca_certificate.as_deref(),
            destination_ca_certificate: self.destination_ca_certificate.as_deref(),
        }
    }
}

impl std::fmt::Debug for TlsFields {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFields")
            .field("termination", &self.termination)
            .field("certificate", &self.certificate.as_ref().map(String::len))
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field(
                "ca_certificate",
                &self.ca_certificate.as_ref().map(String::len),
            )
            .field(
                "destination_ca_certificate",
                &self.destination_ca_certificate.as_ref().map(String::len),
            )
            .finish()
    }
}

/// The digest's keys, drawn once per process: a route's author who could compute the
/// digest could craft a changed spec with the old one's digest, and the change would be
/// ignored.
static SPEC_DIGEST_KEYS: LazyLock<RandomState> = LazyLock::new(RandomState::new);

/// A 64-bit keyed digest of `spec`'s JSON form and of the annotations a router reads
/// (deterministic within the process: maps are ordered). Two different specs of one
/// route share a digest with a chance of about 2^-64.
///
/// The JSON is written out whole and hashed in one piece: SipHash is a stream over the
/// bytes written, so the digest is the one of hashing each of the serializer's small
/// writes as it makes them, without the cost of a call per punctuation mark.
fn spec_digest(spec: &RouteSpec, route: &Route) -> Option<u64> {
    let json = serde_json::to_vec(spec).ok()?;
    let mut digest = SPEC_DIGEST_KEYS.build_hasher();
    digest.write(&json);
    digest_router_annotations(&mut digest, route);
    Some(digest.finish())
}

/// Adds the annotations a router reads (`route`'s, in the map's order) to `digest`, each
/// key and value ended by a zero byte.
fn digest_router_annotations(digest: &mut impl Hasher, route: &Route) {
    let router_annotations = route
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(key, _)| {
            crate::route::routing::ROUTER_ANNOTATION_PREFIXES
                .iter()
                .any(|prefix| key.starts_with(prefix))
        });
    for (key, value) in router_annotations {
        digest.write(key.as_bytes());
        digest.write_u8(0);
        digest.write(value.as_bytes());
        digest.write_u8(0);
    }
}

/// Everything the machine knows about one route.
#[derive(Debug)]
pub(super) struct RouteEntry {
    /// The latest copy from the route watch; `None` once the route is deleted (its
    /// teardown then waits in the queue, behind the routes before it).
    pub latest: Option<Arc<RouteCopy>>,
    /// Where the route stands.
    pub state: RouteState,
    /// What the consumer was last told, so that it is not told the same twice. Boxed:
    /// the map's table keeps room for an entry in each of its (up to twice as many as
    /// routes) slots, and a told summary is larger than the rest of the entry.
    pub told: Option<Box<Told>>,
    /// Transient failures back off along this sequence; it lives across states, and
    /// time (not success) starts it over. Boxed: only routes that failed have one.
    pub backoff: Option<Box<Backoff>>,
    /// When the route is applied again, if a retry is scheduled.
    pub retry_at: Option<Instant>,
    /// The admission last recorded in status (only when the machine records status),
    /// recorded again on [`Input::RecordAll`](super::Input::RecordAll). Boxed, as
    /// [`told`](Self::told).
    pub recorded: Option<Box<Admission>>,
}

impl RouteEntry {
    pub fn new(route: Arc<RouteCopy>) -> Self {
        Self {
            latest: Some(route),
            state: RouteState::Pending,
            told: None,
            backoff: None,
            retry_at: None,
            recorded: None,
        }
    }

    /// The registrations the route holds (none, or one on its secret's watch).
    pub fn holdings(&self) -> Option<&Holdings<SecretSeen>> {
        match &self.state {
            RouteState::Applied {
                stand: Stand::Registered(holdings),
                ..
            } => Some(holdings),
            _ => None,
        }
    }

    /// Whether the route holds any registration.
    pub fn is_registered(&self) -> bool {
        self.holdings().is_some()
    }

    /// The copy of the route last applied.
    pub fn applied(&self) -> Option<&Arc<RouteCopy>> {
        match &self.state {
            RouteState::Pending => None,
            RouteState::Applied { route, .. } => Some(route),
        }
    }
}

/// Where a route stands.
#[derive(Debug)]
pub(super) enum RouteState {
    /// Seen on the route watch, never applied.
    Pending,
    /// Applied, as `route`.
    Applied {
        /// The copy applied. A later copy with the same uid and spec changed nothing
        /// the router cares about (e.g. the router's own status write).
        route: Arc<RouteCopy>,
        /// What the apply led to.
        stand: Stand,
    },
}

/// What an applied route holds and waits for.
#[derive(Debug)]
pub(super) enum Stand {
    /// No external certificate: decided from the route alone, nothing held.
    Local,
    /// Rejected before registering (bad reference, access denied, registration
    /// failed): nothing held.
    Refused,
    /// Its apply is at the head of the queue, registering: nothing held yet.
    Registering,
    /// Registered with the watch of each secret it references (a route: its one
    /// external certificate); the outcome follows the secrets.
    Registered(Holdings<SecretSeen>),
}

/// What a registered route knows of its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SecretSeen {
    /// Just registered: the apply reads the secret next.
    Pending,
    /// Absent from the cache (never created, or deleted): creating it admits the route.
    Missing,
    /// This version was evaluated (`None`: a version without uid/resourceVersion).
    Evaluated(Option<SecretVersionId>),
}

/// A summary of an outcome the consumer was told, about which object (uid) of the
/// route: a route created again under the same name is told anew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Told {
    Admitted {
        object: Option<Arc<str>>,
        /// The served certificate's, if the route has one of its own.
        fingerprint: Option<[u8; 32]>,
        /// The host and wildcard policy of the copy admitted (they decide its SNI).
        host: Option<Arc<str>>,
        wildcard_subdomain: bool,
        warnings: Vec<String>,
        /// Where its traffic goes: a change is told again.
        routing: Arc<RouteRouting>,
    },
    Rejected {
        object: Option<Arc<str>>,
        reason: &'static str,
        message: String,
    },
}

/// Room for this many routes is kept in an empty [`ApplyQueue`]; the room a larger
/// batch (a listing) took is given back once it is applied.
pub(super) const KEPT_ROOM: usize = 1024;

/// Routes waiting to be applied, in order, each at most once (later events for a
/// queued route coalesce into its place).
#[derive(Debug, Default)]
pub(super) struct ApplyQueue {
    order: VecDeque<RouteKey>,
    /// Queued routes, and whether to apply them even if their spec did not change
    /// (retries, claims that changed, applies overtaken by a newer event).
    forced: NameMap<RouteKey, bool>,
}

impl ApplyQueue {
    pub fn push(&mut self, key: RouteKey, forced: bool) {
        match self.forced.get_mut(&key) {
            Some(queued) => *queued |= forced,
            None => {
                self.forced.insert(key.clone(), forced);
                self.order.push_back(key);
            }
        }
    }

    /// Queues `key` first: an apply overtaken by a newer copy of its route is redone
    /// before the routes behind it.
    pub fn push_front(&mut self, key: RouteKey, forced: bool) {
        match self.forced.get_mut(&key) {
            Some(queued) => *queued |= forced,
            None => {
                self.forced.insert(key.clone(), forced);
                self.order.push_front(key);
            }
        }
    }

    pub fn pop(&mut self) -> Option<(RouteKey, bool)> {
        let key = self.order.pop_front()?;
        let forced = self.forced.remove(&key).unwrap_or(false);
        if self.order.is_empty() && self.order.capacity() > KEPT_ROOM {
            // The first listing's routes are all applied: their room would stay
            // allocated for the process's life.
            *self = Self::default();
        }
        Some((key, forced))
    }

    pub fn contains(&self, key: &RouteKey) -> bool {
        self.forced.contains_key(key)
    }

    /// How many routes are queued.
    pub fn len(&self) -> usize {
        self.order.len()
    }
}

/// Start-up: which routes of the first listing still lack an outcome.
#[derive(Debug, Default)]
pub(super) enum Startup {
    /// The first listing has not arrived.
    #[default]
    Unlisted,
    /// Listed; these routes are not decided yet.
    Deciding {
        initial: usize,
        undecided: NameSet<RouteKey>,
    },
}

/// A small deterministic random source for retry jitter (splitmix64): the machine
/// draws no randomness from the outside world, so a seed replays a run exactly.
#[derive(Debug)]
pub(super) struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A draw in `[0, 1]`.
    pub fn draw(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits as a fraction.
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The digest as the serializer's writes were hashed one by one.
    fn spec_digest_streamed(spec: &RouteSpec, route: &Route) -> Option<u64> {
        struct Digest(std::hash::DefaultHasher);
        impl std::io::Write for Digest {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0.write(bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut digest = Digest(SPEC_DIGEST_KEYS.build_hasher());
        serde_json::to_writer(&mut digest, spec).ok()?;
        digest_router_annotations(&mut digest.0, route);
        Some(digest.0.finish())
    }

    /// Hashing the spec's JSON in one piece gives the digest of hashing it write by
    /// write, for routes of every shape; and a changed spec or router annotation still
    /// changes it.
    #[test]
    fn a_spec_hashed_whole_has_the_digest_of_its_writes() {
        let mut routes = Vec::new();
        for (i, host) in ["a.example.com", "b.example.com", "*.wild.example", ""]
            .into_iter()
            .enumerate()
        {
            let mut route = crate::testing::route_with_external_certificate(
                "ns",
                &format!("r{i}"),
                host,
                &format!("secret-\"{i}\"\n\u{e9}"),
            );
            if i % 2 == 1 {
                route.spec.path = Some(format!("/p{i}"));
                let annotations = route.metadata.annotations.get_or_insert_default();
                annotations.insert(
                    "haproxy.router.openshift.io/timeout".to_owned(),
                    format!("{i}s"),
                );
                annotations.insert("unrelated/x".to_owned(), "y".to_owned());
            }
            if i == 2 {
                route.spec.tls = None;
            }
            routes.push(route);
        }
        let mut digests = NameSet::default();
        for route in &routes {
            let digest = spec_digest(&route.spec, route);
            assert!(digest.is_some());
            assert_eq!(digest, spec_digest_streamed(&route.spec, route));
            digests.insert(digest);
        }
        assert_eq!(digests.len(), routes.len());
        let mut changed = routes[1].clone();
        changed.metadata.annotations.get_or_insert_default().insert(
            "haproxy.router.openshift.io/timeout".to_owned(),
            "9s".to_owned(),
        );
        assert_ne!(
            spec_digest(&changed.spec, &changed),
            spec_digest(&routes[1].spec, &routes[1])
        );
        assert_eq!(
            spec_digest(&changed.spec, &changed),
            spec_digest_streamed(&changed.spec, &changed)
        );
    }

    /// A listing's routes all applied, the queue gives their room back and queues on
    /// in order, each route once.
    #[test]
    fn an_applied_listing_gives_its_room_back() {
        let mut queue = ApplyQueue::default();
        for i in 0..5_000 {
            queue.push(RouteKey::new("ns", format!("r{i}")), i % 2 == 0);
        }
        queue.push(RouteKey::new("ns", "r1"), true);
        assert!(queue.order.capacity() >= 5_000);
        let popped: Vec<(RouteKey, bool)> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(popped.len(), 5_000);
        assert_eq!(popped[0], (RouteKey::new("ns", "r0"), true));
        assert_eq!(popped[1], (RouteKey::new("ns", "r1"), true));
        assert_eq!(popped[4_999], (RouteKey::new("ns", "r4999"), false));
        assert!(queue.order.capacity() <= KEPT_ROOM);
        assert!(queue.forced.capacity() <= KEPT_ROOM);

        queue.push(RouteKey::new("ns", "b"), false);
        queue.push_front(RouteKey::new("ns", "a"), true);
        assert!(queue.contains(&RouteKey::new("ns", "b")));
        assert_eq!(queue.pop(), Some((RouteKey::new("ns", "a"), true)));
        assert_eq!(queue.pop(), Some((RouteKey::new("ns", "b"), false)));
        assert_eq!(queue.pop(), None);
    }
}
