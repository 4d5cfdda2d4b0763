//! Errors: [`ApiError`] is a Kubernetes `Status` failure (what the HTTP API answers and
//! what [`crate::StoreHandle`] operations return), [`SimError`] is everything the
//! simulator's Rust API can fail with.

use std::fmt;
use std::path::PathBuf;

use serde_json::{Value, json};

use crate::resources::ResourceDef;

/// Everything the simulator's Rust API can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address that was asked for.
        addr: std::net::SocketAddr,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// TLS material could not be generated or loaded.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// Certificate generation failed.
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The API refused an operation (the same `Status` a client would get).
    #[error("{0}")]
    Api(#[from] ApiError),
    /// A manifest document could not be understood.
    #[error("manifest document {index}: {message}")]
    Manifest {
        /// Zero-based index of the document in the input.
        index: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A generator specification is unusable.
    #[error("invalid generate spec: {0}")]
    Generate(String),
    /// The kubeconfig context name is not one the simulator provides.
    #[error("unknown kubeconfig context {0:?} (the simulator provides \"router\" and \"admin\")")]
    UnknownContext(String),
    /// Building a kube client configuration failed.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// A kube client could not be built.
    #[error("kube client: {0}")]
    Client(#[from] kube::Error),
    /// Writing a file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A command-line argument is unusable.
    #[error("invalid argument: {0}")]
    Argument(String),
}

impl SimError {
    /// The HTTP status code when this is an API refusal (`Api`), else `None`.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            SimError::Api(e) => Some(e.code),
            _ => None,
        }
    }
}

/// A Kubernetes API failure: rendered as a `Status` object (kind `Status`, apiVersion
/// `v1`, status `Failure`) with HTTP status `code`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code (403, 404, 409, 410, 422, 429, ...).
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`,
    /// `Invalid`, `Forbidden`, `TooManyRequests`, ...).
    pub reason: String,
    /// Human-readable message, in kube-apiserver's wording.
    pub message: String,
    /// `details` of the Status (name, group, kind, causes, retryAfterSeconds).
    pub details: Option<Value>,
    /// Seconds for the `Retry-After` header, if any.
    pub retry_after: Option<u64>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// One problem with one field of an object, as in a 422 Invalid `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// Field path, such as `metadata.name` or `data[tls.crt]`.
    pub field: String,
    /// What kind of problem.
    pub kind: FieldErrorKind,
    /// Further explanation.
    pub detail: String,
}

/// Kinds of [`FieldError`], matching Kubernetes' `field.ErrorType`.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldErrorKind {
    /// A required field is missing.
    Required,
    /// The value is not acceptable; the value is shown unless it may be secret.
    Invalid(Option<String>),
    /// A number that is not acceptable (shown as a number, without quotes).
    InvalidNumber(i64),
    /// The field may not be set or changed.
    Forbidden,
    /// The value is too long.
    TooLong,
    /// The value is not one of the supported ones.
    NotSupported(Option<String>),
    /// An unacceptable value shown as `null` (what kube-apiserver shows for a rule about
    /// the whole object).
    InvalidNull,
    /// A value that occurs twice where it must be unique.
    Duplicate(String),
}

