//! The route changes the outputs tell the routing task, coalesced: the latest change of
//! each route wins, and start-up's decision is a flag. The task may wait long on a load
//! (up to the load timeout) while the outputs go on; what waits for it is bounded by the
//! number of routes, and the sender never blocks.
//!
//! The task takes every pending change at once and applies them before it acts, so only
//! each route's latest change matters: the order between routes never did.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use route_secrets::route::RouteKey;
use tokio::sync::Notify;

use super::model::ServedRoute;

/// What the outputs tell the routing task.
#[derive(Debug)]
pub enum RouteChange {
    /// The route is served (added or changed).
    Served(ServedRoute),
    /// The route is no longer served.
    Gone(RouteKey),
    /// Start-up is decided and the crt-list is written.
    Decided,
}

/// What waits for the task.
#[derive(Debug, Default)]
struct Pending {
    /// Per route, its latest change: served as given, or gone (`None`).
    routes: HashMap<RouteKey, Option<ServedRoute>>,
    /// Whether start-up was decided since the task last took the changes.
    decided: bool,
    /// Whether the sender is gone.
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    /// Woken on each change, and when the sender is gone.
    ready: Notify,
}

impl Shared {
    /// The pending changes; a panic elsewhere while holding them left them whole (each
    /// update is one map insert or flag), so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The outputs' side: [`ChangeSender::send`] records a change and returns at once.
#[derive(Debug)]
pub(crate) struct ChangeSender {
    shared: Arc<Shared>,
}

/// The task's side: [`ChangeReceiver::recv`] waits for changes and takes them all.
#[derive(Debug)]
pub(crate) struct ChangeReceiver {
    shared: Arc<Shared>,
}

/// A coalescing channel of route changes.
pub(crate) fn channel() -> (ChangeSender, ChangeReceiver) {
    let shared = Arc::new(Shared::default());
    (
        ChangeSender {
            shared: Arc::clone(&shared),
        },
        ChangeReceiver { shared },
    )
}

impl ChangeSender {
    /// Records `change`, replacing the route's change still pending.
    pub(crate) fn send(&self, change: RouteChange) {
        {
            let mut pending = self.shared.lock();
            match change {
                RouteChange::Served(route) => {
                    pending.routes.insert(route.key.clone(), Some(route));
                }
                RouteChange::Gone(key) => {
                    pending.routes.insert(key, None);
                }
                RouteChange::Decided => pending.decided = true,
            }
        }
        self.shared.ready.notify_one();
    }
}

impl Drop for ChangeSender {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.ready.notify_one();
    }
}

impl ChangeReceiver {
    /// Waits until a change is pending and takes every pending one: the routes' changes
    /// first, then [`RouteChange::Decided`] if start-up was decided. `None` once the
    /// sender is gone and nothing is pending.
    ///
    /// Cancel safe: changes stay pending until a call returns them.
    pub(crate) async fn recv(&mut self) -> Option<Vec<RouteChange>> {
        loop {
            {
                let mut pending = self.shared.lock();
                if !pending.routes.is_empty() || pending.decided {
                    let mut changes: Vec<RouteChange> = pending
                        .routes
                        .drain()
                        .map(|(key, change)| match change {
                            Some(route) => RouteChange::Served(route),
                            None => RouteChange::Gone(key),
                        })
                        .collect();
                    if std::mem::take(&mut pending.decided) {
                        changes.push(RouteChange::Decided);
                    }
                    return Some(changes);
                }
                if pending.closed {
                    return None;
                }
            }
            // A change recorded after the check above left its permit: this returns
            // at once then.
            self.shared.ready.notified().await;
        }
    }

