//! What the API server saw: its audit log (one record per request, with the user, the
//! user agent, the verb, the object and the answer) and its `/metrics`
//! (`apiserver_request_total` by verb, resource and code; API Priority and Fairness
//! rejections by priority level).
//!
//! The audit log is the exact accounting: it says who asked. `/metrics` has no user
//! label, so its counts include the admin's setup and the server's own controllers;
//! compare two snapshots with [`Metrics::since`] to see what happened in between.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::Deserialize;

use crate::error::TestEnvError;

/// One request, as its last audit stage recorded it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditedRequest {
    /// The request's audit id.
    pub audit_id: String,
    /// The last stage recorded: `ResponseStarted` (a watch still open),
    /// `ResponseComplete` or `Panic`.
    pub stage: String,
    /// The authenticated user.
    pub user: String,
    /// The client's `User-Agent`, if it sent one.
    pub user_agent: Option<String>,
    /// The API verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...).
    pub verb: String,
    /// The resource (`secrets`, `routes`, `selfsubjectrulesreviews`, ...); `None` for
    /// non-resource paths such as `/readyz`.
    pub resource: Option<String>,
    /// The subresource (`status`), if any.
    pub subresource: Option<String>,
    /// The object's namespace, if any.
    pub namespace: Option<String>,
    /// The object's name: the one in the path, or for a list or watch the one its
    /// `metadata.name` field selector names (the API server reads it as the request's
    /// name, which is what lets RBAC `resourceNames` authorize it).
    pub name: Option<String>,
    /// The HTTP status code of the answer (a watch that started: 200).
    pub code: Option<u16>,
    /// The request path and query.
    pub request_uri: String,
    /// When the server received it.
    pub received: Option<jiff::Timestamp>,
}

impl AuditedRequest {
    /// Whether this is a watch that asked for a streaming list
    /// (`sendInitialEvents=true`).
    pub fn is_streaming_list(&self) -> bool {
        self.verb == "watch" && self.request_uri.contains("sendInitialEvents=true")
    }
}

/// The audit log's records, one per request.
#[derive(Clone, Debug, Default)]
pub struct AuditLog {
    requests: Vec<AuditedRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    verb: String,
    user: RawUser,
    user_agent: Option<String>,
    object_ref: Option<RawObjectRef>,
    response_status: Option<RawStatus>,
    request_received_timestamp: Option<jiff::Timestamp>,
}

#[derive(Deserialize)]
struct RawUser {
    username: Option<String>,
}

#[derive(Deserialize)]
struct RawObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawStatus {
    code: Option<u16>,
}

impl AuditLog {
    /// Reads an audit log (JSON lines). A last line still being written is ignored.
    pub fn read(path: &Path) -> Result<Self, TestEnvError> {
        let text = std::fs::read_to_string(path).map_err(|source| TestEnvError::Io {
            what: format!("reading the audit log {}", path.display()),
            source,
        })?;
        Self::parse(&text)
    }

    /// Parses audit log text: each request once, at its last recorded stage, in the
    /// order the requests first appear.
    pub fn parse(text: &str) -> Result<Self, TestEnvError> {
        let mut requests: Vec<AuditedRequest> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let lines: Vec<&str> = text.lines().filter(|line| !line.is_empty()).collect();
        for (number, line) in lines.iter().enumerate() {
            let event: RawEvent = match serde_json::from_str(line) {
                Ok(event) => event,
                Err(_) if number + 1 == lines.len() && !text.ends_with('\n') => break,
                Err(error) => {
                    return Err(TestEnvError::format(
                        format!("audit log line {}", number + 1),
                        error,
                    ));
                }
            };
            let object = event.object_ref.unwrap_or(RawObjectRef {
                resource: None,
                subresource: None,
                namespace: None,
                name: None,
            });
            let request = AuditedRequest {
                audit_id: event.audit_id,
                stage: event.stage,
                user: event.user.username.unwrap_or_default(),
                user_agent: event.user_agent,
                verb: event.verb,
                resource: object.resource,
                subresource: object.subresource,
                namespace: object.namespace,
                name: object.name,
                code: event.response_status.and_then(|status| status.code),
                request_uri: event.request_uri,
                received: event.request_received_timestamp,
            };
            match index.get(&request.audit_id) {
                Some(&at) => requests[at] = request,
                None => {
                    index.insert(request.audit_id.clone(), requests.len());
                    requests.push(request);
                }
            }
        }
        Ok(Self { requests })
    }

    /// Every request.
    pub fn requests(&self) -> &[AuditedRequest] {
        &self.requests
    }

    /// The requests of one user.
    pub fn of_user<'a>(&'a self, user: &'a str) -> impl Iterator<Item = &'a AuditedRequest> {
        self.requests
            .iter()
            .filter(move |request| request.user == user)
    }

    /// How many requests `user` made, by verb, resource (empty for non-resource paths)
    /// and status code (0 when none was recorded).
    pub fn summary(&self, user: &str) -> BTreeMap<(String, String, u16), usize> {
        let mut summary = BTreeMap::new();
        for request in self.of_user(user) {
            let resource = match &request.subresource {
                Some(sub) => format!("{}/{sub}", request.resource.as_deref().unwrap_or("")),
                None => request.resource.clone().unwrap_or_default(),
            };
            *summary
                .entry((request.verb.clone(), resource, request.code.unwrap_or(0)))
                .or_insert(0) += 1;
        }
        summary
    }
}

/// One sample of a Prometheus text exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name` (empty when absent).
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

/// A snapshot of the API server's `/metrics`.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    samples: Vec<Sample>,
}

