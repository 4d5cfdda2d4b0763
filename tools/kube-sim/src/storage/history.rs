//! The bounded event history, indexed the way watchers are.
//!
//! A watch that starts from a resourceVersion replays the events after it that its
//! filter matches. Walking the whole history for that would make every renewal of a
//! per-object watch cost every recent change of every object, under the store's one
//! lock: at 100,000 watched secrets renewed a few hundred times a second while
//! hundreds of secrets change a second, that walk is most of the server's work. So
//! each event is also filed under its resource, its (resource, namespace) and its
//! (resource, namespace, name), and a replay walks the narrowest of these its filter
//! allows: a per-object watch only that object's own events. What is replayed is the
//! same as a walk of the whole history would give: an object's namespace and name
//! never change, so an event outside the walked part cannot match the filter.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::resources::ResourceId;
use crate::storage::watch::{Bucket, StoredEvent};

type Events = VecDeque<Arc<StoredEvent>>;

/// Recent events in resourceVersion order, with per-resource, per-namespace and
/// per-object indexes. Every index holds a subsequence of `all`, in the same order.
pub(crate) struct History {
    limit: usize,
    all: Events,
    by_resource: Vec<Events>,
    by_namespace: HashMap<(ResourceId, String), Events>,
    by_object: HashMap<(ResourceId, String, String), Events>,
}

/// Where a replay walks: one of the history's sequences, from the first event after
/// a resourceVersion.
pub(crate) struct Since<'a> {
    events: Option<&'a Events>,
    after: u64,
}

impl<'a> Since<'a> {
    /// The events after the resourceVersion, in order.
    pub(crate) fn events(self) -> impl Iterator<Item = &'a Arc<StoredEvent>> + 'a {
        let after = self.after;
        self.events.into_iter().flat_map(move |events| {
            let from = events.partition_point(|e| e.rv <= after);
            events.range(from..)
        })
    }
}

fn pop_front_of(events: &mut Events, rv: u64) {
    if events.front().is_some_and(|e| e.rv == rv) {
        events.pop_front();
    }
}

impl History {
    /// An empty history of at most `limit` events for `resources` resources.
    pub(crate) fn new(limit: usize, resources: usize) -> Self {
        History {
            limit,
            all: VecDeque::new(),
            by_resource: (0..resources).map(|_| VecDeque::new()).collect(),
            by_namespace: HashMap::new(),
            by_object: HashMap::new(),
        }
    }

    /// Appends an event (its resourceVersion above every kept one) and drops the
    /// oldest beyond the limit; returns the resourceVersion of the last event dropped.
    pub(crate) fn push(&mut self, event: Arc<StoredEvent>) -> Option<u64> {
        if self.limit == 0 {
            return Some(event.rv);
        }
        let resource = event.resource;
        self.by_resource[resource.0].push_back(event.clone());
        self.by_namespace
            .entry((resource, event.namespace.clone()))
            .or_default()
            .push_back(event.clone());
        self.by_object
            .entry((resource, event.namespace.clone(), event.name.clone()))
            .or_default()
            .push_back(event.clone());
        self.all.push_back(event);
        let mut dropped = None;
        while self.all.len() > self.limit {
            let Some(old) = self.all.pop_front() else {
                break;
            };
            self.forget(&old);
            dropped = Some(old.rv);
        }
        dropped
    }

    /// Takes the oldest event `old` out of the indexes (it is the first of each).
    fn forget(&mut self, old: &StoredEvent) {
        pop_front_of(&mut self.by_resource[old.resource.0], old.rv);
        let namespace = (old.resource, old.namespace.clone());
        if let Some(events) = self.by_namespace.get_mut(&namespace) {
            pop_front_of(events, old.rv);
            if events.is_empty() {
                self.by_namespace.remove(&namespace);
            }
        }
        let object = (old.resource, old.namespace.clone(), old.name.clone());
        if let Some(events) = self.by_object.get_mut(&object) {
            pop_front_of(events, old.rv);
            if events.is_empty() {
                self.by_object.remove(&object);
            }
        }
    }

    /// Drops every event.
    pub(crate) fn clear(&mut self) {
        self.all.clear();
        for events in &mut self.by_resource {
            events.clear();
        }
        self.by_namespace.clear();
        self.by_object.clear();
    }

