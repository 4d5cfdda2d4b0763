//! Route events for the pipeline, from a kube-runtime watcher on routes.
//!
//! The watcher's (re-)listings become one [`RouteEvent::Listed`] with every route, so
//! the pipeline sees the initial set at once (to start every secret's registration
//! concurrently) and can tell, after a re-list, which routes vanished while the watch
//! was down. Errors are retried with kube-runtime's default backoff and reported to a
//! callback; they never end the stream.

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;

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
}

/// Watches routes through `api` (all namespaces, or one) with the watcher `config`
/// (label selectors for router sharding), reporting watch errors to `on_error`.
pub fn route_events(
    api: Api<Route>,
    config: watcher::Config,
    mut on_error: impl FnMut(&watcher::Error) + Send + 'static,
) -> impl Stream<Item = RouteEvent> + Send + 'static {
    let mut listing: Option<Vec<Route>> = None;
    watcher(api, config)
        .default_backoff()
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
                    tracing::warn!(error = %err, "route watch failed; retrying");
                    on_error(&err);
                    None
                }
            };
            std::future::ready(event)
        })
}
