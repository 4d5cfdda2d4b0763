//! Which routes the daemon serves: all namespaces or a list (`--namespace`), only
//! namespaces whose labels match (`--namespace-selector`), only routes whose labels
//! match (`--route-selector`, router sharding).
//!
//! The route selector goes to the API server with each route watch. A namespace list
//! means one route watch per namespace; a namespace selector means a watch on
//! namespaces too. [`ScopeFilter`] merges these into the one stream of route events the
//! pipeline expects, with the pipeline's meaning of [`RouteEvent::Listed`] (every route
//! in scope now): it holds back the first listing until every watch has listed, and
//! when a namespace enters or leaves the selection, or one watch re-lists, it emits a
//! fresh complete listing, from which the pipeline removes what vanished.

use std::collections::{HashMap, HashSet};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Event};
use kube::{Client, ResourceExt};
use kube_common::adaptive::{AdaptiveLimiter, sequential_client};
use kube_common::backoff::BackoffPolicy;
use kube_common::reconnect::Reconnect;
use route_secrets::api::route_watch::{RouteEvent, route_events_reconnecting};
use route_secrets::route::{Route, RouteKey};

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
    let mut listing: Option<Vec<String>> = None;
    watcher(
        Api::<Namespace>::all(client),
        watcher::Config::default().labels(selector),
    )
    .default_backoff()
    .filter_map(move |item| {
        let event = match item {
            Ok(Event::Init) => {
                listing = Some(Vec::new());
                None
            }
            Ok(Event::InitApply(namespace)) => {
                listing
                    .get_or_insert_with(Vec::new)
                    .push(namespace.name_any());
                None
            }
            Ok(Event::InitDone) => Some(NamespaceEvent::Listed(listing.take().unwrap_or_default())),
            Ok(Event::Apply(namespace)) => Some(NamespaceEvent::Applied(namespace.name_any())),
            Ok(Event::Delete(namespace)) => Some(NamespaceEvent::Deleted(namespace.name_any())),
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
