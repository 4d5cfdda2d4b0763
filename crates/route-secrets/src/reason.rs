//! Why a route was rejected.
//!
//! [`Reason::name`] is the reason string OpenShift's router writes into the route's
//! `Admitted` condition for the same state; the [`Display`](std::fmt::Display) text is
//! the condition's message; [`Reason::cause`] is a small, stable class of the cause
//! ([`RejectionCause`]), for metric labels and alerts. Messages name the route (and the
//! secret), say what is wrong and what to do. They never contain secret data: callers
//! must not put secret bytes into the free-text `detail` of
//! [`Reason::ExternalCertificateGetFailed`].
//!
//! A reason says what is wrong *now*, never what happened: a deleted secret is a secret
//! that does not exist, a re-created one is a secret that does, so that any router (a
//! replica started later, say) writes the same for the same cluster.

use std::fmt;

use kube_common::Verb;

use crate::route::RouteKey;
use crate::route::SecretNameError;
use crate::route::admission::Admission;
use crate::tls::{
    ROUTER_REASON_CERTIFICATE, ROUTER_REASON_SECRET, TlsCause, TlsConfigProblem, TlsRejection,
};

/// What made the validation of an external certificate fail.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationProblem {
    /// `spec.tls.externalCertificate.name` is not a valid secret name.
    #[error(
        "spec.tls.externalCertificate.name is not a valid secret name ({0}); set it to the \
         name of a kubernetes.io/tls secret in the route's namespace"
    )]
    InvalidSecretName(SecretNameError),
    /// The router's identity lacks a verb on the secret.
    #[error(
        "the router ({identity}) is not allowed to {verb} the secret; grant get, list and \
         watch on it, e.g. a Role with resourceNames: [<secret>] bound to the router's \
         service account"
    )]
    AccessDenied {
        /// The verb that was denied (`get`, `list` or `watch`).
        verb: Verb,
        /// Who asked, e.g. `system:serviceaccount:openshift-ingress:router`.
        identity: String,
    },
    /// The secret does not exist in the route's namespace (never created, or deleted).
    #[error(
        "the secret does not exist in the route's namespace; create it there (a route can \
         only use secrets from its own namespace; the route is admitted once it exists)"
    )]
    SecretNotFound,
    /// The secret's TLS material is not usable.
    #[error("{0}")]
    Tls(#[from] TlsRejection),
}

impl ValidationProblem {
    /// The class of the problem.
    pub fn cause(&self) -> RejectionCause {
        match self {
            Self::InvalidSecretName(_) => RejectionCause::InvalidReference,
            Self::AccessDenied { .. } => RejectionCause::Rbac,
            Self::SecretNotFound => RejectionCause::SecretMissing,
            Self::Tls(rejection) => match rejection.cause() {
                TlsCause::WrongType => RejectionCause::SecretType,
                cause => RejectionCause::Tls(cause),
            },
        }
    }
}

/// Why the router's host admission refuses a route before anything else is looked at.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmissionProblem {
    /// A wildcard route (`spec.wildcardPolicy: Subdomain`) on a router that admits none.
    #[error(
        "wildcard routes are not allowed: spec.wildcardPolicy is Subdomain, and this router \
         does not admit wildcard routes; set spec.wildcardPolicy to None, or start the \
         router with --allow-wildcard-routes"
    )]
    WildcardNotAllowed,
}

/// The class of the cause of a rejection: few and stable, with a lowercase label, for
/// metric labels and alerts. Each class belongs to one reason name
/// ([`RejectionCause::reason_name`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RejectionCause {
    /// The router may not get, list or watch the secret (`rbac`).
    Rbac,
    /// The secret does not exist (`secret_missing`).
    SecretMissing,
    /// The secret is not of type `kubernetes.io/tls` (`secret_type`).
    SecretType,
    /// `spec.tls.externalCertificate.name` is not a valid secret name
    /// (`invalid_reference`).
    InvalidReference,
    /// The API server or the watch cache could not answer (`api_error`); retried.
    ApiError,
    /// A wildcard route, and wildcard routes are not admitted (`wildcard`).
    Wildcard,
    /// The route has no host (`no_host`).
    NoHost,
    /// The route's host is not a valid DNS name (`invalid_host`).
    InvalidHost,
    /// An older route holds the host (`host_claimed`).
    HostClaimed,
    /// The route's TLS configuration around its certificate: the termination's rules,
    /// `caCertificate`, `destinationCACertificate` (`tls_config`).
    TlsConfig,
    /// The certificate or key (a secret's, or the route's inline ones) is unusable, with
    /// the TLS validation's class (its label: `missing_data`, `bad_pem`, `key_mismatch`,
    /// `unsupported_key`, `weak_key`, `weak_signature`).
    Tls(TlsCause),
}

