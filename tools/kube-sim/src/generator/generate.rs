//! The cluster generator: N routes across K namespaces, each route's
//! `spec.tls.externalCertificate` naming a `kubernetes.io/tls` secret with a real
//! ECDSA P-256 certificate (all signed by one CA), and the RBAC a router has.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::duration_serde;
use crate::error::SimError;
use crate::generator::certs::CertAuthority;
use crate::resources::{self, ResourceId};
use crate::storage::handle::upsert;
use crate::storage::store::{Store, WriteOptions};
use kube_common::duration::parse as parse_duration;

/// Namespace of the router's service account.
pub const ROUTER_NAMESPACE: &str = "openshift-ingress";
/// Name of the router's service account.
pub const ROUTER_SERVICE_ACCOUNT: &str = "router";
/// Name of the router's cluster-wide ClusterRole and ClusterRoleBinding.
pub const ROUTER_CLUSTER_ROLE: &str = "certwatch-router";
/// Name of the per-namespace Role and RoleBinding granting the router its secrets.
pub const ROUTER_SECRETS_ROLE: &str = "certwatch-router-secrets";
/// Name of the Role and RoleBinding in [`ROUTER_NAMESPACE`] granting the router its
/// Leases (one status writer among replicas).
pub const ROUTER_LEASES_ROLE: &str = "certwatch-router-leases";
/// Label on generated namespaces: `<index mod shards>`.
pub const SHARD_LABEL: &str = "certwatch.io/shard";
/// Label on every generated object.
pub const GENERATED_LABEL: &str = "certwatch.io/generated";

/// What to generate. Every field has a default; `routes=N,namespaces=K` is typical.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct GenerateSpec {
    /// Number of routes.
    pub routes: usize,
    /// Number of namespaces (routes are spread over them).
    pub namespaces: usize,
    /// Number of distinct secrets (default: one per route). With fewer secrets than
    /// routes, route `i` uses secret `i mod secrets` and lives in its namespace.
    pub secrets: Option<usize>,
    /// Host name pattern; `{route}`, `{namespace}` and `{index}` are substituted.
    pub host_pattern: String,
    /// Validity of the leaf certificates (from an hour ago).
    #[serde(with = "duration_serde")]
    pub validity: Duration,
    /// Namespace name prefix (`app-0`, `app-1`, ...).
    pub namespace_prefix: String,
    /// Route name prefix.
    pub route_prefix: String,
    /// Secret name prefix.
    pub secret_prefix: String,
    /// Namespaces are labelled `certwatch.io/shard=<index mod shards>`.
    pub shards: usize,
    /// Also create the router's RBAC (ClusterRole/Binding and per-namespace
    /// Role/RoleBinding with exactly the secrets its routes use).
    pub router_rbac: bool,
    /// Also give every route the Service it names (`svc-<index>`, port `https`) and an
    /// EndpointSlice with one ready endpoint (a 10.0.0.0/8 address, never contacted),
    /// so that a router writing the routes' configuration has a server per route.
    pub endpoints: bool,
}

impl Default for GenerateSpec {
    fn default() -> Self {
        GenerateSpec {
            routes: 0,
            namespaces: 1,
            secrets: None,
            host_pattern: "{route}.{namespace}.apps.sim.example".to_string(),
            validity: Duration::from_secs(90 * 86_400),
            namespace_prefix: "app-".to_string(),
            route_prefix: "route-".to_string(),
            secret_prefix: "tls-".to_string(),
            shards: 2,
            router_rbac: true,
            endpoints: false,
        }
    }
}

impl GenerateSpec {
    /// `routes` routes over `namespaces` namespaces, one secret per route.
    pub fn new(routes: usize, namespaces: usize) -> Self {
        GenerateSpec {
            routes,
            namespaces,
            ..GenerateSpec::default()
        }
    }

    /// The number of distinct secrets this spec generates.
    pub fn secret_count(&self) -> usize {
        self.secrets.unwrap_or(self.routes).min(self.routes)
    }
}

impl FromStr for GenerateSpec {
    type Err = SimError;

