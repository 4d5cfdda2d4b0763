//! The OpenShift `Route` (`route.openshift.io/v1`), with the fields a router uses.
//!
//! Every struct keeps the fields it does not model in a flattened `extra` map, and every
//! enumerated string keeps values it does not know in an `Other` variant, so that a
//! route read, changed and written back (a status update through the status
//! subresource) never drops what others wrote. Only the top level (`apiVersion`, `kind`,
//! `metadata`, `spec`, `status`) is fixed.
//!
//! The type has no derived CRD schema (`Route::crd()` is not installable): OpenShift owns
//! the definition; install the CRD from `openshift/api` on a cluster without it.

pub mod admission;
pub mod routing;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Fields of an object that this crate does not model, kept verbatim.
pub type UnknownFields = BTreeMap<String, Value>;

/// Declares an enumerated API string that keeps unknown values.
macro_rules! api_string_enum {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $( $(#[$variant_meta])* $variant, )+
            /// A value this version does not know, kept verbatim.
            Other(String),
        }

        impl $name {
            /// The value as written in the API.
            pub fn as_str(&self) -> &str {
                match self {
                    $( Self::$variant => $text, )+
                    Self::Other(text) => text,
                }
            }
        }

        impl From<String> for $name {
            fn from(text: String) -> Self {
                match text.as_str() {
                    $( $text => Self::$variant, )+
                    _ => Self::Other(text),
                }
            }
        }

        impl From<&str> for $name {
            fn from(text: &str) -> Self {
                Self::from(text.to_owned())
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> Self {
                match value {
                    $name::Other(text) => text,
                    known => known.as_str().to_owned(),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

api_string_enum! {
    /// Where TLS is terminated (`spec.tls.termination`).
    #[derive(Default)]
    TlsTermination {
        /// At the router; the router serves the route's certificate.
        #[default]
        Edge = "edge",
        /// At the backend; the router forwards TLS untouched and serves no certificate.
        Passthrough = "passthrough",
        /// At the router, which opens a new TLS connection to the backend.
        Reencrypt = "reencrypt",
    }
}

impl TlsTermination {
    /// Whether the router serves a certificate for this termination (edge, reencrypt).
    pub fn router_serves_certificate(&self) -> bool {
        matches!(self, Self::Edge | Self::Reencrypt)
    }
}

api_string_enum! {
    /// What happens to plain HTTP traffic (`spec.tls.insecureEdgeTerminationPolicy`).
    InsecureEdgeTerminationPolicy {
        /// Plain HTTP is refused.
        None = "None",
        /// Plain HTTP is served too.
        Allow = "Allow",
        /// Plain HTTP is redirected to HTTPS.
        Redirect = "Redirect",
    }
}

api_string_enum! {
    /// Whether a route also serves the other hosts of its domain (`wildcardPolicy`).
    WildcardPolicy {
        /// Only the route's host.
        None = "None",
        /// Every host in the host's parent domain.
        Subdomain = "Subdomain",
    }
}

api_string_enum! {
    /// The status of a condition.
    #[derive(Default)]
    ConditionStatus {
        /// The condition holds.
        True = "True",
        /// The condition does not hold.
        False = "False",
        /// Not known.
        #[default]
        Unknown = "Unknown",
    }
}

/// `spec` of a [`Route`].
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "route.openshift.io",
    version = "v1",
    kind = "Route",
    namespaced,
    status = "RouteStatus",
    schema = "disabled",
    derive = "PartialEq",
    derive = "Default",
    doc = "An OpenShift route (`route.openshift.io/v1`, kind `Route`)."
)]
#[serde(rename_all = "camelCase")]
pub struct RouteSpec {
    /// The host name the route serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// A host name prefix to combine with the router's domain when `host` is empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    /// The path prefix the route serves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The backend.
    #[serde(default)]
    pub to: RouteTargetReference,
    /// More backends, weighted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alternate_backends: Option<Vec<RouteTargetReference>>,
    /// The backend port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<RoutePort>,
    /// TLS settings; absent for plain HTTP routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Wildcard policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wildcard_policy: Option<WildcardPolicy>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

fn service_kind() -> String {
    "Service".to_owned()
}

/// A backend of a route (`spec.to`, `spec.alternateBackends[]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTargetReference {
    /// Kind of the backend; `Service`.
    #[serde(default = "service_kind")]
    pub kind: String,
    /// Name of the backend.
    #[serde(default)]
    pub name: String,
    /// Relative weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

impl Default for RouteTargetReference {
    fn default() -> Self {
        Self {
            kind: service_kind(),
            name: String::new(),
            weight: None,
            extra: UnknownFields::new(),
        }
    }
}

/// The backend port (`spec.port`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutePort {
    /// Port name or number on the backend.
    pub target_port: IntOrString,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

/// Reference to the secret holding a route's certificate (`spec.tls.externalCertificate`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExternalCertificateReference {
    /// Name of a `kubernetes.io/tls` secret in the route's namespace.
    #[serde(default)]
    pub name: String,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

/// TLS settings of a route (`spec.tls`). `Debug` redacts the inline private key.
#[derive(Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Where TLS is terminated.
    #[serde(default)]
    pub termination: TlsTermination,
    /// Inline PEM certificate (chain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate: Option<String>,
    /// Inline PEM private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Inline PEM CA certificate of the chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificate: Option<String>,
    /// PEM CA certificate to verify the backend with (reencrypt).
    #[serde(
        default,
        rename = "destinationCACertificate",
        skip_serializing_if = "Option::is_none"
    )]
    pub destination_ca_certificate: Option<String>,
    /// What happens to plain HTTP traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_edge_termination_policy: Option<InsecureEdgeTerminationPolicy>,
    /// Certificate and key from a secret instead of inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_certificate: Option<ExternalCertificateReference>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("termination", &self.termination)
            .field("certificate", &self.certificate.as_ref().map(|c| c.len()))
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field(
                "ca_certificate",
                &self.ca_certificate.as_ref().map(|c| c.len()),
            )
            .field(
                "destination_ca_certificate",
                &self.destination_ca_certificate.as_ref().map(|c| c.len()),
            )
            .field(
                "insecure_edge_termination_policy",
                &self.insecure_edge_termination_policy,
            )
            .field("external_certificate", &self.external_certificate)
            .field("extra_fields", &self.extra.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `status` of a [`Route`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteStatus {
    /// One entry per router that considered the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<Vec<RouteIngress>>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

/// What one router did with a route (`status.ingress[]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteIngress {
    /// The host the router serves the route on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The router's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_name: Option<String>,
    /// Conditions, among them `Admitted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<RouteIngressCondition>>,
    /// The wildcard policy the router applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wildcard_policy: Option<WildcardPolicy>,
    /// The router's external host name, for CNAME records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_canonical_hostname: Option<String>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

/// A condition of a router's entry (`status.ingress[].conditions[]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteIngressCondition {
    /// The condition's type, e.g. `Admitted`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Whether it holds.
    #[serde(default)]
    pub status: ConditionStatus,
    /// A CamelCase reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A message for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// Fields not modelled here.
    #[serde(flatten)]
    pub extra: UnknownFields,
}

/// Identifies a route: `namespace/name`.
///
/// Its parts are shared strings: a key is held in several places per route (the
/// machine's map, host claims, outcomes, validations, outputs), ten thousand routes at
/// a time, and a clone costs no allocation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RouteKey {
    /// The route's namespace.
    pub namespace: Arc<str>,
    /// The route's name.
    pub name: Arc<str>,
}

impl RouteKey {
    /// A key from its parts.
    pub fn new(namespace: impl AsRef<str>, name: impl AsRef<str>) -> Self {
        Self {
            namespace: Arc::from(namespace.as_ref()),
            name: Arc::from(name.as_ref()),
        }
    }
}

impl fmt::Display for RouteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A string that is not `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not of the form namespace/name")]
pub struct RouteKeyParseError(String);

impl FromStr for RouteKey {
    type Err = RouteKeyParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once('/') {
            Some((namespace, name))
                if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
            {
                Ok(Self::new(namespace, name))
            }
            _ => Err(RouteKeyParseError(text.to_owned())),
        }
    }
}

impl Route {
    /// The route's `namespace/name`, or `None` when either is missing (an object that
    /// did not come from the API server).
    pub fn key(&self) -> Option<RouteKey> {
        Some(RouteKey::new(
            self.namespace()?,
            self.metadata.name.clone()?,
        ))
    }

    /// `spec.host`, when set and non-empty.
    pub fn host(&self) -> Option<&str> {
        self.spec.host.as_deref().filter(|host| !host.is_empty())
    }

    /// The host a router with domain `domain` serves the route at: `spec.host`, or,
    /// when that is empty, `<spec.subdomain>.<domain>` (the router's `ROUTER_DOMAIN`
    /// rule); `None` when neither gives one.
    pub fn host_with_domain(&self, domain: Option<&str>) -> Option<String> {
        if let Some(host) = self.host() {
            return Some(host.to_owned());
        }
        let subdomain = self.spec.subdomain.as_deref().filter(|s| !s.is_empty())?;
        let domain = domain.filter(|d| !d.is_empty())?;
        Some(format!("{subdomain}.{domain}"))
    }

    /// Sets `spec.host` from `spec.subdomain` and the router's domain when the route
    /// has no host, as the router does to every route before it looks at it.
    pub fn apply_router_domain(&mut self, domain: Option<&str>) {
        if self.host().is_none()
            && let Some(host) = self.host_with_domain(domain)
        {
            self.spec.host = Some(host);
        }
    }

    /// The name of the secret holding the route's certificate: `Some` when the route has
    /// `spec.tls.externalCertificate`, whatever its termination (a passthrough route
    /// with one is rejected, as by the router, once its secret is checked). The name is
    /// returned as written, even empty or invalid; check it with
    /// [`validate_secret_name`].
    pub fn external_certificate_name(&self) -> Option<&str> {
        let tls = self.spec.tls.as_ref()?;
        tls.external_certificate
            .as_ref()
            .map(|reference| reference.name.as_str())
    }
}

/// Why a string is not a valid secret name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretNameError {
    /// The name is empty.
    #[error("the secret name is empty")]
    Empty,
    /// The name is longer than 253 characters.
    #[error("the secret name is {len} characters long, at most 253 are allowed")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// The name is not a DNS-1123 subdomain.
    #[error(
        "the secret name must consist of lower-case letters, digits, '-' and '.', and start \
         and end with a letter or digit"
    )]
    NotDnsSubdomain,
}

/// Checks that `name` can name a secret (a DNS-1123 subdomain, as the API server demands).
pub fn validate_secret_name(name: &str) -> Result<(), SecretNameError> {
    use kube_common::NameError;
    kube_common::name::subdomain(name).map_err(|error| match error {
        NameError::Empty => SecretNameError::Empty,
        NameError::TooLong { len, .. } => SecretNameError::TooLong { len },
        _ => SecretNameError::NotDnsSubdomain,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Value {
        json!({
            "apiVersion": "route.openshift.io/v1",
            "kind": "Route",
            "metadata": {
                "name": "shop",
                "namespace": "team-a",
                "resourceVersion": "42",
                "annotations": {"haproxy.router.openshift.io/timeout": "5s"}
            },
            "spec": {
                "host": "shop.example.com",
                "path": "/cart",
                "to": {"kind": "Service", "name": "shop", "weight": 100, "futureField": 1},
                "alternateBackends": [{"kind": "Service", "name": "shop-canary", "weight": 10}],
                "port": {"targetPort": "https"},
                "tls": {
                    "termination": "reencrypt",
                    "destinationCACertificate": "-----BEGIN CERTIFICATE-----\n...",
                    "insecureEdgeTerminationPolicy": "Redirect",
                    "externalCertificate": {"name": "shop-tls"},
                    "newTlsKnob": {"x": true}
                },
                "wildcardPolicy": "None",
                "httpHeaders": {"actions": {"response": []}}
            },
            "status": {
                "ingress": [
                    {
                        "host": "shop.example.com",
                        "routerName": "other-router",
                        "routerCanonicalHostname": "apps.other.example.com",
                        "wildcardPolicy": "None",
                        "conditions": [{
                            "type": "Admitted",
                            "status": "True",
                            "lastTransitionTime": "2024-05-01T10:00:00Z",
                            "observedGeneration": 3
                        }],
                        "someoneElsesField": ["kept"]
                    },
                    {
                        "host": "shop.example.com",
                        "routerName": "default",
                        "conditions": [{
                            "type": "Admitted",
                            "status": "Maybe",
                            "reason": "Thinking"
                        }]
                    }
                ],
                "futureStatus": "kept"
            }
        })
    }

    #[test]
    fn json_round_trip_keeps_unknown_fields_and_values() {
        let original = sample();
        let route: Route = serde_json::from_value(original.clone()).unwrap();
        assert_eq!(
            route.spec.tls.as_ref().unwrap().termination,
            TlsTermination::Reencrypt
        );
        assert!(
            route
                .spec
                .tls
                .as_ref()
                .unwrap()
                .destination_ca_certificate
                .is_some(),
            "destinationCACertificate is read into its field"
        );
        let ingress = route.status.as_ref().unwrap().ingress.as_ref().unwrap();
        assert_eq!(
            ingress[1].conditions.as_ref().unwrap()[0].status,
            ConditionStatus::Other("Maybe".into())
        );
        assert_eq!(serde_json::to_value(&route).unwrap(), original);
    }

    #[test]
    fn unknown_termination_round_trips() {
        let mut value = sample();
        value["spec"]["tls"]["termination"] = json!("quantum");
        let route: Route = serde_json::from_value(value.clone()).unwrap();
        assert_eq!(
            route.spec.tls.as_ref().unwrap().termination,
            TlsTermination::Other("quantum".into())
        );
        assert_eq!(route.external_certificate_name(), Some("shop-tls"));
        assert_eq!(serde_json::to_value(&route).unwrap(), value);
    }

    #[test]
    fn key_and_host() {
        let route: Route = serde_json::from_value(sample()).unwrap();
        assert_eq!(route.key(), Some(RouteKey::new("team-a", "shop")));
        assert_eq!(route.key().unwrap().to_string(), "team-a/shop");
        assert_eq!(
            "team-a/shop".parse::<RouteKey>().unwrap(),
            route.key().unwrap()
        );
        assert!("team-a".parse::<RouteKey>().is_err());
        assert!("a/b/c".parse::<RouteKey>().is_err());
        assert_eq!(route.host(), Some("shop.example.com"));
        let mut local = Route::new("x", RouteSpec::default());
        assert_eq!(local.key(), None);
        local.spec.host = Some(String::new());
        assert_eq!(local.host(), None);
    }

    #[test]
    fn a_cloned_key_shares_its_strings() {
        let key = RouteKey::new("team-a", "shop");
        let copy = key.clone();
        assert!(Arc::ptr_eq(&key.namespace, &copy.namespace));
        assert!(Arc::ptr_eq(&key.name, &copy.name));
    }

    #[test]
    fn external_certificate_name_is_read_whatever_the_termination() {
        let mut route: Route = serde_json::from_value(sample()).unwrap();
        assert_eq!(route.external_certificate_name(), Some("shop-tls"));
        let tls = route.spec.tls.as_mut().unwrap();
        tls.termination = TlsTermination::Edge;
        assert_eq!(route.external_certificate_name(), Some("shop-tls"));
        route.spec.tls.as_mut().unwrap().termination = TlsTermination::Passthrough;
        assert_eq!(route.external_certificate_name(), Some("shop-tls"));
        route.spec.tls.as_mut().unwrap().termination = TlsTermination::Edge;
        route.spec.tls.as_mut().unwrap().external_certificate = None;
        assert_eq!(route.external_certificate_name(), None);
        route.spec.tls = None;
        assert_eq!(route.external_certificate_name(), None);
    }

    #[test]
    fn empty_external_certificate_name_is_reported_as_written() {
        let mut route: Route = serde_json::from_value(sample()).unwrap();
        route.spec.tls.as_mut().unwrap().external_certificate =
            Some(ExternalCertificateReference::default());
        assert_eq!(route.external_certificate_name(), Some(""));
        assert_eq!(validate_secret_name(""), Err(SecretNameError::Empty));
    }

    #[test]
    fn secret_names_follow_dns_1123() {
        for ok in ["a", "shop-tls", "shop.tls.v2", "0abc"] {
            assert_eq!(validate_secret_name(ok), Ok(()), "{ok}");
        }
        for bad in ["Shop", "-a", "a-", "a..b", "a_b", "a/b", ".a", "a."] {
            assert_eq!(
                validate_secret_name(bad),
                Err(SecretNameError::NotDnsSubdomain),
                "{bad}"
            );
        }
        assert_eq!(
            validate_secret_name(&"a".repeat(254)),
            Err(SecretNameError::TooLong { len: 254 })
        );
    }

    #[test]
    fn debug_redacts_inline_key() {
        let mut route: Route = serde_json::from_value(sample()).unwrap();
        let body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDEtOgjuqJoa9";
        route.spec.tls.as_mut().unwrap().key = Some(format!(
            "-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----\n"
        ));
        let debug = format!("{route:?}");
        assert!(!debug.contains(body), "{debug}");
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn resource_identity() {
        use kube::Resource;
        assert_eq!(Route::api_version(&()), "route.openshift.io/v1");
        assert_eq!(Route::kind(&()), "Route");
        assert_eq!(Route::plural(&()), "routes");
        let value = serde_json::to_value(Route::new("r", RouteSpec::default())).unwrap();
        assert_eq!(value["apiVersion"], "route.openshift.io/v1");
        assert_eq!(value["kind"], "Route");
    }
}
