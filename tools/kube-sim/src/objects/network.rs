//! Services (`v1`) and EndpointSlices (`discovery.k8s.io/v1`): defaulting, address
//! allocation and validation as kube-apiserver v1.36 applies them, with its messages.
//!
//! What a router reads of them is modelled closely (ports, target ports, addresses and
//! their conditions); the rest of each kind is stored as given. Checked against the
//! real server by `tests/conformance.rs`.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use serde_json::{Map, Value, json};

use crate::error::FieldError;

/// The service network clusterIPs are allocated from (the shared control plane's
/// `--service-cluster-ip-range`).
pub const SERVICE_NETWORK: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 16);

/// The node port range (kube-apiserver's default `--service-node-port-range`).
pub const NODE_PORTS: std::ops::RangeInclusive<i64> = 30000..=32767;

const SERVICE_TYPES: &str =
    r#"supported values: "ClusterIP", "ExternalName", "LoadBalancer", "NodePort""#;
const PROTOCOLS: &str = r#"supported values: "SCTP", "TCP", "UDP""#;
const ADDRESS_TYPES: &str = r#"supported values: "FQDN", "IPv4", "IPv6""#;

fn is_protocol(text: &str) -> bool {
    matches!(text, "TCP" | "UDP" | "SCTP")
}

/// A Service's server-side defaults (those that need no allocation): `type`
/// `ClusterIP`, `sessionAffinity` `None`, each port's `protocol` `TCP` and `targetPort`
/// its `port`, `internalTrafficPolicy` `Cluster`, `externalTrafficPolicy` `Cluster` for
/// node ports, and an empty `status.loadBalancer`.
pub fn default_service(map: &mut Map<String, Value>) {
    let spec = map.entry("spec").or_insert_with(|| json!({}));
    if let Some(spec) = spec.as_object_mut() {
        let kind = match spec.get("type").and_then(Value::as_str) {
            None | Some("") => {
                spec.insert("type".into(), json!("ClusterIP"));
                "ClusterIP".to_owned()
            }
            Some(kind) => kind.to_owned(),
        };
        spec.entry("sessionAffinity")
            .or_insert_with(|| json!("None"));
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for port in ports.iter_mut().filter_map(Value::as_object_mut) {
                port.entry("protocol").or_insert_with(|| json!("TCP"));
                let unset = match port.get("targetPort") {
                    None | Some(Value::Null) => true,
                    Some(Value::Number(n)) => n.as_i64() == Some(0),
                    Some(Value::String(s)) => s.is_empty(),
                    Some(_) => false,
                };
                if unset && let Some(number) = port.get("port").cloned() {
                    port.insert("targetPort".into(), number);
                }
            }
        }
        if kind != "ExternalName" {
            spec.entry("internalTrafficPolicy")
                .or_insert_with(|| json!("Cluster"));
        }
        if matches!(kind.as_str(), "NodePort" | "LoadBalancer") {
            spec.entry("externalTrafficPolicy")
                .or_insert_with(|| json!("Cluster"));
        }
        if kind == "LoadBalancer" {
            spec.entry("allocateLoadBalancerNodePorts")
                .or_insert_with(|| json!(true));
        }
    }
    let status = map.entry("status").or_insert_with(|| json!({}));
    if let Some(status) = status.as_object_mut() {
        status.entry("loadBalancer").or_insert_with(|| json!({}));
    }
}

