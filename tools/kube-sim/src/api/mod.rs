//! The Kubernetes API surface. This module is the request pipeline, in
//! kube-apiserver's filter order: authentication (401), accounting, the concurrency
//! limit (429), latency, injected faults, authorization (403), then the verb handlers.
//! Around it: what a URL means ([`request_info`]), discovery ([`discovery`]),
//! server-side printing for kubectl ([`table`]) and the body of a watch response
//! ([`watch_stream`]).

pub(crate) mod discovery;
pub(crate) mod openapi;
pub(crate) mod openapi_v2;
pub(crate) mod request_info;
pub(crate) mod table;
pub(crate) mod watch_stream;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use kube_common::Verb;
use serde_json::{Value, json};

use crate::auth::rbac::{AccessVerb, Attributes, forbidden_reason};
use crate::auth::review;
use crate::auth::users::UserInfo;
use crate::control::admission::Admission;
use crate::control::flow_control::{self, Classification, RequestShape};
use crate::control::metrics::RequestKind;
use crate::control::stats::{Protocol, RequestRecord, RequestVerb};
use crate::error::{ApiError, FieldError};
use crate::objects::patch::{PatchBody, PatchKind};
use crate::objects::selectors::{FieldSelector, ObjectFilter};
use crate::resources::{ResourceDef, ResourceKind};
use crate::state::Shared;
use crate::storage::store::{
    ContinueToken, Key, ListPage, ListVersion, Preconditions, UpdateTarget, WatchStart,
    WatchStartError, WriteOptions,
};
use crate::transport::body::SimBody;
use kube_common::labels::LabelSelector;
use openapi::{FieldProblems, FieldValidation};
use request_info::{ResourceRequest, Target};
use table::TableOptions;
use watch_stream::WatchOptions;

/// Largest request body accepted (kube-apiserver's limit is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// What a handler produced.
pub(crate) enum Reply {
    Json {
        code: u16,
        body: Bytes,
        /// `Warning` headers (field validation's, for example).
        warnings: Vec<String>,
    },
    Text {
        code: u16,
        body: Bytes,
        content_type: &'static str,
    },
    Watch {
        body_builder: Box<dyn FnOnce(Option<Admission>) -> SimBody + Send>,
        /// Keep the request in flight until the initial-events-end bookmark.
        holds_permit: bool,
        /// A stream of events (not a single ERROR event): it is counted in the
        /// request metrics when it ends.
        streaming: bool,
    },
}

impl Reply {
    fn json(code: u16, value: &Value) -> Reply {
        Reply::Json {
            code,
            body: Bytes::from(serde_json::to_vec(value).unwrap_or_default()),
            warnings: Vec::new(),
        }
    }

    /// The same with `Warning` headers.
    fn warned(self, warnings: Vec<String>) -> Reply {
        match self {
            Reply::Json { code, body, .. } => Reply::Json {
                code,
                body,
                warnings,
            },
            other => other,
        }
    }
}

fn json_response(code: u16, body: Bytes, retry_after: Option<u64>) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::full(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    if let Some(secs) = retry_after
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        h.insert(RETRY_AFTER, v);
    }
    resp
}

fn error_response(e: &ApiError) -> Response<SimBody> {
    // As kube-apiserver's encoder writes it: Go's field order and a closing newline.
    let mut body = serde_json::to_vec(&e.status_wire()).unwrap_or_default();
    body.push(b'\n');
    json_response(e.code, Bytes::from(body), e.retry_after)
}

/// What the request log, the stats and the metrics need to know about a request.
struct Accounting {
    verb: RequestVerb,
    /// How `apiserver_request_total` labels it (resource requests only).
    kind: Option<RequestKind>,
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    field_selector: Option<String>,
    label_selector: Option<String>,
    send_initial_events: bool,
    resource_version: Option<String>,
}

