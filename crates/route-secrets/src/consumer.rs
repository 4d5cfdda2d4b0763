//! Who holds certificate references: the noun between a resource that names
//! certificates (a Route today) and the secrets it names.
//!
//! A [`ConsumerKey`] names the holder; a [`CertificateRef`] names one secret it
//! references, with the secret's own namespace (a Route's secret is in the route's
//! namespace; a Gateway listener's `certificateRefs` may name another, behind a
//! ReferenceGrant). [`Holdings`] is what a consumer holds: one registration on the
//! watch of each secret it references, with what it knows of that secret. The
//! bookkeeping here takes a list of references per consumer, so a consumer with several
//! references, or references in other namespaces, is not a special case.
//!
//! What is specific to a kind of consumer stays with it: a Route's admission rules,
//! status writes and routing keep [`RouteKey`]. Pure: no I/O.

use std::fmt;
use std::sync::Arc;

use crate::machine::RegistrationId;
use crate::route::RouteKey;

/// Who holds certificate references.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConsumerKey {
    /// A Route (`route.openshift.io/v1`), by `namespace/name`: one reference, its
    /// `spec.tls.externalCertificate`, in its own namespace.
    Route(RouteKey),
}

impl ConsumerKey {
    /// The route, when the consumer is one.
    pub fn route(&self) -> Option<&RouteKey> {
        match self {
            Self::Route(route) => Some(route),
        }
    }
}

impl From<RouteKey> for ConsumerKey {
    fn from(route: RouteKey) -> Self {
        Self::Route(route)
    }
}

impl fmt::Display for ConsumerKey {
    /// As the consumer's own key is written (`namespace/name` for a route), so that
    /// what is logged of a route reads the same whichever key carried it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Route(route) => route.fmt(f),
        }
    }
}

/// One secret a consumer references: its namespace (not necessarily the consumer's)
/// and name. Shared strings: a reference built from a route's key and its cached copy
/// allocates nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CertificateRef {
    /// The secret's namespace.
    pub namespace: Arc<str>,
    /// The secret's name.
    pub name: Arc<str>,
}

impl CertificateRef {
    /// A reference from its parts.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for CertificateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One registration a consumer holds on the watch of one of its references, and what
/// it knows of that secret (`S`, the consumer's machine's own notion).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding<S> {
    /// The secret referenced.
    pub reference: CertificateRef,
    /// The registration on its watch; events are delivered to it, tagged with the
    /// consumer and this id.
    pub registration: RegistrationId,
    /// What the consumer knows of the secret.
    pub seen: S,
}

/// Everything one consumer holds: at most one registration per reference. Boxed: a
/// consumer's entry keeps one pointer, whatever the number of its references (a route
/// has one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holdings<S>(Box<[Holding<S>]>);

impl<S> Holdings<S> {
    /// The holdings `holdings`; a later holding of a reference already held replaces
    /// the earlier one.
    pub fn new(holdings: Vec<Holding<S>>) -> Self {
        let mut unique: Vec<Holding<S>> = Vec::with_capacity(holdings.len());
        for holding in holdings {
            match unique
                .iter_mut()
                .find(|held| held.reference == holding.reference)
            {
                Some(held) => *held = holding,
                None => unique.push(holding),
            }
        }
        Self(unique.into_boxed_slice())
    }

    /// One holding.
    pub fn one(holding: Holding<S>) -> Self {
        Self(Box::new([holding]))
    }

    /// Every holding, in the order given.
    pub fn iter(&self) -> impl Iterator<Item = &Holding<S>> {
        self.0.iter()
    }

    /// Every registration held.
    pub fn registrations(&self) -> impl Iterator<Item = RegistrationId> + '_ {
        self.0.iter().map(|holding| holding.registration)
    }

    /// The holding of registration `id`, if it is one of these.
    pub fn by_registration(&self, id: RegistrationId) -> Option<&Holding<S>> {
        self.0.iter().find(|holding| holding.registration == id)
    }

    /// The holding of registration `id`, to update what is known of its secret.
    pub fn by_registration_mut(&mut self, id: RegistrationId) -> Option<&mut Holding<S>> {
        self.0.iter_mut().find(|holding| holding.registration == id)
    }

    /// The holding on `reference`, if held.
    pub fn of_reference(&self, reference: &CertificateRef) -> Option<&Holding<S>> {
        self.0
            .iter()
            .find(|holding| holding.reference == *reference)
    }

    /// What moving from these holdings to references `wanted` takes: which
    /// registrations are kept (a reference still wanted), which references need a new
    /// registration, and which registrations go.
    pub fn plan(&self, wanted: &[CertificateRef]) -> HoldingPlan {
        let mut plan = HoldingPlan::default();
        for reference in wanted {
            if plan.keep.iter().any(|(kept, _)| kept == reference)
                || plan.register.contains(reference)
            {
                continue;
            }
            match self.of_reference(reference) {
                Some(held) => plan.keep.push((reference.clone(), held.registration)),
                None => plan.register.push(reference.clone()),
            }
        }
        plan.release = self
            .0
            .iter()
            .filter(|held| !wanted.contains(&held.reference))
            .map(|held| held.registration)
            .collect();
        plan
    }
}

/// The registrations a consumer's new references take ([`Holdings::plan`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HoldingPlan {
    /// References still wanted, with the registration held on each.
    pub keep: Vec<(CertificateRef, RegistrationId)>,
    /// References wanted and not held: each needs a registration.
    pub register: Vec<CertificateRef>,
    /// Registrations on references no longer wanted.
    pub release: Vec<RegistrationId>,
}
