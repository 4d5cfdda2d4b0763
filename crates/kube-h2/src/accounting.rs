//! Request accounting: every request the client sends, counted by what it asked for
//! (resource and verb, named as kube-apiserver's request-info names them) and the HTTP
//! status it got, plus retries.
//!
//! This is the client's side of the API server's `apiserver_request_total`: nothing is
//! retried underneath it (there is no retry layer in the stack), so a 429 the server
//! sent is a 429 counted here, and a retry is a request that whoever retried marked
//! with [`kube_common::backoff::Retry`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Uri};
use kube_common::Verb;

use crate::pool::lock;

/// What a request asks for, in kube-apiserver's request-info terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RequestTarget<'a> {
    /// The resource, with its subresource (`secrets`, `routes/status`); for a request
    /// that is not about a resource (discovery, `/version`), the URL path.
    pub(crate) resource: Cow<'a, str>,
    /// The verb.
    pub(crate) verb: Verb,
}

/// Subresources of a namespace: `/api/v1/namespaces/{name}/{status|finalize}`.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

impl<'a> RequestTarget<'a> {
    /// Reads the target of a request the way kube-apiserver's `RequestInfoFactory`
    /// does: `/api/{version}/...` and `/apis/{group}/{version}/...` are resource
    /// requests; the verb follows from the method, whether the path names an object,
    /// and `watch=true`. (The server also reads an exact `metadata.name` field selector
    /// as the request's name, for authorization; that does not change the verb.)
    pub(crate) fn of(method: &Method, uri: &'a Uri) -> Self {
        let path = uri.path();
        let verb_of_method = match *method {
            Method::POST => Verb::Create,
            Method::PUT => Verb::Update,
            Method::PATCH => Verb::Patch,
            Method::DELETE => Verb::Delete,
            // GET, HEAD, and methods the API does not serve (OPTIONS...), which the API
            // server also files under a read.
            _ => Verb::Get,
        };
        let non_resource = || Self {
            resource: Cow::Borrowed(path),
            verb: verb_of_method,
        };
        let mut parts = path.trim_matches('/').split('/');
        // `/api/v1/...` (the core group) or `/apis/{group}/{version}/...`.
        let prefix_ok = match parts.next() {
            Some("api") => parts.next().is_some(),
            Some("apis") => parts.next().is_some() && parts.next().is_some(),
            _ => false,
        };
        // What follows the group and version: at most `watch/namespaces/{ns}/{resource}
        // /{name}/{subresource}`; later segments say nothing about the target. Held in
        // an array, as counting every request must not allocate.
        let mut segments = [""; 6];
        let mut count = 0;
        for segment in parts.filter(|p| !p.is_empty()).take(segments.len()) {
            segments[count] = segment;
            count += 1;
        }
        let mut rest = &segments[..count];
        if !prefix_ok || rest.is_empty() {
            return non_resource();
        }
        let mut verb = verb_of_method;
        // The deprecated `/watch/` path prefix.
        if rest[0] == "watch" {
            rest = &rest[1..];
            verb = Verb::Watch;
            if rest.is_empty() {
                return non_resource();
            }
        }
        if rest[0] == "namespaces" && rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
        }
        let resource = rest[0];
        let has_name = rest.len() > 1;
        let subresource = rest.get(2).copied();
        if !has_name && verb == Verb::Get {
            verb = if query_flag(uri, "watch") {
                Verb::Watch
            } else {
                Verb::List
            };
        }
        if !has_name && verb == Verb::Delete {
            verb = Verb::DeleteCollection;
        }
        let resource = match subresource {
            Some(sub) => Cow::Owned(format!("{resource}/{sub}")),
            None => Cow::Borrowed(resource),
        };
        Self { resource, verb }
    }
}

/// Whether the query sets `name` to a true value (`true` or `1`, as Go's `ParseBool`
/// also reads `t`/`T`/`TRUE`/`True`).
fn query_flag(uri: &Uri, name: &str) -> bool {
    uri.query().is_some_and(|query| {
        query.split('&').any(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            key == name && matches!(value, "1" | "t" | "T" | "true" | "TRUE" | "True")
        })
    })
}

/// The `Retry-After` of a response (the limiter reads it the same way).
pub(crate) use kube_common::adaptive::retry_after;

/// One response (or failed request), as an observer sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResponseRecord<'a> {
    /// The resource with subresource (`secrets`, `routes/status`), or the URL path of a
    /// request that is not about a resource.
    pub resource: &'a str,
    /// The verb, as kube-apiserver names it.
    pub verb: Verb,
    /// The HTTP status; `None` when no response arrived (connection failed, timed out).
    pub code: Option<u16>,
    /// Whether the request was marked as a retry ([`kube_common::backoff::Retry`]).
    pub retry: bool,
    /// The response's `Retry-After`, when it had one (429s, some 5xx).
    pub retry_after: Option<Duration>,
}

/// Told about every response the client receives (and every request that got none).
///
/// Called on the request's task as its response headers arrive: it must return at once
/// (count, or hand over to a channel), never block.
pub trait RequestObserver: Send + Sync + 'static {
    /// A response arrived, or the request failed without one.
    fn response(&self, record: &ResponseRecord<'_>);
}

/// Responses of one resource and verb with one outcome.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct ResponseCount {
    /// The resource with subresource, or the URL path of a non-resource request.
    pub resource: String,
    /// The verb.
    pub verb: Verb,
    /// The HTTP status; `None` for requests that got no response.
    pub code: Option<u16>,
    /// How many.
    pub count: u64,
}

/// Retries of one resource and verb.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub struct RetryCount {
    /// The resource with subresource, or the URL path of a non-resource request.
    pub resource: String,
    /// The verb.
    pub verb: Verb,
    /// How many requests were marked as retries.
    pub count: u64,
}

