//! OpenAPI: the documents kubectl reads before `kubectl apply`, and the field
//! validation kube-apiserver does with the same schemas.
//!
//! kubectl 1.29+ reads `/openapi/v3` and the document of the object's group-version;
//! finding `fieldValidation` among the PATCH parameters there, it leaves validation
//! to the server and sends `fieldValidation=Strict`. The server then refuses unknown
//! and duplicate fields with kube-apiserver's message (400 for a body, 422 for a
//! patch), answers `Warn` with `Warning` headers, and `Ignore` with silence; without
//! the parameter it warns, as kube-apiserver does since 1.27.
//!
//! The documents and the schemas in them live in [`crate::objects::schema`].

use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;

use bytes::Bytes;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};

use crate::error::{ApiError, FieldError};
use crate::objects::schema::{V2_DOCUMENT, V3_DOCUMENTS, field_path, unknown_fields};
use crate::resources::ResourceDef;

/// A content hash for the index's `serverRelativeURL`s (clients cache by it).
fn hash_of(text: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// The media type of the protobuf v2 document, as kube-apiserver labels it (clients
/// ask for `...spec.v2@v1.0+protobuf`, which is no valid media type to answer with).
const V2_PROTOBUF: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// The body and content type for an OpenAPI path (`/openapi/v3`, `/openapi/v3/<gv>`,
/// `/openapi/v2` as JSON or, when `accept` asks for it, protobuf), if it is one the
/// simulator serves.
pub(crate) fn document(path: &str, accept: Option<&str>) -> Option<(Bytes, &'static str)> {
    if path.trim_end_matches('/') == "/openapi/v2" && accept.is_some_and(|a| a.contains("protobuf"))
    {
        static ENCODED: OnceLock<Bytes> = OnceLock::new();
        let encoded = ENCODED.get_or_init(|| {
            let doc: Value = serde_json::from_str(V2_DOCUMENT).unwrap_or(Value::Null);
            Bytes::from(crate::api::openapi_v2::encode(&doc))
        });
        return Some((encoded.clone(), V2_PROTOBUF));
    }
    json_document(path).map(|body| (body, "application/json"))
}

fn json_document(path: &str) -> Option<Bytes> {
    let path = path.trim_end_matches('/');
    match path {
        "/openapi/v3" => {
            let paths: serde_json::Map<String, Value> = V3_DOCUMENTS
                .iter()
                .map(|d| {
                    (
                        d.group_version.to_string(),
                        json!({ "serverRelativeURL": format!("/openapi/v3/{}?hash={}", d.group_version, hash_of(d.text)) }),
                    )
                })
                .collect();
            Some(Bytes::from(
                serde_json::to_vec(&json!({ "paths": paths })).unwrap_or_default(),
            ))
        }
        "/openapi/v2" => Some(Bytes::from_static(V2_DOCUMENT.as_bytes())),
        _ => {
            let group_version = path.strip_prefix("/openapi/v3/")?;
            V3_DOCUMENTS
                .iter()
                .find(|d| d.group_version == group_version)
                .map(|d| Bytes::from_static(d.text.as_bytes()))
        }
    }
}

/// Records the paths of keys that appear twice in one JSON object.
struct DuplicateFinder<'a> {
    path: String,
    found: &'a mut Vec<String>,
}

impl<'de> de::DeserializeSeed<'de> for DuplicateFinder<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DuplicateFinder<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            let here = field_path(&self.path, &key);
            if !seen.insert(key) {
                self.found.push(here.clone());
            }
            map.next_value_seed(DuplicateFinder {
                path: here,
                found: self.found,
            })?;
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while seq
            .next_element_seed(DuplicateFinder {
                path: format!("{}[{i}]", self.path),
                found: self.found,
            })?
            .is_some()
        {
            i += 1;
        }
        Ok(())
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Keys that appear twice in one object of a JSON body (`serde_json::Value` keeps
/// only the last).
pub(crate) fn duplicate_fields(json: &[u8]) -> Vec<String> {
    let mut found = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let _ = de::DeserializeSeed::deserialize(
        DuplicateFinder {
            path: String::new(),
            found: &mut found,
        },
        &mut deserializer,
    );
    found.sort();
    found
}

/// How the request asks unknown and duplicate fields to be treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Refuse the request.
    Strict,
    /// Accept it with a `Warning` header per field (the default).
    Warn,
    /// Accept it silently.
    Ignore,
}

