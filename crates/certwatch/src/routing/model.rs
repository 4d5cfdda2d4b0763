//! From routes and endpoints to HAProxy backends and their servers, with the OpenShift
//! router's rules (`pkg/router/template/router.go`, `calculateServiceWeights` and
//! `getActiveEndpoints`; the template's server lines).
//!
//! - A route's backend is named `<prefix>:<namespace>:<route>`, the prefix by its
//!   termination: `be_http` (plain), `be_edge_http`, `be_secure` (reencrypt), `be_tcp`
//!   (passthrough).
//! - Its servers are the endpoints of each of its services (in service-name order),
//!   filtered by the route's target port (an endpoint's port name or number).
//! - Weights: with one active service (a weight above zero and endpoints), every
//!   endpoint of it gets 1; with several, each service's weight is spread over its
//!   endpoints and scaled so that the largest per-endpoint share is 256 (in single
//!   precision, truncated, never below 1 for a share above 0). A service of weight 0
//!   keeps its servers at weight 0 for HTTP backends (existing sessions stay), and has
//!   none in passthrough backends.
//!
//! Pure: [`RoutingTable`] holds the served routes; [`RoutingTable::plan`] computes one
//! route's backend from an [`EndpointTable`].

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use route_secrets::route::RouteKey;
use route_secrets::route::routing::{RouteRouting, Termination};

use super::endpoints::{Endpoint, EndpointTable, ServiceKey};

/// A route certwatch serves, with what its configuration needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedRoute {
    /// The route.
    pub key: RouteKey,
    /// Its routing data.
    pub routing: Arc<RouteRouting>,
    /// Served for every host of its domain (a wildcard route the router allows).
    pub wildcard: bool,
    /// Whether it has its own certificate in the crt-list (edge and reencrypt routes
    /// without one are served with the default certificate).
    pub has_certificate: bool,
}

/// The backend name prefix of a termination (`None`: the router serves nothing for it).
pub fn backend_prefix(termination: &Termination) -> Option<&'static str> {
    match termination {
        Termination::Http => Some("be_http"),
        Termination::Edge => Some("be_edge_http"),
        Termination::Reencrypt => Some("be_secure"),
        Termination::Passthrough => Some("be_tcp"),
        Termination::Other(_) => None,
    }
}

impl ServedRoute {
    /// The route's backend name (`be_edge_http:ns:name`), if it has one.
    pub fn backend_name(&self) -> Option<String> {
        backend_prefix(&self.routing.termination)
            .map(|prefix| format!("{prefix}:{}:{}", self.key.namespace, self.key.name))
    }

    /// The services the route sends traffic to.
    pub fn services(&self) -> impl Iterator<Item = ServiceKey> + '_ {
        self.routing
            .backends
            .iter()
            .map(|backend| (Arc::clone(&self.key.namespace), Arc::clone(&backend.name)))
    }
}

/// One server of a backend.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Server {
    /// The endpoint's identifier (the router's server name).
    pub id: String,
    /// Address, as a server line takes it.
    pub ip: String,
    /// Port.
    pub port: u16,
    /// Weight, 0..=256.
    pub weight: u16,
    /// The endpoint speaks HTTP/2 without TLS (`appProtocol: h2c`).
    pub h2c: bool,
    /// The service's DNS name (`<service>.<namespace>.svc`), for `verifyhost`.
    pub service_host: String,
    /// Whether it may be health-checked: not an idled service's cluster IP.
    pub health_check: bool,
}

/// A route's backend: its servers and what decides their options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendPlan {
    /// `be_edge_http:ns:name`.
    pub name: String,
    /// Servers, in the router's order.
    pub servers: Vec<Server>,
    /// Endpoints of services with a weight above zero (health checks from 2 on).
    pub active_endpoints: usize,
    /// Services with a weight above zero (round robin from 2 on).
    pub active_services: usize,
}

