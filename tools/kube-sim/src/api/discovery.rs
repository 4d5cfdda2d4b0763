//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/<group>` and
//! `/apis/<group>/<version>`, in the legacy (unaggregated) JSON form. Clients that ask
//! for aggregated discovery fall back to these when the response's content type is
//! plain `application/json`, as kubectl does.

use std::net::SocketAddr;

use serde_json::{Value, json};

use crate::resources::{self, GROUPS, ResourceDef};

/// The Kubernetes version the simulator reports.
pub const SERVER_MINOR: &str = "32";

fn group_version_doc(group: &str, version: &str) -> Value {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({ "groupVersion": gv, "version": version })
}

fn resource_entries(def: &ResourceDef) -> Vec<Value> {
    let mut main = json!({
        "name": def.name,
        "singularName": def.singular,
        "namespaced": def.namespaced,
        "kind": def.kind,
        "verbs": def.verbs,
    });
    if !def.short_names.is_empty() {
        main["shortNames"] = json!(def.short_names);
    }
    let mut out = vec![main];
    if def.status_subresource {
        out.push(json!({
            "name": format!("{}/status", def.name),
            "singularName": "",
            "namespaced": def.namespaced,
            "kind": def.kind,
            "verbs": ["get", "patch", "update"],
        }));
    }
    out
}

/// The JSON document for a non-resource discovery path, if it is one.
pub(crate) fn document(path: &str, server_addr: SocketAddr) -> Option<Value> {
    let trimmed = path.trim_end_matches('/');
    let parts: Vec<&str> = trimmed.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["version"] => Some(json!({
            "major": "1",
            "minor": SERVER_MINOR,
            "emulationMajor": "1",
            "emulationMinor": SERVER_MINOR,
            "gitVersion": format!("v1.{SERVER_MINOR}.0-kube-sim"),
            "gitCommit": "kube-sim",
            "gitTreeState": "clean",
            "buildDate": "2025-01-01T00:00:00Z",
            "goVersion": "go1.23.4",
            "compiler": "gc",
            "platform": "linux/amd64",
        })),
        ["api"] => Some(json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": server_addr.to_string() }],
        })),
        ["api", "v1"] => Some(resource_list("", "v1")),
        ["apis"] => Some(json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": GROUPS.iter().map(|(g, v)| group_doc(g, v)).collect::<Vec<_>>(),
        })),
        ["apis", g] => GROUPS.iter().find(|(name, _)| name == g).map(|(g, v)| {
            let mut d = group_doc(g, v);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            d
        }),
        ["apis", g, v] => GROUPS
            .iter()
            .any(|(name, ver)| name == g && ver == v)
            .then(|| resource_list(g, v)),
        _ => None,
    }
}

fn group_doc(group: &str, version: &str) -> Value {
    json!({
        "name": group,
        "versions": [group_version_doc(group, version)],
        "preferredVersion": group_version_doc(group, version),
    })
}

fn resource_list(group: &str, version: &str) -> Value {
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    let resources: Vec<Value> = resources::in_group_version(group, version)
        .into_iter()
        .flat_map(|id| resource_entries(id.def()))
        .collect();
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": gv,
        "resources": resources,
    })
}

/// Whether a path is a health endpoint.
pub(crate) fn is_health(path: &str) -> bool {
    let p = path.trim_end_matches('/');
    p == "/healthz"
        || p == "/livez"
        || p == "/readyz"
        || p.starts_with("/healthz/")
        || p.starts_with("/livez/")
        || p.starts_with("/readyz/")
}
