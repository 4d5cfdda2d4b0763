//! Reading and writing the `metadata` every object carries.

use serde_json::{Map, Value};

/// Sets `metadata.resourceVersion`.
pub(crate) fn set_resource_version(v: &mut Value, rv: u64) {
    if let Some(meta) = metadata_mut(v) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

/// The `metadata` map, created (or replaced, if it is not a map) when missing.
pub(crate) fn metadata_mut(v: &mut Value) -> Option<&mut Map<String, Value>> {
    let obj = v.as_object_mut()?;
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
}

/// A string field of `metadata`.
pub(crate) fn meta_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get("metadata")?.get(key)?.as_str()
}

/// The current time as an RFC 3339 timestamp with second precision.
pub(crate) fn now_timestamp() -> String {
    let now = jiff::Timestamp::now();
    jiff::Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .to_string()
}
