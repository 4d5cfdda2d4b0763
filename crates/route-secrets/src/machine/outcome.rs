//! What the machine tells its consumer: each route's outcome, and start-up progress.

use std::sync::Arc;

use jiff::Timestamp;

use crate::reason::{Reason, RejectionCause};
use crate::route::admission::Admission;
use crate::route::routing::RouteRouting;
use crate::route::{Route, RouteKey, WildcardPolicy};
use crate::tls::{TlsWarning, ValidatedTls};

/// A route the router serves, with its TLS material.
#[derive(Clone, Debug)]
pub struct AdmittedRoute {
    /// The route.
    pub route: RouteKey,
    /// `spec.host`.
    pub host: Option<String>,
    /// The server names (SNI) the route is served for: what its crt-list line filters
    /// on, or [`Sni::NoHost`]: no crt-list line at all.
    pub sni: Sni,
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
    /// Where the route's traffic goes: termination, path, backends and their weights,
    /// target port, insecure policy, CA certificates, the annotations a router reads.
    pub routing: Arc<RouteRouting>,
}

impl AdmittedRoute {
    /// The condition to record in the route's status: `Admitted=True`, with the
    /// re-creation's reason when there is one, and a message naming every warning
    /// [shown in status](TlsWarning::shown_in_status) (an expired or not yet valid
    /// certificate, served as the router serves it). Without either, no reason and no
    /// message, as the router writes it; so renewing the certificate clears the message.
    pub fn admission(&self) -> Admission {
        let mut admission = self
            .reason
            .as_ref()
            .map_or_else(Admission::admitted, Reason::admission);
        let namespace = &self.route.namespace;
        let warnings: Vec<String> = self
            .warnings
            .iter()
            .filter(|warning| warning.shown_in_status())
            .map(|warning| {
                format!(
                    "external certificate secret {namespace}/{secret}: {warning}",
                    secret = self.secret
                )
            })
            .collect();
        if warnings.is_empty() {
            return admission;
        }
        let warnings = warnings.join("; ");
        let message = match admission.message.take() {
            Some(reason) => format!("{reason}; {warnings}"),
            // Alone, the message names the route, as rejection messages do.
            None => format!("route {}: {warnings}", self.route),
        };
        admission.message = Some(message);
        admission
    }
}

/// The TLS server names (SNI) an admitted route is served for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Sni {
    /// Exactly the route's host.
    Host(String),
    /// Every host under `domain` (`*.<domain>`): an allowed wildcard route
    /// (`spec.wildcardPolicy: Subdomain`), whose host's first label is dropped.
    Subdomain {
        /// The host's parent domain.
        domain: String,
    },
    /// The route has no host (or a wildcard route's host has no parent domain): it must
    /// get no crt-list line, since a line without an SNI filter would capture every
    /// other route's hosts. Its material may still be written.
    NoHost,
}

impl Sni {
    /// The names an admitted `route` is served for, by its host and wildcard policy (a
    /// wildcard route is only admitted when wildcard routes are allowed).
    pub fn of(route: &Route) -> Self {
        let wildcard_subdomain = route.spec.wildcard_policy == Some(WildcardPolicy::Subdomain);
        Self::for_host(route.host(), wildcard_subdomain)
    }

    /// The names for a route's non-empty `host` and whether its wildcard policy is
    /// `Subdomain`.
    pub(crate) fn for_host(host: Option<&str>, wildcard_subdomain: bool) -> Self {
        let Some(host) = host else {
            return Self::NoHost;
        };
        if wildcard_subdomain {
            return match host.split_once('.') {
                Some((_, domain)) if !domain.is_empty() => Self::Subdomain {
                    domain: domain.to_owned(),
                },
                _ => Self::NoHost,
            };
        }
        Self::Host(host.to_owned())
    }

    /// The crt-list line's SNI filter: the host, or `*.<domain>`; `None`: no line.
    pub fn crt_list_filter(&self) -> Option<String> {
        match self {
            Self::Host(host) => Some(host.clone()),
            Self::Subdomain { domain } => Some(format!("*.{domain}")),
            Self::NoHost => None,
        }
    }
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

impl RejectedRoute {
    /// The class of the cause, for metric labels (`rbac`, `secret_missing`, `bad_pem`,
    /// ...). `None` only for a reason that admits, which a rejection never carries.
    pub fn cause(&self) -> Option<RejectionCause> {
        self.reason.cause()
    }
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