/// Per-endpoint weights of a route's services (only those with endpoints), as the
/// router's `calculateServiceWeights`.
fn service_weights(counts: &[(u16, usize)]) -> Vec<Option<u16>> {
    let active = counts.iter().filter(|(w, n)| *n > 0 && *w > 0).count();
    if active == 1 {
        return counts
            .iter()
            .map(|(w, n)| (*n > 0).then_some(u16::from(*w > 0)))
            .collect();
    }
    let shares: Vec<Option<f32>> = counts
        .iter()
        .map(|(w, n)| (*n > 0).then(|| f32::from(*w) / *n as f32))
        .collect();
    let max = shares.iter().flatten().fold(0.0f32, |a, b| a.max(*b));
    let scale = if max > 0.0 { 256.0 / max } else { 0.0 };
    shares
        .iter()
        .map(|share| {
            share.map(|share| {
                // Truncation toward zero, as Go's int32(float32).
                let scaled = (share * scale) as u16;
                if share > 0.0 && scaled < 1 { 1 } else { scaled }
            })
        })
        .collect()
}

/// The served routes, and which routes each service feeds.
#[derive(Debug, Default)]
pub struct RoutingTable {
    routes: BTreeMap<RouteKey, ServedRoute>,
    by_service: HashMap<ServiceKey, ServiceRoutes>,
}

/// The routes one service feeds. Nearly always one route has a service to itself, and
/// a set of one costs a whole tree node (about 0.4 KiB a route): one key is held as
/// itself, two or more in a set.
#[derive(Debug)]
enum ServiceRoutes {
    One(RouteKey),
    Many(BTreeSet<RouteKey>),
}

impl ServiceRoutes {
    fn insert(&mut self, key: RouteKey) {
        match self {
            Self::One(only) if *only == key => {}
            Self::One(only) => {
                let first = only.clone();
                *self = Self::Many(BTreeSet::from([first, key]));
            }
            Self::Many(keys) => {
                keys.insert(key);
            }
        }
    }

    /// Removes `key`; says whether none is left.
    fn remove(&mut self, key: &RouteKey) -> bool {
        match self {
            Self::One(only) => only == key,
            Self::Many(keys) => {
                keys.remove(key);
                if keys.len() == 1
                    && let Some(last) = keys.pop_first()
                {
                    *self = Self::One(last);
                    return false;
                }
                keys.is_empty()
            }
        }
    }

    /// The keys, in order.
    fn iter(&self) -> impl Iterator<Item = &RouteKey> {
        let (one, many) = match self {
            Self::One(key) => (Some(key), None),
            Self::Many(keys) => (None, Some(keys)),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }
}

impl RoutingTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a route; says whether anything changed.
    pub fn upsert(&mut self, route: ServedRoute) -> bool {
        if self.routes.get(&route.key) == Some(&route) {
            return false;
        }
        self.remove(&route.key);
        for service in route.services() {
            match self.by_service.entry(service) {
                Entry::Occupied(mut routes) => routes.get_mut().insert(route.key.clone()),
                Entry::Vacant(slot) => {
                    slot.insert(ServiceRoutes::One(route.key.clone()));
                }
            }
        }
        self.routes.insert(route.key.clone(), route);
        true
    }

    /// Removes a route; says whether it was there.
    pub fn remove(&mut self, key: &RouteKey) -> bool {
        let Some(old) = self.routes.remove(key) else {
            return false;
        };
        for service in old.services() {
            if let Some(routes) = self.by_service.get_mut(&service)
                && routes.remove(key)
            {
                self.by_service.remove(&service);
            }
        }
        true
    }

    /// The routes, by key.
    pub fn routes(&self) -> impl ExactSizeIterator<Item = &ServedRoute> {
        self.routes.values()
    }

    /// One route.
    pub fn get(&self, key: &RouteKey) -> Option<&ServedRoute> {
        self.routes.get(key)
    }