    /// Parses `routes=N,namespaces=K,secrets=S,host=PATTERN,validity=90d,shards=2,
    /// namespace-prefix=P,route-prefix=P,secret-prefix=P,rbac=true,endpoints=false`.
    fn from_str(s: &str) -> Result<Self, SimError> {
        let mut spec = GenerateSpec::default();
        let bad = |m: String| SimError::Generate(m);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("expected key=value, got {part:?}")))?;
            let num = |v: &str| {
                v.parse::<usize>()
                    .map_err(|_| bad(format!("{k}: {v:?} is not a number")))
            };
            match k {
                "routes" => spec.routes = num(v)?,
                "namespaces" => spec.namespaces = num(v)?,
                "secrets" => spec.secrets = Some(num(v)?),
                "shards" => spec.shards = num(v)?,
                "host" | "host-pattern" => spec.host_pattern = v.to_string(),
                "validity" => {
                    spec.validity = parse_duration(v).map_err(|e| bad(e.to_string()))?;
                }
                "namespace-prefix" => spec.namespace_prefix = v.to_string(),
                "route-prefix" => spec.route_prefix = v.to_string(),
                "secret-prefix" => spec.secret_prefix = v.to_string(),
                "rbac" => {
                    spec.router_rbac = v
                        .parse()
                        .map_err(|_| bad(format!("rbac: {v:?} is not true/false")))?;
                }
                "endpoints" => {
                    spec.endpoints = v
                        .parse()
                        .map_err(|_| bad(format!("endpoints: {v:?} is not true/false")))?;
                }
                other => return Err(bad(format!("unknown key {other:?}"))),
            }
        }
        Ok(spec)
    }
}

/// One generated route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedRoute {
    /// Namespace of the route and its secret.
    pub namespace: String,
    /// Route name.
    pub route: String,
    /// Secret named by `spec.tls.externalCertificate.name`.
    pub secret: String,
    /// `spec.host`.
    pub host: String,
}

/// What [`crate::Simulator::generate`] created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GeneratedCluster {
    /// Every route, in creation order (oldest first).
    pub routes: Vec<GeneratedRoute>,
    /// Every namespace created.
    pub namespaces: Vec<String>,
    /// Number of distinct secrets.
    pub secrets: usize,
    /// PEM of the CA that signed every leaf certificate.
    pub ca_pem: String,
    /// The resourceVersion after generation.
    pub resource_version: u64,
}

impl GeneratedCluster {
    /// Distinct (namespace, secret) pairs, sorted.
    pub fn distinct_secrets(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .routes
            .iter()
            .map(|r| (r.namespace.clone(), r.secret.clone()))
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

const DIRECT: WriteOptions = WriteOptions {
    api: false,
    auto_namespace: true,
    skip_validation: false,
    dry_run: false,
};

fn put(store: &Store, id: ResourceId, obj: Value) -> Result<(), SimError> {
    upsert(store, id, obj, DIRECT).map(|_| ())
}

/// The router's cluster-wide rules: list/watch routes everywhere, update route
/// status, create access reviews, read namespaces, list/watch services and
/// EndpointSlices (the routes' backends).
pub(crate) fn router_cluster_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": { "name": ROUTER_CLUSTER_ROLE },
        "rules": [
            { "apiGroups": ["route.openshift.io"], "resources": ["routes"], "verbs": ["list", "watch"] },
            { "apiGroups": ["route.openshift.io"], "resources": ["routes/status"], "verbs": ["update"] },
            { "apiGroups": ["authorization.k8s.io"],
              "resources": ["subjectaccessreviews", "selfsubjectaccessreviews", "selfsubjectrulesreviews"],
              "verbs": ["create"] },
            { "apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"] },
            { "apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"] },
            { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"] },
        ],
    })
}

fn router_subject() -> Value {
    json!([{ "kind": "ServiceAccount", "name": ROUTER_SERVICE_ACCOUNT, "namespace": ROUTER_NAMESPACE }])
}

/// The router's rules in its own namespace: the Leases that elect one status writer
/// among its replicas (created when missing, then read, watched and renewed).
pub fn router_leases_role() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": { "name": ROUTER_LEASES_ROLE, "namespace": ROUTER_NAMESPACE },
        "rules": [
            { "apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
              "verbs": ["create", "get", "list", "watch", "update"] },
        ],
    })
}

/// The binding of [`router_leases_role`] to the router's service account.
pub fn router_leases_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": { "name": ROUTER_LEASES_ROLE, "namespace": ROUTER_NAMESPACE },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER_LEASES_ROLE },
        "subjects": router_subject(),
    })
}