impl Accounting {
    fn for_target(
        method: &Method,
        path: &str,
        target: &Result<Target, ApiError>,
        content_type: Option<&str>,
    ) -> Accounting {
        match target {
            Ok(Target::Resource(rr)) => {
                let def = rr.id.def();
                let apply =
                    content_type.is_some_and(|ct| ct.starts_with("application/apply-patch"));
                let kind = RequestKind {
                    verb: RequestKind::metric_verb(rr.verb, apply),
                    group: def.group,
                    version: def.version,
                    resource: def.name,
                    subresource: rr.subresource.clone().unwrap_or_default(),
                    route_scope: RequestKind::scope(
                        rr.name.is_some(),
                        rr.verb,
                        rr.namespace.is_some(),
                    ),
                    request_scope: RequestKind::scope(
                        request_name(rr).is_some(),
                        rr.verb,
                        rr.namespace.is_some(),
                    ),
                    dry_run: rr.param("dryRun") == Some("All"),
                };
                let field_selector = rr.param("fieldSelector").map(str::to_string);
                let name = rr.name.clone().or_else(|| {
                    field_selector
                        .as_deref()
                        .and_then(|f| FieldSelector::parse(f).ok())
                        .and_then(|f| f.exact("metadata.name").map(str::to_string))
                });
                Accounting {
                    verb: RequestVerb::Api(rr.verb),
                    kind: Some(kind),
                    resource: rr.resource_key(),
                    namespace: rr.namespace.clone(),
                    name,
                    field_selector,
                    label_selector: rr.param("labelSelector").map(str::to_string),
                    send_initial_events: rr.flag("sendInitialEvents"),
                    resource_version: rr.param("resourceVersion").map(str::to_string),
                }
            }
            Ok(Target::NonResource { path }) => Accounting::plain(method, path),
            Err(_) => Accounting::plain(method, path),
        }
    }

    fn plain(method: &Method, path: &str) -> Accounting {
        Accounting {
            verb: RequestVerb::for_method(method),
            kind: None,
            resource: path.to_string(),
            namespace: None,
            name: None,
            field_selector: None,
            label_selector: None,
            send_initial_events: false,
            resource_version: None,
        }
    }
}

/// Serves one API request (everything outside `/sim/`).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    protocol: Protocol,
) -> Response<SimBody> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    tracing::trace!(
        method = %parts.method,
        uri = %parts.uri,
        accept = ?parts.headers.get(http::header::ACCEPT),
        content_type = ?parts.headers.get(CONTENT_TYPE),
        protocol = protocol.as_str(),
        "request"
    );
    let target = request_info::classify(&parts.method, &path, parts.uri.query());
    let acct = Accounting::for_target(
        &parts.method,
        &path,
        &target,
        parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    );
    let user = shared.users.authenticate(
        parts
            .headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    );
    shared.stats.count_request(&acct.verb, &acct.resource);
    // A `Hang` outage holds requests after they arrived (and were counted): the
    // server has them but does not answer.
    shared.faults.wait_while_hanging().await;

    let (response, code, answered_by) =
        respond(&shared, &parts, body, target, &acct, user.as_deref()).await;
    shared.stats.count_response(code);
    // As kube-apiserver: refusals of authentication and authorization are not
    // counted, and a streaming watch is counted by its body when it ends.
    let streaming = response.body().is_long_running();
    if let Some(kind) = &acct.kind
        && code != 401
        && code != 403
        && !streaming
    {
        match answered_by {
            AnsweredBy::Handler => shared.metrics.finished(kind, code),
            AnsweredBy::Filter => shared.metrics.finished_outside_handler(kind, code),
        }
    }
    shared.log.push(RequestRecord {
        seq: 0,
        verb: acct.verb,
        resource: acct.resource,
        namespace: acct.namespace,
        name: acct.name,
        field_selector: acct.field_selector,
        label_selector: acct.label_selector,
        user: user
            .as_ref()
            .map_or_else(|| "system:anonymous".to_string(), |u| u.name.clone()),
        code,
        protocol: protocol.as_str().to_string(),
        send_initial_events: acct.send_initial_events,
        resource_version: acct.resource_version,
    });
    response
}

/// Who answered a request, which decides how kube-apiserver's metrics label its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AnsweredBy {
    /// A filter before the handler (authentication, a concurrency limit).
    Filter,
    /// The handler (including injected faults and authorization refusals).
    Handler,
}

