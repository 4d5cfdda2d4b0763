//! The HTTP side of a per-object watch: the requests, sent through `kube::Client::send`
//! (so they go through the client's auth, base URI and transport), and the reading of
//! their responses into the machine's inputs.
//!
//! Nothing here decides anything: what to send and what a response means for the
//! protocol is [`machine`](crate::machine)'s business.

use std::fmt::Debug;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::{self, BoxFuture};
use http_body_util::{BodyExt, Limited};
use kube::Client;
use kube::client::Body;
use kube::core::{ObjectList, Status, WatchEvent};
use kube_common::Verb;
use serde::de::DeserializeOwned;

use crate::decode::{Line, LineDecoder};
use crate::machine::{self, Failure, Input, Request};
use crate::{MonitorErrorKind, SharedError, TransportError, WatchedObject};

/// The largest error or list response read. A list of one object is one object; an
/// error is a `Status`.
const MAX_RESPONSE: usize = 64 * 1024 * 1024;

/// Where one key's requests go.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    /// The collection's URL path, e.g. `/api/v1/namespaces/shop/secrets`.
    pub(crate) path: &'a str,
    /// The object's name.
    pub(crate) name: &'a str,
}

/// How a request is sent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Send<'a> {
    /// The request.
    pub(crate) request: Request,
    /// For [`Request::Watch`]: the resourceVersion to watch from.
    pub(crate) resource_version: &'a str,
    /// `timeoutSeconds` of a watch.
    pub(crate) timeout_seconds: u32,
    /// Whether this repeats a request that failed (counted apart by the transport).
    pub(crate) retry: bool,
}

/// The URL (path and query) of a request for `target`.
pub(crate) fn url(target: Target<'_>, send: &Send<'_>) -> String {
    let mut query = form_urlencoded::Serializer::new(format!("{}?", target.path));
    query.append_pair("fieldSelector", &format!("metadata.name={}", target.name));
    match send.request {
        Request::List { consistent } => {
            if !consistent {
                query.append_pair("resourceVersion", "0");
            }
        }
        Request::StreamingList => {
            query
                .append_pair("watch", "true")
                .append_pair("allowWatchBookmarks", "true")
                .append_pair("sendInitialEvents", "true")
                // No resourceVersion: a consistent read, as client-go asks for it.
                .append_pair("resourceVersionMatch", "NotOlderThan")
                .append_pair("timeoutSeconds", &send.timeout_seconds.to_string());
        }
        Request::Watch => {
            query
                .append_pair("watch", "true")
                .append_pair("allowWatchBookmarks", "true")
                .append_pair("resourceVersion", send.resource_version)
                .append_pair("timeoutSeconds", &send.timeout_seconds.to_string());
        }
    }
    query.finish()
}

/// What the response to a request was.
pub(crate) enum Answer<K> {
    /// A watch stream is open.
    Stream(EventStream),
    /// Anything else, as the machine's input.
    Input(Input<K>),
}

/// Sends the request and reads its response as far as the machine needs: the headers
/// of a watch, the whole body of a list or an error.
///
/// The request is built and handed to the client before the returned future exists,
/// and what follows the response headers runs as a second future that takes the
/// first one's place: ten thousand of these wait for their headers at once during a
/// start-up, and an `async fn` would keep its arguments, the request and the room for
/// reading a list or an error in every one of them while it waits.
pub(crate) fn send<'a, K>(
    client: &'a Client,
    target: Target<'a>,
    send: Send<'_>,
) -> impl Future<Output = Answer<K>> + 'a
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + std::marker::Send + 'a,
{
    let verb = send.request.verb();
    let kind = send.request;
    // Combinators, not an `async` block: a future awaited from an `async` block's
    // captures is stored twice (the capture and the awaited copy).
    let sending = match build(target, &send) {
        Ok(request) => client
            .send(request)
            .map(|response| {
                response.map_err(|error| TransportError::Request(SharedError::new(error)))
            })
            .left_future(),
        Err(error) => {
            future::ready(Err(TransportError::Request(SharedError::new(error)))).right_future()
        }
    };
    sending.then(move |response| answer(verb, kind, target.name, response))
}

/// The request for `target`.
fn build(target: Target<'_>, send: &Send<'_>) -> Result<http::Request<Body>, http::Error> {
    let mut request = http::Request::get(url(target, send)).body(Body::empty())?;
    let verb = send.request.verb();
    // The span name kube's own requests carry.
    request.extensions_mut().insert(verb.as_str());
    if send.retry {
        request.extensions_mut().insert(kube_common::backoff::Retry);
    }
    if let Request::List { .. } = send.request {
        // The watch follows as soon as the list is answered: a transport that plans its
        // connections for watches plans for this one now, so that a burst of first
        // syncs is not squeezed onto the one connection short requests share.
        request
            .extensions_mut()
            .insert(kube_common::hint::LongLived);
    }
    Ok(request)
}

/// What the response (or the failure to get one) means for the machine: ready at
/// once for a watch (the stream is open), a boxed future that reads the body for a
/// list or an error (boxed so that its room is not reserved while headers are awaited).
fn answer<'a, K>(
    verb: Verb,
    kind: Request,
    name: &'a str,
    response: Result<http::Response<Body>, TransportError>,
) -> future::Either<future::Ready<Answer<K>>, BoxFuture<'a, Answer<K>>>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + std::marker::Send + 'a,
{
    let response = match response {
        Ok(response) => response,
        Err(cause) => {
            return future::ready(Answer::Input(Input::Failed(transport(verb, cause))))
                .left_future();
        }
    };
    let (head, body) = response.into_parts();
    if !head.status.is_success() {
        let retry_after = kube_common::adaptive::retry_after(&head.headers);
        let status = head.status;
        return async move {
            Answer::Input(Input::Failed(
                error_response(verb, status, body, retry_after).await,
            ))
        }
        .boxed()
        .right_future();
    }
    match kind {
        Request::StreamingList | Request::Watch => {
            future::ready(Answer::Stream(EventStream::new(body))).left_future()
        }
        Request::List { .. } => async move { Answer::Input(list_response(verb, name, body).await) }
            .boxed()
            .right_future(),
    }
}

