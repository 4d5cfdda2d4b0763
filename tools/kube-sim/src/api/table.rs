//! Server-side printing: `meta.k8s.io/v1` `Table` responses, which kubectl asks for
//! (`Accept: application/json;as=Table;...`) to print `kubectl get` output.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::objects::meta::meta_str;
use crate::resources::ResourceDef;

/// What each row carries besides its cells (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IncludeObject {
    None,
    Metadata,
    Object,
}

/// Table rendering options of one request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TableOptions {
    pub include_object: IncludeObject,
}

impl TableOptions {
    /// Table options if the `Accept` header asks for a Table.
    pub(crate) fn from_request(
        accept: Option<&str>,
        include_object: Option<&str>,
    ) -> Option<TableOptions> {
        let accept = accept?;
        let wants = accept.split(',').any(|part| {
            let mut params = part.split(';').skip(1).map(str::trim);
            params.any(|p| p == "as=Table")
        });
        if !wants {
            return None;
        }
        let include_object = match include_object {
            Some("None") => IncludeObject::None,
            Some("Object") => IncludeObject::Object,
            _ => IncludeObject::Metadata,
        };
        Some(TableOptions { include_object })
    }
}

struct Column {
    name: &'static str,
    kind: &'static str,
    format: &'static str,
    description: &'static str,
    priority: u32,
}

const fn col(
    name: &'static str,
    kind: &'static str,
    format: &'static str,
    description: &'static str,
) -> Column {
    Column {
        name,
        kind,
        format,
        description,
        priority: 0,
    }
}

const NAME: Column = col(
    "Name",
    "string",
    "name",
    "Name must be unique within a namespace.",
);
const AGE: Column = col(
    "Age",
    "string",
    "",
    "CreationTimestamp is the time the object was created.",
);

fn columns(def: &ResourceDef) -> Vec<Column> {
    match def.name {
        "secrets" => vec![
            NAME,
            col(
                "Type",
                "string",
                "",
                "Used to facilitate programmatic handling of secret data.",
            ),
            col("Data", "integer", "", "Number of keys in data."),
            AGE,
        ],
        "routes" => vec![
            NAME,
            col(
                "Host/Port",
                "string",
                "",
                "Host and port the route is exposed on.",
            ),
            col("Path", "string", "", "Path the route matches."),
            col(
                "Services",
                "string",
                "",
                "Services the route sends traffic to.",
            ),
            col("Port", "string", "", "Target port."),
            col(
                "Termination",
                "string",
                "",
                "TLS termination and insecure edge policy.",
            ),
            col("Wildcard", "string", "", "Wildcard policy."),
        ],
        "namespaces" => vec![
            NAME,
            col("Status", "string", "", "The status of the namespace."),
            AGE,
        ],
        "rolebindings" | "clusterrolebindings" => vec![
            NAME,
            col("Role", "string", "", "The role this binding refers to."),
            AGE,
        ],
        "leases" => vec![
            NAME,
            col(
                "Holder",
                "string",
                "",
                "holderIdentity contains the identity of the holder of a current lease.",
            ),
            AGE,
        ],
        "roles" | "clusterroles" => vec![
            NAME,
            col(
                "Created At",
                "date",
                "",
                "CreationTimestamp is the time the object was created.",
            ),
        ],
        _ => vec![NAME, AGE],
    }
}

