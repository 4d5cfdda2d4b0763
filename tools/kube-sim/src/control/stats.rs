//! Request accounting: counters behind `GET /sim/stats` and the bounded request log
//! behind `GET /sim/requests`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use kube_common::Verb;

use crate::control::flow_control::FlowControlStats;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Per-protocol counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolCounts {
    /// HTTP/1.1.
    pub h1: u64,
    /// HTTP/2.
    pub h2: u64,
}

/// A snapshot of the simulator's counters (the JSON of `GET /sim/stats`).
///
/// `inflight` counts requests being served, as API Priority and Fairness counts them:
/// a non-watch request from arrival until its response body is complete, a watch only
/// until its response headers are sent (or, with `sendInitialEvents`, until the
/// `k8s.io/initial-events-end` bookmark is sent). Open, idle watches are not in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimStats {
    /// Requests by verb, then by resource (with subresource, e.g. `routes/status`;
    /// non-resource requests by URL path). Includes requests answered 401/403/429.
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// Sum of `requests`.
    pub requests_total: u64,
    /// Responses by HTTP status code.
    pub responses: BTreeMap<String, u64>,
    /// Requests in flight now.
    pub inflight: u64,
    /// Highest `inflight` since start or the last reset.
    pub peak_inflight: u64,
    /// Watches open now.
    pub open_watches: u64,
    /// Watches open now, by resource.
    pub open_watches_by_resource: BTreeMap<String, u64>,
    /// Highest `open_watches` since start or the last reset.
    pub peak_open_watches: u64,
    /// Watches started (response headers sent with 200).
    pub watches_started: u64,
    /// Connections accepted, by protocol.
    pub connections: ProtocolCounts,
    /// Connections open now, by protocol.
    pub open_connections: ProtocolCounts,
    /// Response body bytes sent.
    pub bytes_sent: u64,
    /// Watch events sent (including bookmarks and errors).
    pub watch_events_sent: u64,
    /// Requests rejected with 429 by a concurrency limit (the simple one or APF).
    pub rejected_429: u64,
    /// Highest number of requests waiting in the queue at once.
    pub peak_queued: u64,
    /// API Priority and Fairness, when on: each priority level's limits, seats and
    /// queues, and the refusals (also counted in `rejected_429`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowControlStats>,
}

/// HTTP protocol of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// HTTP/1.1.
    H1,
    /// HTTP/2.
    H2,
}

impl Protocol {
    /// `"h1"` or `"h2"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::H1 => "h1",
            Protocol::H2 => "h2",
        }
    }
}

/// The verb a request is counted and logged under: for a resource request its API
/// verb, for anything else (discovery, health, OpenAPI, a path the server does not
/// serve) its HTTP method in lower case, as kube-apiserver's request info names it.
///
/// Serialized as that one word (`"watch"`, `"get"`, `"post"`); compares equal to it as
/// a string, and to the [`Verb`] it carries.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RequestVerb {
    /// A resource request's verb.
    Api(Verb),
    /// Another request's lower-cased HTTP method.
    Http(Box<str>),
}

impl RequestVerb {
    /// The verb for a request that names no resource.
    pub fn for_method(method: &http::Method) -> RequestVerb {
        RequestVerb::Http(method.as_str().to_ascii_lowercase().into_boxed_str())
    }

    /// The word as it is logged.
    pub fn as_str(&self) -> &str {
        match self {
            RequestVerb::Api(verb) => verb.as_str(),
            RequestVerb::Http(method) => method,
        }
    }

    /// The API verb, for a resource request.
    pub fn api(&self) -> Option<Verb> {
        match self {
            RequestVerb::Api(verb) => Some(*verb),
            RequestVerb::Http(_) => None,
        }
    }
}

impl From<Verb> for RequestVerb {
    fn from(verb: Verb) -> Self {
        RequestVerb::Api(verb)
    }
}