impl Metrics {
    /// Parses the Prometheus text format (comments and malformed lines are skipped).
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(parse_sample)
            .collect();
        Self { samples }
    }

    /// The samples of metric `name`.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> {
        self.samples
            .iter()
            .filter(move |sample| sample.name == name)
    }

    /// The sum of metric `name` over the samples whose labels match every
    /// `(label, value)` of `filter`.
    pub fn sum(&self, name: &str, filter: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .filter(|sample| {
                filter
                    .iter()
                    .all(|(label, value)| sample.label(label) == *value)
            })
            .map(|sample| sample.value)
            .sum()
    }

    /// `apiserver_request_total` for a verb as the metric spells it (`LIST`, `WATCH`,
    /// `GET`, `POST`, `PUT`, `PATCH`, `DELETE`), a resource and optionally a code.
    pub fn requests(&self, verb: &str, resource: &str, code: Option<&str>) -> f64 {
        let mut filter = vec![("verb", verb), ("resource", resource)];
        if let Some(code) = code {
            filter.push(("code", code));
        }
        self.sum("apiserver_request_total", &filter)
    }

    /// Requests API Priority and Fairness rejected (429), by priority level.
    pub fn rejected_by_priority_level(&self) -> BTreeMap<String, f64> {
        let mut rejected = BTreeMap::new();
        for sample in self.samples("apiserver_flowcontrol_rejected_requests_total") {
            *rejected
                .entry(sample.label("priority_level").to_owned())
                .or_insert(0.0) += sample.value;
        }
        rejected
    }

    /// What changed since `earlier`: each counter's increase (samples absent earlier
    /// count from zero).
    pub fn since(&self, earlier: &Metrics) -> Metrics {
        let before: HashMap<(&str, &BTreeMap<String, String>), f64> = earlier
            .samples
            .iter()
            .map(|sample| ((sample.name.as_str(), &sample.labels), sample.value))
            .collect();
        let samples = self
            .samples
            .iter()
            .map(|sample| Sample {
                value: sample.value
                    - before
                        .get(&(sample.name.as_str(), &sample.labels))
                        .copied()
                        .unwrap_or(0.0),
                ..sample.clone()
            })
            .collect();
        Metrics { samples }
    }
}

/// `name{label="value",...} 12` or `name 12`.
fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (
                &line[..open],
                parse_labels(&line[open + 1..close])?,
                &line[close + 1..],
            )
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// `a="x",b="y \"quoted\""` (label values may hold escaped quotes, backslashes and
/// newlines, and commas).
fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(labels);
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        chars.next()?; // '='
        if chars.next()? != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '"' => break,
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                other => value.push(other),
            }
        }
        labels.insert(name.trim().to_owned(), value);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn metrics_parse_labels_and_differences() {
        let before = Metrics::parse(
            "# HELP x\napiserver_request_total{code=\"200\",resource=\"secrets\",verb=\"WATCH\"} 3\n",
        );
        let after = Metrics::parse(
            "apiserver_request_total{code=\"200\",resource=\"secrets\",verb=\"WATCH\"} 10\n\
             apiserver_request_total{code=\"429\",resource=\"secrets\",verb=\"WATCH\"} 2\n\
             apiserver_flowcontrol_rejected_requests_total{flow_schema=\"service-accounts\",priority_level=\"workload-low\",reason=\"queue-full\"} 2\n\
             odd{msg=\"a, \\\"b\\\"\"} 1.5e0\nplain 4\n",
        );
        let delta = after.since(&before);
        assert_eq!(delta.requests("WATCH", "secrets", Some("200")), 7.0);
        assert_eq!(delta.requests("WATCH", "secrets", None), 9.0);
        assert_eq!(
            after.rejected_by_priority_level(),
            BTreeMap::from([("workload-low".to_owned(), 2.0)])
        );
        let odd = after.samples("odd").next().unwrap();
        assert_eq!(odd.label("msg"), "a, \"b\"");
        assert_eq!(odd.value, 1.5);
        assert_eq!(after.sum("plain", &[]), 4.0);
    }

    #[test]
    fn audit_log_keeps_one_record_per_request_at_its_last_stage() {
        let text = r#"{"auditID":"a","stage":"ResponseStarted","requestURI":"/api/v1/namespaces/n/secrets?watch=true","verb":"watch","user":{"username":"u"},"userAgent":"certwatch/0.1.0","objectRef":{"resource":"secrets","namespace":"n"},"responseStatus":{"code":200}}
{"auditID":"b","stage":"ResponseComplete","requestURI":"/readyz","verb":"get","user":{"username":"admin"},"responseStatus":{"code":200}}
{"auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/n/secrets?watch=true","verb":"watch","user":{"username":"u"},"userAgent":"certwatch/0.1.0","objectRef":{"resource":"secrets","namespace":"n"},"responseStatus":{"code":200}}
{"auditID":"c","stage":"ResponseComplete","requestURI":"/apis/route.openshift.io/v1/namespaces/n/routes/r/status","verb":"update","user":{"username":"u"},"objectRef":{"resource":"routes","subresource":"status","namespace":"n","name":"r"},"responseStatus":{"code":409}}
{"auditID":"d","stage":"Resp"#;
        let log = AuditLog::parse(text).unwrap();
        assert_eq!(log.requests().len(), 3);
        assert_eq!(log.requests()[0].stage, "ResponseComplete");
        assert_eq!(
            log.summary("u"),
            BTreeMap::from([
                (("update".to_owned(), "routes/status".to_owned(), 409), 1),
                (("watch".to_owned(), "secrets".to_owned(), 200), 1),
            ])
        );
        assert_eq!(log.of_user("admin").count(), 1);
        assert!(AuditLog::parse("not json\n").is_err());
    }
}