impl RejectionCause {
    /// Every class, for metric label sets.
    pub const ALL: [Self; 16] = [
        Self::Rbac,
        Self::SecretMissing,
        Self::SecretType,
        Self::InvalidReference,
        Self::ApiError,
        Self::Wildcard,
        Self::NoHost,
        Self::InvalidHost,
        Self::HostClaimed,
        Self::TlsConfig,
        Self::Tls(TlsCause::MissingData),
        Self::Tls(TlsCause::BadPem),
        Self::Tls(TlsCause::KeyMismatch),
        Self::Tls(TlsCause::UnsupportedKey),
        Self::Tls(TlsCause::WeakKey),
        Self::Tls(TlsCause::WeakSignature),
    ];

    /// The class as a stable lowercase label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rbac => "rbac",
            Self::SecretMissing => "secret_missing",
            // The secret's type is checked with the access rights, as a secret problem.
            Self::SecretType | Self::Tls(TlsCause::WrongType) => "secret_type",
            Self::InvalidReference => "invalid_reference",
            Self::ApiError => "api_error",
            Self::Wildcard => "wildcard",
            Self::NoHost => "no_host",
            Self::InvalidHost => "invalid_host",
            Self::HostClaimed => "host_claimed",
            Self::TlsConfig => "tls_config",
            Self::Tls(cause) => cause.as_str(),
        }
    }

    /// The reason name ([`Reason::name`]) a rejection of this class carries.
    pub fn reason_name(self) -> &'static str {
        match self {
            Self::Rbac
            | Self::SecretMissing
            | Self::SecretType
            | Self::Tls(TlsCause::WrongType)
            | Self::InvalidReference => Reason::EXTERNAL_CERTIFICATE_VALIDATION_FAILED,
            Self::Tls(_) | Self::TlsConfig => Reason::EXTENDED_VALIDATION_FAILED,
            Self::ApiError => Reason::EXTERNAL_CERTIFICATE_GET_FAILED,
            Self::HostClaimed => Reason::HOST_ALREADY_CLAIMED,
            Self::Wildcard => Reason::ROUTE_NOT_ADMITTED,
            Self::NoHost => Reason::NO_HOST_VALUE,
            Self::InvalidHost => Reason::INVALID_HOST,
        }
    }
}

impl fmt::Display for RejectionCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a route is not admitted, as the router would say it for the same state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The route's secret failed validation (RBAC, existence, type, TLS material).
    ExternalCertificateValidationFailed {
        /// The route.
        route: RouteKey,
        /// The secret's name (in the route's namespace).
        secret: String,
        /// What failed.
        problem: ValidationProblem,
    },
    /// The secret could not be read from the router's cache or the API server.
    ExternalCertificateGetFailed {
        /// The route.
        route: RouteKey,
        /// The secret's name (in the route's namespace).
        secret: String,
        /// What went wrong; never secret data.
        detail: String,
    },
    /// The route's own TLS configuration fails the router's extended validation: its
    /// inline certificate and key, CA certificates, or what its termination allows.
    ExtendedValidationFailed {
        /// The route.
        route: RouteKey,
        /// What failed.
        problem: TlsConfigProblem,
    },
    /// An older route holds the route's host (and path, or the host's namespace).
    HostAlreadyClaimed {
        /// The route.
        route: RouteKey,
        /// The host.
        host: String,
        /// The older route that holds it.
        owner: RouteKey,
        /// Whether the host is refused because it belongs to the owner's namespace (the
        /// namespace-ownership check), rather than for an older claim on the same path.
        by_namespace: bool,
    },
    /// The router's host admission refuses the route (its `RouteNotAdmitted`).
    RouteNotAdmitted {
        /// The route.
        route: RouteKey,
        /// Why.
        problem: AdmissionProblem,
    },
    /// The route has no host.
    NoHostValue {
        /// The route.
        route: RouteKey,
    },
    /// The route's host is not a valid DNS name.
    InvalidHost {
        /// The route.
        route: RouteKey,
        /// The host, shortened for messages.
        host: String,
    },
}