impl std::fmt::Display for RequestVerb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for RequestVerb {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for RequestVerb {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<Verb> for RequestVerb {
    fn eq(&self, other: &Verb) -> bool {
        self.api() == Some(*other)
    }
}

impl Serialize for RequestVerb {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RequestVerb {
    /// An API verb's name reads back as that verb, any other word as a method.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let word = String::deserialize(deserializer)?;
        Ok(match word.parse::<Verb>() {
            Ok(verb) => RequestVerb::Api(verb),
            Err(_) => RequestVerb::Http(word.into_boxed_str()),
        })
    }
}

#[derive(Default)]
struct Counters {
    requests: BTreeMap<String, BTreeMap<String, u64>>,
    requests_total: u64,
    responses: BTreeMap<String, u64>,
    open_watches: u64,
    open_watches_by_resource: BTreeMap<String, u64>,
    peak_open_watches: u64,
    watches_started: u64,
    connections: ProtocolCounts,
    open_connections: ProtocolCounts,
    rejected_429: u64,
}

/// Live counters. Hot per-frame counters are atomics; the rest share one mutex.
#[derive(Default)]
pub(crate) struct Stats {
    /// Guards the per-request and per-watch counters (held only to bump a counter).
    counters: Mutex<Counters>,
    bytes_sent: AtomicU64,
    watch_events_sent: AtomicU64,
}

impl Stats {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        kube_common::sync::lock(&self.counters)
    }

    pub(crate) fn count_request(&self, verb: &RequestVerb, resource: &str) {
        let mut c = self.lock();
        c.requests_total += 1;
        let by_resource = c.requests.entry(verb.to_string()).or_default();
        match by_resource.get_mut(resource) {
            Some(n) => *n += 1,
            None => {
                by_resource.insert(resource.to_string(), 1);
            }
        }
    }

    pub(crate) fn count_response(&self, code: u16) {
        let mut c = self.lock();
        *c.responses.entry(code.to_string()).or_default() += 1;
    }

    pub(crate) fn count_rejected(&self) {
        self.lock().rejected_429 += 1;
    }

    pub(crate) fn add_bytes(&self, n: usize) {
        self.bytes_sent.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_watch_event(&self) {
        self.watch_events_sent.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn watch_opened(&self, resource: &str) {
        let mut c = self.lock();
        c.open_watches += 1;
        c.watches_started += 1;
        c.peak_open_watches = c.peak_open_watches.max(c.open_watches);
        *c.open_watches_by_resource
            .entry(resource.to_string())
            .or_default() += 1;
    }

    pub(crate) fn watch_closed(&self, resource: &str) {
        let mut c = self.lock();
        c.open_watches = c.open_watches.saturating_sub(1);
        if let Some(n) = c.open_watches_by_resource.get_mut(resource) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.open_watches_by_resource.remove(resource);
            }
        }
    }

    pub(crate) fn open_watches(&self) -> u64 {
        self.lock().open_watches
    }

    pub(crate) fn connection_opened(&self, p: Protocol) {
        let mut c = self.lock();
        match p {
            Protocol::H1 => {
                c.connections.h1 += 1;
                c.open_connections.h1 += 1;
            }
            Protocol::H2 => {
                c.connections.h2 += 1;
                c.open_connections.h2 += 1;
            }
        }
    }

    pub(crate) fn connection_closed(&self, p: Protocol) {
        let mut c = self.lock();
        match p {
            Protocol::H1 => c.open_connections.h1 = c.open_connections.h1.saturating_sub(1),
            Protocol::H2 => c.open_connections.h2 = c.open_connections.h2.saturating_sub(1),
        }
    }

    /// A snapshot; `inflight`, `peak_inflight` and `peak_queued` come from the limiter.
    pub(crate) fn snapshot(&self, inflight: u64, peak_inflight: u64, peak_queued: u64) -> SimStats {
        let c = self.lock();
        SimStats {
            requests: c.requests.clone(),
            requests_total: c.requests_total,
            responses: c.responses.clone(),
            inflight,
            peak_inflight,
            open_watches: c.open_watches,
            open_watches_by_resource: c.open_watches_by_resource.clone(),
            peak_open_watches: c.peak_open_watches,
            watches_started: c.watches_started,
            connections: c.connections,
            open_connections: c.open_connections,
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            watch_events_sent: self.watch_events_sent.load(Ordering::Relaxed),
            rejected_429: c.rejected_429,
            peak_queued,
            flow_control: None,
        }
    }

