//! Services' endpoints from their EndpointSlices, as the OpenShift router builds them
//! (`pkg/router/controller/endpointsubset` and `createRouterEndpoints` in
//! `pkg/router/template/plugin.go`):
//!
//! - a slice belongs to the service its `kubernetes.io/service-name` label names; a
//!   slice without it is ignored;
//! - a service's slices are taken in name order; within a slice, ready addresses only
//!   (a `ready` condition that is absent counts as ready), sorted by address, and ports
//!   sorted by number, protocol and name; `FQDN` slices and UDP ports are skipped;
//! - one endpoint per (port, address), in that order, named as the router names it
//!   (`pod:<pod>:<service>:<port name>:<ip>:<port>` when the address points at a pod,
//!   `ept:<service>:<port name>:<ip>:<port>` otherwise); an endpoint seen twice is kept
//!   once.
//!
//! An idled service (annotated `idling.alpha.openshift.io/idled-at`, non-empty) whose
//! slices hold no ready address is served as the router serves it
//! (`createRouterEndpoints`): one endpoint per service port (in the Service's order,
//! UDP skipped) at its cluster IP, `ept:<service>:<port name>:<cluster ip>:<port>`,
//! never health-checked (a check would unidle it); a headless one has none. The
//! cluster IP's proxy wakes the service on the first request. The router looks the
//! Service up when its endpoints change; certwatch also when the Service changes.
//!
//! Pure: [`EndpointTable`] is fed slices and Services and says which services changed.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The annotation marking a Service idled (its value the time it was idled).
pub const IDLED_AT_ANNOTATION: &str = "idling.alpha.openshift.io/idled-at";

/// The label naming an EndpointSlice's service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A service: (namespace, name).
pub type ServiceKey = (Arc<str>, Arc<str>);

/// One endpoint of a service: an address and a port, as a server line takes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The router's identifier (see the module documentation).
    pub id: String,
    /// The address (an IPv6 address in brackets).
    pub ip: String,
    /// The port number.
    pub port: u16,
    /// The port's name (the service port's name; may be empty).
    pub port_name: String,
    /// The port's `appProtocol` (`h2c` sends HTTP/2 to the backend).
    pub app_protocol: Option<String>,
    /// Whether HAProxy may health-check it: not an idled service's cluster IP.
    pub health_check: bool,
}

impl Endpoint {
    /// Whether the endpoint's port matches a route's target port: by name or number,
    /// compared as text, as the router does.
    pub fn matches_port(&self, target: &str) -> bool {
        self.port_name == target || self.port.to_string() == target
    }
}

/// What is kept of one EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Slice {
    service: Arc<str>,
    endpoints: Vec<Endpoint>,
}

/// Every service's endpoints, kept from the EndpointSlices seen.
#[derive(Debug, Default)]
pub struct EndpointTable {
    /// (namespace, slice name) → the slice.
    slices: HashMap<(Arc<str>, Arc<str>), Slice>,
    /// Service → its slices' names, in name order.
    by_service: HashMap<ServiceKey, BTreeMap<Arc<str>, ()>>,
    /// Service → its endpoints, aggregated.
    endpoints: HashMap<ServiceKey, Arc<[Endpoint]>>,
    /// Idled services → the endpoints they get while no slice has a ready address.
    idled: HashMap<ServiceKey, Arc<[Endpoint]>>,
}

/// What an idled service is served at: its cluster IP, one endpoint per TCP (or SCTP)
/// port; `None` when `service` is not idled; empty when it has no cluster IP.
fn idled_endpoints(service: &Service) -> Option<Vec<Endpoint>> {
    let idled = service
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(IDLED_AT_ANNOTATION))
        .is_some_and(|value| !value.is_empty());
    if !idled {
        return None;
    }
    let name = service.metadata.name.as_deref().unwrap_or("");
    let spec = service.spec.as_ref();
    let cluster_ip = spec
        .and_then(|spec| spec.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None");
    let Some(cluster_ip) = cluster_ip else {
        return Some(Vec::new());
    };
    let mut out: Vec<Endpoint> = Vec::new();
    for port in spec
        .and_then(|spec| spec.ports.as_ref())
        .into_iter()
        .flatten()
    {
        if port.protocol.as_deref() == Some("UDP") {
            continue;
        }
        let Ok(number) = u16::try_from(port.port) else {
            continue;
        };
        let port_name = port.name.as_deref().unwrap_or("");
        let id = format!("ept:{name}:{port_name}:{cluster_ip}:{number}");
        if out.iter().any(|known| known.id == id) {
            continue;
        }
        out.push(Endpoint {
            id,
            ip: format_ip(cluster_ip),
            port: number,
            port_name: port_name.to_owned(),
            app_protocol: port.app_protocol.clone(),
            health_check: false,
        });
    }
    Some(out)
}