pub(crate) fn router_cluster_binding() -> Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": { "name": ROUTER_CLUSTER_ROLE },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROUTER_CLUSTER_ROLE },
        "subjects": router_subject(),
    })
}

/// Upserts the Role and RoleBinding that let the router get/list/watch exactly
/// `names` (plus any names the Role already has) in `namespace`.
pub(crate) fn grant_router_secrets(
    store: &Store,
    namespace: &str,
    names: &[String],
) -> Result<(), SimError> {
    let existing = store.get(
        resources::ROLES,
        &(namespace.to_string(), ROUTER_SECRETS_ROLE.to_string()),
    );
    let mut all: Vec<String> = existing
        .as_deref()
        .and_then(|r| r.pointer("/rules/0/resourceNames"))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    all.extend(names.iter().cloned());
    all.sort();
    all.dedup();
    if all.is_empty() {
        // An empty resourceNames list would grant every secret.
        return Ok(());
    }
    put(
        store,
        resources::ROLES,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": { "name": ROUTER_SECRETS_ROLE, "namespace": namespace },
            "rules": [{ "apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"], "resourceNames": all }],
        }),
    )?;
    put(
        store,
        resources::ROLE_BINDINGS,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": { "name": ROUTER_SECRETS_ROLE, "namespace": namespace },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ROUTER_SECRETS_ROLE },
            "subjects": router_subject(),
        }),
    )
}

fn host_for(pattern: &str, route: &str, namespace: &str, index: usize) -> String {
    pattern
        .replace("{route}", route)
        .replace("{namespace}", namespace)
        .replace("{index}", &index.to_string())
}

/// Maximum SAN entries per generated certificate (routes sharing one secret beyond
/// this are not all listed).
const MAX_SANS: usize = 100;

/// The service a generated route names.
fn service_name(index: usize) -> String {
    format!("svc-{index}")
}

/// The Service of route `index` and its EndpointSlice: one ready endpoint on the port
/// the route targets (`https`), at an address of 10.0.0.0/8 derived from the index.
/// The Service is headless: the simulator's service network (a /16) has fewer
/// addresses than a large cluster's routes, and a router reads a Service's cluster IP
/// only for an idled one.
fn put_backend(store: &Store, namespace: &str, index: usize) -> Result<(), SimError> {
    let service = service_name(index);
    put(
        store,
        resources::SERVICES,
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": service,
                "namespace": namespace,
                "labels": { GENERATED_LABEL: "true" },
            },
            "spec": {
                "clusterIP": "None",
                "ports": [{ "name": "https", "port": 443, "targetPort": "https", "protocol": "TCP" }],
            },
        }),
    )?;
    let address = format!(
        "10.{}.{}.{}",
        index >> 16 & 255,
        index >> 8 & 255,
        index & 255
    );
    put(
        store,
        resources::ENDPOINT_SLICES,
        json!({
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": format!("{service}-1"),
                "namespace": namespace,
                "labels": {
                    "kubernetes.io/service-name": service,
                    GENERATED_LABEL: "true",
                },
            },
            "addressType": "IPv4",
            "ports": [{ "name": "https", "port": 8443, "protocol": "TCP" }],
            "endpoints": [{ "addresses": [address], "conditions": { "ready": true } }],
        }),
    )
}