async fn respond(
    shared: &Arc<Shared>,
    parts: &http::request::Parts,
    body: Incoming,
    target: Result<Target, ApiError>,
    acct: &Accounting,
    user: Option<&UserInfo>,
) -> (Response<SimBody>, u16, AnsweredBy) {
    let counted_by = |resp: Response<SimBody>, by: AnsweredBy| {
        let code = resp.status().as_u16();
        let (p, b) = resp.into_parts();
        (
            Response::from_parts(p, b.counted(shared.stats.clone())),
            code,
            by,
        )
    };
    let counted = |resp: Response<SimBody>| counted_by(resp, AnsweredBy::Handler);
    let Some(user) = user else {
        return counted(error_response(&ApiError::unauthorized()));
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => return counted(error_response(&e)),
    };
    // API Priority and Fairness first, as kube-apiserver filters (after
    // authentication, before authorization), then the simple limit.
    let seat = match shared.flow_control() {
        None => None,
        Some(control) => match control.admit(classify(user, &target, &parts.method)).await {
            Ok(seat) => Some(seat),
            Err((class, rejection)) => {
                tracing::debug!(
                    user = %user.name,
                    flow_schema = class.flow_schema(),
                    priority_level = class.priority_level(),
                    reason = rejection.reason.as_str(),
                    "API Priority and Fairness refused a request"
                );
                shared.stats.count_rejected();
                return counted_by(
                    too_many_requests(rejection.retry_after_secs),
                    AnsweredBy::Filter,
                );
            }
        },
    };
    let permit = match shared.limiter.acquire().await {
        Ok(inflight) => Admission {
            _inflight: inflight,
            _seat: seat,
        },
        Err(rejected) => {
            shared.stats.count_rejected();
            return counted_by(
                error_response(&ApiError::too_many_requests(rejected.retry_after_secs)),
                AnsweredBy::Filter,
            );
        }
    };
    let delay = shared.latency_for(latency_verb(&acct.verb, &parts.method));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(e) = shared.faults.take_failure(
        &acct.verb,
        &acct.resource,
        acct.namespace.as_deref(),
        acct.name.as_deref(),
    ) {
        return counted(with_permit(error_response(&e), permit));
    }
    let reply = match &target {
        Target::NonResource { path } => non_resource(
            shared,
            user,
            &parts.method,
            path,
            parts
                .headers
                .get(http::header::ACCEPT)
                .and_then(|v| v.to_str().ok()),
        ),
        Target::Resource(rr) => match authorize(shared, user, rr) {
            Err(e) => Err(e),
            Ok(()) => resource(shared, parts, body, rr, user).await,
        },
    };
    let resp = match reply {
        Err(e) => with_permit(error_response(&e), permit),
        Ok(Reply::Json {
            code,
            body,
            warnings,
        }) => {
            let mut resp = json_response(code, body, None);
            for warning in warnings {
                // kube-apiserver's format: `299 - "<text>"`.
                let value = format!("299 - {warning:?}");
                if let Ok(value) = HeaderValue::from_str(&value) {
                    resp.headers_mut().append(http::header::WARNING, value);
                }
            }
            with_permit(resp, permit)
        }
        Ok(Reply::Text {
            code,
            body,
            content_type,
        }) => {
            let mut resp = Response::new(SimBody::full(body));
            *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
            resp.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
            with_permit(resp, permit)
        }
        Ok(Reply::Watch {
            body_builder,
            holds_permit,
            streaming,
        }) => {
            // A list-then-watch style watch leaves the in-flight count as its headers
            // go out; a streaming list stays until its initial-events-end bookmark.
            let permit = if holds_permit {
                Some(permit)
            } else {
                drop(permit);
                None
            };
            let mut body = body_builder(permit);
            if streaming && let Some(kind) = &acct.kind {
                body = body.long_running(shared.metrics.watch_started(kind.clone()));
            }
            let mut resp = Response::new(body);
            let h = resp.headers_mut();
            h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
            resp
        }
    };
    counted(resp)
}

/// The verb whose latency applies: a resource request's own, or for other requests
/// the verb their method would have on a resource (a discovery GET is a `get`).
fn latency_verb(verb: &RequestVerb, method: &Method) -> Option<Verb> {
    verb.api().or(match *method {
        Method::GET | Method::HEAD => Some(Verb::Get),
        Method::POST => Some(Verb::Create),
        Method::PUT => Some(Verb::Update),
        Method::PATCH => Some(Verb::Patch),
        Method::DELETE => Some(Verb::Delete),
        _ => None,
    })
}