fn format_ip(address: &str) -> String {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V6(_)) => format!("[{address}]"),
        _ => address.to_owned(),
    }
}

/// The endpoints one slice contributes to `service`, in the router's order.
fn slice_endpoints(slice: &EndpointSlice, service: &str) -> Vec<Endpoint> {
    if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
        return Vec::new();
    }
    let mut addresses: Vec<(&str, Option<&str>, &str)> = Vec::new();
    for endpoint in slice.endpoints.iter().flatten() {
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|conditions| conditions.ready)
            .unwrap_or(true);
        if !ready {
            continue;
        }
        let pod = endpoint
            .target_ref
            .as_ref()
            .filter(|target| target.kind.as_deref() == Some("Pod"))
            .and_then(|target| target.name.as_deref());
        let hostname = endpoint.hostname.as_deref().unwrap_or("");
        for address in &endpoint.addresses {
            addresses.push((address.as_str(), pod, hostname));
        }
    }
    addresses.sort_by(|a, b| a.0.cmp(b.0).then(a.2.cmp(b.2)));
    let mut ports: Vec<(i32, &str, &str, Option<&str>)> = slice
        .ports
        .iter()
        .flatten()
        .map(|port| {
            (
                port.port.unwrap_or(0),
                port.protocol.as_deref().unwrap_or("TCP"),
                port.name.as_deref().unwrap_or(""),
                port.app_protocol.as_deref(),
            )
        })
        .collect();
    ports.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(b.1)).then(a.2.cmp(b.2)));
    let mut out = Vec::new();
    for (number, protocol, name, app_protocol) in ports {
        if protocol == "UDP" {
            continue;
        }
        let Ok(port) = u16::try_from(number) else {
            continue;
        };
        if port == 0 {
            continue;
        }
        for &(address, pod, _) in &addresses {
            let id = match pod {
                Some(pod) => format!("pod:{pod}:{service}:{name}:{address}:{port}"),
                None => format!("ept:{service}:{name}:{address}:{port}"),
            };
            out.push(Endpoint {
                id,
                ip: format_ip(address),
                port,
                port_name: name.to_owned(),
                app_protocol: app_protocol.map(str::to_owned),
                health_check: true,
            });
        }
    }
    out
}