impl FieldError {
    /// A missing required field.
    pub fn required(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Required,
            detail: detail.into(),
        }
    }

    /// An unacceptable value (shown in the message).
    pub fn invalid(
        field: impl Into<String>,
        value: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Invalid(Some(value.into())),
            detail: detail.into(),
        }
    }

    /// An unacceptable number (shown without quotes, as Go prints an integer).
    pub fn invalid_number(field: impl Into<String>, value: i64, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::InvalidNumber(value),
            detail: detail.into(),
        }
    }

    /// An unacceptable value that must not be echoed (secret data).
    pub fn invalid_redacted(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Invalid(None),
            detail: detail.into(),
        }
    }

    /// A field that may not be set or changed.
    pub fn forbidden(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Forbidden,
            detail: detail.into(),
        }
    }

    /// A value that is too long.
    pub fn too_long(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::TooLong,
            detail: detail.into(),
        }
    }

    /// A value that is not one of the supported ones.
    pub fn not_supported(
        field: impl Into<String>,
        value: Option<String>,
        detail: impl Into<String>,
    ) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::NotSupported(value),
            detail: detail.into(),
        }
    }

    /// An unacceptable value shown as `null`.
    pub fn invalid_null(field: impl Into<String>, detail: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::InvalidNull,
            detail: detail.into(),
        }
    }

    /// A value that must be unique and is not.
    pub fn duplicate(field: impl Into<String>, value: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind: FieldErrorKind::Duplicate(value.into()),
            detail: String::new(),
        }
    }

    fn cause_reason(&self) -> &'static str {
        match self.kind {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid(_) | FieldErrorKind::InvalidNumber(_) => "FieldValueInvalid",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::NotSupported(_) => "FieldValueNotSupported",
            FieldErrorKind::InvalidNull => "FieldValueInvalid",
            FieldErrorKind::Duplicate(_) => "FieldValueDuplicate",
        }
    }

    fn type_message(&self) -> String {
        let base = match &self.kind {
            FieldErrorKind::Required => "Required value".to_string(),
            FieldErrorKind::Invalid(Some(v)) => format!("Invalid value: {v:?}"),
            FieldErrorKind::Invalid(None) => "Invalid value".to_string(),
            FieldErrorKind::InvalidNumber(n) => format!("Invalid value: {n}"),
            FieldErrorKind::Forbidden => "Forbidden".to_string(),
            FieldErrorKind::TooLong => "Too long".to_string(),
            FieldErrorKind::NotSupported(Some(v)) => format!("Unsupported value: {v:?}"),
            FieldErrorKind::NotSupported(None) => "Unsupported value".to_string(),
            FieldErrorKind::InvalidNull => "Invalid value: null".to_string(),
            FieldErrorKind::Duplicate(v) => format!("Duplicate value: {v:?}"),
        };
        if self.detail.is_empty() {
            base
        } else {
            format!("{base}: {}", self.detail)
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.type_message())
    }
}

/// `resource` or `resource.group`, as kube-apiserver names a GroupResource.
pub(crate) fn qualified_resource(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.name.to_string()
    } else {
        format!("{}.{}", def.name, def.group)
    }
}

/// `Kind` or `Kind.group`, as kube-apiserver names a GroupKind.
pub(crate) fn qualified_kind(def: &ResourceDef) -> String {
    if def.group.is_empty() {
        def.kind.to_string()
    } else {
        format!("{}.{}", def.kind, def.group)
    }
}

fn resource_details(def: &ResourceDef, name: &str) -> Value {
    let mut d = json!({ "kind": def.name });
    if !name.is_empty() {
        d["name"] = json!(name);
    }
    if !def.group.is_empty() {
        d["group"] = json!(def.group);
    }
    d
}

