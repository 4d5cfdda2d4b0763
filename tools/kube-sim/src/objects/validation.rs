//! Object defaulting and validation, as kube-apiserver (and OpenShift's route API)
//! apply them on create and update. Errors name the field and never echo secret data.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Map, Value, json};

use crate::error::FieldError;
use crate::resources::{self, ResourceDef, ResourceId};

/// Maximum total size of a Secret's data (keys plus decoded values), as in Kubernetes.
pub const MAX_SECRET_SIZE: usize = 1024 * 1024;

/// Checks a DNS-1123 label (namespace names), with the API server's message.
pub fn dns1123_label(s: &str) -> Result<(), String> {
    kube_common::name::label(s).map_err(|error| error.to_string())
}

/// Checks a DNS-1123 subdomain (names of most objects, hosts), with the API server's
/// message.
pub fn dns1123_subdomain(s: &str) -> Result<(), String> {
    kube_common::name::subdomain(s).map_err(|error| error.to_string())
}

/// Checks a name that must only be a valid URL path segment (RBAC objects).
pub fn path_segment_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name is required".to_string());
    }
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    if s.contains('/') || s.contains('%') {
        return Err("may not contain '/' or '%'".to_string());
    }
    Ok(())
}

/// Validates an object name for a resource.
pub fn validate_name(def: &ResourceDef, name: &str) -> Result<(), String> {
    match def.name {
        "namespaces" => dns1123_label(name),
        "roles" | "rolebindings" | "clusterroles" | "clusterrolebindings" => {
            path_segment_name(name)
        }
        _ => dns1123_subdomain(name),
    }
}

/// Fills in server-side defaults on a new or updated object: a Secret's `stringData`
/// is merged into `data` and its `type` defaults to `Opaque`; a Namespace gets its
/// `kubernetes.io/metadata.name` label, finalizer and `Active` phase; a Route gets
/// `wildcardPolicy: None` and its target references `kind: Service`, `weight: 100`; a
/// Service its type, session affinity, port protocols and
/// target ports ([`crate::objects::network`]; its addresses are allocated by the store).
pub fn apply_defaults(id: ResourceId, obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    match id.def().name {
        "secrets" => {
            if let Some(Value::Object(string_data)) = map.remove("stringData") {
                let data = map
                    .entry("data")
                    .or_insert_with(|| Value::Object(Map::new()));
                if !data.is_object() {
                    *data = Value::Object(Map::new());
                }
                if let Some(data) = data.as_object_mut() {
                    for (k, v) in string_data {
                        let text = match v {
                            Value::String(s) => s,
                            other => other.to_string(),
                        };
                        data.insert(k, Value::String(B64.encode(text.as_bytes())));
                    }
                }
            }
            if map.get("data").is_some_and(Value::is_null) {
                map.remove("data");
            }
            let type_missing = map
                .get("type")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty);
            if type_missing {
                map.insert("type".into(), json!("Opaque"));
            }
        }
        "namespaces" => {
            let name = map
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            if let Some(meta) = map.get_mut("metadata").and_then(Value::as_object_mut) {
                let labels = meta
                    .entry("labels")
                    .or_insert_with(|| Value::Object(Map::new()));
                if !labels.is_object() {
                    *labels = Value::Object(Map::new());
                }
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert("kubernetes.io/metadata.name".into(), json!(name));
                }
            }
            let spec = map.entry("spec").or_insert_with(|| json!({}));
            if let Some(spec) = spec.as_object_mut() {
                spec.entry("finalizers")
                    .or_insert_with(|| json!(["kubernetes"]));
            }
            let status = map.entry("status").or_insert_with(|| json!({}));
            if let Some(status) = status.as_object_mut() {
                status.entry("phase").or_insert_with(|| json!("Active"));
            }
        }
        "routes" => {
            if let Some(spec) = map.get_mut("spec").and_then(Value::as_object_mut) {
                spec.entry("wildcardPolicy")
                    .or_insert_with(|| json!("None"));
                // The CRD's defaults of every target reference.
                let default_target = |target: &mut Value| {
                    if let Some(target) = target.as_object_mut() {
                        target.entry("kind").or_insert_with(|| json!("Service"));
                        target.entry("weight").or_insert_with(|| json!(100));
                    }
                };
                if let Some(to) = spec.get_mut("to") {
                    default_target(to);
                }
                if let Some(backends) = spec
                    .get_mut("alternateBackends")
                    .and_then(Value::as_array_mut)
                {
                    backends.iter_mut().for_each(default_target);
                }
            }
        }
        "services" => crate::objects::network::default_service(map),
        "endpointslices" => crate::objects::network::default_endpoint_slice(map),
        _ => {}
    }
}

