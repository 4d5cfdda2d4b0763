//! Request accounting: every request the client sends, counted by what it asked for
//! (resource and verb, named as kube-apiserver's request-info names them:
//! [`kube_common::request_info`]) and the HTTP status it got, plus retries.
//!
//! This is the client's side of the API server's `apiserver_request_total`: nothing is
//! retried underneath it (there is no retry layer in the stack), so a 429 the server
//! sent is a 429 counted here, and a retry is a request that whoever retried marked
//! with [`kube_common::backoff::Retry`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_common::Verb;

use kube_common::sync::lock;

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