/// API Priority and Fairness's refusal, exactly as kube-apiserver writes it: plain
/// text, not a `Status`, with the level's current `Retry-After`.
fn too_many_requests(retry_after_secs: u64) -> Response<SimBody> {
    let mut resp = Response::new(SimBody::full(Bytes::from_static(
        b"Too many requests, please try again later.\n",
    )));
    *resp.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let h = resp.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs));
    resp
}

/// Where API Priority and Fairness files a request: its user, and what it asks for as
/// kube-apiserver's request info reads it.
fn classify(user: &UserInfo, target: &Target, method: &Method) -> Classification {
    match target {
        Target::Resource(rr) => {
            let def = rr.id.def();
            let resource = rr.resource_key();
            // A namespace's own URL is a request in that namespace.
            let namespace =
                rr.namespace
                    .as_deref()
                    .or(match rr.id == crate::resources::NAMESPACES {
                        true => rr.name.as_deref(),
                        false => None,
                    });
            flow_control::classify(
                user,
                RequestShape::Resource {
                    verb: rr.verb.as_str(),
                    group: def.group,
                    resource: &resource,
                    namespace,
                },
            )
        }
        Target::NonResource { path } => {
            let verb = RequestVerb::for_method(method);
            flow_control::classify(
                user,
                RequestShape::NonResource {
                    verb: verb.as_str(),
                    path,
                },
            )
        }
    }
}

fn with_permit(resp: Response<SimBody>, permit: Admission) -> Response<SimBody> {
    let (p, b) = resp.into_parts();
    Response::from_parts(p, b.holding(Some(permit)))
}

/// The name kube-apiserver's request info gives a request, which both RBAC's
/// `resourceNames` and a 403's message use: the URL's, or for a list or watch the
/// value of an exact `metadata.name` field selector (when it could be a name).
fn request_name(rr: &ResourceRequest) -> Option<String> {
    match rr.verb {
        Verb::List | Verb::Watch => rr
            .param("fieldSelector")
            .and_then(|f| FieldSelector::parse(f).ok())
            .and_then(|f| f.exact("metadata.name").map(str::to_string))
            .filter(|name| crate::objects::validation::path_segment_name(name).is_ok()),
        _ => rr.name.clone(),
    }
}

fn authorize(shared: &Shared, user: &UserInfo, rr: &ResourceRequest) -> Result<(), ApiError> {
    let def = rr.id.def();
    let name = request_name(rr).unwrap_or_default();
    // A namespace's own URL (`/api/v1/namespaces/{name}`) is, to RBAC, a request in
    // that namespace: Roles there may grant access to it.
    let namespace = match &rr.namespace {
        Some(ns) => ns.clone(),
        None if rr.id == crate::resources::NAMESPACES => name.clone(),
        None => String::new(),
    };
    let attrs = Attributes {
        verb: AccessVerb::Api(rr.verb),
        group: def.group.to_string(),
        resource: def.name.to_string(),
        subresource: rr.subresource.clone().unwrap_or_default(),
        namespace,
        name,
        path: None,
    };
    if shared.authorizer.authorize(user, &attrs).allowed {
        return Ok(());
    }
    Err(ApiError::forbidden(
        def,
        &attrs.name,
        &forbidden_reason(&user.name, &attrs),
    ))
}

fn non_resource(
    shared: &Shared,
    user: &UserInfo,
    method: &Method,
    path: &str,
    accept: Option<&str>,
) -> Result<Reply, ApiError> {
    let verb = RequestVerb::for_method(method);
    let attrs = Attributes::non_resource(AccessVerb::parse(verb.as_str()), path);
    if !shared.authorizer.authorize(user, &attrs).allowed {
        return Err(ApiError::forbidden_path(&user.name, verb.as_str(), path));
    }
    if *method != Method::GET && *method != Method::HEAD {
        return Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on {path}"
        )));
    }
    if crate::api::discovery::is_health(path) {
        return Ok(Reply::Text {
            code: 200,
            body: Bytes::from_static(b"ok"),
            content_type: "text/plain; charset=utf-8",
        });
    }
    if path == "/metrics" {
        let flow = shared.flow_control().map(|fc| fc.stats());
        return Ok(Reply::Text {
            code: 200,
            body: Bytes::from(shared.metrics.encode(flow.as_ref())),
            content_type: "text/plain; version=0.0.4; charset=utf-8",
        });
    }
    if let Some((body, content_type)) = openapi::document(path, accept) {
        return Ok(Reply::Text {
            code: 200,
            body,
            content_type,
        });
    }
    match crate::api::discovery::document(path, shared.addr) {
        Some(doc) => Ok(Reply::json(200, &doc)),
        None => Err(ApiError::no_route()),
    }
}

