//! The admin API under `/sim/` (JSON, no authentication, never under `/api` or
//! `/apis`). Admin requests are not counted in the stats or the request log and are
//! not delayed.
//!
//! | Method | Path | Body / query | Answer |
//! |---|---|---|---|
//! | GET | `/sim` | | this table as JSON |
//! | GET | `/sim/stats` | | [`crate::SimStats`] |
//! | POST | `/sim/stats/reset` | | `{}` |
//! | GET | `/sim/requests` | `?since=SEQ` | `[RequestRecord]` with `seq > SEQ` |
//! | GET, PUT | `/sim/latency` | [`crate::LatencyConfig`] | the latency model |
//! | GET, PUT | `/sim/limits` | [`crate::LimitsConfig`] | the concurrency limit |
//! | GET, PUT | `/sim/flow-control` | [`crate::FlowControlConfig`] or `null` | API Priority and Fairness (`null`: off) |
//! | GET, PUT | `/sim/features` | [`crate::ServerFeatures`] | streaming-list support |
//! | GET | `/sim/faults` | | [`crate::FaultState`] |
//! | DELETE | `/sim/faults` | | clears every fault |
//! | POST | `/sim/faults/close-watches` | | `{"closed": n}` |
//! | PUT | `/sim/faults/close-after` | `{"events": K}` or `{"events": null}` | |
//! | POST | `/sim/faults/fail` | [`crate::FailRule`] | |
//! | POST | `/sim/faults/outage` | `{"duration": "5s", "mode": "refuse" \| "hang"}` | |
//! | POST | `/sim/faults/compact` | | `{"resourceVersion": "N"}` |
//! | POST | `/sim/seed` | YAML/JSON manifests | `{"loaded": n}` |
//! | POST | `/sim/generate` | [`crate::GenerateSpec`] | [`crate::GeneratedCluster`] |

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use kube_common::Verb;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::config::{
    FlowControlConfig, LatencyConfig, LimitsConfig, ServerFeatures, duration_serde,
};
use crate::control::faults::{FailRule, OutageMode};
use crate::generator::generate::GenerateSpec;
use crate::state::Shared;
use crate::transport::body::SimBody;

/// Largest admin request body (manifests can be large).
const MAX_ADMIN_BODY: usize = 64 * 1024 * 1024;

/// The admin endpoints, for `GET /sim` and the CLI help.
pub const ENDPOINTS: &[(&str, &str, &str)] = &[
    (
        "GET",
        "/sim/stats",
        "counters (requests by verb/resource, responses, in-flight, watches, connections, bytes)",
    ),
    (
        "POST",
        "/sim/stats/reset",
        "zero counters and peaks (open watches and connections stay)",
    ),
    (
        "GET",
        "/sim/requests?since=SEQ",
        "request log entries after SEQ",
    ),
    (
        "GET|PUT",
        "/sim/latency",
        "{\"default\":\"1400ms\",\"jitter\":\"100ms\",\"per_verb\":{\"list\":\"2s\"}}",
    ),
    (
        "GET|PUT",
        "/sim/limits",
        "{\"max_inflight\":100,\"queue_len\":50,\"retry_after\":\"1s\"}",
    ),
    (
        "GET|PUT",
        "/sim/flow-control",
        "{\"max_requests_inflight\":4,\"max_mutating_requests_inflight\":2} turns API Priority and Fairness on; null turns it off",
    ),
    (
        "GET|PUT",
        "/sim/features",
        "{\"watch_list\":false} refuses streaming lists (422); {\"watch_progress\":false} answers them with an ERROR event",
    ),
    ("GET", "/sim/faults", "current faults"),
    ("DELETE", "/sim/faults", "clear every fault"),
    (
        "POST",
        "/sim/faults/close-watches",
        "close every open watch now",
    ),
    (
        "PUT",
        "/sim/faults/close-after",
        "{\"events\":K} closes each watch after K events; {\"events\":null} stops",
    ),
    (
        "POST",
        "/sim/faults/fail",
        "{\"verb\":\"get\",\"resource\":\"secrets\",\"code\":500,\"count\":3,\"namespace\":null,\"name\":null}",
    ),
    (
        "POST",
        "/sim/faults/outage",
        "{\"duration\":\"5s\",\"mode\":\"refuse\"|\"hang\"}",
    ),
    (
        "POST",
        "/sim/faults/compact",
        "drop the event history (older resourceVersions get 410)",
    ),
    (
        "POST",
        "/sim/seed",
        "body: YAML/JSON manifests (multi-document) to create or replace",
    ),
    (
        "POST",
        "/sim/generate",
        "{\"routes\":2000,\"namespaces\":50,\"secrets\":2000} (see GenerateSpec)",
    ),
];

