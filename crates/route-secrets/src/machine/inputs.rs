//! What the machine is told: route changes from the route watch, the results of the
//! network work it asked for, secret changes, and the passing of time.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use kube_common::Verb;
use secret_monitor::WatchedObject;

use super::effects::{Preparation, RegistrationId};
use crate::consumer::ConsumerKey;
use crate::route::Route;
use crate::tls::{TlsRejection, ValidatedTls};

/// One input to [`RouteMachine::step`](super::RouteMachine::step).
#[derive(Clone, Debug)]
pub enum Input {
    /// A complete listing of routes: the start-up set, or the state after a re-list
    /// (routes absent from it were deleted).
    Listed(Vec<Route>),
    /// A route was created or changed.
    Applied(Route),
    /// A route was deleted.
    Deleted(Route),
    /// The network part of the apply the machine asked for
    /// ([`Effect::Prepare`](super::Effect::Prepare)) is done.
    Prepared(Prepared),
    /// The secret of a consumer's registration changed.
    Secret {
        /// The consumer the registration belongs to.
        consumer: ConsumerKey,
        /// The registration the change was delivered to.
        registration: RegistrationId,
        /// What changed.
        change: SecretChange,
    },
    /// Time passed; retries that are due run. Send it at
    /// [`RouteMachine::next_wakeup`](super::RouteMachine::next_wakeup).
    Tick,
    /// The status writer starts writing (this replica was elected): record every
    /// route's current outcome again, with its latest copy, so that what the status
    /// does not already say is written.
    RecordAll,
}

/// The result of a [`Preparation`]: what the network said.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The preparation this answers.
    pub preparation: Preparation,
    /// What happened.
    pub outcome: PreparedOutcome,
}

/// What the network part of an apply found, in the order it is done: the access check,
/// then (when allowed) the registration, then the cached secret.
#[derive(Clone, Debug)]
pub enum PreparedOutcome {
    /// The access check could not be answered (API error); nothing was registered.
    AccessUnanswered {
        /// What went wrong; never secret data.
        detail: String,
    },
    /// The router identity may not use `verb` on the secret; nothing was registered.
    AccessDenied {
        /// The first verb denied.
        verb: Verb,
        /// How much longer the denial is trusted: a check after that asks again.
        recheck_after: Duration,
    },
    /// Access is allowed, but the API server refused the secret's watch (403).
    RegistrationForbidden {
        /// The refused verb.
        verb: Verb,
    },
    /// Access is allowed, but the secret's watch failed for another reason.
    RegistrationFailed {
        /// What went wrong; never secret data.
        detail: String,
    },
    /// Access is allowed and the route is registered (with the new registration, when
    /// the preparation asked for one): the secret as the watch cache holds it.
    Ready(SecretLookup),
}

/// The secret as a registration's watch cache holds it.
#[derive(Clone, Debug)]
pub enum SecretLookup {
    /// The secret exists.
    Found(SecretVersion),
    /// The secret does not exist (it is still watched).
    NotFound,
    /// The cache could not answer.
    Failed {
        /// What went wrong; never secret data.
        detail: String,
    },
}

/// A change of a registered secret.
#[derive(Clone, Debug)]
pub enum SecretChange {
    /// The secret exists in this version (created, changed, or seen after a re-list).
    Present(SecretVersion),
    /// The secret was deleted.
    Deleted,
}

/// One version of a secret, validated (without a host: the machine adds the host
/// check per route).
#[derive(Clone, Debug)]
pub struct SecretVersion {
    /// Which version it is; `None` for an object without uid or resourceVersion (never
    /// from an API server), which is then always evaluated again.
    pub id: Option<SecretVersionId>,
    /// The validation of its TLS material.
    pub validation: Result<Arc<ValidatedTls>, TlsRejection>,
    /// The wall-clock time at which the validation was found to hold (see
    /// [`dates::validation_holds`](super::dates::validation_holds)). A route admitted
    /// with it is evaluated again when its certificate's validity changes, counted from
    /// this time ([`dates::dates_change_in`](super::dates::dates_change_in)), so that
    /// its status message follows the dates.
    pub as_of: Timestamp,
}

/// `(uid, resourceVersion)` of a secret: a new uid is a re-created secret, a new
/// resourceVersion a changed one.
///
/// Shared strings: every route using a secret version keeps its id (what it last
/// evaluated), and a clone costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SecretVersionId {
    /// `metadata.uid`.
    pub uid: Arc<str>,
    /// `metadata.resourceVersion`.
    pub resource_version: Arc<str>,
}

impl SecretVersionId {
    /// The version of `secret` (a `Secret` or a
    /// [`TlsSecret`](crate::tls::TlsSecret)), when it has both fields.
    pub fn of(secret: &impl WatchedObject) -> Option<Self> {
        Some(Self {
            uid: Arc::from(secret.object_uid()?),
            resource_version: Arc::from(secret.object_resource_version()?),
        })
    }
}