impl Reason {
    /// The secret failed validation (access, existence, type).
    pub const EXTERNAL_CERTIFICATE_VALIDATION_FAILED: &'static str = ROUTER_REASON_SECRET;
    /// The certificate, key or TLS configuration failed validation.
    pub const EXTENDED_VALIDATION_FAILED: &'static str = ROUTER_REASON_CERTIFICATE;
    /// The secret could not be read.
    pub const EXTERNAL_CERTIFICATE_GET_FAILED: &'static str = "ExternalCertificateGetFailed";
    /// An older route holds the host.
    pub const HOST_ALREADY_CLAIMED: &'static str = "HostAlreadyClaimed";
    /// The host admission refuses the route.
    pub const ROUTE_NOT_ADMITTED: &'static str = "RouteNotAdmitted";
    /// The route has no host.
    pub const NO_HOST_VALUE: &'static str = "NoHostValue";
    /// The host is not a valid DNS name.
    pub const INVALID_HOST: &'static str = "InvalidHost";

    /// Every reason name, for metric label sets.
    pub const NAMES: [&'static str; 7] = [
        Self::EXTERNAL_CERTIFICATE_VALIDATION_FAILED,
        Self::EXTENDED_VALIDATION_FAILED,
        Self::EXTERNAL_CERTIFICATE_GET_FAILED,
        Self::HOST_ALREADY_CLAIMED,
        Self::ROUTE_NOT_ADMITTED,
        Self::NO_HOST_VALUE,
        Self::INVALID_HOST,
    ];

