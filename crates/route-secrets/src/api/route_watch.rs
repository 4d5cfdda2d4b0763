//! Which routes the router sees, as the one stream of route events the pipeline
//! expects: every namespace or a list of them, only namespaces whose labels match a
//! selector, only routes whose labels match a selector (router sharding).
//!
//! Each route watch is a kube-runtime watcher. Its (re-)listings become one
//! [`RouteEvent::Listed`] with every route, so the pipeline sees the initial set at
//! once (to start every secret's registration concurrently) and can tell, after a
//! re-list, which routes vanished while the watch was down.
//!
//! The route selector goes to the API server with each route watch. A namespace list
//! means one route watch per namespace; a namespace selector means a watch on
//! namespaces too. [`ScopeFilter`] merges these into one stream with the pipeline's
//! meaning of [`RouteEvent::Listed`] (every route in scope now): it holds back the
//! first listing until every watch has listed, and when a namespace enters or leaves
//! the selection, or one watch re-lists, it emits a fresh complete listing, from which
//! the pipeline removes what vanished.
//!
//! Failed requests are retried along [`kube_common::backoff`] (client-go's reflector
//! policy: 0.8 s doubling to a 30 s cap, started over after 2 minutes without a
//! failure), so a route created after a fault has ended is seen at most one capped
//! delay plus one list later. The sequence is *not* started over by a watcher event:
//! kube-runtime's watcher reports every re-list attempt as an event before it lists,
//! so a failing list would otherwise stay at its first delay forever. A request the
//! API server refuses as malformed (400, e.g. an invalid label selector) cannot
//! succeed by retrying: it ends the stream with [`RouteEvent::Failed`].

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use kube_common::adaptive::{AdaptiveLimiter, sequential_client};
use kube_common::backoff::{Backoff, BackoffPolicy};
use kube_common::listing::{Change, ListingStreamExt};
use kube_common::reconnect::{Reconnect, Waited};

use crate::route::{Route, RouteKey};

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
    let events = backed_off(
        watcher(api, config),
        PolicyBackoff(Backoff::new(policy)),
        reconnect,
    )
    .gather_listings()
    .filter_map(move |item| {
        let event = match item {
            Ok(Change::Listed(routes)) => Some(RouteEvent::Listed(routes)),
            Ok(Change::Applied(route)) => Some(RouteEvent::Applied(route)),
            Ok(Change::Deleted(route)) => Some(RouteEvent::Deleted(route)),
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

/// The routes in scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteScope {
    /// Namespaces to watch; empty means all.
    pub namespaces: Vec<String>,
    /// Label selector on namespaces (e.g. `router=public`).
    pub namespace_selector: Option<String>,
    /// Label selector on routes (e.g. `shard=a`).
    pub route_selector: Option<String>,
}

/// A change to the set of selected namespaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceEvent {
    /// Every selected namespace (first listing or a re-list).
    Listed(Vec<String>),
    /// A namespace became selected (or changed).
    Applied(String),
    /// A namespace is no longer selected (deleted, or its labels changed).
    Deleted(String),
}

/// An input of [`ScopeFilter`].
#[derive(Clone, Debug)]
pub enum ScopeInput {
    /// An event of route watch number `.0`.
    Routes(usize, Box<RouteEvent>),
    /// A namespace selection change.
    Namespaces(NamespaceEvent),
}

/// Merges route watches and the namespace selection; see the
/// [module documentation](self).
#[derive(Debug)]
pub struct ScopeFilter {
    /// Per route watch: its routes, once it has listed.
    sources: Vec<Option<HashMap<RouteKey, Route>>>,
    /// Selected namespaces: `None` = no selector (all), or not listed yet when
    /// `selector` is set.
    selected: Option<HashSet<String>>,
    selector: bool,
    started: bool,
    /// Routes the pipeline has been told about (and not told are gone).
    forwarded: HashSet<RouteKey>,
}

impl ScopeFilter {
    /// A filter over `sources` route watches, with a namespace selection if
    /// `namespace_selector`.
    pub fn new(sources: usize, namespace_selector: bool) -> Self {
        Self {
            sources: vec![None; sources],
            selected: None,
            selector: namespace_selector,
            started: false,
            forwarded: HashSet::new(),
        }
    }

    fn in_scope(&self, namespace: &str) -> bool {
        !self.selector
            || self
                .selected
                .as_ref()
                .is_some_and(|set| set.contains(namespace))
    }

    fn ready(&self) -> bool {
        self.sources.iter().all(Option::is_some) && (!self.selector || self.selected.is_some())
    }

    /// Every route in scope now, as one listing.
    fn listing(&mut self) -> RouteEvent {
        let routes: Vec<Route> = self
            .sources
            .iter()
            .flatten()
            .flat_map(HashMap::values)
            .filter(|route| self.in_scope(route.namespace().as_deref().unwrap_or("")))
            .cloned()
            .collect();
        self.forwarded = routes.iter().filter_map(Route::key).collect();
        RouteEvent::Listed(routes)
    }

    /// Applies one input; returns what to tell the pipeline.
    pub fn apply(&mut self, input: ScopeInput) -> Option<RouteEvent> {
        let relist = match input {
            ScopeInput::Routes(source, event) => {
                let slot = self.sources.get_mut(source)?;
                match *event {
                    RouteEvent::Listed(routes) => {
                        *slot = Some(
                            routes
                                .into_iter()
                                .filter_map(|route| Some((route.key()?, route)))
                                .collect(),
                        );
                        true
                    }
                    RouteEvent::Applied(route) => {
                        let key = route.key()?;
                        let routes = slot.as_mut()?;
                        routes.insert(key.clone(), route.clone());
                        if !self.started {
                            return None;
                        }
                        if self.in_scope(&key.namespace) {
                            self.forwarded.insert(key);
                            return Some(RouteEvent::Applied(route));
                        }
                        return self
                            .forwarded
                            .remove(&key)
                            .then_some(RouteEvent::Deleted(route));
                    }
                    RouteEvent::Deleted(route) => {
                        let key = route.key()?;
                        slot.as_mut()?.remove(&key);
                        return (self.started && self.forwarded.remove(&key))
                            .then_some(RouteEvent::Deleted(route));
                    }
                    // The pipeline stops on it, whichever watch refused.
                    RouteEvent::Failed(error) => return Some(RouteEvent::Failed(error)),
                }
            }
            ScopeInput::Namespaces(event) => {
                match event {
                    NamespaceEvent::Listed(names) => {
                        self.selected = Some(names.into_iter().collect());
                    }
                    NamespaceEvent::Applied(name) => {
                        if !self.selected.get_or_insert_with(HashSet::new).insert(name) {
                            return None;
                        }
                    }
                    NamespaceEvent::Deleted(name) => {
                        if !self.selected.as_mut().is_some_and(|set| set.remove(&name)) {
                            return None;
                        }
                    }
                }
                true
            }
        };
        if relist && self.ready() {
            self.started = true;
            return Some(self.listing());
        }
        None
    }
}

/// Namespace selection events from a watch on namespaces matching `selector`.
fn namespace_events(
    client: Client,
    selector: &str,
    mut on_error: impl FnMut(&watcher::Error) + Send + 'static,
) -> impl Stream<Item = NamespaceEvent> + Send + 'static {
    watcher(
        Api::<Namespace>::all(client),
        watcher::Config::default().labels(selector),
    )
    .default_backoff()
    .gather_listings()
    .filter_map(move |item| {
        let event = match item {
            Ok(Change::Listed(namespaces)) => Some(NamespaceEvent::Listed(
                namespaces.iter().map(ResourceExt::name_any).collect(),
            )),
            Ok(Change::Applied(namespace)) => Some(NamespaceEvent::Applied(namespace.name_any())),
            Ok(Change::Deleted(namespace)) => Some(NamespaceEvent::Deleted(namespace.name_any())),
            Err(error) => {
                tracing::warn!(%error, "namespace watch failed; retrying");
                on_error(&error);
                None
            }
        };
        std::future::ready(event)
    })
}