/// A snapshot of the client's request accounting since it was built.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestStats {
    /// Every (resource, verb, outcome) seen, sorted.
    pub responses: Vec<ResponseCount>,
    /// Every (resource, verb) retried, sorted.
    pub retries: Vec<RetryCount>,
}

impl RequestStats {
    /// Responses for `resource` and `verb` with status `code` (`None`: no response).
    pub fn count(&self, resource: &str, verb: Verb, code: Option<u16>) -> u64 {
        self.responses
            .iter()
            .filter(|r| r.resource == resource && r.verb == verb && r.code == code)
            .map(|r| r.count)
            .sum()
    }

    /// Responses for `resource` and `verb`, whatever the outcome.
    pub fn requests(&self, resource: &str, verb: Verb) -> u64 {
        self.responses
            .iter()
            .filter(|r| r.resource == resource && r.verb == verb)
            .map(|r| r.count)
            .sum()
    }

    /// Responses with status `code`, over every resource and verb.
    pub fn with_code(&self, code: u16) -> u64 {
        self.responses
            .iter()
            .filter(|r| r.code == Some(code))
            .map(|r| r.count)
            .sum()
    }

    /// Every request counted (with or without a response).
    pub fn total(&self) -> u64 {
        self.responses.iter().map(|r| r.count).sum()
    }

    /// Retries of `resource` and `verb`.
    pub fn retries_of(&self, resource: &str, verb: Verb) -> u64 {
        self.retries
            .iter()
            .filter(|r| r.resource == resource && r.verb == verb)
            .map(|r| r.count)
            .sum()
    }

    /// Every retry counted.
    pub fn retries_total(&self) -> u64 {
        self.retries.iter().map(|r| r.count).sum()
    }
}

/// Counts of one resource.
#[derive(Default)]
struct ResourceCounts {
    responses: HashMap<(Verb, Option<u16>), u64>,
    retries: HashMap<Verb, u64>,
}

/// The live accounting shared by the transport and the handles.
#[derive(Default)]
pub(crate) struct Accounting {
    /// Guards the counts per resource (looked up by `&str`, so counting a request
    /// allocates only for a resource seen for the first time). Held for one map update.
    counts: Mutex<HashMap<Box<str>, ResourceCounts>>,
    observer: Option<Arc<dyn RequestObserver>>,
}

impl fmt::Debug for Accounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Accounting")
            .field("observer", &self.observer.is_some())
            .finish_non_exhaustive()
    }
}

impl Accounting {
    pub(crate) fn new(observer: Option<Arc<dyn RequestObserver>>) -> Self {
        Self {
            counts: Mutex::default(),
            observer,
        }
    }

    /// Counts one outcome and tells the observer.
    pub(crate) fn record(&self, record: &ResponseRecord<'_>) {
        {
            let mut counts = lock(&self.counts);
            let resource = match counts.get_mut(record.resource) {
                Some(existing) => existing,
                None => counts.entry(record.resource.into()).or_default(),
            };
            *resource
                .responses
                .entry((record.verb, record.code))
                .or_default() += 1;
            if record.retry {
                *resource.retries.entry(record.verb).or_default() += 1;
            }
        }
        if let Some(observer) = &self.observer {
            observer.response(record);
        }
    }

    pub(crate) fn snapshot(&self) -> RequestStats {
        let mut stats = RequestStats::default();
        {
            let counts = lock(&self.counts);
            for (resource, counts) in counts.iter() {
                for (&(verb, code), &count) in &counts.responses {
                    stats.responses.push(ResponseCount {
                        resource: resource.to_string(),
                        verb,
                        code,
                        count,
                    });
                }
                for (&verb, &count) in &counts.retries {
                    stats.retries.push(RetryCount {
                        resource: resource.to_string(),
                        verb,
                        count,
                    });
                }
            }
        }
        stats.responses.sort();
        stats.retries.sort();
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, uri: &str) -> (String, Verb) {
        let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("{uri}: {e}"));
        let target = RequestTarget::of(&method, &uri);
        (target.resource.into_owned(), target.verb)
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
    fn counts_by_resource_verb_and_code_and_retries_apart() {
        let accounting = Accounting::default();
        let record = |resource, verb, code, retry| ResponseRecord {
            resource,
            verb,
            code,
            retry,
            retry_after: None,
        };
        accounting.record(&record("secrets", Verb::Watch, Some(200), false));
        accounting.record(&record("secrets", Verb::Watch, Some(429), false));
        accounting.record(&record("secrets", Verb::Watch, Some(200), true));
        accounting.record(&record("secrets", Verb::List, None, true));
        accounting.record(&record("routes/status", Verb::Update, Some(409), false));
        let stats = accounting.snapshot();
        assert_eq!(stats.count("secrets", Verb::Watch, Some(200)), 2);
        assert_eq!(stats.count("secrets", Verb::Watch, Some(429)), 1);
        assert_eq!(stats.requests("secrets", Verb::Watch), 3);
        assert_eq!(stats.count("secrets", Verb::List, None), 1);
        assert_eq!(stats.with_code(429), 1);
        assert_eq!(stats.total(), 5);
        assert_eq!(stats.retries_of("secrets", Verb::Watch), 1);
        assert_eq!(stats.retries_of("secrets", Verb::List), 1);
        assert_eq!(stats.retries_total(), 2);
        // Sorted, so that exporters and tests see a stable order.
        let resources: Vec<&str> = stats
            .responses
            .iter()
            .map(|r| r.resource.as_str())
            .collect();
        assert_eq!(
            resources,
            ["routes/status", "secrets", "secrets", "secrets"]
        );
    }
}