impl ApiError {
    /// A failure with the given code, reason and message and no details.
    pub fn new(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden for a resource request, in kube-apiserver's wording.
    pub(crate) fn forbidden(def: &ResourceDef, name: &str, reason: &str) -> Self {
        let q = qualified_resource(def);
        let message = if name.is_empty() {
            format!("{q} is forbidden: {reason}")
        } else {
            format!("{q} {name:?} is forbidden: {reason}")
        };
        ApiError {
            details: Some(resource_details(def, name)),
            ..ApiError::new(403, "Forbidden", message)
        }
    }

    /// 403 Forbidden for a non-resource URL.
    pub(crate) fn forbidden_path(user: &str, verb: &str, path: &str) -> Self {
        ApiError {
            // kube-apiserver sends empty details here, not none.
            details: Some(json!({})),
            ..ApiError::new(
                403,
                "Forbidden",
                format!("forbidden: User {user:?} cannot {verb} path {path:?}"),
            )
        }
    }

    /// 404 NotFound for a named object.
    pub(crate) fn not_found(def: &ResourceDef, name: &str) -> Self {
        ApiError {
            details: Some(resource_details(def, name)),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} {name:?} not found", qualified_resource(def)),
            )
        }
    }

    /// 404 NotFound for a URL the server does not serve.
    pub fn no_route() -> Self {
        ApiError {
            details: None,
            ..ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            )
        }
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    /// 409 AlreadyExists.
    pub(crate) fn already_exists(def: &ResourceDef, name: &str) -> Self {
        ApiError {
            details: Some(resource_details(def, name)),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} {name:?} already exists", qualified_resource(def)),
            )
        }
    }

    /// 409 Conflict on a stale resourceVersion or failed precondition.
    pub(crate) fn conflict(def: &ResourceDef, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(resource_details(def, name)),
            ..ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} {name:?}: {why}",
                    qualified_resource(def)
                ),
            )
        }
    }

    /// 409 Conflict because `metadata.resourceVersion` is stale.
    pub(crate) fn stale(def: &ResourceDef, name: &str) -> Self {
        ApiError::conflict(
            def,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid: an update without `metadata.resourceVersion` of a resource that
    /// refuses unconditional updates (kube-apiserver names the resource, not the kind).
    pub(crate) fn resource_version_required(def: &ResourceDef, name: &str) -> Self {
        let error = FieldError::invalid_number(
            "metadata.resourceVersion",
            0,
            "must be specified for an update",
        );
        let mut details = resource_details(def, name);
        details["causes"] = json!([{
            "reason": error.cause_reason(),
            "message": error.type_message(),
            "field": error.field,
        }]);
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{} {name:?} is invalid: {error}", qualified_resource(def)),
            )
        }
    }

    /// 410 Expired (Gone).
    pub fn expired(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/strategic-merge-patch+json, application/json-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// 422 Invalid with field causes.
    pub(crate) fn invalid(def: &ResourceDef, name: &str, errors: &[FieldError]) -> Self {
        let summary = match errors {
            [one] => one.to_string(),
            many => format!(
                "[{}]",
                many.iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut details = resource_details(def, name);
        details["kind"] = json!(def.kind);
        details["causes"] = Value::Array(
            errors
                .iter()
                .map(|e| {
                    json!({
                        "reason": e.cause_reason(),
                        "message": e.type_message(),
                        "field": e.field,
                    })
                })
                .collect(),
        );
        ApiError {
            details: Some(details),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{} {name:?} is invalid: {summary}", qualified_kind(def)),
            )
        }
    }

    /// 422 Invalid for request parameters (not an object), as kube-apiserver words
    /// it for `ListOptions`.
    pub fn invalid_params(kind: &str, errors: &[FieldError]) -> Self {
        let summary = errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        ApiError {
            details: Some(json!({
                "kind": kind,
                "group": "meta.k8s.io",
                "causes": errors.iter().map(|e| json!({
                    "reason": e.cause_reason(),
                    "message": e.type_message(),
                    "field": e.field,
                })).collect::<Vec<_>>(),
            })),
            ..ApiError::new(
                422,
                "Invalid",
                format!("{kind}.meta.k8s.io \"\" is invalid: {summary}"),
            )
        }
    }

    /// 429 TooManyRequests with a Retry-After.
    pub fn too_many_requests(retry_after_secs: u64) -> Self {
        ApiError {
            details: Some(json!({ "retryAfterSeconds": retry_after_secs })),
            retry_after: Some(retry_after_secs),
            ..ApiError::new(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
            )
        }
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError {
            details: Some(json!({ "causes": [{ "message": message }] })),
            ..ApiError::new(
                500,
                "InternalError",
                format!("Internal error occurred: {message}"),
            )
        }
    }

    /// 504 Timeout for a resourceVersion newer than the server has.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        ApiError {
            details: Some(json!({
                "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
                "retryAfterSeconds": 1,
            })),
            retry_after: Some(1),
            ..ApiError::new(
                504,
                "Timeout",
                format!("Timeout: Too large resource version: {requested}, current: {current}"),
            )
        }
    }

    /// The standard reason phrase for an injected failure code.
    pub fn for_code(code: u16, message: impl Into<String>) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        let mut e = ApiError::new(code, reason, message);
        if code == 429 || code == 503 {
            e.retry_after = Some(1);
            e.details = Some(json!({ "retryAfterSeconds": 1 }));
        }
        e
    }

    /// The `Status` as kube-apiserver encodes it: Go's field order, empty fields left
    /// out, so that a refusal reads byte for byte as the real server's (serialize it
    /// with serde; [`ApiError::to_status`] is the same as a JSON value).
    pub(crate) fn status_wire(&self) -> StatusWire<'_> {
        StatusWire {
            kind: "Status",
            api_version: "v1",
            metadata: EmptyObject {},
            status: "Failure",
            message: &self.message,
            reason: &self.reason,
            details: self.details.as_ref().map(DetailsWire::new),
            code: self.code,
        }
    }

    /// The `Status` object for this failure.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A `Status` in the order of kube-apiserver's Go struct (`metav1.Status`): kind,