/// kube-apiserver's short human duration (`45s`, `5m10s`, `3h`, `12d`, `2y30d`).
pub(crate) fn human_age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".to_string();
    };
    let secs = jiff::Timestamp::now().as_second() - ts.as_second();
    if secs < -1 {
        return "<invalid>".to_string();
    }
    let secs = secs.max(0);
    let minutes = secs / 60;
    let hours = minutes / 60;
    let days = hours / 24;
    let years = days / 365;
    if secs < 120 {
        format!("{secs}s")
    } else if minutes < 10 {
        let s = secs % 60;
        if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        }
    } else if minutes < 180 {
        format!("{minutes}m")
    } else if hours < 8 {
        let m = minutes % 60;
        if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 24 * 8 {
        let h = hours % 24;
        if h == 0 {
            format!("{days}d")
        } else {
            format!("{days}d{h}h")
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else if days < 365 * 8 {
        let d = days % 365;
        if d == 0 {
            format!("{years}y")
        } else {
            format!("{years}y{d}d")
        }
    } else {
        format!("{years}y")
    }
}

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn cells(def: &ResourceDef, obj: &Value) -> Vec<Value> {
    let name = json!(meta_str(obj, "name").unwrap_or(""));
    let created = meta_str(obj, "creationTimestamp");
    let age = json!(human_age(created));
    match def.name {
        "secrets" => vec![
            name,
            json!(obj.get("type").and_then(Value::as_str).unwrap_or("Opaque")),
            json!(
                obj.get("data")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.len())
            ),
            age,
        ],
        "routes" => {
            let host = str_at(obj, "/spec/host");
            let path = str_at(obj, "/spec/path");
            let service = str_at(obj, "/spec/to/name");
            let port = obj
                .pointer("/spec/port/targetPort")
                .map(|p| match p {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| "<all>".to_string());
            let termination = str_at(obj, "/spec/tls/termination");
            let insecure = str_at(obj, "/spec/tls/insecureEdgeTerminationPolicy");
            let termination = if insecure.is_empty() {
                termination.to_string()
            } else {
                format!("{termination}/{insecure}")
            };
            vec![
                name,
                json!(host),
                json!(path),
                json!(service),
                json!(port),
                json!(termination),
                json!(str_at(obj, "/spec/wildcardPolicy")),
            ]
        }
        "namespaces" => vec![name, json!(str_at(obj, "/status/phase")), age],
        "rolebindings" | "clusterrolebindings" => vec![
            name,
            json!(format!(
                "{}/{}",
                str_at(obj, "/roleRef/kind"),
                str_at(obj, "/roleRef/name")
            )),
            age,
        ],
        "roles" | "clusterroles" => vec![name, json!(created.unwrap_or(""))],
        "leases" => vec![name, json!(str_at(obj, "/spec/holderIdentity")), age],
        _ => vec![name, age],
    }
}

fn row(def: &ResourceDef, obj: &Value, opts: TableOptions) -> Value {
    let mut r = json!({ "cells": cells(def, obj) });
    match opts.include_object {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            r["object"] = json!({
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
            });
        }
        IncludeObject::Object => r["object"] = obj.clone(),
    }
    r
}

fn column_definitions(def: &ResourceDef) -> Value {
    Value::Array(
        columns(def)
            .into_iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "type": c.kind,
                    "format": c.format,
                    "description": c.description,
                    "priority": c.priority,
                })
            })
            .collect(),
    )
}

/// A Table for a list page.
pub(crate) fn list_table(
    def: &ResourceDef,
    items: &[Arc<Value>],
    opts: TableOptions,
    rv: u64,
    continue_token: Option<&str>,
) -> Value {
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": column_definitions(def),
        "rows": items.iter().map(|o| row(def, o, opts)).collect::<Vec<_>>(),
    })
}

/// A Table for a single object.
pub(crate) fn object_table(def: &ResourceDef, obj: &Value, opts: TableOptions) -> Value {
    let rv = meta_str(obj, "resourceVersion").unwrap_or("");
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": { "resourceVersion": rv },
        "columnDefinitions": column_definitions(def),
        "rows": [row(def, obj, opts)],
    })
}

/// A Table for one watch event; only the first event of a watch carries the
/// column definitions, as kube-apiserver does.
pub(crate) fn event_table(
    def: &ResourceDef,
    obj: &Value,
    opts: TableOptions,
    with_columns: bool,
) -> Value {
    let mut t = object_table(def, obj, opts);
    if !with_columns {
        t["columnDefinitions"] = json!([]);
    }
    t
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn detects_table_accept() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert!(TableOptions::from_request(Some(accept), None).is_some());
        assert!(TableOptions::from_request(Some("application/json"), None).is_none());
        assert!(TableOptions::from_request(None, None).is_none());
    }

    #[test]
    fn ages() {
        let now = jiff::Timestamp::now();
        let ago = |s: i64| {
            jiff::Timestamp::from_second(now.as_second() - s)
                .unwrap()
                .to_string()
        };
        assert_eq!(human_age(Some(&ago(30))), "30s");
        assert_eq!(human_age(Some(&ago(310))), "5m10s");
        assert_eq!(human_age(Some(&ago(3 * 86_400))), "3d");
        assert_eq!(human_age(None), "<unknown>");
    }
}
