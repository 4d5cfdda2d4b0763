//! What a router needs to send a route's traffic: its termination, path, backends
//! with their weights, target port, insecure policy, the CA certificates of its TLS
//! settings, and the annotations a router reads. Computed from one version of a route
//! ([`RouteRouting::of`]) and carried by its admission, so that whoever configures the
//! proxy never reads the route object again.
//!
//! The rules are openshift/router's (`pkg/router/template/router.go`,
//! `createServiceAliasConfig` and `getServiceUnits`): a backend's weight defaults to 1
//! and is clamped to 0..=256; the target port is compared as text
//! (`IntOrString.String()`) with an endpoint's port name or number.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{InsecureEdgeTerminationPolicy, Route, TlsTermination, WildcardPolicy};

/// The annotation prefixes a router reads (`haproxy.router.openshift.io/...`,
/// `router.openshift.io/...`); others are not kept.
pub const ROUTER_ANNOTATION_PREFIXES: &[&str] =
    &["haproxy.router.openshift.io/", "router.openshift.io/"];

/// How a route's traffic is carried.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Termination {
    /// No `spec.tls`: plain HTTP to the backend.
    Http,
    /// TLS ends at the router; plain HTTP to the backend.
    Edge,
    /// TLS ends at the router, which opens a new TLS connection to the backend.
    Reencrypt,
    /// TLS passes through to the backend, chosen by SNI.
    Passthrough,
    /// A termination this version does not know, as written (the router serves
    /// nothing for it).
    Other(String),
}

impl Termination {
    /// The termination of `route` (`spec.tls` absent: HTTP).
    pub fn of(route: &Route) -> Self {
        match route.spec.tls.as_ref().map(|tls| &tls.termination) {
            None => Self::Http,
            Some(TlsTermination::Edge) => Self::Edge,
            Some(TlsTermination::Reencrypt) => Self::Reencrypt,
            Some(TlsTermination::Passthrough) => Self::Passthrough,
            Some(TlsTermination::Other(text)) => Self::Other(text.clone()),
        }
    }

    /// The value as written in `spec.tls.termination` (empty for HTTP).
    pub fn as_str(&self) -> &str {
        match self {
            Self::Http => "",
            Self::Edge => "edge",
            Self::Reencrypt => "reencrypt",
            Self::Passthrough => "passthrough",
            Self::Other(text) => text,
        }
    }
}

/// What happens to plain HTTP requests for a TLS route.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InsecurePolicy {
    /// Refused (not routed): the default, and what an unknown value means.
    #[default]
    None,
    /// Served over plain HTTP too.
    Allow,
    /// Redirected to HTTPS.
    Redirect,
}

impl InsecurePolicy {
    fn of(value: Option<&InsecureEdgeTerminationPolicy>) -> Self {
        match value {
            Some(InsecureEdgeTerminationPolicy::Allow) => Self::Allow,
            Some(InsecureEdgeTerminationPolicy::Redirect) => Self::Redirect,
            _ => Self::None,
        }
    }

    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Allow => "Allow",
            Self::Redirect => "Redirect",
        }
    }
}

/// One backend of a route: `spec.to` or an entry of `spec.alternateBackends`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Backend {
    /// `kind` (`Service`).
    pub kind: Arc<str>,
    /// The service's name, in the route's namespace.
    pub name: Arc<str>,
    /// The weight, defaulted to 1 and clamped to 0..=256 as the router does; 0 sends no
    /// new traffic.
    pub weight: u16,
}

/// One action of `spec.httpHeaders.actions`: a header set or deleted.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HeaderAction {
    /// The header's name.
    pub name: String,
    /// `Some(value)`: set to this value (an HAProxy format string); `None`: deleted.
    pub set: Option<String>,
}

/// The actions of one list of `spec.httpHeaders.actions` (`request` or `response`) the
/// router keeps (`getHeadersList`): `Set` with a name and a non-empty value, `Delete`
/// with a name; others are dropped.
fn header_actions(list: Option<&serde_json::Value>) -> Vec<HeaderAction> {
    list.and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|item| {
            let name = item.get("name")?.as_str().filter(|n| !n.is_empty())?;
            let action = item.get("action")?;
            match action.get("type")?.as_str()? {
                "Set" => {
                    let value = action
                        .get("set")?
                        .get("value")?
                        .as_str()
                        .filter(|v| !v.is_empty())?;
                    Some(HeaderAction {
                        name: name.to_owned(),
                        set: Some(value.to_owned()),
                    })
                }
                "Delete" => Some(HeaderAction {
                    name: name.to_owned(),
                    set: None,
                }),
                _ => None,
            }
        })
        .collect()
}

