//! Route events for the pipeline, from a kube-runtime watcher on routes.
//!
//! The watcher's (re-)listings become one [`RouteEvent::Listed`] with every route, so
//! the pipeline sees the initial set at once (to start every secret's registration
//! concurrently) and can tell, after a re-list, which routes vanished while the watch
//! was down.
//!
//! Failed requests are retried along [`kube_common::backoff`] (client-go's reflector
//! policy: 0.8 s doubling to a 30 s cap, started over after 2 minutes without a
//! failure), so a route created after a fault has ended is seen at most one capped
//! delay plus one list later. The sequence is *not* started over by a watcher event:
//! kube-runtime's watcher reports every re-list attempt as an event before it lists,
//! so resetting on events kept a failing list at its first delay forever. A request
//! the API server refuses as malformed (400, e.g. an invalid label selector) cannot
//! succeed by retrying: it ends the stream with [`RouteEvent::Failed`].

use std::fmt;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::watcher;
use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::reconnect::{Reconnect, Waited};

use crate::route::Route;

/// A change to the set of routes.
#[derive(Clone, Debug)]
pub enum RouteEvent {
    /// A complete listing: every route that exists now. The first one is the start-up
    /// set; later ones follow a re-list (routes absent from it were deleted).
    Listed(Vec<Route>),
    /// A route was created or changed.
    Applied(Route),
    /// A route was deleted.
    Deleted(Route),
    /// The API server refused the watch in a way no retry can fix; the stream ends
    /// after this event.
    Failed(RouteWatchError),
}

/// The route watch was refused for good.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the API server refused the route watch ({code} {reason}): {message}; check the route \
     selector and the namespaces certwatch watches"
)]
pub struct RouteWatchError {
    /// HTTP status code.
    pub code: u16,
    /// The `Status` reason, e.g. `BadRequest`.
    pub reason: String,
    /// The API server's message.
    pub message: String,
}

impl RouteWatchError {
    /// The permanent failure behind `error`, if it is one: a request the API server
    /// rejects as malformed (400). Everything else (403 until a grant, 404 until the
    /// CRD is installed, 429, 5xx, broken connections) may pass and is retried.
    pub fn permanent(error: &watcher::Error) -> Option<Self> {
        let api_error = match error {
            watcher::Error::InitialListFailed(kube::Error::Api(status))
            | watcher::Error::WatchStartFailed(kube::Error::Api(status))
            | watcher::Error::WatchFailed(kube::Error::Api(status)) => status,
            watcher::Error::WatchError(status) => {
                return (status.code == 400).then(|| Self {
                    code: status.code,
                    reason: status.reason.clone(),
                    message: status.message.clone(),
                });
            }
            _ => return None,
        };
        (api_error.code == 400).then(|| Self {
            code: api_error.code,
            reason: api_error.reason.clone(),
            message: api_error.message.clone(),
        })
    }
}

/// The one retry policy as a sequence of delays. It is never reset by the watcher's
/// events: the policy starts over after a healthy period, not on the watcher's next
/// event (which, for a list that keeps failing, is the re-list attempt itself), and
/// after an outage of the server (see [`backed_off`]).
struct PolicyBackoff(Backoff);

impl fmt::Debug for PolicyBackoff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyBackoff")
            .field(self.0.policy())
            .finish()
    }
}

impl Iterator for PolicyBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        // tokio's clock, so that tests with a paused clock see the policy they set.
        let now = tokio::time::Instant::now().into_std();
        Some(self.0.next_delay_at(now, rand::random::<f64>()))
    }
}

/// Whether the watcher's request failed without an answer from the server (refused
/// connection, broken stream): what an outage of the server looks like.
fn unanswered(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(error)
        | watcher::Error::WatchStartFailed(error)
        | watcher::Error::WatchFailed(error) => !matches!(error, kube::Error::Api(_)),
        watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => false,
    }
}

/// `events` with a delay after each error before the next request: the policy's next
/// delay, or, for a request that failed without an answer when the server's prober is
/// given, until the server answers again after an outage (the sequence then starts
/// over). kube-runtime's watcher sends its next request when it is next polled, so
/// holding the poll back is the delay.
fn backed_off<S, T>(
    events: S,
    policy: PolicyBackoff,
    reconnect: Option<Reconnect>,
) -> impl Stream<Item = Result<T, watcher::Error>> + Send
where
    S: Stream<Item = Result<T, watcher::Error>> + Send,
    T: Send,
{
    struct State<S> {
        events: std::pin::Pin<Box<S>>,
        policy: PolicyBackoff,
        reconnect: Option<Reconnect>,
        /// The last item was an error: whether it came without an answer.
        after_error: Option<bool>,
    }
    let state = State {
        events: Box::pin(events),
        policy,
        reconnect,
        after_error: None,
    };
    futures::stream::unfold(state, |mut state| async move {
        if let Some(unanswered) = state.after_error.take() {
            let delay = state.policy.next().unwrap_or_default();
            // A failure with an answer during an outage counts too: a starting
            // kube-apiserver answers 403 to everything for a moment.
            match state
                .reconnect
                .as_ref()
                .filter(|reconnect| unanswered || reconnect.in_outage())
            {
                Some(reconnect) => {
                    let mut waited = reconnect.unanswered().wait(delay).await;
                    // While the server is down only its prober asks.
                    while waited == Waited::Elapsed && reconnect.in_outage() {
                        let delay = state.policy.next().unwrap_or_default();
                        waited = reconnect.unanswered().wait(delay).await;
                    }
                    if waited == Waited::ServerBack {
                        state.policy.0.reset();
                    }
                }
                None => tokio::time::sleep(delay).await,
            }
        }
        let item = state.events.next().await?;
        if let Err(error) = &item {
            state.after_error = Some(unanswered(error));
        }
        Some((item, state))
    })
}

