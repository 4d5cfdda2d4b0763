//! A kube client for one sequence of requests that something else retries, such as
//! kube-runtime's watcher (a list, a watch, a re-list after a failure): each request
//! goes through the limiter like every other start-up request, and a request that
//! follows a failed one is marked as a retry.
//!
//! The watcher keeps its own semantics (when to re-list, when to re-watch, its backoff
//! between attempts); the client underneath adds what the limiter gives the rest of
//! certwatch: a refusal for load shrinks the shared window, the refused request's place
//! in line and its `Retry-After` carry over to the watcher's next request (which waits
//! for them), and the transport's accounting counts that next request as a retry.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, header};
use kube::Client;
use kube::client::Body;

use super::{AdaptiveLimiter, Attempt, Turn, is_overload_status};

/// A client whose requests, one after another, go through `limiter` (see the [module
/// docs](self)). Requests are assumed to come one at a time, as a watcher sends them:
/// use one such client per watcher.
pub fn sequential_client(client: Client, limiter: AdaptiveLimiter) -> Client {
    let default_namespace = client.default_namespace().to_owned();
    let service = Sequence {
        client,
        limiter,
        after_failure: Arc::new(Mutex::new(AfterFailure::default())),
    };
    Client::new(service, default_namespace)
}

/// What the last request of the sequence left for the next one.
#[derive(Debug, Default)]
struct AfterFailure {
    /// The last request failed: the next one retries it.
    failed: bool,
    /// The last request was refused for load: its place in line, due after the
    /// refusal's `Retry-After`.
    refused: Option<Turn>,
}

#[derive(Clone)]
struct Sequence {
    client: Client,
    limiter: AdaptiveLimiter,
    /// Guards what the last request left for the next; locked only between awaits.
    after_failure: Arc<Mutex<AfterFailure>>,
}

impl Sequence {
    fn take_after_failure(&self) -> AfterFailure {
        std::mem::take(&mut *crate::sync::lock(&self.after_failure))
    }

    fn leave_after(&self, left: AfterFailure) {
        *crate::sync::lock(&self.after_failure) = left;
    }

    async fn send(self, request: Request<Body>) -> Result<Response<Body>, kube::Error> {
        let previous = self.take_after_failure();
        let turn = previous.refused.unwrap_or_else(|| self.limiter.turn());
        let attempt = if previous.failed {
            Attempt::Retry
        } else {
            Attempt::First
        };
        // Held until the response's headers: for a watch, until the server has
        // accepted it (its events then flow without taking a seat's worth of work).
        let permit = turn.acquire().await;
        let result = self.client.send(attempt.mark(request)).await;
        let left = match &result {
            Ok(response) if is_overload_status(response.status().as_u16()) => AfterFailure {
                failed: true,
                refused: Some(permit.refused(retry_after(response.headers()))),
            },
            Ok(response) if response.status().is_success() => {
                permit.succeeded();
                AfterFailure::default()
            }
            // Not about load (403 until a grant, a broken connection): nothing to
            // learn, but the watcher's next request retries this one.
            Ok(_) | Err(_) => AfterFailure {
                failed: true,
                refused: None,
            },
        };
        self.leave_after(left);
        result
    }
}

impl tower::Service<Request<Body>> for Sequence {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _context: &mut Context<'_>) -> Poll<Result<(), kube::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        Box::pin(self.clone().send(request))
    }
}

/// The `Retry-After` of a response, in whole seconds as kube-apiserver sends it.
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use tokio::time::Instant;

    use super::*;

    /// What the server saw of one request: when, and whether it was marked a retry.
    type Seen = Arc<Mutex<Vec<(Duration, bool)>>>;

    /// A client whose server answers with `statuses` in turn (429s with
    /// `Retry-After: 1`), recording each request in `seen`.
    fn scripted_client(statuses: &[u16], seen: &Seen, started: Instant) -> Client {
        let statuses = Arc::new(Mutex::new(
            statuses.iter().copied().collect::<VecDeque<_>>(),
        ));
        let seen = Arc::clone(seen);
        let service = tower::service_fn(move |request: Request<Body>| {
            let retry = request
                .extensions()
                .get::<crate::backoff::Retry>()
                .is_some();
            seen.lock().unwrap().push((started.elapsed(), retry));
            let status = statuses.lock().unwrap().pop_front().unwrap_or(200);
            async move {
                let mut response = Response::builder().status(status);
                if status == 429 {
                    response = response.header(header::RETRY_AFTER, "1");
                }
                Ok::<_, std::convert::Infallible>(response.body(String::from("{}")).unwrap())
            }
        });
        Client::new(service, "default")
    }

    async fn get(client: &Client) -> u16 {
        let request = Request::get("/api/v1/namespaces").body(Vec::new()).unwrap();
        client
            .send(request.map(Body::from))
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_request_shrinks_the_window_and_its_retry_waits_and_is_marked() {
        let started = Instant::now();
        let seen = Seen::default();
        let limiter = AdaptiveLimiter::new(Some(8));
        // Someone else holds 3 permits: the refusal cuts the window to what is out.
        let others: Vec<_> = [(); 3].map(|()| limiter.acquire()).into_iter().collect();
        let mut held = Vec::new();
        for other in others {
            held.push(other.await);
        }
        let client = sequential_client(
            scripted_client(&[429, 503, 200, 200], &seen, started),
            limiter.clone(),
        );
        assert_eq!(get(&client).await, 429);
        assert_eq!(limiter.snapshot().window, Some(2));
        drop(held);
        // The watcher retries sooner than Retry-After: its request waits it out.
        assert_eq!(get(&client).await, 503);
        // 503 without Retry-After: the limiter's backoff delay (800 ms step, jittered).
        assert_eq!(get(&client).await, 200);
        assert_eq!(get(&client).await, 200);
        let seen = seen.lock().unwrap().clone();
        let retries: Vec<bool> = seen.iter().map(|(_, retry)| *retry).collect();
        assert_eq!(retries, [false, true, true, false]);
        assert!(seen[1].0 >= Duration::from_secs(1), "{seen:?}");
        assert!(
            seen[2].0 - seen[1].0 >= Duration::from_millis(400),
            "{seen:?}"
        );
        let snapshot = limiter.snapshot();
        assert_eq!(
            (snapshot.refused, snapshot.succeeded, snapshot.in_flight),
            (2, 2, 0)
        );
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(header::RETRY_AFTER, http::HeaderValue::from_static("3"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(
            header::RETRY_AFTER,
            http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&headers), None);
    }
}
