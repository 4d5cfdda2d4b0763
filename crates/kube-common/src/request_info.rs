//! What a request to the API server is about, read from its method and URL the way
//! kube-apiserver's `RequestInfoFactory` reads it: a resource request (verb, group,
//! version, namespace, resource, name, subresource) or a request that is not about a
//! resource (discovery, `/version`, health).
//!
//! The client counts its requests by it and the simulator routes them by it, so both
//! name a request as the API server does (`apiserver_request_total`). Reading a request
//! allocates nothing: the parts borrow from the path, still percent-encoded.
//!
//! ```
//! use http::Method;
//! use kube_common::Verb;
//! use kube_common::request_info::RequestInfo;
//!
//! let info = RequestInfo::parse(&Method::GET, "/api/v1/namespaces/shop/secrets", Some("watch=1"));
//! assert_eq!(info.verb(), Verb::Watch);
//! assert_eq!(info.resource_key(), "secrets");
//! let status = "/apis/route.openshift.io/v1/namespaces/shop/routes/r/status";
//! assert_eq!(RequestInfo::parse(&Method::PUT, status, None).resource_key(), "routes/status");
//! ```

use std::borrow::Cow;

use http::Method;

use crate::Verb;

/// Subresources of a namespace: `/api/v1/namespaces/{name}/{status|finalize}`.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// A request about a resource: `/api/{version}/...` (the core group) or
/// `/apis/{group}/{version}/...`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceInfo<'a> {
    /// The API group; empty for the core group.
    pub group: &'a str,
    /// The API version.
    pub version: &'a str,
    /// The namespace the resource is under (`/namespaces/{namespace}/{resource}...`).
    /// `None` for a cluster-wide request, and for a namespace object itself
    /// (`/namespaces/{name}`, `.../status`, `.../finalize`), whose name the API server
    /// also reports as its namespace.
    pub namespace: Option<&'a str>,
    /// The resource (`secrets`).
    pub resource: &'a str,
    /// The object's name, when the path names one.
    pub name: Option<&'a str>,
    /// The subresource (`status`), when the path names one.
    pub subresource: Option<&'a str>,
    /// Whether more segments follow the subresource (no resource has any: the API
    /// server answers 404).
    pub excess: bool,
    /// The verb.
    pub verb: Verb,
}

/// What a request is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestInfo<'a> {
    /// A request about a resource.
    Resource(ResourceInfo<'a>),
    /// Any other request (discovery, `/version`, `/healthz`), named by its path.
    NonResource {
        /// The URL path.
        path: &'a str,
        /// The verb of its method.
        verb: Verb,
    },
}

impl<'a> RequestInfo<'a> {
    /// Reads a request as kube-apiserver does: the verb follows from the method,
    /// whether the path names an object, the deprecated `/watch/` prefix, and
    /// `watch=true` in the `query`. (The server also reads an exact `metadata.name`
    /// field selector as the request's name, for authorization; that does not change
    /// the verb.)
    pub fn parse(method: &Method, path: &'a str, query: Option<&str>) -> Self {
        let verb_of_method = match *method {
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            // GET, HEAD, and methods the API does not serve (OPTIONS...), which the API
            // server also files under a read.
            _ => Verb::Get,
        };
        let non_resource = Self::NonResource {
            path,
            verb: verb_of_method,
        };
        let mut parts = path.split('/').filter(|part| !part.is_empty());
        let (group, version) = match (parts.next(), parts.next()) {
            (Some("api"), Some(version)) => ("", version),
            (Some("apis"), Some(group)) => match parts.next() {
                Some(version) => (group, version),
                None => return non_resource,
            },
            _ => return non_resource,
        };
        // What follows the group and version: at most `watch/namespaces/{ns}/{resource}
        // /{name}/{subresource}` says what the request is about, and a seventh segment
        // that there are more. Held in an array: counting every request must not
        // allocate.
        let mut segments = [""; 7];
        let mut count = 0;
        for part in parts.take(segments.len()) {
            segments[count] = part;
            count += 1;
        }
        let mut rest = &segments[..count];
        let mut verb = verb_of_method;
        match rest {
            [] | ["watch"] => return non_resource,
            ["watch", after @ ..] => {
                rest = after;
                verb = Verb::Watch;
            }
            _ => {}
        }
        let mut namespace = None;
        if let ["namespaces", name, next, ..] = rest
            && !NAMESPACE_SUBRESOURCES.contains(next)
        {
            namespace = Some(*name);
            rest = &rest[2..];
        }
        let (resource, name, subresource, excess) = match rest {
            [resource] => (*resource, None, None, false),
            [resource, name] => (*resource, Some(*name), None, false),
            [resource, name, subresource, after @ ..] => (
                *resource,
                Some(*name),
                Some(*subresource),
                !after.is_empty(),
            ),
            [] => return non_resource,
        };
        if name.is_none() && verb == Verb::Get {
            verb = if query_flag(query, "watch") {
                Verb::Watch
            } else {
                Verb::List
            };
        }
        if name.is_none() && verb == Verb::Delete {
            verb = Verb::DeleteCollection;
        }
        Self::Resource(ResourceInfo {
            group,
            version,
            namespace,
            resource,
            name,
            subresource,
            excess,
            verb,
        })
    }