/// Allocates a new Service's cluster IP (unless it is headless or an `ExternalName`)
/// and node ports, avoiding those `existing` services hold. A cluster IP the client
/// chose is kept; the IP family fields follow the address. `existing` is read only
/// when something is allocated: a service with its address chosen and no node ports
/// costs nothing per existing service (a generated cluster creates one per route).
pub fn allocate_service<'a>(obj: &mut Value, existing: impl Iterator<Item = &'a Value>) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
        .to_owned();
    if kind == "ExternalName" {
        return;
    }
    let chosen = spec
        .get("clusterIP")
        .and_then(Value::as_str)
        .filter(|ip| !ip.is_empty())
        .map(str::to_owned);
    let wants_node_ports = kind == "NodePort"
        || (kind == "LoadBalancer"
            && spec
                .get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false));
    let mut ips = BTreeSet::new();
    let mut node_ports = BTreeSet::new();
    if chosen.is_none() || wants_node_ports {
        for service in existing {
            if let Some(ip) = service
                .pointer("/spec/clusterIP")
                .and_then(Value::as_str)
                .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
            {
                ips.insert(ip);
            }
            for port in service
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(n) = port.get("nodePort").and_then(Value::as_i64) {
                    node_ports.insert(n);
                }
            }
        }
    }
    let ip = match chosen {
        Some(ip) => ip,
        None => {
            let (base, prefix) = SERVICE_NETWORK;
            let size = 1u32 << (32 - u32::from(prefix));
            let base = u32::from(base);
            // Like kube-apiserver, a random free address (the first one is the
            // `kubernetes` service's).
            let start = 2 + rand::random::<u32>() % (size - 3);
            let free = (0..size - 3)
                .map(|i| Ipv4Addr::from(base + 2 + (start - 2 + i) % (size - 3)))
                .find(|ip| !ips.contains(ip));
            match free {
                Some(ip) => ip.to_string(),
                None => return,
            }
        }
    };
    // A headless service without a selector serves whatever addresses its
    // EndpointSlices name: the server makes it dual-stack.
    let headless_without_selector = ip == "None" && spec.get("selector").is_none_or(Value::is_null);
    if headless_without_selector {
        spec.entry("ipFamilyPolicy")
            .or_insert_with(|| json!("RequireDualStack"));
        spec.insert("ipFamilies".into(), json!(["IPv4", "IPv6"]));
    } else {
        spec.entry("ipFamilyPolicy")
            .or_insert_with(|| json!("SingleStack"));
        spec.insert("ipFamilies".into(), json!(["IPv4"]));
    }
    spec.insert("clusterIPs".into(), json!([ip]));
    spec.insert("clusterIP".into(), json!(ip));
    if !wants_node_ports {
        return;
    }
    let mut next = NODE_PORTS
        .clone()
        .filter(|port| !node_ports.contains(port))
        .collect::<Vec<_>>()
        .into_iter();
    for port in spec
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        let has = port
            .get("nodePort")
            .and_then(Value::as_i64)
            .is_some_and(|n| n != 0);
        if !has && let Some(n) = next.next() {
            port.insert("nodePort".into(), json!(n));
        }
    }
}

/// On update, what the server allocated stays when the new object leaves it out (as
/// kube-apiserver's service storage patches allocated values from the old object).
pub fn keep_allocated(old: &Value, new: &mut Value) {
    let Some(spec) = new.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
        let unset = match spec.get(field) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Array(a)) => a.is_empty(),
            Some(_) => false,
        };
        if unset && let Some(value) = old.pointer(&format!("/spec/{field}")) {
            spec.insert(field.into(), value.clone());
        }
    }
    let old_ports: Vec<&Value> = old
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|p| p.iter().collect())
        .unwrap_or_default();
    for port in spec
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        if port
            .get("nodePort")
            .and_then(Value::as_i64)
            .is_some_and(|n| n != 0)
        {
            continue;
        }
        let same = old_ports.iter().find(|old| {
            old.get("port") == port.get("port") && old.get("protocol") == port.get("protocol")
        });
        if let Some(n) = same.and_then(|old| old.get("nodePort")) {
            port.insert("nodePort".into(), n.clone());
        }
    }
}

/// An IANA service name as a target port (`IsValidPortName`): each problem found.
fn port_name_problems(name: &str) -> Vec<&'static str> {
    let mut problems = Vec::new();
    if name.len() > 15 {
        problems.push("must be no more than 15 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        problems.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)");
    }
    if !name.bytes().any(|b| b.is_ascii_lowercase()) {
        problems.push("must contain at least one letter (a-z)");
    }
    if name.contains("--") {
        problems.push("must not contain consecutive hyphens");
    }
    if name.starts_with('-') || name.ends_with('-') {
        problems.push("must not begin or end with a hyphen");
    }
    problems
}

fn label_problem(name: &str) -> Option<String> {
    kube_common::name::label(name).err().map(|e| e.to_string())
}

