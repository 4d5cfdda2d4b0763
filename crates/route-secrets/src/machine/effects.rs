//! What the machine asks its shell to do, and the registration ids it hands out for it.

use std::fmt;
use std::sync::Arc;

use super::outcome::{Readiness, RouteOutcome};
use crate::consumer::{CertificateRef, ConsumerKey};
use crate::route::Route;
use crate::route::admission::Admission;

/// One thing for the shell to do, in the order given.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Start the referenced secret's watch and its access question ahead of the
    /// queue, so that the consumer's apply finds both ready. Holds the watch until
    /// [`Effect::ReleasePrefetched`]. Idempotent per secret.
    Prefetch(CertificateRef),
    /// Every route that was queued has been applied: drop prefetch holds that no route
    /// took up.
    ReleasePrefetched,
    /// Do the network part of applying the route at the head of the queue, and answer
    /// with [`Input::Prepared`](super::Input::Prepared). At most one is outstanding.
    Prepare(Preparation),
    /// Drop this registration (its watch closes when no one else holds it).
    Unregister(RegistrationId),
    /// Tell the consumer.
    Emit(Box<RouteOutcome>),
    /// Record the outcome in the route's `status.ingress[]` entry.
    RecordStatus {
        /// The latest copy of the route (its resourceVersion guards the write).
        route: Arc<Route>,
        /// What to record.
        admission: Admission,
    },
    /// Remove this router's `status.ingress[]` entry: the route left its view
    /// (deleted, or its labels or its namespace's no longer match).
    ClearStatus {
        /// The latest copy of the route (its resourceVersion guards the write).
        route: Arc<Route>,
    },
    /// Start-up progress changed.
    Readiness(Readiness),
}

/// The network part of an apply: check the router's access to the referenced secret;
/// when allowed, register (if asked) and read the secret from the registration's cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preparation {
    /// Whose apply it is (the registration's events are delivered tagged with it).
    pub consumer: ConsumerKey,
    /// The secret referenced, in its own namespace.
    pub reference: CertificateRef,
    /// Register the consumer with this new id; `None` when it holds a registration on
    /// this reference already.
    pub register: Option<RegistrationId>,
    /// The registration whose cached secret to read: the new one, or the one held.
    pub read: RegistrationId,
}

/// Identifies one registration of a consumer on a referenced secret's watch. A
/// consumer that registers again (another secret, or after a failure) gets a new id,
/// so that events and results of a registration it has since dropped are recognised
/// and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrationId(pub(crate) u64);

impl fmt::Display for RegistrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "registration #{}", self.0)
    }
}