/// A route's routing data (see the [module documentation](self)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RouteRouting {
    /// How its traffic is carried.
    pub termination: Termination,
    /// `spec.host`, when set and non-empty.
    pub host: Option<Arc<str>>,
    /// `spec.path`, when set and non-empty.
    pub path: Option<Arc<str>>,
    /// `spec.wildcardPolicy` is `Subdomain` (served for the whole domain only when the
    /// router allows wildcard routes).
    pub wildcard_subdomain: bool,
    /// `spec.to` first, then `spec.alternateBackends` in order. A backend named twice
    /// counts once, with its last weight (the router keeps one entry per service).
    pub backends: Vec<Backend>,
    /// `spec.port.targetPort` as text: a port name or number an endpoint must have.
    pub target_port: Option<Arc<str>>,
    /// `spec.tls.insecureEdgeTerminationPolicy` (always `None` for HTTP routes).
    pub insecure_policy: InsecurePolicy,
    /// `spec.tls.caCertificate` (PEM; public material).
    pub ca_certificate: Option<Arc<str>>,
    /// `spec.tls.destinationCACertificate` (PEM; the CA a reencrypt route's backends
    /// are verified with).
    pub destination_ca_certificate: Option<Arc<str>>,
    /// The route's annotations a router reads ([`ROUTER_ANNOTATION_PREFIXES`]).
    pub annotations: BTreeMap<String, String>,
    /// `spec.httpHeaders.actions.request`, in order.
    pub request_headers: Vec<HeaderAction>,
    /// `spec.httpHeaders.actions.response`, in order.
    pub response_headers: Vec<HeaderAction>,
}