/// The route events of `scope`, for the pipeline. `on_error` hears of every failed
/// watch request (`"routes"` or `"namespaces"`); watches retry with backoff and never
/// end the stream. Each watcher's requests go through `limiter`
/// ([`sequential_client`]): a 429 shrinks the window the rest of start-up shares, its
/// `Retry-After` holds the watcher's next request, and that request counts as a retry.
/// With `reconnect`, route watches resume as soon as the API server answers again after
/// an outage ([`kube_common::reconnect`]).
pub fn scoped_route_events(
    client: Client,
    scope: &RouteScope,
    limiter: &AdaptiveLimiter,
    reconnect: Option<Reconnect>,
    on_error: impl Fn(&'static str, &watcher::Error) + Clone + Send + Sync + 'static,
) -> futures::stream::BoxStream<'static, RouteEvent> {
    let route_events = move |api, config, on_error| {
        route_events_reconnecting(
            api,
            config,
            BackoffPolicy::default(),
            reconnect.clone(),
            on_error,
        )
    };
    // One client per watcher: each carries its own watcher's retry state.
    let paced = || sequential_client(client.clone(), limiter.clone());
    // One list request, from the API server's watch cache (resourceVersion=0), as
    // client-go's reflector lists: pages of 500 would cost one round trip each before
    // the first route can be decided (four at the seed's 2,000 routes).
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    if let Some(selector) = &scope.route_selector {
        config = config.labels(selector);
    }
    let route_error = {
        let on_error = on_error.clone();
        move |error: &watcher::Error| on_error("routes", error)
    };
    let apis: Vec<Api<Route>> = if scope.namespaces.is_empty() {
        vec![Api::all(paced())]
    } else {
        scope
            .namespaces
            .iter()
            .map(|namespace| Api::namespaced(paced(), namespace))
            .collect()
    };
    if apis.len() == 1 && scope.namespace_selector.is_none() {
        // One watch and no selection: its events are already what the pipeline wants.
        let api = apis.into_iter().next().unwrap_or_else(|| Api::all(paced()));
        return route_events(api, config, route_error).boxed();
    }

    let mut inputs: Vec<futures::stream::BoxStream<'static, ScopeInput>> = apis
        .into_iter()
        .enumerate()
        .map(|(index, api)| {
            route_events(api, config.clone(), route_error.clone())
                .map(move |event| ScopeInput::Routes(index, Box::new(event)))
                .boxed()
        })
        .collect();
    let sources = inputs.len();
    if let Some(selector) = &scope.namespace_selector {
        let on_error = on_error.clone();
        inputs.push(
            namespace_events(paced(), selector, move |error| {
                on_error("namespaces", error)
            })
            .map(ScopeInput::Namespaces)
            .boxed(),
        );
    }
    let mut filter = ScopeFilter::new(sources, scope.namespace_selector.is_some());
    futures::stream::select_all(inputs)
        .filter_map(move |input| std::future::ready(filter.apply(input)))
        .boxed()
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

    fn route(namespace: &str, name: &str) -> Route {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "route.openshift.io/v1",
            "kind": "Route",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"host": format!("{name}.example.com"), "to": {"kind": "Service", "name": "s"}}
        }))
        .unwrap()
    }

    fn names(event: Option<RouteEvent>) -> Vec<String> {
        match event {
            Some(RouteEvent::Listed(routes)) => {
                let mut names: Vec<String> = routes
                    .iter()
                    .map(|r| r.key().unwrap().to_string())
                    .collect();
                names.sort();
                names
            }
            other => panic!("expected a listing, got {other:?}"),
        }
    }

    #[test]
    fn first_listing_waits_for_every_source_and_the_selection() {
        let mut filter = ScopeFilter::new(2, true);
        assert!(
            filter
                .apply(ScopeInput::Routes(
                    0,
                    Box::new(RouteEvent::Listed(vec![route("a", "r1")]))
                ))
                .is_none()
        );
        assert!(
            filter
                .apply(ScopeInput::Routes(
                    1,
                    Box::new(RouteEvent::Listed(vec![route("b", "r2")]))
                ))
                .is_none()
        );
        // An event before the start is folded into the first listing.
        assert!(
            filter
                .apply(ScopeInput::Routes(
                    1,
                    Box::new(RouteEvent::Applied(route("b", "r3")))
                ))
                .is_none()
        );
        let listed = filter.apply(ScopeInput::Namespaces(NamespaceEvent::Listed(vec![
            "b".into(),
        ])));
        assert_eq!(names(listed), ["b/r2", "b/r3"]);
    }

    #[test]
    fn namespace_changes_relist_and_unselected_routes_vanish() {
        let mut filter = ScopeFilter::new(1, true);
        filter.apply(ScopeInput::Routes(
            0,
            Box::new(RouteEvent::Listed(vec![route("a", "r1"), route("b", "r2")])),
        ));
        assert_eq!(
            names(
                filter.apply(ScopeInput::Namespaces(NamespaceEvent::Listed(vec![
                    "a".into()
                ])))
            ),
            ["a/r1"]
        );
        // A route in an unselected namespace is not forwarded.
        assert!(
            filter
                .apply(ScopeInput::Routes(
                    0,
                    Box::new(RouteEvent::Applied(route("b", "r9")))
                ))
                .is_none()
        );
        assert_eq!(
            names(filter.apply(ScopeInput::Namespaces(NamespaceEvent::Applied("b".into())))),
            ["a/r1", "b/r2", "b/r9"]
        );
        assert_eq!(
            names(filter.apply(ScopeInput::Namespaces(NamespaceEvent::Deleted("a".into())))),
            ["b/r2", "b/r9"]
        );
        // Deleting a route never forwarded says nothing; a forwarded one is deleted.
        assert!(
            filter
                .apply(ScopeInput::Routes(
                    0,
                    Box::new(RouteEvent::Deleted(route("a", "r1")))
                ))
                .is_none()
        );
        assert!(matches!(
            filter.apply(ScopeInput::Routes(
                0,
                Box::new(RouteEvent::Deleted(route("b", "r2")))
            )),
            Some(RouteEvent::Deleted(_))
        ));
    }

    #[test]
    fn a_relist_of_one_source_keeps_the_others() {
        let mut filter = ScopeFilter::new(2, false);
        filter.apply(ScopeInput::Routes(
            0,
            Box::new(RouteEvent::Listed(vec![route("a", "r1")])),
        ));
        assert_eq!(
            names(filter.apply(ScopeInput::Routes(
                1,
                Box::new(RouteEvent::Listed(vec![route("b", "r2")]))
            ))),
            ["a/r1", "b/r2"]
        );
        assert_eq!(
            names(filter.apply(ScopeInput::Routes(0, Box::new(RouteEvent::Listed(vec![]))))),
            ["b/r2"]
        );
        assert!(matches!(
            filter.apply(ScopeInput::Routes(
                1,
                Box::new(RouteEvent::Applied(route("b", "r3")))
            )),
            Some(RouteEvent::Applied(_))
        ));
    }
}