/// Validates an object (after defaulting) for create (`old == None`) or update.
pub fn validate(id: ResourceId, obj: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let def = id.def();
    let mut errs = Vec::new();
    validate_metadata(def, obj, &mut errs);
    match def.name {
        "secrets" => validate_secret(obj, old, &mut errs),
        "routes" => validate_route(obj, &mut errs),
        "leases" => crate::objects::lease::validate(obj, &mut errs),
        "roles" | "clusterroles" => validate_role(def, obj, &mut errs),
        "rolebindings" | "clusterrolebindings" => validate_binding(def, obj, old, &mut errs),
        "services" => crate::objects::network::validate_service(obj, old, &mut errs),
        "endpointslices" => crate::objects::network::validate_endpoint_slice(obj, &mut errs),
        _ => {}
    }
    errs
}

fn validate_metadata(def: &ResourceDef, obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(meta) = obj.get("metadata").and_then(Value::as_object) else {
        errs.push(FieldError::required("metadata", ""));
        return;
    };
    match meta.get("name").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(
            "metadata.name",
            "name or generateName is required",
        )),
        Some(name) => {
            if let Err(e) = validate_name(def, name) {
                errs.push(FieldError::invalid("metadata.name", name, e));
            }
        }
    }
    if def.namespaced {
        match meta.get("namespace").and_then(Value::as_str) {
            None | Some("") => errs.push(FieldError::required("metadata.namespace", "")),
            Some(ns) => {
                if let Err(e) = dns1123_label(ns) {
                    errs.push(FieldError::invalid("metadata.namespace", ns, e));
                }
            }
        }
    }
    if let Some(labels) = meta.get("labels") {
        match labels.as_object() {
            Some(labels) => {
                for (k, v) in labels {
                    if let Err(e) = kube_common::labels::key(k) {
                        errs.push(FieldError::invalid("metadata.labels", k, e.to_string()));
                    }
                    match v.as_str() {
                        Some(v) => {
                            if let Err(e) = kube_common::labels::value(v) {
                                errs.push(FieldError::invalid(
                                    format!("metadata.labels[{k}]"),
                                    v,
                                    e.to_string(),
                                ));
                            }
                        }
                        None => errs.push(FieldError::invalid(
                            format!("metadata.labels[{k}]"),
                            v.to_string(),
                            "label values must be strings",
                        )),
                    }
                }
            }
            None if labels.is_null() => {}
            None => errs.push(FieldError::invalid(
                "metadata.labels",
                labels.to_string(),
                "must be a map of strings",
            )),
        }
    }
    if let Some(ann) = meta.get("annotations") {
        match ann.as_object() {
            Some(ann) => {
                let mut total = 0usize;
                for (k, v) in ann {
                    if let Err(e) = kube_common::labels::key(k) {
                        errs.push(FieldError::invalid(
                            "metadata.annotations",
                            k,
                            e.to_string(),
                        ));
                    }
                    if !v.is_string() {
                        errs.push(FieldError::invalid(
                            format!("metadata.annotations[{k}]"),
                            v.to_string(),
                            "annotation values must be strings",
                        ));
                    }
                    total += k.len() + v.as_str().map_or(0, str::len);
                }
                if total > 256 * 1024 {
                    errs.push(FieldError::too_long(
                        "metadata.annotations",
                        "must have at most 262144 bytes",
                    ));
                }
            }
            None if ann.is_null() => {}
            None => errs.push(FieldError::invalid(
                "metadata.annotations",
                ann.to_string(),
                "must be a map of strings",
            )),
        }
    }
}