impl FieldValidation {
    /// From the `fieldValidation` query parameter.
    pub(crate) fn from_param(value: Option<&str>) -> Result<FieldValidation, ApiError> {
        match value {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }
}

/// What field validation found in one object.
#[derive(Debug, Default)]
pub(crate) struct FieldProblems {
    /// `unknown field "a.b"` / `duplicate field "c"`, in kube-apiserver's order.
    pub problems: Vec<String>,
}

impl FieldProblems {
    /// Unknown fields of `object` and duplicates of its raw JSON (when it was JSON).
    pub(crate) fn of(def: &ResourceDef, object: &Value, raw_json: Option<&[u8]>) -> FieldProblems {
        let mut problems: Vec<String> = raw_json
            .map(duplicate_fields)
            .unwrap_or_default()
            .into_iter()
            .map(|f| format!("duplicate field {f:?}"))
            .collect();
        problems.extend(
            unknown_fields(def, object)
                .into_iter()
                .map(|f| format!("unknown field {f:?}")),
        );
        FieldProblems { problems }
    }

    /// Applies a validation level to a body: the error to refuse it with, else the
    /// warnings to send.
    pub(crate) fn judge_body(
        self,
        def: &ResourceDef,
        level: FieldValidation,
    ) -> Result<Vec<String>, ApiError> {
        match level {
            _ if self.problems.is_empty() => Ok(Vec::new()),
            FieldValidation::Strict => Err(ApiError::bad_request(format!(
                "{kind} in version {version:?} cannot be handled as a {kind}: strict decoding error: {}",
                self.problems.join(", "),
                kind = def.kind,
                version = def.version,
            ))),
            FieldValidation::Warn => Ok(self.problems),
            FieldValidation::Ignore => Ok(Vec::new()),
        }
    }

    /// The same for the result of a patch, which kube-apiserver refuses as an
    /// invalid `patch` (422) quoting the patched object.
    pub(crate) fn judge_patched(
        self,
        patched: &Value,
        level: FieldValidation,
    ) -> Result<Vec<String>, ApiError> {
        match level {
            _ if self.problems.is_empty() => Ok(Vec::new()),
            FieldValidation::Strict => {
                let shown = serde_json::to_string(patched).unwrap_or_default();
                let detail = format!("strict decoding error: {}", self.problems.join(", "));
                let error = FieldError::invalid("patch", shown, detail);
                let mut refused =
                    ApiError::new(422, "Invalid", format!(" \"\" is invalid: {error}"));
                refused.details = Some(json!({
                    "causes": [{
                        "reason": "FieldValueInvalid",
                        "message": error.to_string().trim_start_matches("patch: "),
                        "field": "patch",
                    }],
                }));
                Err(refused)
            }
            FieldValidation::Warn => Ok(self.problems),
            FieldValidation::Ignore => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::resources;

    #[test]
    fn unknown_fields_are_named_as_kube_apiserver_names_them() {
        let role = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "r9", "bogusMeta": 1, "labels": {"any": "thing"}},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "nope": true}],
            "zzz": 1,
        });
        assert_eq!(
            unknown_fields(resources::ROLES.def(), &role),
            ["metadata.bogusMeta", "rules[0].nope", "zzz"]
        );
        let route = json!({
            "apiVersion": "route.openshift.io/v1", "kind": "Route", "metadata": {"name": "r"},
            "spec": {"to": {"kind": "Service", "name": "x"}, "tls": {"termination": "edge", "bogus": 1}},
            "extra": 2,
        });
        assert_eq!(
            unknown_fields(resources::ROUTES.def(), &route),
            ["extra", "spec.tls.bogus"]
        );
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"},
            "data": {"tls.crt": "eA=="}, "stringData": {"x": "y"}, "type": "Opaque"});
        assert!(unknown_fields(resources::SECRETS.def(), &secret).is_empty());
        let problems = FieldProblems::of(
            resources::SECRETS.def(),
            &json!({"bogus": 1}),
            Some(br#"{"type":"Opaque","type":"Opaque","bogus":1}"#),
        );
        assert_eq!(
            problems
                .judge_body(resources::SECRETS.def(), FieldValidation::Strict)
                .unwrap_err()
                .message,
            "Secret in version \"v1\" cannot be handled as a Secret: strict decoding error: duplicate field \"type\", unknown field \"bogus\""
        );
    }

    #[test]
    fn documents_are_served_by_their_index() {
        let index: Value =
            serde_json::from_slice(&document("/openapi/v3", None).unwrap().0).unwrap();
        for gv in ["api/v1", "apis/route.openshift.io/v1"] {
            let url = index["paths"][gv]["serverRelativeURL"].as_str().unwrap();
            let path = url.split('?').next().unwrap();
            assert!(document(path, None).is_some(), "{path}");
        }
        let (v2, media) = document("/openapi/v2", Some(V2_PROTOBUF)).unwrap();
        assert_eq!(media, V2_PROTOBUF);
        assert_eq!(&v2[..5], b"\x0a\x032.0");
    }
}
