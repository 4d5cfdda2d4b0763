//! What the machine tells its consumer: each route's outcome, and start-up progress.

use std::sync::Arc;

use jiff::Timestamp;

use crate::reason::Reason;
use crate::route::RouteKey;
use crate::tls::{TlsWarning, ValidatedTls};

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