fn is_config_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k != "."
        && k != ".."
        && k.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn validate_secret(obj: &Value, old: Option<&Value>, errs: &mut Vec<FieldError>) {
    let mut total = 0usize;
    let data = obj.get("data");
    let data_map = match data {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => {
            errs.push(FieldError::invalid_redacted(
                "data",
                "must be a map of base64-encoded values",
            ));
            None
        }
    };
    if let Some(m) = data_map {
        for (k, v) in m {
            if !is_config_key(k) {
                errs.push(FieldError::invalid(
                    "data",
                    k,
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
            match v.as_str() {
                Some(s) => match B64.decode(s) {
                    Ok(bytes) => total += k.len() + bytes.len(),
                    Err(_) => errs.push(FieldError::invalid_redacted(
                        format!("data[{k}]"),
                        "the value is not valid base64 (the value is not shown because it may be secret)",
                    )),
                },
                None if v.is_null() => {}
                None => errs.push(FieldError::invalid_redacted(
                    format!("data[{k}]"),
                    "must be a base64-encoded string",
                )),
            }
        }
    }
    if total > MAX_SECRET_SIZE {
        errs.push(FieldError::too_long(
            "data",
            format!("must have at most {MAX_SECRET_SIZE} bytes"),
        ));
    }
    let ty = obj.get("type").and_then(Value::as_str).unwrap_or("Opaque");
    if ty == "kubernetes.io/tls" {
        for key in ["tls.crt", "tls.key"] {
            if !data_map.is_some_and(|m| m.contains_key(key)) {
                errs.push(FieldError::required(format!("data[{key}]"), ""));
            }
        }
    }
    if let Some(old) = old {
        let old_ty = old.get("type").and_then(Value::as_str).unwrap_or("Opaque");
        if old_ty != ty {
            errs.push(FieldError::invalid("type", ty, "field is immutable"));
        }
        if old.get("immutable").and_then(Value::as_bool) == Some(true) {
            if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
                errs.push(FieldError::forbidden(
                    "immutable",
                    "field is immutable when `immutable` is set",
                ));
            }
            if obj.get("data") != old.get("data") {
                errs.push(FieldError::forbidden(
                    "data",
                    "field is immutable when `immutable` is set",
                ));
            }
        }
    }
}

/// The pattern of `spec.host` and `spec.subdomain` in the Route CRD (DNS labels of
/// letters of either case, digits and `-`).
const ROUTE_HOST_PATTERN: &str = r"^([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9])(\.([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9\-]{0,61}[a-zA-Z0-9]))*$";

/// Whether `host` matches [`ROUTE_HOST_PATTERN`].
fn matches_route_host_pattern(host: &str) -> bool {
    host.split('.').all(|label| {
        let bytes = label.as_bytes();
        !bytes.is_empty()
            && bytes.len() <= 63
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric()
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-')
    })
}

/// The Route CRD's rules (route.openshift.io/v1 as MicroShift installs it: its OpenAPI
/// schema, then its CEL rules), with kube-apiserver's messages. As there, the CEL rules
/// are evaluated only when the schema found no error of a kind they could depend on
/// (required, enum, length); otherwise one `<nil>` cause says they were not checked.
/// The schema's composition rules (anyOf, allOf, not) report themselves as `<nil>`
/// causes around the errors of their first alternative.
fn validate_route(obj: &Value, errs: &mut Vec<FieldError>) {
    let Some(spec) = obj.get("spec").filter(|spec| spec.is_object()) else {
        return;
    };
    fn text(value: Option<&Value>) -> Option<&str> {
        value.and_then(Value::as_str)
    }
    let given = |value: Option<&Value>| text(value).is_some_and(|text| !text.is_empty());
    let composition = |field: &str, rule: &str| {
        FieldError::invalid("<nil>", "", format!("{field:?} must {rule}"))
    };
    let empty_only = |field: &str| FieldError::too_long(field, "may not be more than 0 bytes");
    let tls = spec.get("tls").filter(|tls| tls.is_object());
    let termination = tls.and_then(|tls| text(tls.get("termination")));
    let mut blocking = false;

    // spec: allOf [anyOf [no path, no tls, not passthrough], anyOf [a host, not Subdomain]].
    let mut spec_errors = Vec::new();
    if given(spec.get("path")) && termination == Some("passthrough") {
        spec_errors.push(composition("spec", "validate at least one schema (anyOf)"));
        spec_errors.push(empty_only("spec.path"));
        blocking = true;
    }
    if !given(spec.get("host")) && text(spec.get("wildcardPolicy")) == Some("Subdomain") {
        spec_errors.push(composition("spec", "validate at least one schema (anyOf)"));
        spec_errors.push(composition("spec", "not validate the schema (not)"));
    }
    if !spec_errors.is_empty() {
        errs.append(&mut spec_errors);
        errs.push(composition("spec", "validate all the schemas (allOf)"));
    }

    for field in ["host", "subdomain"] {
        let Some(value) = text(spec.get(field)).filter(|value| !value.is_empty()) else {
            continue;
        };
        let path = format!("spec.{field}");
        if value.len() > 253 {
            errs.push(FieldError::too_long(path, "may not be more than 253 bytes"));
            blocking = true;
        } else if !matches_route_host_pattern(value) {
            errs.push(FieldError::invalid(
                &path,
                value,
                format!("{path} in body should match '{ROUTE_HOST_PATTERN}'"),
            ));
        }
    }
    if let Some(path) = text(spec.get("path"))
        && !path.starts_with('/')
    {
        errs.push(FieldError::invalid(
            "spec.path",
            path,
            "spec.path in body should match '^/'",
        ));
    }

    if let Some(tls) = tls {
        // spec.tls: allOf [anyOf [no certificates, not passthrough], anyOf [no
        // destination CA, not edge]].
        let mut tls_errors = Vec::new();
        if termination == Some("passthrough") {
            let set: Vec<&str> = [
                "caCertificate",
                "certificate",
                "destinationCACertificate",
                "key",
            ]
            .into_iter()
            .filter(|field| given(tls.get(*field)))
            .collect();
            if !set.is_empty() {
                tls_errors.push(composition(
                    "spec.tls",
                    "validate at least one schema (anyOf)",
                ));
                for field in set {
                    tls_errors.push(empty_only(&format!("spec.tls.{field}")));
                }
            }
        }
        if termination == Some("edge") && given(tls.get("destinationCACertificate")) {
            tls_errors.push(composition(
                "spec.tls",
                "validate at least one schema (anyOf)",
            ));
            tls_errors.push(empty_only("spec.tls.destinationCACertificate"));
        }
        if !tls_errors.is_empty() {
            errs.append(&mut tls_errors);
            errs.push(composition("spec.tls", "validate all the schemas (allOf)"));
            blocking = true;
        }
        if let Some(policy) = text(tls.get("insecureEdgeTerminationPolicy"))
            && !matches!(policy, "Allow" | "None" | "Redirect" | "")
        {
            errs.push(FieldError::not_supported(
                "spec.tls.insecureEdgeTerminationPolicy",
                Some(policy.to_string()),
                "supported values: \"Allow\", \"None\", \"Redirect\", \"\"",
            ));
            blocking = true;
        }
        match termination {
            None => {
                errs.push(FieldError::required("spec.tls.termination", ""));
                blocking = true;
            }
            Some("edge" | "reencrypt" | "passthrough") => {}
            Some(other) => {
                errs.push(FieldError::not_supported(
                    "spec.tls.termination",
                    Some(other.to_string()),
                    "supported values: \"edge\", \"reencrypt\", \"passthrough\"",
                ));
                blocking = true;
            }
        }
    }
    match spec.get("to").filter(|to| to.is_object()) {
        None => {
            errs.push(FieldError::required("spec.to", ""));
            blocking = true;
        }
        Some(to) => {
            if text(to.get("name")).is_none() {
                errs.push(FieldError::required("spec.to.name", ""));
                blocking = true;
            }
        }
    }
    if let Some(policy) = text(spec.get("wildcardPolicy"))
        && !matches!(policy, "None" | "Subdomain" | "")
    {
        errs.push(FieldError::not_supported(
            "spec.wildcardPolicy",
            Some(policy.to_string()),
            "supported values: \"None\", \"Subdomain\", \"\"",
        ));
        blocking = true;
    }

    if blocking {
        errs.push(FieldError::invalid_null(
            "<nil>",
            "some validation rules were not checked because the object was invalid; correct \
             the existing errors to complete validation",
        ));
        return;
    }
    // The CEL rules (x-kubernetes-validations). `has()` is true for a field that is set,
    // even to "".
    if let Some(tls) = tls {
        if tls.get("certificate").is_some() && tls.get("externalCertificate").is_some() {
            errs.push(FieldError::invalid_redacted(
                "spec.tls",
                "cannot have both spec.tls.certificate and spec.tls.externalCertificate",
            ));
        }
        if termination == Some("passthrough")
            && text(tls.get("insecureEdgeTerminationPolicy")) == Some("Allow")
        {
            errs.push(FieldError::invalid_redacted(
                "spec.tls",
                "cannot have both spec.tls.termination: passthrough and \
                 spec.tls.insecureEdgeTerminationPolicy: Allow",
            ));
        }
    }
    if termination == Some("passthrough") && spec.get("httpHeaders").is_some() {
        errs.push(FieldError::invalid_redacted(
            "spec",
            "header actions are not permitted when tls termination is passthrough.",
        ));
    }
}

fn validate_role(def: &ResourceDef, obj: &Value, errs: &mut Vec<FieldError>) {
    let rules = match obj.get("rules") {
        None | Some(Value::Null) => return,
        Some(Value::Array(r)) => r,
        Some(_) => {
            errs.push(FieldError::invalid("rules", "", "must be a list"));
            return;
        }
    };
    for (i, rule) in rules.iter().enumerate() {
        let list = |k: &str| rule.get(k).and_then(Value::as_array);
        if list("verbs").is_none_or(Vec::is_empty) {
            errs.push(FieldError::required(
                format!("rules[{i}].verbs"),
                "verbs must contain at least one value",
            ));
        }
        let has_urls = list("nonResourceURLs").is_some_and(|u| !u.is_empty());
        if has_urls && def.namespaced {
            errs.push(FieldError::invalid(
                format!("rules[{i}].nonResourceURLs"),
                "",
                "namespaced rules cannot apply to non-resource URLs",
            ));
        }
        if !has_urls {
            if list("apiGroups").is_none_or(Vec::is_empty) {
                errs.push(FieldError::required(
                    format!("rules[{i}].apiGroups"),
                    "resource rules must supply at least one api group",
                ));
            }
            if list("resources").is_none_or(Vec::is_empty) {
                errs.push(FieldError::required(
                    format!("rules[{i}].resources"),
                    "resource rules must supply at least one resource",
                ));
            }
        }
    }
}

fn validate_binding(
    def: &ResourceDef,
    obj: &Value,
    old: Option<&Value>,
    errs: &mut Vec<FieldError>,
) {
    let role_ref = obj.get("roleRef");
    let kind = role_ref.and_then(|r| r.get("kind")).and_then(Value::as_str);
    let name = role_ref.and_then(|r| r.get("name")).and_then(Value::as_str);
    let allowed: &[&str] = if def.namespaced {
        &["Role", "ClusterRole"]
    } else {
        &["ClusterRole"]
    };
    match kind {
        Some(k) if allowed.contains(&k) => {}
        Some(k) => errs.push(FieldError::not_supported(
            "roleRef.kind",
            Some(k.to_string()),
            format!("supported values: {allowed:?}"),
        )),
        None => errs.push(FieldError::required("roleRef.kind", "")),
    }
    if name.is_none_or(str::is_empty) {
        errs.push(FieldError::required("roleRef.name", ""));
    }
    if let Some(old) = old
        && old.get("roleRef") != role_ref
    {
        errs.push(FieldError::invalid(
            "roleRef",
            role_ref.map(Value::to_string).unwrap_or_default(),
            "cannot change roleRef",
        ));
    }
    if let Some(subjects) = obj.get("subjects").and_then(Value::as_array) {
        for (i, s) in subjects.iter().enumerate() {
            let kind = s.get("kind").and_then(Value::as_str).unwrap_or_default();
            if !["User", "Group", "ServiceAccount"].contains(&kind) {
                errs.push(FieldError::not_supported(
                    format!("subjects[{i}].kind"),
                    Some(kind.to_string()),
                    "supported values: \"ServiceAccount\", \"User\", \"Group\"",
                ));
            }
            if s.get("name")
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::required(format!("subjects[{i}].name"), ""));
            }
            if kind == "ServiceAccount"
                && !def.namespaced
                && s.get("namespace")
                    .and_then(Value::as_str)
                    .is_none_or(str::is_empty)
            {
                errs.push(FieldError::required(format!("subjects[{i}].namespace"), ""));
            }
        }
    }
}