    /// The events of resource `id` after `rv` that a watcher filed under `bucket` can
    /// match: those of one object, of one namespace, or of the whole resource.
    /// `namespaced` tells whether the resource's objects have a namespace (a
    /// cluster-scoped object's is empty, so a name alone pins it down).
    pub(crate) fn since(
        &self,
        id: ResourceId,
        namespaced: bool,
        bucket: &Bucket,
        rv: u64,
    ) -> Since<'_> {
        let events = match bucket {
            Bucket::NamespaceName(ns, name) => self.by_object.get(&(id, ns.clone(), name.clone())),
            Bucket::Name(name) if !namespaced => {
                self.by_object.get(&(id, String::new(), name.clone()))
            }
            Bucket::Namespace(ns) => self.by_namespace.get(&(id, ns.clone())),
            Bucket::Name(_) | Bucket::All => self.by_resource.get(id.0),
        };
        Since { events, after: rv }
    }

    /// The events of resource `id` after `rv`, in order.
    pub(crate) fn of_resource_since(&self, id: ResourceId, rv: u64) -> Since<'_> {
        Since {
            events: self.by_resource.get(id.0),
            after: rv,
        }
    }

    /// Events kept, over all resources.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.all.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::storage::watch::ChangeKind;
    use serde_json::json;

    fn event(rv: u64, resource: usize, ns: &str, name: &str) -> Arc<StoredEvent> {
        Arc::new(StoredEvent::new(
            rv,
            ResourceId(resource),
            ns.to_owned(),
            name.to_owned(),
            ChangeKind::Modified,
            Arc::new(json!({})),
            None,
        ))
    }

    fn rvs(since: Since<'_>) -> Vec<u64> {
        since.events().map(|e| e.rv).collect()
    }

    fn object(ns: &str, name: &str) -> Bucket {
        Bucket::NamespaceName(ns.to_owned(), name.to_owned())
    }

    #[test]
    fn a_replay_of_one_object_walks_only_its_own_events() {
        let mut history = History::new(100, 2);
        // 90 changes of other objects around 3 of `a/one`'s.
        let mut rv = 0;
        for i in 0..30 {
            for (ns, name) in [("a", "other"), ("b", "one"), ("a", "one")] {
                rv += 1;
                let name = if (ns, name) == ("a", "one") && i % 10 != 0 {
                    "third"
                } else {
                    name
                };
                history.push(event(rv, 0, ns, name));
            }
        }
        assert_eq!(history.len(), 90);
        // `a/one` changed at 3, 33 and 63; a replay after 3 yields the last two only.
        assert_eq!(
            rvs(history.since(ResourceId(0), true, &object("a", "one"), 3)),
            [33, 63]
        );
        assert_eq!(
            rvs(history.since(ResourceId(0), true, &object("a", "one"), 0)),
            [3, 33, 63]
        );
        assert!(rvs(history.since(ResourceId(1), true, &object("a", "one"), 0)).is_empty());
        assert!(rvs(history.since(ResourceId(0), true, &object("c", "one"), 0)).is_empty());
        // A namespace's replay walks that namespace's events, the resource's all.
        let a = history.since(ResourceId(0), true, &Bucket::Namespace("a".to_owned()), 80);
        assert_eq!(rvs(a), [81, 82, 84, 85, 87, 88, 90]);
        let all = history.since(ResourceId(0), true, &Bucket::All, 85);
        assert_eq!(rvs(all), [86, 87, 88, 89, 90]);
        // A name across namespaces of a namespaced resource walks the resource.
        let named = history.since(ResourceId(0), true, &Bucket::Name("one".to_owned()), 87);
        assert_eq!(rvs(named), [88, 89, 90]);
    }

    #[test]
    fn a_cluster_scoped_object_is_found_by_its_name_alone() {
        let mut history = History::new(10, 1);
        history.push(event(1, 0, "", "x"));
        history.push(event(2, 0, "", "y"));
        history.push(event(3, 0, "", "x"));
        let x = history.since(ResourceId(0), false, &Bucket::Name("x".to_owned()), 0);
        assert_eq!(rvs(x), [1, 3]);
    }

    #[test]
    fn dropping_the_oldest_events_drops_them_from_every_index() {
        let mut history = History::new(3, 1);
        assert_eq!(history.push(event(1, 0, "a", "x")), None);
        assert_eq!(history.push(event(2, 0, "b", "y")), None);
        assert_eq!(history.push(event(3, 0, "a", "x")), None);
        assert_eq!(history.push(event(4, 0, "b", "z")), Some(1));
        assert_eq!(history.push(event(5, 0, "b", "z")), Some(2));
        assert_eq!(history.len(), 3);
        assert_eq!(
            rvs(history.since(ResourceId(0), true, &object("a", "x"), 0)),
            [3]
        );
        assert!(rvs(history.since(ResourceId(0), true, &object("b", "y"), 0)).is_empty());
        // The emptied object's and namespace's entries are gone, not kept empty.
        assert!(
            !history
                .by_object
                .contains_key(&(ResourceId(0), "b".to_owned(), "y".to_owned()))
        );
        assert_eq!(rvs(history.of_resource_since(ResourceId(0), 0)), [3, 4, 5]);
        history.push(event(6, 0, "b", "z"));
        assert!(
            !history
                .by_namespace
                .contains_key(&(ResourceId(0), "a".to_owned()))
        );
        assert_eq!(history.by_object.len(), 1);
        history.clear();
        assert_eq!(history.len(), 0);
        assert!(rvs(history.of_resource_since(ResourceId(0), 0)).is_empty());
    }

    #[test]
    fn a_history_of_no_events_keeps_none() {
        let mut history = History::new(0, 1);
        assert_eq!(history.push(event(7, 0, "a", "x")), Some(7));
        assert_eq!(history.len(), 0);
    }
}
