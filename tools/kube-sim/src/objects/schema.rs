//! The schemas of the served kinds, as kube-apiserver publishes them in its OpenAPI
//! documents: which fields an object of each kind may have. The API uses them to
//! validate fields (`fieldValidation`) and, like kube-apiserver, to drop unknown
//! fields from what it stores; [`crate::api`] also serves the documents themselves.
//!
//! The documents under `openapi/` are kube-apiserver v1.36's own, trimmed to the
//! resources kube-sim serves and without their prose, by `openapi/refresh.py`.

use std::collections::BTreeSet;
use std::sync::OnceLock;

use serde_json::Value;

use crate::resources::ResourceDef;

/// One served document: the group-version it describes and its JSON.
pub(crate) struct Document {
    /// `api/v1`, `apis/<group>/<version>`.
    pub group_version: &'static str,
    pub text: &'static str,
}

pub(crate) const V3_DOCUMENTS: &[Document] = &[
    Document {
        group_version: "api/v1",
        text: include_str!("../../openapi/v3-api-v1.json"),
    },
    Document {
        group_version: "apis/route.openshift.io/v1",
        text: include_str!("../../openapi/v3-apis-route-openshift-io-v1.json"),
    },
    Document {
        group_version: "apis/rbac.authorization.k8s.io/v1",
        text: include_str!("../../openapi/v3-apis-rbac-authorization-k8s-io-v1.json"),
    },
    Document {
        group_version: "apis/authorization.k8s.io/v1",
        text: include_str!("../../openapi/v3-apis-authorization-k8s-io-v1.json"),
    },
    Document {
        group_version: "apis/discovery.k8s.io/v1",
        text: include_str!("../../openapi/v3-apis-discovery-k8s-io-v1.json"),
    },
];

pub(crate) const V2_DOCUMENT: &str = include_str!("../../openapi/v2.json");

/// The parsed v3 documents, once.
fn parsed() -> &'static [(&'static str, Value)] {
    static PARSED: OnceLock<Vec<(&'static str, Value)>> = OnceLock::new();
    PARSED.get_or_init(|| {
        V3_DOCUMENTS
            .iter()
            .map(|d| {
                (
                    d.group_version,
                    serde_json::from_str(d.text).unwrap_or(Value::Null),
                )
            })
            .collect()
    })
}

/// A group-version's schemas and the name of one kind's schema in it.
fn schema_for(def: &ResourceDef) -> Option<(&'static Value, &'static Value)> {
    let group_version = if def.group.is_empty() {
        format!("api/{}", def.version)
    } else {
        format!("apis/{}/{}", def.group, def.version)
    };
    let (_, doc) = parsed().iter().find(|(gv, _)| *gv == group_version)?;
    let schemas = doc.pointer("/components/schemas")?;
    let schema = schemas.as_object()?.values().find(|s| {
        s.get("x-kubernetes-group-version-kind")
            .and_then(Value::as_array)
            .is_some_and(|gvks| {
                gvks.iter().any(|gvk| {
                    gvk["group"] == def.group
                        && gvk["version"] == def.version
                        && gvk["kind"] == def.kind
                })
            })
    })?;
    Some((schemas, schema))
}

/// Follows `$ref` and the `allOf: [{$ref}]` wrapper kube-apiserver puts around refs.
fn resolve<'a>(schemas: &'a Value, mut schema: &'a Value) -> &'a Value {
    for _ in 0..32 {
        let next = match (schema.get("$ref"), schema.get("allOf")) {
            (Some(Value::String(r)), _) => r
                .strip_prefix("#/components/schemas/")
                .and_then(|name| schemas.get(name)),
            (_, Some(Value::Array(all))) if all.len() == 1 => Some(&all[0]),
            _ => None,
        };
        match next {
            Some(n) => schema = n,
            None => break,
        }
    }
    schema
}

pub(crate) fn field_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn unknown_in(
    schemas: &Value,
    schema: &Value,
    value: &Value,
    path: &str,
    out: &mut BTreeSet<String>,
) {
    let schema = resolve(schemas, schema);
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (key, item) in fields {
                let here = field_path(path, key);
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(property), _) => unknown_in(schemas, property, item, &here, out),
                    (None, Some(values)) => unknown_in(schemas, values, item, &here, out),
                    // An object schema that names no properties takes anything.
                    (None, None) if properties.is_none() => {}
                    (None, None) => {
                        out.insert(here);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    unknown_in(schemas, item_schema, item, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// The fields of `object` its kind's schema does not know, as kube-apiserver names
/// them (`spec.tls.bogus`, `rules[0].nope`), in order.
pub(crate) fn unknown_fields(def: &ResourceDef, object: &Value) -> Vec<String> {
    let Some((schemas, schema)) = schema_for(def) else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    unknown_in(schemas, schema, object, "", &mut out);
    out.into_iter().collect()
}

fn prune_in(schemas: &Value, schema: &Value, value: &mut Value) {
    let schema = resolve(schemas, schema);
    if schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true)
    {
        return;
    }
    match value {
        Value::Object(fields) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            fields.retain(|key, _| {
                properties.is_none_or(|p| p.contains_key(key)) || additional.is_some()
            });
            for (key, item) in fields.iter_mut() {
                match (properties.and_then(|p| p.get(key)), additional) {
                    (Some(property), _) => prune_in(schemas, property, item),
                    (None, Some(values)) => prune_in(schemas, values, item),
                    (None, None) => {}
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    prune_in(schemas, item_schema, item);
                }
            }
        }
        _ => {}
    }
}

/// Drops the fields its kind's schema does not know from an object, as kube-apiserver
/// does with what it stores (unless told to refuse them).
pub(crate) fn prune_unknown(def: &ResourceDef, object: &mut Value) {
    if let Some((schemas, schema)) = schema_for(def) {
        prune_in(schemas, schema, object);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::resources;
    use serde_json::json;

    #[test]
    fn every_served_kind_has_a_schema() {
        for def in resources::RESOURCES {
            assert!(schema_for(def).is_some(), "{}", def.kind);
        }
    }

    #[test]
    fn unknown_fields_are_dropped_known_ones_kept() {
        let mut route = json!({
            "apiVersion": "route.openshift.io/v1", "kind": "Route",
            "metadata": {"name": "r", "labels": {"a": "b"}, "bogus": 1},
            "spec": {"host": "h", "to": {"kind": "Service", "name": "x"}, "tls": {"termination": "edge", "bogus": 1}},
            "status": {"ingress": [{"routerName": "default", "bogus": 1}]},
            "extra": 2,
        });
        prune_unknown(resources::ROUTES.def(), &mut route);
        assert_eq!(
            route,
            json!({
                "apiVersion": "route.openshift.io/v1", "kind": "Route",
                "metadata": {"name": "r", "labels": {"a": "b"}},
                "spec": {"host": "h", "to": {"kind": "Service", "name": "x"}, "tls": {"termination": "edge"}},
                "status": {"ingress": [{"routerName": "default"}]},
            })
        );
    }
}