impl EndpointTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The endpoints of `service` (none when it has no slices).
    pub fn endpoints(&self, namespace: &str, service: &str) -> Arc<[Endpoint]> {
        let key: ServiceKey = (Arc::from(namespace), Arc::from(service));
        self.endpoints
            .get(&key)
            .cloned()
            .unwrap_or_else(|| Arc::from(Vec::new()))
    }

    /// Services with endpoints known.
    pub fn services(&self) -> usize {
        self.endpoints.len()
    }

    /// A Service was added or changed; returns it when its endpoints changed (it is
    /// idled, or no longer, and its slices have no ready address).
    pub fn apply_service(&mut self, service: &Service) -> Vec<ServiceKey> {
        let (Some(namespace), Some(name)) = (
            service.metadata.namespace.as_deref(),
            service.metadata.name.as_deref(),
        ) else {
            return Vec::new();
        };
        let key: ServiceKey = (Arc::from(namespace), Arc::from(name));
        let new = idled_endpoints(service).map(Arc::from);
        if self.idled.get(&key) == new.as_ref() {
            return Vec::new();
        }
        match new {
            Some(endpoints) => self.idled.insert(key.clone(), endpoints),
            None => self.idled.remove(&key),
        };
        if self.rebuild(&key) {
            vec![key]
        } else {
            Vec::new()
        }
    }

    /// A Service was deleted; returns it when its endpoints changed.
    pub fn remove_service(&mut self, namespace: &str, name: &str) -> Vec<ServiceKey> {
        let key: ServiceKey = (Arc::from(namespace), Arc::from(name));
        if self.idled.remove(&key).is_none() {
            return Vec::new();
        }
        if self.rebuild(&key) {
            vec![key]
        } else {
            Vec::new()
        }
    }

    /// Replaces every Service (a re-list); returns the services whose endpoints
    /// changed.
    pub fn replace_services<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a Service>,
    ) -> Vec<ServiceKey> {
        let before = std::mem::take(&mut self.idled);
        for service in services {
            let (Some(namespace), Some(name)) = (
                service.metadata.namespace.as_deref(),
                service.metadata.name.as_deref(),
            ) else {
                continue;
            };
            if let Some(endpoints) = idled_endpoints(service) {
                self.idled.insert(
                    (Arc::from(namespace), Arc::from(name)),
                    Arc::from(endpoints),
                );
            }
        }
        let touched: Vec<ServiceKey> = before
            .iter()
            .filter(|(key, endpoints)| self.idled.get(*key) != Some(*endpoints))
            .map(|(key, _)| key.clone())
            .chain(
                self.idled
                    .keys()
                    .filter(|key| !before.contains_key(*key))
                    .cloned(),
            )
            .collect();
        touched
            .into_iter()
            .filter(|key| self.rebuild(key))
            .collect()
    }

    /// A slice was added or changed; returns the services whose endpoints changed.
    pub fn apply(&mut self, slice: &EndpointSlice) -> Vec<ServiceKey> {
        let (Some(namespace), Some(name)) = (
            slice.metadata.namespace.as_deref(),
            slice.metadata.name.as_deref(),
        ) else {
            return Vec::new();
        };
        let service = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
            .filter(|service| !service.is_empty());
        let slice_key: (Arc<str>, Arc<str>) = (Arc::from(namespace), Arc::from(name));
        let Some(service) = service else {
            // No (longer a) service's: like a deletion.
            return self.remove_key(&slice_key);
        };
        let new = Slice {
            service: Arc::from(service.as_str()),
            endpoints: slice_endpoints(slice, service),
        };
        let mut changed = Vec::new();
        match self.slices.get(&slice_key) {
            Some(old) if *old == new => return changed,
            Some(old) if old.service != new.service => {
                changed.extend(self.remove_key(&slice_key));
            }
            _ => {}
        }
        let service_key: ServiceKey = (Arc::clone(&slice_key.0), Arc::clone(&new.service));
        self.by_service
            .entry(service_key.clone())
            .or_default()
            .insert(Arc::clone(&slice_key.1), ());
        self.slices.insert(slice_key, new);
        if self.rebuild(&service_key) {
            changed.push(service_key);
        }
        changed
    }

    /// A slice was deleted; returns the services whose endpoints changed.
    pub fn remove(&mut self, namespace: &str, name: &str) -> Vec<ServiceKey> {
        self.remove_key(&(Arc::from(namespace), Arc::from(name)))
    }

    /// Replaces every slice (a re-list); returns the services whose endpoints changed.
    pub fn replace_all<'a>(
        &mut self,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Vec<ServiceKey> {
        let before = std::mem::take(&mut self.endpoints);
        self.slices.clear();
        self.by_service.clear();
        for slice in slices {
            self.apply(slice);
        }
        let mut changed: Vec<ServiceKey> = before
            .iter()
            .filter(|(key, endpoints)| self.endpoints.get(*key) != Some(*endpoints))
            .map(|(key, _)| key.clone())
            .collect();
        changed.extend(
            self.endpoints
                .keys()
                .filter(|key| !before.contains_key(*key))
                .cloned(),
        );
        changed
    }

    fn remove_key(&mut self, slice_key: &(Arc<str>, Arc<str>)) -> Vec<ServiceKey> {
        let Some(old) = self.slices.remove(slice_key) else {
            return Vec::new();
        };
        let service_key: ServiceKey = (Arc::clone(&slice_key.0), old.service);
        if let Some(names) = self.by_service.get_mut(&service_key) {
            names.remove(&slice_key.1);
            if names.is_empty() {
                self.by_service.remove(&service_key);
            }
        }
        if self.rebuild(&service_key) {
            vec![service_key]
        } else {
            Vec::new()
        }
    }

    /// Recomputes one service's endpoints; says whether they changed.
    fn rebuild(&mut self, service: &ServiceKey) -> bool {
        let mut endpoints: Vec<Endpoint> = Vec::new();
        if let Some(names) = self.by_service.get(service) {
            for name in names.keys() {
                let Some(slice) = self.slices.get(&(Arc::clone(&service.0), Arc::clone(name)))
                else {
                    continue;
                };
                for endpoint in &slice.endpoints {
                    if !endpoints.iter().any(|known| known.id == endpoint.id) {
                        endpoints.push(endpoint.clone());
                    }
                }
            }
        }
        // An idled service whose slices have no ready address: its cluster IP.
        if endpoints.is_empty()
            && self.by_service.contains_key(service)
            && let Some(idled) = self.idled.get(service)
        {
            endpoints = idled.to_vec();
        }
        let old = self.endpoints.get(service);
        if old.map(|old| &old[..]) == Some(&endpoints[..])
            || (old.is_none() && endpoints.is_empty())
        {
            return false;
        }
        if endpoints.is_empty() && !self.by_service.contains_key(service) {
            self.endpoints.remove(service);
        } else {
            self.endpoints.insert(service.clone(), Arc::from(endpoints));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn slice(value: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(value).unwrap()
    }

    fn web(name: &str, endpoints: serde_json::Value) -> EndpointSlice {
        slice(json!({
            "metadata": {"name": name, "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": 8443}, {"name": "http", "port": 8080},
                      {"name": "dns", "port": 53, "protocol": "UDP"}],
            "endpoints": endpoints,
        }))
    }

    fn ids(table: &EndpointTable) -> Vec<String> {
        table
            .endpoints("shop", "web")
            .iter()
            .map(|e| e.id.clone())
            .collect()
    }

    #[test]
    fn ready_addresses_times_ports_in_the_routers_order() {
        let mut table = EndpointTable::new();
        let changed = table.apply(&web(
            "web-b",
            json!([
                {"addresses": ["10.0.0.9"], "conditions": {"ready": true},
                 "targetRef": {"kind": "Pod", "name": "web-9"}},
                {"addresses": ["10.0.0.3"]},
                {"addresses": ["10.0.0.5"], "conditions": {"ready": false}},
            ]),
        ));
        assert_eq!(changed.len(), 1);
        assert_eq!(
            ids(&table),
            [
                "ept:web:http:10.0.0.3:8080",
                "pod:web-9:web:http:10.0.0.9:8080",
                "ept:web:https:10.0.0.3:8443",
                "pod:web-9:web:https:10.0.0.9:8443",
            ]
        );
        let first = &table.endpoints("shop", "web")[0];
        assert!(first.matches_port("http") && first.matches_port("8080"));
        assert!(!first.matches_port("https") && !first.matches_port("80"));
        // A second slice comes after the first by name; the same endpoint once.
        table.apply(&web(
            "web-a",
            json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.3"]}]),
        ));
        assert_eq!(
            ids(&table)[..2],
            ["ept:web:http:10.0.0.1:8080", "ept:web:http:10.0.0.3:8080"]
        );
        assert_eq!(ids(&table).len(), 6);
        // The same slice again changes nothing.
        assert!(
            table
                .apply(&web(
                    "web-a",
                    json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.3"]}])
                ))
                .is_empty()
        );
        // Deleting slices empties the service.
        assert_eq!(table.remove("shop", "web-a").len(), 1);
        assert_eq!(table.remove("shop", "web-b").len(), 1);
        assert!(table.endpoints("shop", "web").is_empty());
        assert_eq!(table.services(), 0);
    }

    #[test]
    fn slices_without_a_service_or_addresses_of_another_kind_give_nothing() {
        let mut table = EndpointTable::new();
        let orphan = slice(json!({"metadata": {"name": "x", "namespace": "shop"},
            "addressType": "IPv4", "ports": [{"port": 80}], "endpoints": [{"addresses": ["10.0.0.1"]}]}));
        assert!(table.apply(&orphan).is_empty());
        let fqdn = slice(
            json!({"metadata": {"name": "f", "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "FQDN", "ports": [{"port": 80}], "endpoints": [{"addresses": ["a.example"]}]}),
        );
        assert!(table.apply(&fqdn).is_empty());
        let v6 = slice(
            json!({"metadata": {"name": "v6", "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv6", "ports": [{"port": 80}], "endpoints": [{"addresses": ["2001:db8::1"]}]}),
        );
        table.apply(&v6);
        let endpoint = &table.endpoints("shop", "web")[0];
        assert_eq!(endpoint.ip, "[2001:db8::1]");
        assert_eq!(endpoint.id, "ept:web::2001:db8::1:80");
    }

    #[test]
    fn a_relist_reports_what_changed() {
        let mut table = EndpointTable::new();
        let a = web("web-a", json!([{"addresses": ["10.0.0.1"]}]));
        table.apply(&a);
        let other = slice(
            json!({"metadata": {"name": "db-a", "namespace": "shop", "labels": {SERVICE_NAME_LABEL: "db"}},
            "addressType": "IPv4", "ports": [{"port": 5432}], "endpoints": [{"addresses": ["10.0.1.1"]}]}),
        );
        let changed = table.replace_all([&a, &other]);
        assert_eq!(changed, [(Arc::from("shop"), Arc::from("db"))]);
        let changed = table.replace_all([&other]);
        assert_eq!(changed, [(Arc::from("shop"), Arc::from("web"))]);
    }

    fn service(annotations: serde_json::Value, cluster_ip: &str) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
            "spec": {"clusterIP": cluster_ip, "ports": [
                {"name": "https", "port": 443, "protocol": "TCP", "appProtocol": "h2c"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "http", "port": 80, "protocol": "TCP"},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn an_idled_service_without_ready_addresses_is_served_at_its_cluster_ip() {
        let idled = json!({IDLED_AT_ANNOTATION: "2026-12-06T05:00:00Z"});
        let mut table = EndpointTable::new();
        // Idled, but no slice seen: nothing (the router hears of no endpoints).
        assert!(
            table
                .apply_service(&service(idled.clone(), "10.96.0.7"))
                .is_empty()
        );
        assert!(table.endpoints("shop", "web").is_empty());
        // An empty slice: the cluster IP, every TCP port in the Service's order,
        // without health checks.
        let changed = table.apply(&web("web-a", json!([])));
        assert_eq!(changed.len(), 1);
        assert_eq!(
            ids(&table),
            ["ept:web:https:10.96.0.7:443", "ept:web:http:10.96.0.7:80"]
        );
        let endpoints = table.endpoints("shop", "web");
        assert!(
            endpoints
                .iter()
                .all(|e| !e.health_check && e.ip == "10.96.0.7")
        );
        assert_eq!(endpoints[0].app_protocol.as_deref(), Some("h2c"));
        // A ready address: the slices' endpoints, checked as ever.
        table.apply(&web("web-a", json!([{"addresses": ["10.0.0.1"]}])));
        assert_eq!(ids(&table)[0], "ept:web:http:10.0.0.1:8080");
        assert!(
            table
                .endpoints("shop", "web")
                .iter()
                .all(|e| e.health_check)
        );
        // Not ready again, then the annotation removed, then set empty: nothing.
        table.apply(&web(
            "web-a",
            json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false}}]),
        ));
        assert_eq!(ids(&table).len(), 2);
        assert_eq!(
            table.apply_service(&service(json!({}), "10.96.0.7")).len(),
            1
        );
        assert!(table.endpoints("shop", "web").is_empty());
        assert!(
            table
                .apply_service(&service(json!({IDLED_AT_ANNOTATION: ""}), "10.96.0.7"))
                .is_empty()
        );
        // A headless idled service: nothing to send its traffic to.
        assert!(
            table
                .apply_service(&service(idled.clone(), "None"))
                .is_empty()
        );
        assert!(table.endpoints("shop", "web").is_empty());
        // A re-list with it idled again, then the Service deleted.
        let changed = table.replace_services([&service(idled, "10.96.0.8")]);
        assert_eq!(changed, [(Arc::from("shop"), Arc::from("web"))]);
        assert_eq!(ids(&table)[1], "ept:web:http:10.96.0.8:80");
        assert_eq!(table.remove_service("shop", "web").len(), 1);
        assert!(table.endpoints("shop", "web").is_empty());
    }
}