/// `IntOrString` as Kubernetes' `String()` writes it.
fn int_or_string(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// A weight as the router takes it: 1 when absent, clamped to 0..=256.
fn weight(value: Option<i32>) -> u16 {
    u16::try_from(value.unwrap_or(1).clamp(0, 256)).unwrap_or(0)
}

/// A backend's `kind`: nearly always `Service`, which every route then shares instead
/// of holding a copy of its own.
fn backend_kind(kind: &str) -> Arc<str> {
    static SERVICE: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
    if kind == "Service" {
        Arc::clone(SERVICE.get_or_init(|| Arc::from("Service")))
    } else {
        Arc::from(kind)
    }
}

fn non_empty(value: Option<&String>) -> Option<Arc<str>> {
    value
        .filter(|text| !text.is_empty())
        .map(|text| Arc::from(text.as_str()))
}

impl RouteRouting {
    /// The routing data of one version of `route`.
    pub fn of(route: &Route) -> Self {
        let spec = &route.spec;
        let tls = spec.tls.as_ref();
        let targets = 1 + spec.alternate_backends.as_ref().map_or(0, Vec::len);
        let mut backends: Vec<Backend> = Vec::with_capacity(targets);
        for target in std::iter::once(&spec.to).chain(spec.alternate_backends.iter().flatten()) {
            let backend = Backend {
                kind: backend_kind(&target.kind),
                name: Arc::from(target.name.as_str()),
                weight: weight(target.weight),
            };
            match backends.iter_mut().find(|known| known.name == backend.name) {
                Some(known) => known.weight = backend.weight,
                None => backends.push(backend),
            }
        }
        backends.shrink_to_fit();
        let annotations = route
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(key, _)| {
                ROUTER_ANNOTATION_PREFIXES
                    .iter()
                    .any(|prefix| key.starts_with(prefix))
            })
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        let actions = spec
            .extra
            .get("httpHeaders")
            .and_then(|headers| headers.get("actions"));
        Self {
            termination: Termination::of(route),
            host: route.host().map(Arc::from),
            path: non_empty(spec.path.as_ref()),
            wildcard_subdomain: spec.wildcard_policy == Some(WildcardPolicy::Subdomain),
            backends,
            target_port: spec
                .port
                .as_ref()
                .map(|port| Arc::from(int_or_string(&port.target_port).as_str()))
                .filter(|port: &Arc<str>| !port.is_empty()),
            insecure_policy: match tls {
                Some(tls) => InsecurePolicy::of(tls.insecure_edge_termination_policy.as_ref()),
                None => InsecurePolicy::None,
            },
            ca_certificate: tls.and_then(|tls| non_empty(tls.ca_certificate.as_ref())),
            destination_ca_certificate: tls
                .and_then(|tls| non_empty(tls.destination_ca_certificate.as_ref())),
            annotations,
            request_headers: header_actions(actions.and_then(|a| a.get("request"))),
            response_headers: header_actions(actions.and_then(|a| a.get("response"))),
        }
    }

    /// The annotation `name`, if set.
    pub fn annotation(&self, name: &str) -> Option<&str> {
        self.annotations.get(name).map(String::as_str)
    }

    /// Backends with a weight above zero (the router's `ActiveServiceUnits`).
    pub fn active_backends(&self) -> usize {
        self.backends.iter().filter(|b| b.weight > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(spec: serde_json::Value) -> Route {
        serde_json::from_value(json!({
            "apiVersion": "route.openshift.io/v1",
            "kind": "Route",
            "metadata": {"name": "shop", "namespace": "team-a", "annotations": {
                "haproxy.router.openshift.io/balance": "leastconn",
                "router.openshift.io/cookie_name": "c",
                "kubectl.kubernetes.io/last-applied-configuration": "{}"
            }},
            "spec": spec
        }))
        .unwrap()
    }

    #[test]
    fn header_actions_keep_what_the_router_keeps() {
        let routing = RouteRouting::of(&route(json!({
            "host": "a.example", "to": {"kind": "Service", "name": "web"},
            "httpHeaders": {"actions": {
                "request": [
                    {"name": "X-Set", "action": {"type": "Set", "set": {"value": "v"}}},
                    {"name": "X-Empty", "action": {"type": "Set", "set": {"value": ""}}},
                    {"name": "X-Gone", "action": {"type": "Delete"}},
                    {"name": "", "action": {"type": "Delete"}},
                    {"name": "X-Odd", "action": {"type": "Rename"}}
                ],
                "response": [{"name": "Server", "action": {"type": "Delete"}}]
            }}
        })));
        assert_eq!(
            routing.request_headers,
            [
                HeaderAction {
                    name: "X-Set".into(),
                    set: Some("v".into())
                },
                HeaderAction {
                    name: "X-Gone".into(),
                    set: None
                }
            ]
        );
        assert_eq!(
            routing.response_headers,
            [HeaderAction {
                name: "Server".into(),
                set: None
            }]
        );
    }

    #[test]
    fn a_plain_route_has_its_service_with_weight_one() {
        let routing = RouteRouting::of(&route(
            json!({"host": "a.example", "to": {"kind": "Service", "name": "web"}}),
        ));
        assert_eq!(routing.termination, Termination::Http);
        assert_eq!(routing.insecure_policy, InsecurePolicy::None);
        assert_eq!(routing.host.as_deref(), Some("a.example"));
        assert_eq!(routing.path, None);
        assert_eq!(
            routing.backends,
            [Backend {
                kind: "Service".into(),
                name: "web".into(),
                weight: 1
            }]
        );
        assert_eq!(routing.target_port, None);
        assert_eq!(routing.active_backends(), 1);
        assert_eq!(
            routing.annotations.keys().collect::<Vec<_>>(),
            [
                "haproxy.router.openshift.io/balance",
                "router.openshift.io/cookie_name"
            ]
        );
    }

    #[test]
    fn weights_default_clamp_and_merge_as_the_router_takes_them() {
        let routing = RouteRouting::of(&route(json!({
            "host": "a.example", "path": "/cart",
            "to": {"kind": "Service", "name": "web", "weight": 300},
            "alternateBackends": [
                {"kind": "Service", "name": "canary", "weight": -4},
                {"kind": "Service", "name": "blue"},
                {"kind": "Service", "name": "canary", "weight": 20}
            ],
            "port": {"targetPort": 8443},
            "tls": {"termination": "reencrypt", "insecureEdgeTerminationPolicy": "Redirect",
                    "destinationCACertificate": "-----BEGIN CERTIFICATE-----\n"}
        })));
        let weights: Vec<(&str, u16)> = routing
            .backends
            .iter()
            .map(|b| (&*b.name, b.weight))
            .collect();
        assert_eq!(weights, [("web", 256), ("canary", 20), ("blue", 1)]);
        assert_eq!(routing.target_port.as_deref(), Some("8443"));
        assert_eq!(routing.termination, Termination::Reencrypt);
        assert_eq!(routing.insecure_policy, InsecurePolicy::Redirect);
        assert_eq!(routing.path.as_deref(), Some("/cart"));
        assert!(routing.destination_ca_certificate.is_some());
        let named = RouteRouting::of(&route(json!({
            "to": {"kind": "Service", "name": "web", "weight": 0},
            "port": {"targetPort": "https"},
            "tls": {"termination": "passthrough"}
        })));
        assert_eq!(named.target_port.as_deref(), Some("https"));
        assert_eq!(named.termination, Termination::Passthrough);
        assert_eq!(named.active_backends(), 0);
        assert_eq!(named.host, None);
    }
}
