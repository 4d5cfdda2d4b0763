//! authorization.k8s.io/v1 reviews, answered from the same authorizer that guards
//! requests: SubjectAccessReview, LocalSubjectAccessReview, SelfSubjectAccessReview
//! and SelfSubjectRulesReview.
//!
//! As in Kubernetes, a review for `list` or `watch` with a `name` is allowed by a
//! `resourceNames` rule (the request rule — name only via a `metadata.name` field
//! selector — is the API handler's business).

use serde_json::{Value, json};

use crate::auth::rbac::{AccessVerb, Attributes, Authorizer};
use crate::auth::users::UserInfo;
use crate::error::{ApiError, FieldError};
use crate::resources::ResourceDef;

fn s(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("").to_string()
}

fn attributes(spec: &Value) -> Result<Attributes, Vec<FieldError>> {
    let ra = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let na = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    match (ra, na) {
        (Some(ra), None) => Ok(Attributes {
            verb: AccessVerb::parse(&s(ra, "verb")),
            group: s(ra, "group"),
            resource: s(ra, "resource"),
            subresource: s(ra, "subresource"),
            namespace: s(ra, "namespace"),
            name: s(ra, "name"),
            path: None,
        }),
        (None, Some(na)) => Ok(Attributes::non_resource(
            AccessVerb::parse(&s(na, "verb")),
            s(na, "path"),
        )),
        _ => Err(vec![FieldError::invalid(
            "spec.resourceAttributes",
            "",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )]),
    }
}

fn decision_status(authorizer: &Authorizer, user: &UserInfo, attrs: &Attributes) -> Value {
    let d = authorizer.authorize(user, attrs);
    let mut status = json!({ "allowed": d.allowed });
    if !d.reason.is_empty() {
        status["reason"] = json!(d.reason);
    }
    status
}

/// Answers a review of kind `def` posted by `requester` (to a URL in `url_namespace`
/// for the local kind); the response is the review with its `status` filled in.
pub(crate) fn answer(
    authorizer: &Authorizer,
    def: &ResourceDef,
    url_namespace: Option<&str>,
    requester: &UserInfo,
    mut review: Value,
    rules_incomplete: bool,
) -> Result<Value, ApiError> {
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let invalid = |errs: Vec<FieldError>| ApiError::invalid(def, "", &errs);
    let status = match def.name {
        "subjectaccessreviews" | "localsubjectaccessreviews" => {
            let mut attrs = attributes(&spec).map_err(invalid)?;
            if def.name == "localsubjectaccessreviews" {
                let url_ns = url_namespace.unwrap_or_default().to_string();
                if attrs.namespace.is_empty() {
                    attrs.namespace = url_ns.clone();
                } else if attrs.namespace != url_ns {
                    return Err(invalid(vec![FieldError::invalid(
                        "spec.resourceAttributes.namespace",
                        attrs.namespace.clone(),
                        "must match metadata.namespace",
                    )]));
                }
            }
            let user = UserInfo {
                name: s(&spec, "user"),
                groups: spec
                    .get("groups")
                    .and_then(Value::as_array)
                    .map(|g| {
                        g.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            if user.name.is_empty() && user.groups.is_empty() {
                return Err(invalid(vec![FieldError::invalid(
                    "spec.user",
                    "",
                    "at least one of user or group must be specified",
                )]));
            }
            decision_status(authorizer, &user, &attrs)
        }
        "selfsubjectaccessreviews" => {
            let attrs = attributes(&spec).map_err(invalid)?;
            decision_status(authorizer, requester, &attrs)
        }
        "selfsubjectrulesreviews" => {
            let ns = s(&spec, "namespace");
            let (resource_rules, non_resource_rules) = authorizer.rules_for(requester, &ns);
            json!({
                "resourceRules": resource_rules,
                "nonResourceRules": non_resource_rules,
                "incomplete": rules_incomplete,
            })
        }
        _ => return Err(ApiError::no_route()),
    };
    if let Some(map) = review.as_object_mut() {
        map.insert("apiVersion".into(), json!(def.api_version()));
        map.insert("kind".into(), json!(def.kind));
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        if let Some(meta) = meta.as_object_mut() {
            meta.insert("creationTimestamp".into(), Value::Null);
            if let Some(ns) = url_namespace {
                meta.insert("namespace".into(), json!(ns));
            }
        }
        map.insert("status".into(), status);
    }
    Ok(review)
}
