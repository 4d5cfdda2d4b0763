//! Why a route with an external certificate was rejected or re-admitted.
//!
//! [`Reason::name`] is the reason string OpenShift's router writes into the route's
//! `Admitted` condition; the [`Display`](std::fmt::Display) text is the condition's
//! message. Messages name the route and the secret, say what is wrong and what to do.
//! They never contain secret data: callers must not put secret bytes into the free-text
//! `detail` of [`Reason::ExternalCertificateGetFailed`].

use std::fmt;

use kube_common::Verb;

use crate::route::RouteKey;
use crate::route::SecretNameError;
use crate::route::admission::Admission;
use crate::tls::TlsRejection;

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
    /// Both an inline certificate or key and an external certificate are set.
    #[error(
        "spec.tls sets an inline certificate or key as well as externalCertificate; remove \
         one of them"
    )]
    InlineCertificateConflict,
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
    /// The secret does not exist in the route's namespace.
    #[error(
        "the secret does not exist in the route's namespace; create it there (a route can \
         only use secrets from its own namespace)"
    )]
    SecretNotFound,
    /// The secret's TLS material is not usable.
    #[error("{0}")]
    Tls(#[from] TlsRejection),
}

/// The reason recorded for a route whose external certificate changed its fate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// The route or its secret failed validation (RBAC, existence, type, TLS material).
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
    /// The secret was deleted; the router keeps watching for it.
    ExternalCertificateSecretDeleted {
        /// The route.
        route: RouteKey,
        /// The secret's name (in the route's namespace).
        secret: String,
    },
    /// The secret was created again and the route passed validation again.
    ExternalCertificateSecretRecreated {
        /// The route.
        route: RouteKey,
        /// The secret's name (in the route's namespace).
        secret: String,
    },
}

impl Reason {
    /// Every reason name, for metric label sets.
    pub const NAMES: [&'static str; 4] = [
        "ExternalCertificateValidationFailed",
        "ExternalCertificateGetFailed",
        "ExternalCertificateSecretDeleted",
        "ExternalCertificateSecretRecreated",
    ];

    /// The reason as OpenShift writes it into the `Admitted` condition.
    pub fn name(&self) -> &'static str {
        match self {
            Self::ExternalCertificateValidationFailed { .. } => Self::NAMES[0],
            Self::ExternalCertificateGetFailed { .. } => Self::NAMES[1],
            Self::ExternalCertificateSecretDeleted { .. } => Self::NAMES[2],
            Self::ExternalCertificateSecretRecreated { .. } => Self::NAMES[3],
        }
    }

    /// The route concerned.
    pub fn route(&self) -> &RouteKey {
        match self {
            Self::ExternalCertificateValidationFailed { route, .. }
            | Self::ExternalCertificateGetFailed { route, .. }
            | Self::ExternalCertificateSecretDeleted { route, .. }
            | Self::ExternalCertificateSecretRecreated { route, .. } => route,
        }
    }

    /// The name of the secret concerned.
    pub fn secret(&self) -> &str {
        match self {
            Self::ExternalCertificateValidationFailed { secret, .. }
            | Self::ExternalCertificateGetFailed { secret, .. }
            | Self::ExternalCertificateSecretDeleted { secret, .. }
            | Self::ExternalCertificateSecretRecreated { secret, .. } => secret,
        }
    }

    /// Whether the route is served after this event (only a re-creation admits).
    pub fn admits(&self) -> bool {
        matches!(self, Self::ExternalCertificateSecretRecreated { .. })
    }

    /// The condition to record in the route's status.
    pub fn admission(&self) -> Admission {
        Admission {
            admitted: self.admits(),
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
            Self::ExternalCertificateSecretDeleted { route, secret } => write!(
                f,
                "route {route}: external certificate secret {namespace}/{secret} was deleted; \
                 recreate it (the route is admitted again automatically) or point \
                 spec.tls.externalCertificate.name at another secret"
            ),
            Self::ExternalCertificateSecretRecreated { route, secret } => write!(
                f,
                "route {route}: external certificate secret {namespace}/{secret} was \
                 recreated and validated; the route is served again"
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
            Reason::ExternalCertificateSecretDeleted {
                route: route(),
                secret: "shop-tls".into(),
            },
            Reason::ExternalCertificateSecretRecreated {
                route: route(),
                secret: "shop-tls".into(),
            },
        ];
        let names: Vec<_> = reasons.iter().map(Reason::name).collect();
        assert_eq!(names, Reason::NAMES);
        for reason in &reasons {
            let message = reason.to_string();
            assert!(message.contains("team-a/shop"), "{message}");
            assert!(message.contains("team-a/shop-tls"), "{message}");
            assert_eq!(reason.route(), &route());
            assert_eq!(reason.secret(), "shop-tls");
        }
    }

    #[test]
    fn admission_follows_reason() {
        let deleted = Reason::ExternalCertificateSecretDeleted {
            route: route(),
            secret: "s".into(),
        };
        let admission = deleted.admission();
        assert!(!admission.admitted);
        assert_eq!(
            admission.reason.as_deref(),
            Some("ExternalCertificateSecretDeleted")
        );
        assert!(
            admission
                .message
                .unwrap()
                .contains("was deleted; recreate it")
        );
        let recreated = Reason::ExternalCertificateSecretRecreated {
            route: route(),
            secret: "s".into(),
        };
        assert!(recreated.admission().admitted);
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
    }
}