/// Generates the cluster described by `spec` into `store`.
pub(crate) fn generate(store: &Store, spec: &GenerateSpec) -> Result<GeneratedCluster, SimError> {
    if spec.namespaces == 0 {
        return Err(SimError::Generate("namespaces must be at least 1".into()));
    }
    let secret_count = spec.secret_count();
    if spec.routes > 0 && secret_count == 0 {
        return Err(SimError::Generate(
            "secrets must be at least 1 when routes > 0".into(),
        ));
    }
    let shards = spec.shards.max(1);
    let ca = CertAuthority::new(
        "kube-sim generated workload CA",
        spec.validity.max(Duration::from_secs(86_400)) * 2,
    )?;
    let namespaces: Vec<String> = (0..spec.namespaces)
        .map(|k| format!("{}{k}", spec.namespace_prefix))
        .collect();
    let secret_ns = |j: usize| j % spec.namespaces;
    let secret_name = |j: usize| format!("{}{j}", spec.secret_prefix);
    let routes: Vec<GeneratedRoute> = (0..spec.routes)
        .map(|i| {
            let j = i % secret_count;
            let namespace = namespaces[secret_ns(j)].clone();
            let route = format!("{}{i}", spec.route_prefix);
            let host = host_for(&spec.host_pattern, &route, &namespace, i);
            GeneratedRoute {
                namespace,
                route,
                secret: secret_name(j),
                host,
            }
        })
        .collect();
    for r in &routes {
        if let Err(e) = crate::objects::validation::dns1123_subdomain(&r.host) {
            return Err(SimError::Generate(format!(
                "host pattern {:?} yields {:?} for route {}: {e}",
                spec.host_pattern, r.host, r.route
            )));
        }
    }

    for (k, ns) in namespaces.iter().enumerate() {
        put(
            store,
            resources::NAMESPACES,
            json!({
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": { "name": ns, "labels": {
                    SHARD_LABEL: (k % shards).to_string(),
                    GENERATED_LABEL: "true",
                } },
            }),
        )?;
    }

    let mut hosts_by_secret: Vec<Vec<String>> = vec![Vec::new(); secret_count];
    for (i, r) in routes.iter().enumerate() {
        let hosts = &mut hosts_by_secret[i % secret_count];
        if hosts.len() < MAX_SANS {
            hosts.push(r.host.clone());
        }
    }
    for (j, hosts) in hosts_by_secret.iter().enumerate() {
        let leaf = ca.leaf(hosts, spec.validity)?;
        let chain = format!("{}{}", leaf.cert_pem, ca.pem);
        put(
            store,
            resources::SECRETS,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": secret_name(j),
                    "namespace": namespaces[secret_ns(j)],
                    "labels": { GENERATED_LABEL: "true" },
                },
                "type": "kubernetes.io/tls",
                "data": {
                    "tls.crt": B64.encode(chain.as_bytes()),
                    "tls.key": B64.encode(leaf.key_pem.as_bytes()),
                },
            }),
        )?;
    }

    if spec.router_rbac {
        put(
            store,
            resources::NAMESPACES,
            json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ROUTER_NAMESPACE },
            }),
        )?;
        put(store, resources::CLUSTER_ROLES, router_cluster_role())?;
        put(
            store,
            resources::CLUSTER_ROLE_BINDINGS,
            router_cluster_binding(),
        )?;
        put(store, resources::ROLES, router_leases_role())?;
        put(store, resources::ROLE_BINDINGS, router_leases_binding())?;
        let mut by_ns: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for r in &routes {
            by_ns
                .entry(&r.namespace)
                .or_default()
                .push(r.secret.clone());
        }
        for (ns, names) in by_ns {
            grant_router_secrets(store, ns, &names)?;
        }
    }

    // Creation timestamps increase with the index, so "oldest first" is route order.
    let base = jiff::Timestamp::now().as_second() - spec.routes as i64 - 60;
    for (i, r) in routes.iter().enumerate() {
        let created = jiff::Timestamp::from_second(base + i as i64)
            .map(|t| t.to_string())
            .unwrap_or_default();
        put(
            store,
            resources::ROUTES,
            json!({
                "apiVersion": "route.openshift.io/v1",
                "kind": "Route",
                "metadata": {
                    "name": r.route,
                    "namespace": r.namespace,
                    "creationTimestamp": created,
                    "labels": { GENERATED_LABEL: "true" },
                },
                "spec": {
                    "host": r.host,
                    "to": { "kind": "Service", "name": service_name(i), "weight": 100 },
                    "port": { "targetPort": "https" },
                    "tls": {
                        "termination": "edge",
                        "insecureEdgeTerminationPolicy": "Redirect",
                        "externalCertificate": { "name": r.secret },
                    },
                    "wildcardPolicy": "None",
                },
                "status": {},
            }),
        )?;
    }
    if spec.endpoints {
        for (i, r) in routes.iter().enumerate() {
            put_backend(store, &r.namespace, i)?;
        }
    }
    tracing::info!(
        routes = routes.len(),
        namespaces = namespaces.len(),
        secrets = secret_count,
        "generated cluster"
    );
    Ok(GeneratedCluster {
        routes,
        namespaces,
        secrets: secret_count,
        ca_pem: ca.pem,
        resource_version: store.current_rv(),
    })
}