/// Validates a Service (after defaulting and allocation).
pub fn validate_service(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let spec = obj.get("spec").cloned().unwrap_or_else(|| json!({}));
    let kind = spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP");
    let headless = spec.get("clusterIP").and_then(Value::as_str) == Some("None");
    let ports = spec
        .get("ports")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if ports.is_empty() && kind != "ExternalName" && !headless {
        errs.push(FieldError::required("spec.ports", ""));
    }
    let mut names = BTreeSet::new();
    for (i, port) in ports.iter().enumerate() {
        let at = |field: &str| format!("spec.ports[{i}].{field}");
        match port.get("name").and_then(Value::as_str).unwrap_or("") {
            "" if ports.len() > 1 => errs.push(FieldError::required(at("name"), "")),
            "" => {}
            name => {
                if let Some(problem) = label_problem(name) {
                    errs.push(FieldError::invalid(at("name"), name, problem));
                }
                if !names.insert(name.to_owned()) {
                    errs.push(FieldError::duplicate(at("name"), name));
                }
            }
        }
        let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
        if !(1..=65535).contains(&number) {
            errs.push(FieldError::invalid_number(
                at("port"),
                number,
                "must be between 1 and 65535, inclusive",
            ));
        }
        let protocol = port.get("protocol").and_then(Value::as_str).unwrap_or("");
        if !is_protocol(protocol) {
            errs.push(FieldError::not_supported(
                at("protocol"),
                Some(protocol.to_owned()),
                PROTOCOLS,
            ));
        }
        match port.get("targetPort") {
            Some(Value::Number(n)) => {
                let n = n.as_i64().unwrap_or(0);
                if !(1..=65535).contains(&n) {
                    errs.push(FieldError::invalid_number(
                        at("targetPort"),
                        n,
                        "must be between 1 and 65535, inclusive",
                    ));
                }
            }
            Some(Value::String(name)) => {
                for problem in port_name_problems(name) {
                    errs.push(FieldError::invalid(
                        at("targetPort"),
                        name.as_str(),
                        problem,
                    ));
                }
            }
            _ => {}
        }
    }
    if !matches!(
        kind,
        "ClusterIP" | "ExternalName" | "LoadBalancer" | "NodePort"
    ) {
        errs.push(FieldError::not_supported(
            "spec.type",
            Some(kind.to_owned()),
            SERVICE_TYPES,
        ));
    }
    if let Some(old) = old {
        let before = old.pointer("/spec/clusterIP").and_then(Value::as_str);
        let after = spec.get("clusterIP").and_then(Value::as_str);
        if before.is_some() && before != after && kind != "ExternalName" {
            errs.push(FieldError::invalid(
                "spec.clusterIPs[0]",
                after.unwrap_or(""),
                "may not change once set",
            ));
        }
    }
}

/// An EndpointSlice's server-side defaults: each port's `protocol` `TCP`, each
/// endpoint's `conditions` an empty object.
pub fn default_endpoint_slice(map: &mut Map<String, Value>) {
    for port in map
        .get_mut("ports")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        port.entry("protocol").or_insert_with(|| json!("TCP"));
    }
    for endpoint in map
        .get_mut("endpoints")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
    {
        endpoint.entry("conditions").or_insert_with(|| json!({}));
    }
}

/// Whether an update of an EndpointSlice bumps its `metadata.generation`: anything but
/// its metadata changed, or its labels did.
pub fn endpoint_slice_generation_changes(old: &Value, new: &Value) -> bool {
    let without_meta = |v: &Value| {
        let mut v = v.clone();
        if let Some(map) = v.as_object_mut() {
            map.remove("metadata");
            map.remove("apiVersion");
            map.remove("kind");
        }
        v
    };
    without_meta(old) != without_meta(new)
        || old.pointer("/metadata/labels") != new.pointer("/metadata/labels")
}

/// How an address fails kube-apiserver's checks, for an `IPv4` or `IPv6` slice:
/// `Err((at_list, message))` where `at_list` says the error is reported on the
/// `addresses` list rather than the entry (a family mismatch).
fn address_problems(address: &str, family: &str) -> Vec<(bool, String)> {
    let ip = match address.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => {
            let leading_zero = address.split('.').count() == 4
                && address.split('.').all(|part| {
                    !part.is_empty()
                        && part.len() <= 3
                        && part.bytes().all(|b| b.is_ascii_digit())
                        && part.parse::<u16>().is_ok_and(|n| n <= 255)
                });
            let message = if leading_zero {
                "must not have leading 0s"
            } else {
                "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
            };
            return vec![(false, message.to_owned())];
        }
    };
    let mut problems = Vec::new();
    match (family, ip) {
        ("IPv4", IpAddr::V6(_)) => problems.push((true, "must be an IPv4 address".to_owned())),
        ("IPv6", IpAddr::V4(_)) => problems.push((true, "must be an IPv6 address".to_owned())),
        _ => {}
    }
    if ip.is_unspecified() {
        problems.push((false, format!("may not be unspecified ({address})")));
    }
    if ip.is_loopback() {
        problems.push((
            false,
            "may not be in the loopback range (127.0.0.0/8, ::1/128)".to_owned(),
        ));
    }
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    };
    if link_local {
        problems.push((
            false,
            "may not be in the link-local range (169.254.0.0/16, fe80::/10)".to_owned(),
        ));
    }
    let link_local_multicast = match ip {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => (v6.segments()[0] & 0xff0f) == 0xff02,
    };
    if link_local_multicast {
        problems.push((
            false,
            "may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)".to_owned(),
        ));
    }
    problems
}