async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                ApiError::new(
                    413,
                    "RequestEntityTooLarge",
                    "the request body is too large (limit 3 MiB)",
                )
            } else {
                ApiError::bad_request(format!("cannot read the request body: {e}"))
            }
        })
}

fn decode_object(content_type: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
    let ct = content_type.unwrap_or("application/json");
    let base = ct.split(';').next().unwrap_or("").trim();
    let value: Value = match base {
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        "application/json" | "" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding JSON: {e}")))?,
        "application/vnd.kubernetes.protobuf" => crate::transport::protobuf::decode(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding protobuf: {e}")))?,
        other => return Err(ApiError::unsupported_media_type(other)),
    };
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    Ok(value)
}

fn check_kind(def: &ResourceDef, obj: &Value) -> Result<(), ApiError> {
    let want_version = def.api_version();
    if let Some(kind) = obj.get("kind").and_then(Value::as_str)
        && !kind.is_empty()
        && kind != def.kind
    {
        return Err(ApiError::bad_request(format!(
            "the body is a {kind}, but this endpoint serves {} ({want_version})",
            def.kind
        )));
    }
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str)
        && !av.is_empty()
        && av != want_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({want_version})"
        )));
    }
    Ok(())
}

/// Puts the URL's namespace into the object, refusing a different one in the body.
fn bind_namespace(
    def: &ResourceDef,
    rr: &ResourceRequest,
    obj: &mut Value,
) -> Result<(), ApiError> {
    if !def.namespaced {
        return Ok(());
    }
    let url_ns = rr.namespace.clone().unwrap_or_default();
    let meta = obj
        .as_object_mut()
        .map(|m| m.entry("metadata").or_insert_with(|| json!({})))
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let Some(meta) = meta.as_object_mut() else {
        return Err(ApiError::bad_request("metadata must be an object"));
    };
    match meta.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != url_ns => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            meta.insert("namespace".into(), json!(url_ns));
            Ok(())
        }
    }
}

fn write_options(rr: &ResourceRequest) -> Result<WriteOptions, ApiError> {
    let dry_run = match rr.param("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::invalid_params(
                "CreateOptions",
                &[FieldError::not_supported(
                    "dryRun",
                    Some(other.to_string()),
                    "supported values: \"All\"",
                )],
            ));
        }
    };
    Ok(WriteOptions {
        api: true,
        dry_run,
        ..WriteOptions::default()
    })
}

fn key_for(rr: &ResourceRequest) -> Key {
    (
        rr.namespace.clone().unwrap_or_default(),
        rr.name.clone().unwrap_or_default(),
    )
}

fn build_filter(rr: &ResourceRequest) -> Result<ObjectFilter, ApiError> {
    let def = rr.id.def();
    let bad_request = |error: &dyn std::fmt::Display| ApiError::bad_request(error.to_string());
    let fields = FieldSelector::parse(rr.param("fieldSelector").unwrap_or(""))
        .map_err(|error| bad_request(&error))?;
    fields
        .validate_for(def)
        .map_err(|error| bad_request(&error))?;
    let labels = LabelSelector::parse(rr.param("labelSelector").unwrap_or(""))
        .map_err(|error| bad_request(&error))?;
    Ok(ObjectFilter {
        namespace: rr.namespace.clone(),
        fields,
        labels,
    })
}

fn parse_rv(s: &str) -> Result<u64, ApiError> {
    s.parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version {s:?}: must be a decimal number"
        ))
    })
}