    /// The verb.
    pub fn verb(&self) -> Verb {
        match self {
            Self::Resource(info) => info.verb,
            Self::NonResource { verb, .. } => *verb,
        }
    }

    /// How the request is counted: `resource` or `resource/subresource` (`secrets`,
    /// `routes/status`), or the path of a request that is not about a resource.
    /// Allocates only for a subresource.
    pub fn resource_key(&self) -> Cow<'a, str> {
        match *self {
            Self::Resource(ResourceInfo {
                resource,
                subresource: Some(subresource),
                ..
            }) => Cow::Owned(format!("{resource}/{subresource}")),
            Self::Resource(ResourceInfo { resource, .. }) => Cow::Borrowed(resource),
            Self::NonResource { path, .. } => Cow::Borrowed(path),
        }
    }
}

/// Whether `query` sets `name` to a true value, as Go's `strconv.ParseBool` reads one
/// (`1`, `t`, `T`, `true`, `TRUE`, `True`).
pub fn query_flag(query: Option<&str>, name: &str) -> bool {
    query.is_some_and(|query| {
        query.split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == name && matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, uri: &str) -> (String, Verb) {
        let (path, query) = match uri.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (uri, None),
        };
        let info = RequestInfo::parse(&method, path, query);
        (info.resource_key().into_owned(), info.verb())
    }

    /// The cases of kube-apiserver's `TestGetAPIRequestInfo` that a client can send.
    #[test]
    fn resource_and_verb_as_the_api_server_reads_them() {
        let cases = [
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets",
                "secrets",
                Verb::List,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets?fieldSelector=metadata.name%3Da",
                "secrets",
                Verb::List,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets?watch=true&resourceVersion=5",
                "secrets",
                Verb::Watch,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets?watch=1",
                "secrets",
                Verb::Watch,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets?watch=false",
                "secrets",
                Verb::List,
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/ns/secrets",
                "secrets",
                Verb::Watch,
            ),
            (
                Method::GET,
                "/api/v1/namespaces/ns/secrets/a",
                "secrets",
                Verb::Get,
            ),
            (Method::GET, "/api/v1/secrets", "secrets", Verb::List),
            (Method::GET, "/api/v1/namespaces", "namespaces", Verb::List),
            (
                Method::GET,
                "/api/v1/namespaces/ns",
                "namespaces",
                Verb::Get,
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/status",
                "namespaces/status",
                Verb::Update,
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/ns/finalize",
                "namespaces/finalize",
                Verb::Update,
            ),
            (
                Method::POST,
                "/api/v1/namespaces/ns/secrets",
                "secrets",
                Verb::Create,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/secrets/a",
                "secrets",
                Verb::Delete,
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/ns/secrets",
                "secrets",
                Verb::DeleteCollection,
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/ns/secrets/a",
                "secrets",
                Verb::Patch,
            ),
            (
                Method::PUT,
                "/apis/route.openshift.io/v1/namespaces/ns/routes/r/status",
                "routes/status",
                Verb::Update,
            ),
            (
                Method::GET,
                "/apis/route.openshift.io/v1/routes?watch=true",
                "routes",
                Verb::Watch,
            ),
            (
                Method::POST,
                "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                "selfsubjectrulesreviews",
                Verb::Create,
            ),
            // Not about a resource: discovery and the like, filed under the path.
            (Method::GET, "/api", "/api", Verb::Get),
            (Method::GET, "/api/v1", "/api/v1", Verb::Get),
            (
                Method::GET,
                "/apis/route.openshift.io/v1",
                "/apis/route.openshift.io/v1",
                Verb::Get,
            ),
            (Method::GET, "/version", "/version", Verb::Get),
        ];
        for (method, uri, resource, verb) in cases {
            let (got_resource, got_verb) = target(method, uri);
            assert_eq!((got_resource.as_str(), got_verb), (resource, verb), "{uri}");
        }
    }

    #[test]
    fn the_parts_of_a_resource_request() {
        let parse = |method, path| match RequestInfo::parse(&method, path, None) {
            RequestInfo::Resource(info) => info,
            other => panic!("{path}: {other:?}"),
        };
        let info = parse(
            Method::PUT,
            "/apis/route.openshift.io/v1/namespaces/a/routes/r/status",
        );
        assert_eq!(
            (info.group, info.version, info.namespace, info.resource),
            ("route.openshift.io", "v1", Some("a"), "routes")
        );
        assert_eq!(
            (info.name, info.subresource, info.excess),
            (Some("r"), Some("status"), false)
        );
        let namespace = parse(Method::GET, "/api/v1/namespaces/ns1");
        assert_eq!(
            (namespace.namespace, namespace.resource, namespace.name),
            (None, "namespaces", Some("ns1"))
        );
        let legacy = parse(Method::GET, "/api/v1/watch/namespaces/a/secrets/x");
        assert_eq!((legacy.verb, legacy.name), (Verb::Watch, Some("x")));
        assert!(parse(Method::GET, "/api/v1/namespaces/a/secrets/x/status/more").excess);
        assert!(parse(Method::GET, "/api/v1/namespaces/a/secrets/x/y/z/w/v").excess);
    }
}