/// Validates an EndpointSlice.
pub fn validate_endpoint_slice(obj: &Value, errs: &mut Vec<FieldError>) {
    let family = obj.get("addressType").and_then(Value::as_str).unwrap_or("");
    match family {
        "" => errs.push(FieldError::required("addressType", "")),
        "IPv4" | "IPv6" | "FQDN" => {}
        other => errs.push(FieldError::not_supported(
            "addressType",
            Some(other.to_owned()),
            ADDRESS_TYPES,
        )),
    }
    let mut names = BTreeSet::new();
    for (i, port) in obj
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = port.get("name").and_then(Value::as_str).unwrap_or("");
        if !name.is_empty()
            && let Some(problem) = label_problem(name)
        {
            errs.push(FieldError::invalid(
                format!("ports[{i}].name"),
                name,
                problem,
            ));
        }
        if !names.insert(name.to_owned()) {
            errs.push(FieldError::duplicate(format!("ports[{i}].name"), name));
        }
        if let Some(protocol) = port.get("protocol").and_then(Value::as_str)
            && !is_protocol(protocol)
        {
            errs.push(FieldError::not_supported(
                format!("ports[{i}].protocol"),
                Some(protocol.to_owned()),
                PROTOCOLS,
            ));
        }
    }
    for (i, endpoint) in obj
        .get("endpoints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let addresses = endpoint
            .get("addresses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if addresses.is_empty() {
            errs.push(FieldError::required(
                format!("endpoints[{i}].addresses"),
                "must contain at least 1 address",
            ));
        }
        for (j, address) in addresses.iter().enumerate() {
            let address = address.as_str().unwrap_or("");
            if family == "FQDN" {
                if let Err(e) = kube_common::name::subdomain(address) {
                    errs.push(FieldError::invalid(
                        format!("endpoints[{i}].addresses[{j}]"),
                        address,
                        e.to_string(),
                    ));
                }
                continue;
            }
            if !matches!(family, "IPv4" | "IPv6") {
                continue;
            }
            for (at_list, problem) in address_problems(address, family) {
                let field = if at_list {
                    format!("endpoints[{i}].addresses")
                } else {
                    format!("endpoints[{i}].addresses[{j}]")
                };
                errs.push(FieldError::invalid(field, address, problem));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(errs: &[FieldError]) -> Vec<String> {
        errs.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_service_gets_the_servers_defaults_and_an_address() {
        let mut service = json!({
            "metadata": {"name": "web", "namespace": "demo"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "https", "port": 443}]}
        });
        default_service(service.as_object_mut().unwrap());
        allocate_service(&mut service, std::iter::empty());
        let spec = &service["spec"];
        assert_eq!(spec["type"], "ClusterIP");
        assert_eq!(spec["sessionAffinity"], "None");
        assert_eq!(spec["internalTrafficPolicy"], "Cluster");
        assert_eq!(spec["ports"][0]["targetPort"], 8080);
        assert_eq!(spec["ports"][1]["targetPort"], 443);
        assert_eq!(spec["ports"][1]["protocol"], "TCP");
        let ip: Ipv4Addr = spec["clusterIP"].as_str().unwrap().parse().unwrap();
        assert_eq!(ip.octets()[..2], [10, 96]);
        assert_eq!(spec["clusterIPs"], json!([ip.to_string()]));
        assert_eq!(spec["ipFamilyPolicy"], "SingleStack");
        assert_eq!(service["status"], json!({"loadBalancer": {}}));
        let mut errs = Vec::new();
        validate_service(&service, None, &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn node_ports_are_distinct() {
        let mut taken = json!({"spec": {"type": "NodePort", "clusterIP": "10.96.0.9", "ports": [{"port": 1, "nodePort": 30000}]}});
        default_service(taken.as_object_mut().unwrap());
        let mut service = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        default_service(service.as_object_mut().unwrap());
        allocate_service(&mut service, std::iter::once(&taken));
        assert_eq!(service["spec"]["ports"][0]["nodePort"], 30001);
        assert_eq!(service["spec"]["externalTrafficPolicy"], "Cluster");
        assert_ne!(service["spec"]["clusterIP"], "10.96.0.9");
        taken["spec"]["ports"][0]["nodePort"] = json!(0);
    }

    #[test]
    fn service_errors_read_as_kube_apiserver_writes_them() {
        let mut errs = Vec::new();
        let service = json!({"spec": {"type": "Weird", "clusterIP": "10.96.0.5", "ports": [
            {"port": 0, "name": "Bad_Name", "protocol": "XTP", "targetPort": "no_such!"}
        ]}});
        validate_service(&service, None, &mut errs);
        assert_eq!(
            messages(&errs),
            [
                "spec.ports[0].name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ports[0].protocol: Unsupported value: \"XTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.ports[0].targetPort: Invalid value: \"no_such!\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
                "spec.type: Unsupported value: \"Weird\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
            ]
        );
    }

    #[test]
    fn endpoint_slice_addresses_are_checked_as_the_server_does() {
        let mut errs = Vec::new();
        let slice = json!({"addressType": "IPv4", "endpoints": [
            {"addresses": ["127.0.0.1"]}, {"addresses": ["0.0.0.0"]}, {"addresses": ["224.0.0.1"]},
            {"addresses": ["169.254.1.1"]}, {"addresses": ["10.0.0.01"]}, {"addresses": ["::1x"]},
            {"addresses": ["fe80::1"]}, {"addresses": []}, {"addresses": ["192.0.2.2"]}
        ], "ports": [{"name": "A"}, {"name": "A"}]});
        validate_endpoint_slice(&slice, &mut errs);
        assert_eq!(
            messages(&errs),
            [
                "ports[0].name: Invalid value: \"A\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "ports[1].name: Invalid value: \"A\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "ports[1].name: Duplicate value: \"A\"",
                "endpoints[0].addresses[0]: Invalid value: \"127.0.0.1\": may not be in the loopback range (127.0.0.0/8, ::1/128)",
                "endpoints[1].addresses[0]: Invalid value: \"0.0.0.0\": may not be unspecified (0.0.0.0)",
                "endpoints[2].addresses[0]: Invalid value: \"224.0.0.1\": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)",
                "endpoints[3].addresses[0]: Invalid value: \"169.254.1.1\": may not be in the link-local range (169.254.0.0/16, fe80::/10)",
                "endpoints[4].addresses[0]: Invalid value: \"10.0.0.01\": must not have leading 0s",
                "endpoints[5].addresses[0]: Invalid value: \"::1x\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                "endpoints[6].addresses: Invalid value: \"fe80::1\": must be an IPv4 address",
                "endpoints[6].addresses[0]: Invalid value: \"fe80::1\": may not be in the link-local range (169.254.0.0/16, fe80::/10)",
                "endpoints[7].addresses: Required value: must contain at least 1 address",
            ]
        );
    }

    #[test]
    fn the_resource_ids_name_these_kinds() {
        assert_eq!(crate::resources::SERVICES.def().name, "services");
        assert_eq!(
            crate::resources::ENDPOINT_SLICES.def().name,
            "endpointslices"
        );
    }

    #[test]
    fn generation_follows_content_and_labels() {
        let old = json!({"metadata": {"name": "a", "labels": {"x": "1"}, "resourceVersion": "1"}, "endpoints": []});
        let mut new = old.clone();
        new["metadata"]["resourceVersion"] = json!("2");
        new["metadata"]["annotations"] = json!({"a": "b"});
        assert!(!endpoint_slice_generation_changes(&old, &new));
        new["metadata"]["labels"]["x"] = json!("2");
        assert!(endpoint_slice_generation_changes(&old, &new));
        let mut new = old.clone();
        new["endpoints"] = json!([{"addresses": ["10.0.0.1"]}]);
        assert!(endpoint_slice_generation_changes(&old, &new));
    }
}