/// A list's objects, keeping only the one named like the key (the field selector
/// already did that; this guards against a server that ignores it).
async fn list_response<K>(verb: Verb, name: &str, body: Body) -> Input<K>
where
    K: WatchedObject + Clone + DeserializeOwned,
{
    let bytes = match read_all(body).await {
        Ok(bytes) => bytes,
        Err(cause) => return Input::Failed(transport(verb, cause)),
    };
    match serde_json::from_slice::<ObjectList<K>>(&bytes) {
        Ok(list) => Input::Listed {
            resource_version: list.metadata.resource_version,
            object: list
                .items
                .into_iter()
                .find(|object| object.object_name() == Some(name)),
        },
        Err(error) => Input::Failed(transport(verb, TransportError::decode(&error))),
    }
}

/// An error response: the `Status` the API server sent, or what can be said without
/// one.
async fn error_response(
    verb: Verb,
    code: http::StatusCode,
    body: Body,
    retry_after: Option<Duration>,
) -> Failure {
    let status = read_all(body)
        .await
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Status>(&bytes).ok())
        .filter(|status| status.code != 0)
        .unwrap_or_else(|| Status {
            code: code.as_u16(),
            reason: code.canonical_reason().unwrap_or_default().to_owned(),
            message: format!("the server answered {code} without a Status"),
            ..Status::default()
        });
    Failure {
        retry_after: retry_after.or_else(|| machine::retry_after(&status)),
        kind: machine::api_error(&status, verb),
    }
}

async fn read_all(body: Body) -> Result<Bytes, TransportError> {
    Limited::new(body, MAX_RESPONSE)
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .map_err(|error| TransportError::Body(SharedError::from_boxed(error)))
}

fn transport(verb: Verb, cause: TransportError) -> Failure {
    Failure {
        kind: MonitorErrorKind::Transport { verb, cause },
        retry_after: None,
    }
}

/// An open watch response, decoded event by event.
pub(crate) struct EventStream {
    body: Body,
    lines: LineDecoder,
    /// Set once the body ended; the decoder may still hold a last line.
    ended: bool,
}

impl EventStream {
    fn new(body: Body) -> Self {
        Self {
            body,
            lines: LineDecoder::default(),
            ended: false,
        }
    }

    /// The next input from the stream: an event, its clean end, or its failure.
    pub(crate) async fn next<K>(&mut self) -> Input<K>
    where
        K: DeserializeOwned,
    {
        loop {
            match self.lines.next_line() {
                Ok(Some(line)) => return decode_event(&line),
                Ok(None) => {}
                Err(_too_long) => {
                    let max = crate::decode::MAX_LINE;
                    return Input::Failed(transport(
                        Verb::Watch,
                        TransportError::EventTooLong { max },
                    ));
                }
            }
            if self.ended {
                return match self.lines.finish() {
                    Some(line) => decode_event(&line),
                    None => Input::Ended,
                };
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.lines.push(data);
                    }
                }
                Some(Err(error)) => {
                    return Input::Failed(transport(
                        Verb::Watch,
                        TransportError::Body(SharedError::new(error)),
                    ));
                }
                None => self.ended = true,
            }
        }
    }
}

fn decode_event<K: DeserializeOwned>(line: &Line) -> Input<K> {
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(event) => Input::Event(event),
        Err(error) => Input::Failed(transport(Verb::Watch, TransportError::decode(&error))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(request: Request) -> Vec<(String, String)> {
        let target = Target {
            path: "/api/v1/namespaces/shop/secrets",
            name: "shop-tls",
        };
        let url = url(
            target,
            &Send {
                request,
                resource_version: "42",
                timeout_seconds: 300,
                retry: false,
            },
        );
        let (path, query) = url.split_once('?').unwrap();
        assert_eq!(path, target.path);
        form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect()
    }

    fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
        expected
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_streaming_list_asks_for_a_consistent_read() {
        assert_eq!(
            query(Request::StreamingList),
            pairs(&[
                ("fieldSelector", "metadata.name=shop-tls"),
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("sendInitialEvents", "true"),
                ("resourceVersionMatch", "NotOlderThan"),
                ("timeoutSeconds", "300"),
            ])
        );
    }

    #[test]
    fn lists_read_the_cache_first_and_consistently_after_an_expiry() {
        assert_eq!(
            query(Request::List { consistent: false }),
            pairs(&[
                ("fieldSelector", "metadata.name=shop-tls"),
                ("resourceVersion", "0")
            ])
        );
        assert_eq!(
            query(Request::List { consistent: true }),
            pairs(&[("fieldSelector", "metadata.name=shop-tls")])
        );
    }

    #[test]
    fn a_watch_resumes_from_its_resource_version() {
        assert_eq!(
            query(Request::Watch),
            pairs(&[
                ("fieldSelector", "metadata.name=shop-tls"),
                ("watch", "true"),
                ("allowWatchBookmarks", "true"),
                ("resourceVersion", "42"),
                ("timeoutSeconds", "300"),
            ])
        );
    }
}