async fn resource(
    shared: &Arc<Shared>,
    parts: &http::request::Parts,
    body: Incoming,
    rr: &ResourceRequest,
    user: &UserInfo,
) -> Result<Reply, ApiError> {
    let def = rr.id.def();
    let accept = parts
        .headers
        .get(http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let content_type = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let table = TableOptions::from_request(accept, rr.param("includeObject"));
    if def.storage == ResourceKind::AccessReview {
        let body = read_body(body).await?;
        let obj = decode_object(content_type.as_deref(), &body)?;
        check_kind(def, &obj)?;
        let rules_incomplete = shared.rules_incomplete.load(Ordering::Relaxed);
        return review::answer(
            &shared.authorizer,
            def,
            rr.namespace.as_deref(),
            user,
            obj,
            rules_incomplete,
        )
        .map(|v| Reply::json(201, &v));
    }
    match rr.verb {
        Verb::Get => {
            let obj = shared
                .store
                .get(rr.id, &key_for(rr))
                .ok_or_else(|| ApiError::not_found(def, rr.name.as_deref().unwrap_or("")))?;
            Ok(match table {
                Some(t) => Reply::json(200, &table::object_table(def, &obj, t)),
                None => Reply::json(200, &obj),
            })
        }
        Verb::List => list(shared, rr, table),
        Verb::Watch => watch(shared, rr, table),
        Verb::Create => {
            let body = read_body(body).await?;
            let mut obj = decode_object(content_type.as_deref(), &body)?;
            let warnings = body_field_problems(def, rr, content_type.as_deref(), &body, &obj)?;
            check_kind(def, &obj)?;
            bind_namespace(def, rr, &mut obj)?;
            let stored = shared.store.create(rr.id, obj, write_options(rr)?)?;
            Ok(Reply::json(201, &stored).warned(warnings))
        }
        Verb::Update => {
            let body = read_body(body).await?;
            let mut obj = decode_object(content_type.as_deref(), &body)?;
            let warnings = body_field_problems(def, rr, content_type.as_deref(), &body, &obj)?;
            check_kind(def, &obj)?;
            bind_namespace(def, rr, &mut obj)?;
            let url_name = rr.name.clone().unwrap_or_default();
            if let Some(n) = obj.pointer("/metadata/name").and_then(Value::as_str)
                && !n.is_empty()
                && n != url_name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({url_name})"
                )));
            }
            let target = if rr.subresource.is_some() {
                UpdateTarget::Status
            } else {
                UpdateTarget::Main
            };
            let (stored, created) =
                shared
                    .store
                    .update(rr.id, key_for(rr), obj, target, write_options(rr)?)?;
            Ok(Reply::json(if created { 201 } else { 200 }, &stored).warned(warnings))
        }
        Verb::Patch => {
            let kind = PatchKind::from_content_type(content_type.as_deref().unwrap_or(""))?;
            if kind == PatchKind::Apply && rr.param("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::invalid_params(
                    "PatchOptions",
                    &[FieldError::required(
                        "fieldManager",
                        "is required for apply patch",
                    )],
                ));
            }
            let body = read_body(body).await?;
            let patch = PatchBody::decode(kind, &body)?;
            let level = FieldValidation::from_param(rr.param("fieldValidation"))?;
            // Field validation looks at the patched object, as kube-apiserver does;
            // a patch that creates (apply) is judged like a body.
            let warnings = match shared.store.get(rr.id, &key_for(rr)) {
                Some(current) => {
                    let mut patched = (*current).clone();
                    patch.apply_to(&mut patched)?;
                    FieldProblems::of(def, &patched, None).judge_patched(&patched, level)?
                }
                None => FieldProblems::of(def, &patch.patch, None).judge_body(def, level)?,
            };
            let target = if rr.subresource.is_some() {
                UpdateTarget::Status
            } else {
                UpdateTarget::Main
            };
            let (stored, created) =
                shared
                    .store
                    .patch(rr.id, key_for(rr), &patch, target, write_options(rr)?)?;
            Ok(Reply::json(if created { 201 } else { 200 }, &stored).warned(warnings))
        }
        Verb::Delete => {
            let body = read_body(body).await?;
            let opts: Value = if body.iter().all(u8::is_ascii_whitespace) {
                json!({})
            } else {
                decode_object(content_type.as_deref(), &body)?
            };
            let pre = Preconditions {
                uid: opts
                    .pointer("/preconditions/uid")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                resource_version: opts
                    .pointer("/preconditions/resourceVersion")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            };
            let mut wopts = write_options(rr)?;
            if opts
                .get("dryRun")
                .and_then(Value::as_array)
                .is_some_and(|a| a.iter().any(|v| v == "All"))
            {
                wopts.dry_run = true;
            }
            let gone = shared.store.delete(rr.id, key_for(rr), &pre, wopts)?;
            let mut details = json!({
                "name": rr.name.clone().unwrap_or_default(),
                "kind": def.name,
                "uid": crate::objects::meta::meta_str(&gone, "uid").unwrap_or(""),
            });
            if !def.group.is_empty() {
                details["group"] = json!(def.group);
            }
            Ok(Reply::json(
                200,
                &json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }),
            ))
        }
        Verb::DeleteCollection => {
            let filter = build_filter(rr)?;
            let gone = shared
                .store
                .delete_collection(rr.id, &filter, write_options(rr)?)?;
            let page = ListPage {
                encoded: Vec::new(),
                items: gone,
                rv: shared.store.current_rv(),
                continue_token: None,
                remaining: None,
            };
            Ok(Reply::Json {
                code: 200,
                body: list_json(def, &page),
                warnings: Vec::new(),
            })
        }
    }
}

