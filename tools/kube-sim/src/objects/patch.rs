//! PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (applied as a
//! merge patch after dropping `$`-directives; adequate for the map-shaped objects the
//! simulator serves), JSON patch (RFC 6902) and server-side apply (applied as a merge
//! patch of the applied configuration; managed fields are not tracked).

use serde_json::Value;

use crate::error::ApiError;

/// The patch types kube-apiserver accepts, by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    StrategicMerge,
    /// `application/json-patch+json`
    Json,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchKind {
    /// The patch kind for a request `Content-Type`.
    pub fn from_content_type(ct: &str) -> Result<PatchKind, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchKind::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchKind::StrategicMerge),
            "application/json-patch+json" => Ok(PatchKind::Json),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchKind::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// A decoded PATCH body.
#[derive(Debug, Clone)]
pub struct PatchBody {
    /// The patch type.
    pub kind: PatchKind,
    /// The patch document.
    pub patch: Value,
}

impl PatchBody {
    /// Decodes the body for the given patch type (YAML accepted for apply patches).
    pub fn decode(kind: PatchKind, body: &[u8]) -> Result<PatchBody, ApiError> {
        let patch: Value = if kind == PatchKind::Apply {
            serde_yaml::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?
        };
        match kind {
            PatchKind::Json if !patch.is_array() => Err(ApiError::bad_request(
                "json patch must be a list of operations",
            )),
            PatchKind::Merge | PatchKind::StrategicMerge | PatchKind::Apply
                if !patch.is_object() =>
            {
                Err(ApiError::bad_request("patch must be a JSON object"))
            }
            _ => Ok(PatchBody { kind, patch }),
        }
    }

    /// Applies the patch to `target`.
    pub fn apply_to(&self, target: &mut Value) -> Result<(), ApiError> {
        match self.kind {
            PatchKind::Merge | PatchKind::Apply => {
                json_patch::merge(target, &self.patch);
                Ok(())
            }
            PatchKind::StrategicMerge => {
                let mut p = self.patch.clone();
                strip_directives(&mut p);
                json_patch::merge(target, &p);
                Ok(())
            }
            PatchKind::Json => {
                let ops: json_patch::Patch = serde_json::from_value(self.patch.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid json patch: {e}")))?;
                json_patch::patch(target, &ops).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!("the json patch could not be applied: {e}"),
                    )
                })
            }
        }
    }
}

/// Removes strategic-merge directives (`$patch`, `$retainKeys`,
/// `$setElementOrder/...`, `$deleteFromPrimitiveList/...`).
fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|k, _| !k.starts_with('$'));
            for child in map.values_mut() {
                strip_directives(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls() {
        let mut doc = json!({"a": 1, "b": {"c": 2, "d": 3}});
        let p = PatchBody::decode(PatchKind::Merge, br#"{"b":{"c":null,"e":4}}"#).unwrap();
        p.apply_to(&mut doc).unwrap();
        assert_eq!(doc, json!({"a": 1, "b": {"d": 3, "e": 4}}));
    }

    #[test]
    fn strategic_merge_drops_directives() {
        let mut doc = json!({"data": {"a": "x"}});
        let p = PatchBody::decode(
            PatchKind::StrategicMerge,
            br#"{"$setElementOrder/items":[],"data":{"b":"y"}}"#,
        )
        .unwrap();
        p.apply_to(&mut doc).unwrap();
        assert_eq!(doc, json!({"data": {"a": "x", "b": "y"}}));
    }

    #[test]
    fn json_patch_ops() {
        let mut doc = json!({"a": [1]});
        let p = PatchBody::decode(
            PatchKind::Json,
            br#"[{"op":"add","path":"/a/-","value":2}]"#,
        )
        .unwrap();
        p.apply_to(&mut doc).unwrap();
        assert_eq!(doc, json!({"a": [1, 2]}));
        let bad = PatchBody::decode(PatchKind::Json, br#"[{"op":"remove","path":"/zz"}]"#).unwrap();
        assert_eq!(bad.apply_to(&mut doc).unwrap_err().code, 422);
    }
}
