//! Turns a method and URL into a request the simulator serves: what kube-apiserver's
//! RequestInfo resolves ([`kube_common::request_info`], the grammar the daemon counts
//! its requests by), checked against the resources served and decoded: a resource
//! request (verb, resource, namespace, name, subresource) or a non-resource request
//! (discovery, health).

use std::collections::HashMap;

use http::Method;
use kube_common::Verb;
use kube_common::request_info::RequestInfo;
use percent_encoding::percent_decode_str;

use crate::error::ApiError;
use crate::resources::{self, ResourceId};

/// Query parameters (the last value of a repeated key wins).
pub(crate) type Query = HashMap<String, String>;

/// A request for a resource.
#[derive(Debug, Clone)]
pub(crate) struct ResourceRequest {
    pub id: ResourceId,
    pub verb: Verb,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
    pub query: Query,
}

impl ResourceRequest {
    /// `resource` or `resource/subresource`, as stats and fail rules name it.
    pub(crate) fn resource_key(&self) -> String {
        match &self.subresource {
            Some(s) => format!("{}/{s}", self.id.def().name),
            None => self.id.def().name.to_string(),
        }
    }

    pub(crate) fn param(&self, key: &str) -> Option<&str> {
        self.query.get(key).map(String::as_str)
    }

    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.param(key), Some("true" | "1"))
    }
}

/// What a request is.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    Resource(ResourceRequest),
    /// A non-resource URL (discovery, version, health, openapi).
    NonResource {
        path: String,
    },
}

fn parse_query(raw: Option<&str>) -> Query {
    raw.map(|q| {
        form_urlencoded::parse(q.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect()
    })
    .unwrap_or_default()
}

fn decode(seg: &str) -> Result<String, ApiError> {
    percent_decode_str(seg)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            ApiError::bad_request(format!("invalid percent-encoding in path segment {seg:?}"))
        })
}

/// Classifies a request, as kube-apiserver reads it ([`RequestInfo`]), against the
/// resources the simulator serves. Unknown API paths yield 404 Status errors; a method
/// the resource or URL does not take, 405.
pub(crate) fn classify(
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Result<Target, ApiError> {
    let info = match RequestInfo::parse(method, path, query) {
        RequestInfo::Resource(info) => info,
        RequestInfo::NonResource { .. } => {
            return Ok(Target::NonResource {
                path: if path.is_empty() {
                    "/".into()
                } else {
                    path.to_string()
                },
            });
        }
    };
    if info.excess {
        return Err(ApiError::no_route());
    }
    let resource = decode(info.resource)?;
    let namespace = info.namespace.map(decode).transpose()?;
    let name = info.name.map(decode).transpose()?;
    let subresource = info.subresource.map(decode).transpose()?;
    let mut query = parse_query(query);
    let id = resources::find(info.group, info.version, &resource).ok_or_else(ApiError::no_route)?;
    let def = id.def();
    if namespace.is_some() && !def.namespaced {
        return Err(ApiError::no_route());
    }
    if let Some(sub) = &subresource
        && !(sub == "status" && def.status_subresource)
    {
        return Err(ApiError::no_route());
    }
    let verb = info.verb;
    // The method that verb takes, on an object or a collection as the verb needs.
    let method_fits = match verb {
        Verb::Get | Verb::List | Verb::Watch => *method == Method::GET,
        Verb::Create => *method == Method::POST && name.is_none(),
        Verb::Update | Verb::Patch | Verb::Delete => name.is_some(),
        Verb::DeleteCollection => true,
    };
    if !method_fits {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        )));
    }
    let served =
        def.verbs.contains(&verb) || (verb == Verb::Watch && def.verbs.contains(&Verb::List));
    if !served {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({verb} {})",
            def.name
        )));
    }
    if def.namespaced && namespace.is_none() && !matches!(verb, Verb::List | Verb::Watch) {
        return Err(ApiError::no_route());
    }
    if verb == Verb::Watch
        && let Some(n) = &name
    {
        // A watch on a single object URL is a watch with a metadata.name selector.
        let selector = format!(
            "metadata.name={}",
            crate::objects::selectors::escape_field_value(n)
        );
        let combined = match query.get("fieldSelector").filter(|s| !s.is_empty()) {
            Some(existing) => format!("{existing},{selector}"),
            None => selector,
        };
        query.insert("fieldSelector".into(), combined);
    }
    Ok(Target::Resource(ResourceRequest {
        id,
        verb,
        namespace,
        name: if verb == Verb::Watch { None } else { name },
        subresource,
        query,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn res(method: Method, path: &str, q: Option<&str>) -> ResourceRequest {
        match classify(&method, path, q).unwrap() {
            Target::Resource(r) => r,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths() {
        let r = res(
            Method::GET,
            "/api/v1/namespaces/ns1/secrets",
            Some("watch=true"),
        );
        assert_eq!((r.verb, r.namespace.as_deref()), (Verb::Watch, Some("ns1")));
        let r = res(Method::GET, "/api/v1/namespaces/ns1", None);
        assert_eq!(
            (r.verb, r.id.def().name, r.name.as_deref()),
            (Verb::Get, "namespaces", Some("ns1"))
        );
        let r = res(Method::PUT, "/api/v1/namespaces/ns1/status", None);
        assert_eq!(r.subresource.as_deref(), Some("status"));
        let r = res(
            Method::PUT,
            "/apis/route.openshift.io/v1/namespaces/a/routes/r/status",
            None,
        );
        assert_eq!(r.resource_key(), "routes/status");
        let r = res(Method::GET, "/api/v1/secrets", None);
        assert_eq!((r.verb, r.namespace), (Verb::List, None));
        let r = res(Method::GET, "/api/v1/watch/namespaces/a/secrets/x", None);
        assert_eq!(r.verb, Verb::Watch);
        assert_eq!(r.param("fieldSelector"), Some("metadata.name=x"));
        assert!(classify(&Method::GET, "/api/v1/namespaces/a/widgets", None).is_err());
        assert!(classify(&Method::POST, "/api/v1/secrets", None).is_err());
        assert!(matches!(
            classify(&Method::GET, "/apis", None).unwrap(),
            Target::NonResource { .. }
        ));
    }
}