/// Field validation of a create or update body: refuses it (`fieldValidation=Strict`)
/// or returns the warnings to send. Protobuf bodies cannot carry unknown fields.
fn body_field_problems(
    def: &ResourceDef,
    rr: &ResourceRequest,
    content_type: Option<&str>,
    raw: &[u8],
    object: &Value,
) -> Result<Vec<String>, ApiError> {
    let level = FieldValidation::from_param(rr.param("fieldValidation"))?;
    let base = content_type.unwrap_or("application/json");
    let raw_json = (base.starts_with("application/json") || base.is_empty()).then_some(raw);
    if base.starts_with("application/vnd.kubernetes.protobuf") {
        return Ok(Vec::new());
    }
    FieldProblems::of(def, object, raw_json).judge_body(def, level)
}

/// Encodes a list page as `<Kind>List` JSON without building a Value tree.
fn list_json(def: &ResourceDef, page: &ListPage) -> Bytes {
    let mut buf = Vec::with_capacity(128 + page.items.len() * 512);
    let mut meta = json!({ "resourceVersion": page.rv.to_string() });
    if let Some(c) = &page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(r) = page.remaining {
        meta["remainingItemCount"] = json!(r);
    }
    buf.extend_from_slice(b"{\"kind\":\"");
    buf.extend_from_slice(def.list_kind.as_bytes());
    buf.extend_from_slice(b"\",\"apiVersion\":\"");
    buf.extend_from_slice(def.api_version().as_bytes());
    buf.extend_from_slice(b"\",\"metadata\":");
    let _ = serde_json::to_writer(&mut buf, &meta);
    buf.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        match page.encoded.get(i).and_then(Option::as_ref) {
            Some(json) => buf.extend_from_slice(json),
            None => {
                let _ = serde_json::to_writer(&mut buf, &**item);
            }
        }
    }
    buf.extend_from_slice(b"]}");
    Bytes::from(buf)
}