    /// Number of routes.
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// The routes a service feeds.
    pub fn routes_of(&self, service: &ServiceKey) -> impl Iterator<Item = &ServedRoute> {
        self.by_service
            .get(service)
            .into_iter()
            .flat_map(ServiceRoutes::iter)
            .filter_map(|key| self.routes.get(key))
    }

    /// The backend of `route` for the endpoints in `table` (`None` for a termination
    /// the router serves nothing for).
    pub fn plan(route: &ServedRoute, table: &EndpointTable) -> Option<BackendPlan> {
        let name = route.backend_name()?;
        let routing = &route.routing;
        let target = routing.target_port.as_deref();
        // Services in name order (the router's template walks a map: sorted keys).
        let mut services: Vec<(&str, u16)> = routing
            .backends
            .iter()
            .map(|backend| (&*backend.name, backend.weight))
            .collect();
        services.sort_by(|a, b| a.0.cmp(b.0));
        let endpoints: Vec<Vec<Endpoint>> = services
            .iter()
            .map(|(service, _)| {
                table
                    .endpoints(&route.key.namespace, service)
                    .iter()
                    .filter(|endpoint| target.is_none_or(|port| endpoint.matches_port(port)))
                    .cloned()
                    .collect()
            })
            .collect();
        let counts: Vec<(u16, usize)> = services
            .iter()
            .zip(&endpoints)
            .map(|((_, weight), endpoints)| (*weight, endpoints.len()))
            .collect();
        let weights = service_weights(&counts);
        let passthrough = routing.termination == Termination::Passthrough;
        let mut servers = Vec::new();
        for (((service, _), endpoints), weight) in services.iter().zip(&endpoints).zip(weights) {
            let Some(weight) = weight else { continue };
            if passthrough && weight == 0 {
                continue;
            }
            let service_host = format!("{service}.{}.svc", route.key.namespace);
            for endpoint in endpoints {
                servers.push(Server {
                    id: endpoint.id.clone(),
                    ip: endpoint.ip.clone(),
                    port: endpoint.port,
                    weight,
                    h2c: matches!(
                        endpoint.app_protocol.as_deref(),
                        Some("h2c" | "kubernetes.io/h2c")
                    ),
                    service_host: service_host.clone(),
                    health_check: endpoint.health_check,
                });
            }
        }
        let active_endpoints = counts
            .iter()
            .filter(|(weight, _)| *weight > 0)
            .map(|(_, n)| n)
            .sum();
        Some(BackendPlan {
            name,
            servers,
            active_endpoints,
            active_services: routing.active_backends(),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use route_secrets::route::routing::{Backend, InsecurePolicy};
    use serde_json::json;

    pub(crate) fn routing(termination: Termination, backends: &[(&str, u16)]) -> RouteRouting {
        RouteRouting {
            termination,
            host: Some("shop.example".into()),
            path: None,
            wildcard_subdomain: false,
            backends: backends
                .iter()
                .map(|(name, weight)| Backend {
                    kind: "Service".into(),
                    name: (*name).into(),
                    weight: *weight,
                })
                .collect(),
            target_port: None,
            insecure_policy: InsecurePolicy::None,
            ca_certificate: None,
            destination_ca_certificate: None,
            annotations: BTreeMap::new(),
            request_headers: Vec::new(),
            response_headers: Vec::new(),
        }
    }

    pub(crate) fn served(name: &str, routing: RouteRouting) -> ServedRoute {
        ServedRoute {
            key: RouteKey::new("shop", name),
            routing: Arc::new(routing),
            wildcard: false,
            has_certificate: true,
        }
    }

    pub(crate) fn endpoints(table: &mut EndpointTable, service: &str, ips: &[&str]) {
        let endpoints: Vec<serde_json::Value> =
            ips.iter().map(|ip| json!({"addresses": [ip]})).collect();
        table.apply(
            &serde_json::from_value(json!({
                "metadata": {"name": format!("{service}-1"), "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}],
                "endpoints": endpoints,
            }))
            .unwrap(),
        );
    }

    fn weights(plan: &BackendPlan) -> Vec<(String, u16)> {
        plan.servers
            .iter()
            .map(|s| (s.ip.clone(), s.weight))
            .collect()
    }

    #[test]
    fn one_active_service_gives_every_endpoint_weight_one() {
        let mut table = EndpointTable::new();
        endpoints(&mut table, "web", &["10.0.0.1", "10.0.0.2"]);
        let route = served("r", routing(Termination::Edge, &[("web", 100)]));
        let plan = RoutingTable::plan(&route, &table).unwrap();
        assert_eq!(plan.name, "be_edge_http:shop:r");
        assert_eq!(
            weights(&plan),
            [("10.0.0.1".into(), 1), ("10.0.0.2".into(), 1)]
        );
        assert_eq!(plan.active_endpoints, 2);
        assert_eq!(plan.active_services, 1);
        assert_eq!(plan.servers[0].service_host, "web.shop.svc");
        assert_eq!(plan.servers[0].id, "ept:web:http:10.0.0.1:8080");
    }

    #[test]
    fn several_services_scale_to_256_per_endpoint_share() {
        // The router's own example: A weight 20 over 2 endpoints, B weight 10 over 4:
        // 256 and 64.
        let mut table = EndpointTable::new();
        endpoints(&mut table, "a", &["10.0.0.1", "10.0.0.2"]);
        endpoints(
            &mut table,
            "b",
            &["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.4"],
        );
        let route = served("r", routing(Termination::Http, &[("b", 10), ("a", 20)]));
        let plan = RoutingTable::plan(&route, &table).unwrap();
        let w: Vec<u16> = plan.servers.iter().map(|s| s.weight).collect();
        assert_eq!(w, [256, 256, 64, 64, 64, 64], "services in name order");
        assert_eq!(plan.active_endpoints, 6);
        // A tiny share is never rounded down to 0.
        assert_eq!(service_weights(&[(256, 1), (1, 300)]), [Some(256), Some(1)]);
        // No endpoints: no weight at all for that service.
        assert_eq!(service_weights(&[(5, 0), (1, 2)]), [None, Some(1)]);
        // Nothing active: zeros.
        assert_eq!(service_weights(&[(0, 2), (0, 1)]), [Some(0), Some(0)]);
    }

    #[test]
    fn weight_zero_services_stay_for_http_and_go_for_passthrough() {
        let mut table = EndpointTable::new();
        endpoints(&mut table, "a", &["10.0.0.1"]);
        endpoints(&mut table, "b", &["10.0.1.1"]);
        let http = served("r", routing(Termination::Reencrypt, &[("a", 1), ("b", 0)]));
        let plan = RoutingTable::plan(&http, &table).unwrap();
        assert_eq!(
            weights(&plan),
            [("10.0.0.1".into(), 1), ("10.0.1.1".into(), 0)]
        );
        assert_eq!(plan.active_endpoints, 1);
        let tcp = served(
            "t",
            routing(Termination::Passthrough, &[("a", 1), ("b", 0)]),
        );
        let plan = RoutingTable::plan(&tcp, &table).unwrap();
        assert_eq!(plan.name, "be_tcp:shop:t");
        assert_eq!(weights(&plan), [("10.0.0.1".into(), 1)]);
        assert!(
            RoutingTable::plan(
                &served("o", routing(Termination::Other("x".into()), &[("a", 1)])),
                &table
            )
            .is_none()
        );
    }

    #[test]
    fn the_target_port_picks_endpoints_by_name_or_number() {
        let mut table = EndpointTable::new();
        table.apply(
            &serde_json::from_value(json!({
                "metadata": {"name": "web-1", "namespace": "shop",
                             "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443, "appProtocol": "h2c"}],
                "endpoints": [{"addresses": ["10.0.0.1"]}],
            }))
            .unwrap(),
        );
        let mut by_name = routing(Termination::Http, &[("web", 1)]);
        let all = RoutingTable::plan(&served("r", by_name.clone()), &table).unwrap();
        assert_eq!(all.servers.len(), 2, "no target port: every port");
        by_name.target_port = Some("https".into());
        let plan = RoutingTable::plan(&served("r", by_name.clone()), &table).unwrap();
        assert_eq!(plan.servers.len(), 1);
        assert_eq!(plan.servers[0].port, 8443);
        assert!(plan.servers[0].h2c);
        by_name.target_port = Some("8080".into());
        let plan = RoutingTable::plan(&served("r", by_name.clone()), &table).unwrap();
        assert_eq!(plan.servers[0].port, 8080);
        by_name.target_port = Some("80".into());
        let plan = RoutingTable::plan(&served("r", by_name), &table).unwrap();
        assert!(
            plan.servers.is_empty(),
            "the service port is not the target port"
        );
    }

    #[test]
    fn the_table_knows_which_routes_a_service_feeds() {
        let mut table = RoutingTable::new();
        assert!(table.upsert(served(
            "r",
            routing(Termination::Edge, &[("a", 1), ("b", 1)])
        )));
        assert!(!table.upsert(served(
            "r",
            routing(Termination::Edge, &[("a", 1), ("b", 1)])
        )));
        assert!(table.upsert(served("s", routing(Termination::Edge, &[("b", 1)]))));
        let names = |table: &RoutingTable, service: &str| -> Vec<String> {
            table
                .routes_of(&(Arc::from("shop"), Arc::from(service)))
                .map(|r| r.key.name.to_string())
                .collect()
        };
        assert_eq!(names(&table, "a"), ["r"]);
        assert_eq!(names(&table, "b"), ["r", "s"]);
        assert!(table.upsert(served("r", routing(Termination::Edge, &[("b", 1)]))));
        assert!(names(&table, "a").is_empty());
        assert!(table.remove(&RouteKey::new("shop", "s")));
        assert_eq!(names(&table, "b"), ["r"]);
        assert_eq!(table.len(), 1);
    }

    proptest::proptest! {
        /// Routes put, moved between services and removed at random: each service
        /// feeds exactly the routes whose backends name it, in key order, and a
        /// service no route names is forgotten.
        #[test]
        fn which_routes_a_service_feeds_follows_random_changes(
            steps in proptest::collection::vec((0..6usize, proptest::option::of(0..4u8), 0..4u8), 1..80)
        ) {
            const SERVICES: [&str; 4] = ["a", "b", "c", "d"];
            let mut table = RoutingTable::new();
            let mut expected: BTreeMap<String, Vec<&str>> = BTreeMap::new();
            for (route, first, second) in steps {
                let name = ["r0", "r1", "r2", "r3", "r4", "r5"][route];
                match first {
                    None => {
                        table.remove(&RouteKey::new("shop", name));
                        expected.remove(name);
                    }
                    Some(first) => {
                        let mut services = vec![SERVICES[usize::from(first)]];
                        if second != first {
                            services.push(SERVICES[usize::from(second)]);
                        }
                        let backends: Vec<_> = services.iter().map(|s| (*s, 1)).collect();
                        table.upsert(served(name, routing(Termination::Edge, &backends)));
                        expected.insert(name.to_owned(), services);
                    }
                }
                for service in SERVICES {
                    let fed: Vec<String> = table
                        .routes_of(&(Arc::from("shop"), Arc::from(service)))
                        .map(|r| r.key.name.to_string())
                        .collect();
                    let wanted: Vec<String> = expected
                        .iter()
                        .filter(|(_, services)| services.contains(&service))
                        .map(|(name, _)| name.clone())
                        .collect();
                    proptest::prop_assert_eq!(fed, wanted, "service {}", service);
                }
                let named: BTreeSet<&str> = expected.values().flatten().copied().collect();
                proptest::prop_assert_eq!(table.by_service.len(), named.len());
            }
        }
    }
}