    /// The number of routes with a change pending.
    #[cfg(test)]
    fn pending_routes(&self) -> usize {
        self.shared.lock().routes.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use route_secrets::route::routing::Termination;

    use super::*;
    use crate::routing::model::tests::{routing, served};

    fn route(name: &str, weight: u16) -> ServedRoute {
        served(name, routing(Termination::Edge, &[("web", weight)]))
    }

    /// What a table holds after the changes: per route its weight, and whether decided.
    #[derive(Debug, Default, PartialEq)]
    struct Applied {
        routes: BTreeMap<String, u16>,
        decided: bool,
    }

    impl Applied {
        fn apply(&mut self, change: &RouteChange) {
            match change {
                RouteChange::Served(route) => {
                    self.routes
                        .insert(route.key.name.to_string(), route.routing.backends[0].weight);
                }
                RouteChange::Gone(key) => {
                    self.routes.remove(&*key.name);
                }
                RouteChange::Decided => self.decided = true,
            }
        }
    }

    #[tokio::test]
    async fn latest_change_per_route_wins() {
        let (sender, mut receiver) = channel();
        sender.send(RouteChange::Served(route("a", 1)));
        sender.send(RouteChange::Served(route("b", 1)));
        sender.send(RouteChange::Served(route("a", 2)));
        sender.send(RouteChange::Gone(RouteKey::new("shop", "b")));
        sender.send(RouteChange::Decided);
        sender.send(RouteChange::Served(route("c", 3)));
        assert_eq!(receiver.pending_routes(), 3);

        let changes = receiver.recv().await.expect("changes pending");
        assert_eq!(changes.len(), 4, "{changes:?}");
        assert!(
            matches!(changes.last(), Some(RouteChange::Decided)),
            "decided comes after the routes: {changes:?}"
        );
        let mut applied = Applied::default();
        for change in &changes {
            applied.apply(change);
        }
        assert_eq!(
            applied.routes,
            BTreeMap::from([("a".to_owned(), 2), ("c".to_owned(), 3)])
        );
        assert!(applied.decided);
        assert_eq!(receiver.pending_routes(), 0);
    }

    #[tokio::test]
    async fn waits_for_a_change_and_ends_when_the_sender_is_gone() {
        let (sender, mut receiver) = channel();
        let waiting = tokio::spawn(async move {
            let mut batches = Vec::new();
            while let Some(changes) = receiver.recv().await {
                batches.push(changes.len());
            }
            batches
        });
        tokio::task::yield_now().await;
        sender.send(RouteChange::Decided);
        drop(sender);
        let batches = waiting.await.expect("receiver task");
        assert_eq!(batches, vec![1]);
    }

    #[tokio::test]
    async fn pending_changes_outlive_the_sender() {
        let (sender, mut receiver) = channel();
        sender.send(RouteChange::Served(route("a", 1)));
        drop(sender);
        assert_eq!(receiver.recv().await.map(|changes| changes.len()), Some(1));
        assert!(receiver.recv().await.is_none());
    }

    /// Random changes from a sending task, taken in whatever batches the receiver
    /// finds: the table built from the batches is the one built from every change in
    /// order, and no more routes are ever pending than exist.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn random_changes_end_in_the_same_table() {
        const ROUTES: usize = 16;
        for seed in 0..20_u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let changes: Vec<RouteChange> = (0..2_000)
                .map(|_| {
                    let name = format!("r{}", rng.random_range(0..ROUTES));
                    match rng.random_range(0..10) {
                        0 => RouteChange::Decided,
                        1..=3 => RouteChange::Gone(RouteKey::new("shop", &name)),
                        _ => RouteChange::Served(route(&name, rng.random_range(0..256))),
                    }
                })
                .collect();
            let mut expected = Applied::default();
            for change in &changes {
                expected.apply(change);
            }

            let (sender, mut receiver) = channel();
            let sending = tokio::spawn(async move {
                for (n, change) in changes.into_iter().enumerate() {
                    sender.send(change);
                    if n % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            });
            let mut applied = Applied::default();
            let mut batches = 0;
            while let Some(batch) = receiver.recv().await {
                assert!(batch.len() <= ROUTES + 1, "{} changes", batch.len());
                batches += 1;
                for change in &batch {
                    applied.apply(change);
                }
            }
            sending.await.expect("sending task");
            assert!(batches > 0);
            assert_eq!(applied, expected, "seed {seed}");
        }
    }
}
