//! What the machine tells its consumer: each route's outcome, and start-up progress.

use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;

use crate::reason::{Reason, RejectionCause};
use crate::route::admission::Admission;
use crate::route::routing::RouteRouting;
use crate::route::{Route, RouteKey, WildcardPolicy};
use crate::tls::{TlsWarning, ValidatedTls};

/// A route the router serves, with the certificate it is served with.
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
    /// The certificate the route is served with: its secret's, or its inline one.
    /// `None` for a route the router serves no certificate of its own for: without TLS,
    /// passthrough, or edge and reencrypt without a certificate (the router's default
    /// certificate answers for them).
    pub certificate: Option<RouteCertificate>,
    /// Things to tell people (expiring soon, host not covered).
    pub warnings: Vec<TlsWarning>,
    /// Where the route's traffic goes: termination, path, backends and their weights,
    /// target port, insecure policy, CA certificates, the annotations a router reads.
    pub routing: Arc<RouteRouting>,
}

/// The certificate an admitted route is served with, and where it comes from.
#[derive(Clone, Debug)]
pub struct RouteCertificate {
    /// Its secret, or the route itself.
    pub source: CertificateSource,
    /// The validated certificate chain and key.
    pub tls: Arc<ValidatedTls>,
}

/// Where a route's certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertificateSource {
    /// The secret `spec.tls.externalCertificate` names (in the route's namespace).
    Secret(String),
    /// The route's own `spec.tls.certificate` and `spec.tls.key`.
    Inline,
}

impl CertificateSource {
    /// The secret's name, for a certificate from a secret.
    pub fn secret(&self) -> Option<&str> {
        match self {
            Self::Secret(name) => Some(name),
            Self::Inline => None,
        }
    }
}

impl fmt::Display for CertificateSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Secret(name) => write!(f, "external certificate secret {name}"),
            Self::Inline => f.write_str("inline certificate (spec.tls.certificate)"),
        }
    }
}

impl AdmittedRoute {
    /// The served certificate, if the route has one of its own.
    pub fn tls(&self) -> Option<&Arc<ValidatedTls>> {
        self.certificate
            .as_ref()
            .map(|certificate| &certificate.tls)
    }

    /// The secret the route's certificate comes from, if it comes from one.
    pub fn secret(&self) -> Option<&str> {
        self.certificate
            .as_ref()
            .and_then(|certificate| certificate.source.secret())
    }

    /// The condition to record in the route's status: `Admitted=True`, with a message
    /// naming every warning [shown in status](TlsWarning::shown_in_status) (an expired
    /// or not yet valid certificate, served as the router serves it). Without one, no
    /// reason and no message, as the router writes it; so renewing the certificate
    /// clears the message.
    pub fn admission(&self) -> Admission {
        let admission = Admission::admitted();
        let namespace = &self.route.namespace;
        let source = match self
            .certificate
            .as_ref()
            .map(|certificate| &certificate.source)
        {
            Some(CertificateSource::Secret(secret)) => {
                format!("external certificate secret {namespace}/{secret}")
            }
            Some(CertificateSource::Inline) | None => "inline certificate".to_owned(),
        };
        let warnings: Vec<String> = self
            .warnings
            .iter()
            .filter(|warning| warning.shown_in_status())
            .map(|warning| format!("{source}: {warning}"))
            .collect();
        if warnings.is_empty() {
            return admission;
        }
        Admission {
            // The message names the route, as rejection messages do.
            message: Some(format!("route {}: {}", self.route, warnings.join("; "))),
            ..admission
        }
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
    /// ...).
    pub fn cause(&self) -> RejectionCause {
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
    /// The route is gone (or out of scope).
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