    /// The reason as OpenShift's router writes it into the `Admitted` condition:
    /// `ExternalCertificateValidationFailed` for access and secret problems (name,
    /// existence, type), `ExtendedValidationFailed` for certificate, key and TLS
    /// configuration problems, the host admission's names for host problems.
    pub fn name(&self) -> &'static str {
        match self {
            Self::ExternalCertificateValidationFailed {
                problem: ValidationProblem::Tls(rejection),
                ..
            } => rejection.router_reason(),
            Self::ExternalCertificateValidationFailed { .. } => {
                Self::EXTERNAL_CERTIFICATE_VALIDATION_FAILED
            }
            Self::ExtendedValidationFailed { .. } => Self::EXTENDED_VALIDATION_FAILED,
            Self::ExternalCertificateGetFailed { .. } => Self::EXTERNAL_CERTIFICATE_GET_FAILED,
            Self::HostAlreadyClaimed { .. } => Self::HOST_ALREADY_CLAIMED,
            Self::RouteNotAdmitted { .. } => Self::ROUTE_NOT_ADMITTED,
            Self::NoHostValue { .. } => Self::NO_HOST_VALUE,
            Self::InvalidHost { .. } => Self::INVALID_HOST,
        }
    }

    /// The class of the cause.
    pub fn cause(&self) -> RejectionCause {
        match self {
            Self::ExternalCertificateValidationFailed { problem, .. } => problem.cause(),
            Self::ExternalCertificateGetFailed { .. } => RejectionCause::ApiError,
            Self::ExtendedValidationFailed { problem, .. } => problem
                .tls_cause()
                .map_or(RejectionCause::TlsConfig, RejectionCause::Tls),
            Self::HostAlreadyClaimed { .. } => RejectionCause::HostClaimed,
            Self::RouteNotAdmitted {
                problem: AdmissionProblem::WildcardNotAllowed,
                ..
            } => RejectionCause::Wildcard,
            Self::NoHostValue { .. } => RejectionCause::NoHost,
            Self::InvalidHost { .. } => RejectionCause::InvalidHost,
        }
    }

    /// The route concerned.
    pub fn route(&self) -> &RouteKey {
        match self {
            Self::ExternalCertificateValidationFailed { route, .. }
            | Self::ExternalCertificateGetFailed { route, .. }
            | Self::ExtendedValidationFailed { route, .. }
            | Self::HostAlreadyClaimed { route, .. }
            | Self::RouteNotAdmitted { route, .. }
            | Self::NoHostValue { route }
            | Self::InvalidHost { route, .. } => route,
        }
    }

    /// The name of the secret concerned, for a reason about the route's secret.
    pub fn secret(&self) -> Option<&str> {
        match self {
            Self::ExternalCertificateValidationFailed { secret, .. }
            | Self::ExternalCertificateGetFailed { secret, .. } => Some(secret),
            _ => None,
        }
    }

    /// The condition to record in the route's status: `Admitted=False` with this reason.
    pub fn admission(&self) -> Admission {
        Admission {
            admitted: false,
            reason: Some(self.name().to_owned()),
            message: Some(self.to_string()),
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let namespace = &self.route().namespace;
        match self {
            Self::ExternalCertificateValidationFailed {
                route,
                secret,
                problem,
            } => write!(
                f,
                "route {route}: external certificate secret {namespace}/{secret} failed \
                 validation: {problem}"
            ),
            Self::ExternalCertificateGetFailed {
                route,
                secret,
                detail,
            } => write!(
                f,
                "route {route}: cannot read external certificate secret {namespace}/{secret}: \
                 {detail}; check that the secret exists and the router may read it, the \
                 router retries when the secret changes"
            ),
            Self::ExtendedValidationFailed { route, problem } => {
                write!(f, "route {route}: spec.tls failed validation: {problem}")
            }
            Self::HostAlreadyClaimed {
                route,
                host,
                owner,
                by_namespace: true,
            } => write!(
                f,
                "route {route}: host {host} belongs to namespace {owner_namespace}, where \
                 route {owner} claimed it first; use another host, or ask for the namespace \
                 ownership check to be disabled",
                owner_namespace = owner.namespace
            ),
            Self::HostAlreadyClaimed {
                route, host, owner, ..
            } => write!(
                f,
                "route {route}: host {host} (with this path) is already served by the older \
                 route {owner}; use another host or path (this route takes over if {owner} \
                 is deleted or changes host)"
            ),
            Self::RouteNotAdmitted { route, problem } => write!(f, "route {route}: {problem}"),
            Self::NoHostValue { route } => write!(
                f,
                "route {route}: no host value was defined for the route; set spec.host"
            ),
            Self::InvalidHost { route, host } => write!(
                f,
                "route {route}: host {host:?} must conform to DNS 952 subdomain conventions \
                 (lower-case letters, digits, '-' and '.', labels of at most 63 characters); \
                 correct spec.host"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route() -> RouteKey {
        RouteKey::new("team-a", "shop")
    }

    #[test]
    fn names_are_openshifts() {
        let reasons = [
            Reason::ExternalCertificateValidationFailed {
                route: route(),
                secret: "shop-tls".into(),
                problem: ValidationProblem::SecretNotFound,
            },
            Reason::ExternalCertificateGetFailed {
                route: route(),
                secret: "shop-tls".into(),
                detail: "watch not synced".into(),
            },
        ];
        let names: Vec<_> = reasons.iter().map(Reason::name).collect();
        assert_eq!(
            names,
            [
                "ExternalCertificateValidationFailed",
                "ExternalCertificateGetFailed"
            ]
        );
        for reason in &reasons {
            let message = reason.to_string();
            assert!(message.contains("team-a/shop"), "{message}");
            assert!(message.contains("team-a/shop-tls"), "{message}");
            assert_eq!(reason.route(), &route());
            assert_eq!(reason.secret(), Some("shop-tls"));
        }
        let no_host = Reason::NoHostValue { route: route() };
        assert_eq!(no_host.secret(), None);
        assert!(no_host.to_string().contains("team-a/shop"));
    }

    fn validation_failed(problem: ValidationProblem) -> Reason {
        Reason::ExternalCertificateValidationFailed {
            route: route(),
            secret: "shop-tls".into(),
            problem,
        }
    }

    /// Access and secret problems are the router's `ExternalCertificateValidationFailed`,
    /// certificate, key and TLS configuration problems its `ExtendedValidationFailed`,
    /// host problems its host admission's reasons; every rejection has a class whose
    /// reason name is the rejection's.
    #[test]
    fn every_rejection_has_a_cause_class_of_its_reason() {
        let wrong_type = TlsRejection::WrongSecretType {
            found: Some("Opaque".into()),
        };
        let cases = [
            (
                validation_failed(ValidationProblem::AccessDenied {
                    verb: Verb::Get,
                    identity: "router".into(),
                }),
                "ExternalCertificateValidationFailed",
                "rbac",
            ),
            (
                validation_failed(ValidationProblem::SecretNotFound),
                "ExternalCertificateValidationFailed",
                "secret_missing",
            ),
            (
                validation_failed(wrong_type.into()),
                "ExternalCertificateValidationFailed",
                "secret_type",
            ),
            (
                validation_failed(ValidationProblem::InvalidSecretName(SecretNameError::Empty)),
                "ExternalCertificateValidationFailed",
                "invalid_reference",
            ),
            (
                validation_failed(TlsRejection::KeyEmpty.into()),
                "ExtendedValidationFailed",
                "missing_data",
            ),
            (
                Reason::ExternalCertificateGetFailed {
                    route: route(),
                    secret: "shop-tls".into(),
                    detail: "timeout".into(),
                },
                "ExternalCertificateGetFailed",
                "api_error",
            ),
            (
                Reason::ExtendedValidationFailed {
                    route: route(),
                    problem: TlsConfigProblem::PassthroughWithCertificate {
                        fields: "spec.tls.externalCertificate".into(),
                    },
                },
                "ExtendedValidationFailed",
                "tls_config",
            ),
            (
                Reason::ExtendedValidationFailed {
                    route: route(),
                    problem: TlsConfigProblem::Inline(TlsRejection::KeyEmpty),
                },
                "ExtendedValidationFailed",
                "missing_data",
            ),
            (
                Reason::RouteNotAdmitted {
                    route: route(),
                    problem: AdmissionProblem::WildcardNotAllowed,
                },
                "RouteNotAdmitted",
                "wildcard",
            ),
            (
                Reason::NoHostValue { route: route() },
                "NoHostValue",
                "no_host",
            ),
            (
                Reason::InvalidHost {
                    route: route(),
                    host: "Shop.example".into(),
                },
                "InvalidHost",
                "invalid_host",
            ),
            (
                Reason::HostAlreadyClaimed {
                    route: route(),
                    host: "shop.example".into(),
                    owner: RouteKey::new("team-b", "older"),
                    by_namespace: true,
                },
                "HostAlreadyClaimed",
                "host_claimed",
            ),
        ];
        for (reason, name, label) in cases {
            let cause = reason.cause();
            assert_eq!((reason.name(), cause.as_str()), (name, label), "{reason}");
            assert_eq!(cause.reason_name(), name, "{cause}");
            let admission = reason.admission();
            assert!(!admission.admitted);
            assert_eq!(admission.reason.as_deref(), Some(name));
        }
    }

    /// Labels are distinct and lowercase, and every reason name is reachable from a
    /// class.
    #[test]
    fn cause_labels_are_stable_and_distinct() {
        let labels: std::collections::BTreeSet<_> =
            RejectionCause::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(labels.len(), RejectionCause::ALL.len());
        assert!(
            labels
                .iter()
                .all(|l| l.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        );
        let reasons: std::collections::BTreeSet<_> = RejectionCause::ALL
            .iter()
            .map(|c| c.reason_name())
            .collect();
        let all: std::collections::BTreeSet<_> = Reason::NAMES.into_iter().collect();
        assert_eq!(reasons, all);
        // TLS's own classes are reused as they are, but for the secret's type (a secret
        // problem, labelled as such).
        for cause in TlsCause::ALL {
            let expected = match cause {
                TlsCause::WrongType => "secret_type",
                other => other.as_str(),
            };
            assert_eq!(RejectionCause::Tls(cause).as_str(), expected);
        }
    }

    #[test]
    fn validation_messages_say_what_to_do() {
        let denied = Reason::ExternalCertificateValidationFailed {
            route: route(),
            secret: "shop-tls".into(),
            problem: ValidationProblem::AccessDenied {
                verb: Verb::Watch,
                identity: "system:serviceaccount:openshift-ingress:router".into(),
            },
        };
        let message = denied.to_string();
        assert!(
            message.contains("not allowed to watch the secret"),
            "{message}"
        );
        assert!(message.contains("resourceNames"), "{message}");

        let tls = Reason::ExternalCertificateValidationFailed {
            route: route(),
            secret: "shop-tls".into(),
            problem: TlsRejection::KeyEmpty.into(),
        };
        assert!(
            tls.to_string()
                .ends_with(&TlsRejection::KeyEmpty.to_string())
        );

        let name = ValidationProblem::InvalidSecretName(SecretNameError::Empty);
        assert!(name.to_string().contains("secret name is empty"));

        let passthrough = Reason::ExtendedValidationFailed {
            route: route(),
            problem: TlsConfigProblem::PassthroughWithCertificate {
                fields: "spec.tls.externalCertificate".into(),
            },
        };
        assert!(
            passthrough
                .to_string()
                .contains("passthrough termination does not support certificates"),
            "{passthrough}"
        );
    }
}