struct AdminError {
    code: u16,
    message: String,
}

impl AdminError {
    fn bad(message: impl Into<String>) -> AdminError {
        AdminError {
            code: 400,
            message: message.into(),
        }
    }
}

type AdminResult = Result<(u16, Value), AdminError>;

fn respond(code: u16, value: &Value) -> Response<SimBody> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let mut resp = Response::new(SimBody::full(Bytes::from(body)));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

async fn body_bytes(body: Incoming) -> Result<Bytes, AdminError> {
    Limited::new(body, MAX_ADMIN_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| AdminError::bad(format!("cannot read the request body: {e}")))
}

async fn json_body<T: DeserializeOwned>(body: Incoming) -> Result<T, AdminError> {
    let bytes = body_bytes(body).await?;
    serde_json::from_slice(&bytes).map_err(|e| AdminError::bad(format!("invalid JSON body: {e}")))
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

#[derive(Deserialize)]
struct CloseAfter {
    events: Option<u64>,
}

#[derive(Deserialize)]
struct OutageRequest {
    #[serde(with = "duration_serde")]
    duration: Duration,
    mode: OutageMode,
}

/// Whether a fail rule's verb can match anything: `*`, an API verb, or the
/// lower-cased HTTP method a non-resource request is logged under.
fn is_verb_pattern(verb: &str) -> bool {
    const METHODS: &[&str] = &["head", "options", "post", "put", "connect", "trace"];
    verb == "*" || verb.parse::<Verb>().is_ok() || METHODS.contains(&verb)
}

async fn route(
    shared: Arc<Shared>,
    method: Method,
    path: &str,
    query: Option<&str>,
    body: Incoming,
) -> AdminResult {
    let faults = shared.faults_handle();
    match (method, path) {
        (Method::GET, "/sim") => Ok((
            200,
            json!({
                "endpoints": ENDPOINTS.iter().map(|(m, p, d)| json!({"method": m, "path": p, "description": d})).collect::<Vec<_>>(),
            }),
        )),
        (Method::GET, "/sim/stats") => Ok((200, to_json(&shared.stats_snapshot()))),
        (Method::POST, "/sim/stats/reset") => {
            shared.reset_stats();
            Ok((200, json!({})))
        }
        (Method::GET, "/sim/requests") => {
            let since = query
                .and_then(|q| {
                    form_urlencoded::parse(q.as_bytes())
                        .find(|(k, _)| k == "since")
                        .map(|(_, v)| v.into_owned())
                })
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| AdminError::bad("since must be a number"))
                })
                .transpose()?
                .unwrap_or(0);
            Ok((200, to_json(&shared.log.since(since))))
        }
        (Method::GET, "/sim/latency") => Ok((200, to_json(&shared.latency()))),
        (Method::PUT, "/sim/latency") => {
            let cfg: LatencyConfig = json_body(body).await?;
            shared.set_latency(cfg.clone());
            Ok((200, to_json(&cfg)))
        }
        (Method::GET, "/sim/limits") => Ok((200, to_json(&shared.limiter.config()))),
        (Method::PUT, "/sim/limits") => {
            let cfg: LimitsConfig = json_body(body).await?;
            shared.limiter.set_config(cfg.clone());
            Ok((200, to_json(&cfg)))
        }
        (Method::GET, "/sim/flow-control") => Ok((
            200,
            to_json(&shared.flow_control().map(|fc| fc.config().clone())),
        )),
        (Method::PUT, "/sim/flow-control") => {
            let config: Option<FlowControlConfig> = json_body(body).await?;
            shared.set_flow_control(config.clone());
            Ok((200, to_json(&config)))
        }
        (Method::GET, "/sim/features") => Ok((200, to_json(&shared.features()))),
        (Method::PUT, "/sim/features") => {
            let features: ServerFeatures = json_body(body).await?;
            shared.set_features(features);
            Ok((200, to_json(&features)))
        }
        (Method::GET, "/sim/faults") => Ok((200, to_json(&faults.state()))),
        (Method::DELETE, "/sim/faults") => {
            faults.clear();
            Ok((200, to_json(&faults.state())))
        }
        (Method::POST, "/sim/faults/close-watches") => {
            Ok((200, json!({ "closed": faults.close_all_watches() })))
        }
        (Method::PUT, "/sim/faults/close-after") => {
            let req: CloseAfter = json_body(body).await?;
            faults.close_watches_after(req.events.filter(|n| *n > 0));
            Ok((200, to_json(&faults.state())))
        }
        (Method::POST, "/sim/faults/fail") => {
            let rule: FailRule = json_body(body).await?;
            if !is_verb_pattern(&rule.verb) {
                return Err(AdminError::bad(format!(
                    "verb {:?} is neither \"*\", an API verb (get, list, watch, create, update, patch, delete, deletecollection) nor a lower-case HTTP method",
                    rule.verb
                )));
            }
            if !(100..=599).contains(&rule.code) {
                return Err(AdminError::bad(
                    "code must be an HTTP status code (100-599)",
                ));
            }
            faults.fail_next(rule);
            Ok((200, to_json(&faults.state())))
        }
        (Method::POST, "/sim/faults/outage") => {
            let req: OutageRequest = json_body(body).await?;
            faults.outage(req.duration, req.mode);
            Ok((200, to_json(&faults.state())))
        }
        (Method::POST, "/sim/faults/compact") => {
            let rv = faults.compact_history();
            Ok((200, json!({ "resourceVersion": rv.to_string() })))
        }
        (Method::POST, "/sim/seed") => {
            let bytes = body_bytes(body).await?;
            let text = String::from_utf8(bytes.to_vec())
                .map_err(|_| AdminError::bad("manifests must be UTF-8 text"))?;
            let store = shared.store.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                crate::storage::handle::load_manifests(&store, &text)
            })
            .await
            .map_err(|e| AdminError {
                code: 500,
                message: e.to_string(),
            })?
            .map_err(|e| AdminError::bad(e.to_string()))?;
            Ok((200, json!({ "loaded": loaded })))
        }
        (Method::POST, "/sim/generate") => {
            let spec: GenerateSpec = json_body(body).await?;
            let store = shared.store.clone();
            let generated = tokio::task::spawn_blocking(move || {
                crate::generator::generate::generate(&store, &spec)
            })
            .await
            .map_err(|e| AdminError {
                code: 500,
                message: e.to_string(),
            })?
            .map_err(|e| AdminError::bad(e.to_string()))?;
            Ok((200, to_json(&generated)))
        }
        (_, p)
            if ENDPOINTS
                .iter()
                .any(|(_, ep, _)| ep.split('?').next() == Some(p))
                || p == "/sim/faults"
                || p == "/sim" =>
        {
            Err(AdminError {
                code: 405,
                message: format!("method not allowed on {p}"),
            })
        }
        (_, p) => Err(AdminError {
            code: 404,
            message: format!("no admin endpoint {p}; GET /sim lists them"),
        }),
    }
}

/// Serves one admin request.
pub(crate) async fn serve(shared: Arc<Shared>, req: Request<Incoming>) -> Response<SimBody> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().trim_end_matches('/').to_string();
    let path = if path.is_empty() {
        "/".to_string()
    } else {
        path
    };
    match route(shared, parts.method, &path, parts.uri.query(), body).await {
        Ok((code, value)) => respond(code, &value),
        Err(e) => respond(e.code, &json!({ "error": e.message })),
    }
}