    /// Zeroes counters; peaks restart from the current values; open watches and
    /// connections are left as they are.
    pub(crate) fn reset(&self) {
        let mut c = self.lock();
        c.requests.clear();
        c.requests_total = 0;
        c.responses.clear();
        c.peak_open_watches = c.open_watches;
        c.watches_started = 0;
        c.connections = ProtocolCounts::default();
        c.rejected_429 = 0;
        self.bytes_sent.store(0, Ordering::Relaxed);
        self.watch_events_sent.store(0, Ordering::Relaxed);
    }
}

/// One served request, as kept in the request log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Sequence number (increasing, starting at 1).
    pub seq: u64,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`), or the lower-cased HTTP method for
    /// non-resource requests.
    pub verb: RequestVerb,
    /// Resource with subresource (`secrets`, `routes/status`), or the URL path for
    /// non-resource requests.
    pub resource: String,
    /// Namespace from the URL.
    pub namespace: Option<String>,
    /// The URL's object name, or the value of a `metadata.name=` field selector.
    pub name: Option<String>,
    /// `fieldSelector` parameter.
    pub field_selector: Option<String>,
    /// `labelSelector` parameter.
    pub label_selector: Option<String>,
    /// Authenticated user (`system:anonymous` when the token was missing or unknown).
    pub user: String,
    /// HTTP status code of the response.
    pub code: u16,
    /// `"h1"` or `"h2"`.
    pub protocol: String,
    /// Whether the request asked for `sendInitialEvents=true`.
    pub send_initial_events: bool,
    /// `resourceVersion` parameter.
    pub resource_version: Option<String>,
}

struct LogInner {
    next_seq: u64,
    records: VecDeque<RequestRecord>,
    limit: usize,
}

/// The bounded log of recent requests.
pub(crate) struct RequestLog {
    /// Guards the records and the sequence counter.
    inner: Mutex<LogInner>,
}

impl RequestLog {
    pub(crate) fn new(limit: usize) -> RequestLog {
        RequestLog {
            inner: Mutex::new(LogInner {
                next_seq: 1,
                records: VecDeque::new(),
                limit,
            }),
        }
    }

    pub(crate) fn push(&self, mut record: RequestRecord) {
        let mut inner = kube_common::sync::lock(&self.inner);
        record.seq = inner.next_seq;
        inner.next_seq += 1;
        if inner.limit == 0 {
            return;
        }
        inner.records.push_back(record);
        while inner.records.len() > inner.limit {
            inner.records.pop_front();
        }
    }

    /// Records with `seq > since`, oldest first.
    pub(crate) fn since(&self, since: u64) -> Vec<RequestRecord> {
        let inner = kube_common::sync::lock(&self.inner);
        let start = inner.records.partition_point(|r| r.seq <= since);
        inner.records.range(start..).cloned().collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn request_verbs_keep_their_wire_words() {
        let watch = RequestVerb::from(Verb::Watch);
        assert_eq!(serde_json::to_string(&watch).unwrap(), "\"watch\"");
        assert!(watch == "watch" && watch == Verb::Watch && watch != Verb::List);
        let post = RequestVerb::for_method(&http::Method::POST);
        assert_eq!((post.as_str(), post.api()), ("post", None));
        for word in ["deletecollection", "get", "post", "options"] {
            let verb: RequestVerb = serde_json::from_str(&format!("\"{word}\"")).unwrap();
            assert_eq!(verb, *word);
        }
        let get: RequestVerb = serde_json::from_str("\"get\"").unwrap();
        assert_eq!(
            get.api(),
            Some(Verb::Get),
            "an API verb's word reads back as the verb"
        );
    }
}