fn list(
    shared: &Shared,
    rr: &ResourceRequest,
    table: Option<TableOptions>,
) -> Result<Reply, ApiError> {
    let def = rr.id.def();
    let filter = build_filter(rr)?;
    let rv = rr.param("resourceVersion").filter(|s| !s.is_empty());
    let rvm = rr.param("resourceVersionMatch").filter(|s| !s.is_empty());
    let cont = rr.param("continue").filter(|s| !s.is_empty());
    let mut errs = Vec::new();
    if rr.param("sendInitialEvents").is_some() {
        errs.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if rvm.is_some() && rv.is_none() {
        errs.push(FieldError::forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if cont.is_some() && rv.is_some_and(|r| r != "0") {
        errs.push(FieldError::forbidden(
            "resourceVersion",
            "specifying resource version is not allowed when using continue",
        ));
    }
    if let Some(m) = rvm
        && m != "NotOlderThan"
        && m != "Exact"
    {
        errs.push(FieldError::not_supported(
            "resourceVersionMatch",
            Some(m.to_string()),
            "supported values: \"Exact\", \"NotOlderThan\", \"\"",
        ));
    }
    if rvm == Some("Exact") && rv == Some("0") {
        errs.push(FieldError::forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
        ));
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid_params("ListOptions", &errs));
    }
    // kube-apiserver reads a zero or negative limit as no limit.
    let limit = match rr.param("limit").filter(|s| !s.is_empty()) {
        Some(l) => {
            let n = l.parse::<i64>().map_err(|_| {
                ApiError::bad_request(format!("invalid limit {l:?}: must be an integer"))
            })?;
            usize::try_from(n).ok().filter(|n| *n > 0)
        }
        None => None,
    };
    let cont = cont.map(ContinueToken::decode).transpose()?;
    let version = match (rv, rvm) {
        (None, _) => ListVersion::Latest,
        (Some("0"), _) => ListVersion::Any,
        (Some(r), Some("Exact")) => ListVersion::Exact(parse_rv(r)?),
        (Some(r), _) => ListVersion::NotOlderThan(parse_rv(r)?),
    };
    let page = shared
        .store
        .list(rr.id, &filter, limit, cont.as_ref(), version)?;
    Ok(match table {
        Some(t) => Reply::json(
            200,
            &table::list_table(def, &page.items, t, page.rv, page.continue_token.as_deref()),
        ),
        None => Reply::Json {
            code: 200,
            body: list_json(def, &page),
            warnings: Vec::new(),
        },
    })
}

fn watch(
    shared: &Arc<Shared>,
    rr: &ResourceRequest,
    table: Option<TableOptions>,
) -> Result<Reply, ApiError> {
    let def = rr.id.def();
    let filter = Arc::new(build_filter(rr)?);
    let send_initial_events = match rr.param("sendInitialEvents") {
        None | Some("") => None,
        Some("true" | "1") => Some(true),
        Some("false" | "0") => Some(false),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "invalid sendInitialEvents {other:?}: must be true or false"
            )));
        }
    };
    let rv = rr.param("resourceVersion").filter(|s| !s.is_empty());
    let rvm = rr.param("resourceVersionMatch").filter(|s| !s.is_empty());
    let bookmarks = rr.flag("allowWatchBookmarks");
    let features = shared.features();
    let mut errs = Vec::new();
    if send_initial_events.is_some() && !features.watch_list {
        errs.push(FieldError::forbidden(
            "sendInitialEvents",
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        ));
    }
    match send_initial_events {
        Some(_) => {
            if rvm != Some("NotOlderThan") {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
        }
        None => {
            if rvm.is_some() {
                errs.push(FieldError::forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
        }
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid_params("ListOptions", &errs));
    }
    let timeout = match rr.param("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(t) => Some(Duration::from_secs(t.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {t:?}"))
        })?)),
        None => None,
    };
    let start = match (send_initial_events, rv) {
        (Some(true), Some(r)) if r != "0" => {
            let r = parse_rv(r)?;
            let current = shared.store.current_rv();
            if r > current {
                return Err(ApiError::too_large_resource_version(r, current));
            }
            WatchStart::CurrentWithState
        }
        (Some(true), _) => WatchStart::CurrentWithState,
        (Some(false), None | Some("0")) => WatchStart::After(shared.store.current_rv()),
        (None, None | Some("0")) => WatchStart::CurrentWithState,
        (_, Some(r)) => WatchStart::After(parse_rv(r)?),
    };
    if send_initial_events == Some(true) && bookmarks && !features.watch_progress {
        // The streaming list needs the storage to report progress for its closing
        // bookmark; without it kube-apiserver answers 200 and one ERROR event.
        let status = ApiError::new(
            500,
            "InternalError",
            "a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled",
        );
        let shared = shared.clone();
        return Ok(Reply::Watch {
            body_builder: Box::new(move |_| watch_stream::error_body(&shared, &status)),
            holds_permit: false,
            streaming: false,
        });
    }
    let sub = match shared.store.watch(rr.id, filter, start) {
        Ok(sub) => sub,
        Err(WatchStartError::Expired { requested, oldest }) => {
            let status =
                ApiError::expired(format!("too old resource version: {requested} ({oldest})"));
            let shared = shared.clone();
            return Ok(Reply::Watch {
                body_builder: Box::new(move |_| watch_stream::error_body(&shared, &status)),
                holds_permit: false,
                streaming: false,
            });
        }
        Err(WatchStartError::TooLarge { requested, current }) => {
            return Err(ApiError::too_large_resource_version(requested, current));
        }
    };
    let opts = WatchOptions {
        bookmarks,
        timeout,
        initial_events_end: send_initial_events == Some(true),
        table,
    };
    let holds_permit = opts.initial_events_end;
    let shared = shared.clone();
    Ok(Reply::Watch {
        body_builder: Box::new(move |permit| {
            watch_stream::watch_body(shared, def, sub, opts, permit)
        }),
        holds_permit,
        streaming: true,
    })
}