/// apiVersion, metadata, status, message, reason, details, code.
#[derive(Debug, serde::Serialize)]
pub(crate) struct StatusWire<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: EmptyObject,
    status: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    message: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<DetailsWire<'a>>,
    code: u16,
}

/// `{}`: a Status's list metadata, always empty in an error.
#[derive(Debug, serde::Serialize)]
struct EmptyObject {}

/// `metav1.StatusDetails`' keys in its Go field order; keys the struct does not have
/// are not sent.
const DETAILS_KEYS: &[&str] = &[
    "name",
    "group",
    "kind",
    "uid",
    "causes",
    "retryAfterSeconds",
];

/// `metav1.StatusCause`'s keys in its Go field order.
const CAUSE_KEYS: &[&str] = &["reason", "message", "field"];

/// A `details` object (or one of its causes) serialized with `keys`, in that order.
#[derive(Debug)]
struct DetailsWire<'a> {
    object: &'a Value,
    keys: &'static [&'static str],
}

impl<'a> DetailsWire<'a> {
    fn new(details: &'a Value) -> Self {
        DetailsWire {
            object: details,
            keys: DETAILS_KEYS,
        }
    }
}

impl serde::Serialize for DetailsWire<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(None)?;
        for &key in self.keys {
            match (key, self.object.get(key)) {
                (_, None) => {}
                ("causes", Some(Value::Array(causes))) => {
                    let causes: Vec<DetailsWire<'_>> = causes
                        .iter()
                        .map(|cause| DetailsWire {
                            object: cause,
                            keys: CAUSE_KEYS,
                        })
                        .collect();
                    map.serialize_entry(key, &causes)?;
                }
                (_, Some(value)) => map.serialize_entry(key, value)?,
            }
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bodies kube-apiserver v1.36 sent (recorded by the conformance test); the
    /// simulator's `details` are built in another key order on purpose.
    #[test]
    fn a_status_reads_byte_for_byte_as_kube_apiserver_writes_it() {
        let forbidden_message = "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled";
        let cases = [
            (
                ApiError {
                    details: Some(json!({
                        "causes": [{
                            "field": "sendInitialEvents",
                            "message": "Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                            "reason": "FieldValueForbidden",
                        }],
                        "kind": "ListOptions",
                        "group": "meta.k8s.io",
                    })),
                    ..ApiError::new(422, "Invalid", forbidden_message)
                },
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","reason":"Invalid","details":{"group":"meta.k8s.io","kind":"ListOptions","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled","field":"sendInitialEvents"}]},"code":422}"#,
            ),
            (
                ApiError::forbidden_path(
                    "system:serviceaccount:openshift-ingress:router",
                    "get",
                    "/metrics",
                ),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"forbidden: User \"system:serviceaccount:openshift-ingress:router\" cannot get path \"/metrics\"","reason":"Forbidden","details":{},"code":403}"#,
            ),
            (
                ApiError::new(
                    500,
                    "InternalError",
                    "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
                ),
                r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled","reason":"InternalError","code":500}"#,
            ),
        ];
        for (error, kube_apiserver) in cases {
            let ours = serde_json::to_string(&error.status_wire()).unwrap_or_default();
            assert_eq!(ours, kube_apiserver);
            // The same object as the JSON value the Rust API hands out.
            let reparsed: Value = serde_json::from_str(&ours).unwrap_or_default();
            assert_eq!(reparsed, error.to_status());
        }
    }
}