/// Watches routes through `api` (all namespaces, or one) with the watcher `config`
/// (label selectors for router sharding), retrying failed requests with the default
/// [`BackoffPolicy`] and reporting each failure to `on_error`.
pub fn route_events(
    api: Api<Route>,
    config: watcher::Config,
    on_error: impl FnMut(&watcher::Error) + Send + 'static,
) -> impl Stream<Item = RouteEvent> + Send + 'static {
    route_events_with_backoff(api, config, BackoffPolicy::default(), on_error)
}

/// [`route_events`] with another retry policy (tests use short delays).
pub fn route_events_with_backoff(
    api: Api<Route>,
    config: watcher::Config,
    policy: BackoffPolicy,
    on_error: impl FnMut(&watcher::Error) + Send + 'static,
) -> impl Stream<Item = RouteEvent> + Send + 'static {
    route_events_reconnecting(api, config, policy, None, on_error)
}

/// [`route_events_with_backoff`] with the API server's prober: after an outage of the
/// server the watch resumes as soon as the server answers again
/// ([`kube_common::reconnect`]), not after the backoff the outage grew.
pub fn route_events_reconnecting(
    api: Api<Route>,
    config: watcher::Config,
    policy: BackoffPolicy,
    reconnect: Option<Reconnect>,
    mut on_error: impl FnMut(&watcher::Error) + Send + 'static,
) -> impl Stream<Item = RouteEvent> + Send + 'static {
    let mut listing: Option<Vec<Route>> = None;
    let events = backed_off(
        watcher(api, config),
        PolicyBackoff(Backoff::new(policy)),
        reconnect,
    )
    .filter_map(move |item| {
        let event = match item {
            Ok(watcher::Event::Init) => {
                listing = Some(Vec::new());
                None
            }
            Ok(watcher::Event::InitApply(route)) => {
                listing.get_or_insert_with(Vec::new).push(route);
                None
            }
            Ok(watcher::Event::InitDone) => {
                Some(RouteEvent::Listed(listing.take().unwrap_or_default()))
            }
            Ok(watcher::Event::Apply(route)) => Some(RouteEvent::Applied(route)),
            Ok(watcher::Event::Delete(route)) => Some(RouteEvent::Deleted(route)),
            Err(err) => {
                on_error(&err);
                match RouteWatchError::permanent(&err) {
                    Some(permanent) => {
                        tracing::error!(error = %permanent, "route watch refused; giving up");
                        Some(RouteEvent::Failed(permanent))
                    }
                    None => {
                        tracing::warn!(error = %err, "route watch failed; retrying");
                        None
                    }
                }
            }
        };
        std::future::ready(event)
    });
    // Nothing follows a permanent failure, not even another request.
    futures::stream::unfold(
        (Box::pin(events), false),
        |(mut events, ended)| async move {
            if ended {
                return None;
            }
            let event = events.next().await?;
            let ended = matches!(event, RouteEvent::Failed(_));
            Some((event, (events, ended)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_route_watch_backs_off_to_the_cap() {
        let policy = BackoffPolicy::default();
        let mut backoff = PolicyBackoff(Backoff::new(policy));
        let mut delays = Vec::new();
        for _ in 0..10 {
            delays.push(backoff.next().unwrap_or_default());
        }
        assert!(delays.iter().all(|d| *d <= policy.max), "{delays:?}");
        assert!(delays[0] <= policy.initial, "{delays:?}");
        // Jitter keeps each delay within the upper half of its step: by the seventh
        // failure the step is the cap.
        assert!(
            delays[6..].iter().all(|d| *d >= policy.max / 2),
            "{delays:?}"
        );
    }

    #[test]
    fn only_a_malformed_request_is_permanent() {
        let status = |code: u16| kube::core::Status {
            code,
            reason: "Reason".to_owned(),
            message: "message".to_owned(),
            ..kube::core::Status::default()
        };
        let list =
            |code| watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status(code))));
        assert_eq!(
            RouteWatchError::permanent(&list(400)).map(|e| e.code),
            Some(400)
        );
        for code in [401, 403, 404, 410, 429, 500, 503] {
            assert_eq!(RouteWatchError::permanent(&list(code)), None, "{code}");
        }
        let watch = watcher::Error::WatchError(Box::new(status(400)));
        assert!(RouteWatchError::permanent(&watch).is_some());
    }
}