/// The resource an object belongs to, from its `apiVersion` and `kind`.
pub fn resource_of(obj: &Value) -> Result<ResourceId, String> {
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .ok_or("missing apiVersion")?;
    let kind = obj
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("missing kind")?;
    resources::by_kind(api_version, kind)
        .ok_or_else(|| format!("the simulator does not serve {kind} in {api_version}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::resources::{NAMESPACES, ROUTES, SECRETS};

    #[test]
    fn names() {
        assert!(dns1123_subdomain("a.b-c").is_ok());
        assert!(dns1123_subdomain("A").is_err());
        assert!(dns1123_subdomain("a..b").is_err());
        assert!(dns1123_label("a.b").is_err());
        assert!(path_segment_name("system:router").is_ok());
        assert!(path_segment_name("a/b").is_err());
    }

    #[test]
    fn tls_secret_needs_both_keys_and_base64() {
        let mut s = json!({"apiVersion":"v1","kind":"Secret","metadata":{"name":"x","namespace":"n"},
            "type":"kubernetes.io/tls","data":{"tls.crt":"!!notbase64"}});
        apply_defaults(SECRETS, &mut s);
        let errs = validate(SECRETS, &s, None);
        let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert!(
            text.iter()
                .any(|t| t.contains("data[tls.key]: Required value")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.contains("data[tls.crt]: Invalid value")),
            "{text:?}"
        );
        assert!(
            !text.iter().any(|t| t.contains("notbase64")),
            "secret bytes leaked: {text:?}"
        );
    }

    #[test]
    fn string_data_is_merged() {
        let mut s = json!({"metadata":{"name":"x","namespace":"n"},"stringData":{"a":"hello"}});
        apply_defaults(SECRETS, &mut s);
        assert_eq!(s["data"]["a"], "aGVsbG8=");
        assert_eq!(s["type"], "Opaque");
        assert!(s.get("stringData").is_none());
    }

    #[test]
    fn namespace_defaults() {
        let mut n = json!({"metadata":{"name":"team-a"}});
        apply_defaults(NAMESPACES, &mut n);
        assert_eq!(
            n["metadata"]["labels"]["kubernetes.io/metadata.name"],
            "team-a"
        );
        assert_eq!(n["status"]["phase"], "Active");
    }

    #[test]
    fn route_tls_rules() {
        let route =
            |spec: Value| json!({"metadata": {"name": "r", "namespace": "n"}, "spec": spec});
        let to = json!({"kind": "Service", "name": "app"});
        // The CRD accepts a passthrough route with an external certificate (the router
        // refuses it), upper-case hosts and any external certificate name.
        for spec in [
            json!({"host": "a.example.com", "to": to,
                   "tls": {"termination": "passthrough", "externalCertificate": {"name": "s"}}}),
            json!({"host": "A.example.com", "to": to,
                   "tls": {"termination": "edge", "externalCertificate": {"name": "Not_A_Name"}}}),
            json!({"host": "a.example.com", "to": to,
                   "tls": {"termination": "edge", "key": "k", "externalCertificate": {"name": "s"}}}),
        ] {
            assert_eq!(
                validate(ROUTES, &route(spec.clone()), None),
                vec![],
                "{spec}"
            );
        }
        let fields = |spec: Value| -> Vec<String> {
            validate(ROUTES, &route(spec), None)
                .into_iter()
                .map(|error| error.field)
                .collect()
        };
        // CEL: has() holds for a field set to "".
        assert_eq!(
            fields(json!({"host": "a.example.com", "to": to,
                          "tls": {"termination": "edge", "certificate": "", "externalCertificate": {"name": "s"}}})),
            ["spec.tls"]
        );
        assert_eq!(
            fields(json!({"host": "a.example.com", "to": to,
                          "tls": {"termination": "passthrough", "certificate": "c"}})),
            ["<nil>", "spec.tls.certificate", "<nil>", "<nil>"]
        );
        assert_eq!(
            fields(json!({"host": "a.example.com", "to": to, "tls": {}})),
            ["spec.tls.termination", "<nil>"]
        );
        assert_eq!(
            fields(json!({"host": "a.example.com"})),
            ["spec.to", "<nil>"]
        );
    }
}
