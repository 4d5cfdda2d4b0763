//! Watch events and the watcher index.
//!
//! Every committed change becomes one [`StoredEvent`], kept in the bounded history and
//! handed to the watchers that may care. Watchers are indexed by resource and by the
//! exact namespace and/or name their selectors pin down, so an event for one secret
//! visits only the watchers of that secret, its namespace, its name and the
//! resource-wide watchers — never all 10,000 per-secret watchers.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::objects::selectors::ObjectFilter;
use crate::resources::ResourceId;

/// What a committed change did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// How one watcher sees an event: the change itself, or a selector transition (an
/// object that starts matching is ADDED, one that stops matching is DELETED, carrying
/// its previous state at the event's resourceVersion, as kube-apiserver does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    Added,
    Modified,
    Deleted,
    DeletedPrevious,
}

impl Delivery {
    fn slot(self) -> usize {
        match self {
            Delivery::Added => 0,
            Delivery::Modified => 1,
            Delivery::Deleted => 2,
            Delivery::DeletedPrevious => 3,
        }
    }

    pub(crate) fn type_name(self) -> &'static str {
        match self {
            Delivery::Added => "ADDED",
            Delivery::Modified => "MODIFIED",
            Delivery::Deleted | Delivery::DeletedPrevious => "DELETED",
        }
    }
}

/// One committed change, shared by the history and every watcher it is sent to.
#[derive(Debug)]
pub(crate) struct StoredEvent {
    pub rv: u64,
    pub resource: ResourceId,
    pub namespace: String,
    pub name: String,
    pub change: ChangeKind,
    /// The object after the change (for a deletion: its last state, at `rv`).
    pub object: Arc<Value>,
    /// The object before the change (`None` for a creation).
    pub prev: Option<Arc<Value>>,
    /// Encoded JSON lines per [`Delivery`], built on first use: one encoding serves
    /// every watcher that receives the event the same way.
    encoded: [OnceLock<Bytes>; 4],
}

impl StoredEvent {
    pub(crate) fn new(
        rv: u64,
        resource: ResourceId,
        namespace: String,
        name: String,
        change: ChangeKind,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        StoredEvent {
            rv,
            resource,
            namespace,
            name,
            change,
            object,
            prev,
            encoded: Default::default(),
        }
    }

    /// How a watcher with `filter` sees this event, if at all.
    pub(crate) fn delivery_for(&self, filter: &ObjectFilter) -> Option<Delivery> {
        let now = filter.matches(&self.object);
        match self.change {
            ChangeKind::Added => now.then_some(Delivery::Added),
            ChangeKind::Deleted => now.then_some(Delivery::Deleted),
            ChangeKind::Modified => {
                let before = self.prev.as_deref().is_some_and(|p| filter.matches(p));
                match (before, now) {
                    (true, true) => Some(Delivery::Modified),
                    (false, true) => Some(Delivery::Added),
                    (true, false) => Some(Delivery::DeletedPrevious),
                    (false, false) => None,
                }
            }
        }
    }

    /// The object a delivery carries.
    pub(crate) fn object_for(&self, delivery: Delivery) -> Arc<Value> {
        match (delivery, &self.prev) {
            (Delivery::DeletedPrevious, Some(prev)) => {
                let mut v = (**prev).clone();
                crate::objects::meta::set_resource_version(&mut v, self.rv);
                Arc::new(v)
            }
            _ => self.object.clone(),
        }
    }

    /// The JSON line (`{"type":..,"object":..}\n`) for a delivery.
    pub(crate) fn encoded(&self, delivery: Delivery) -> Bytes {
        self.encoded[delivery.slot()]
            .get_or_init(|| encode_event(delivery.type_name(), &*self.object_for(delivery)))
            .clone()
    }
}

/// One watch event line around an object already encoded as JSON.
pub(crate) fn encode_event_json(event_type: &str, object_json: &[u8]) -> Bytes {
    event_line(event_type, object_json.len(), |buf| {
        buf.extend_from_slice(object_json);
    })
}

/// Encodes one watch event line.
pub(crate) fn encode_event(event_type: &str, object: &impl serde::Serialize) -> Bytes {
    // Serializing a `Value` or a `Status` (string keys only) into a Vec cannot fail.
    event_line(event_type, 256, |buf| {
        let _ = serde_json::to_writer(buf, object);
    })
}

/// `{"type":"<event_type>","object":<what write_object writes>}` and a newline.
fn event_line(
    event_type: &str,
    size_hint: usize,
    write_object: impl FnOnce(&mut Vec<u8>),
) -> Bytes {
    let mut buf = Vec::with_capacity(size_hint + 32);
    buf.extend_from_slice(b"{\"type\":\"");
    buf.extend_from_slice(event_type.as_bytes());
    buf.extend_from_slice(b"\",\"object\":");
    write_object(&mut buf);
    buf.extend_from_slice(b"}\n");
    Bytes::from(buf)
}

/// What a watcher's channel carries.
pub(crate) type DeliveryItem = (Arc<StoredEvent>, Delivery);

struct WatcherEntry {
    filter: Arc<ObjectFilter>,
    tx: mpsc::Sender<DeliveryItem>,
}

/// Where a watcher is filed in the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bucket {
    All,
    Namespace(String),
    Name(String),
    NamespaceName(String, String),
}

impl Bucket {
    pub(crate) fn for_filter(filter: &ObjectFilter) -> Bucket {
        match (filter.exact_namespace(), filter.exact_name()) {
            (Some(ns), Some(name)) => Bucket::NamespaceName(ns.to_string(), name.to_string()),
            (Some(ns), None) => Bucket::Namespace(ns.to_string()),
            (None, Some(name)) => Bucket::Name(name.to_string()),
            (None, None) => Bucket::All,
        }
    }
}

type Slots = HashMap<u64, WatcherEntry>;

#[derive(Default)]
struct ResourceWatchers {
    all: Slots,
    by_namespace: HashMap<String, Slots>,
    by_name: HashMap<String, Slots>,
    by_namespace_name: HashMap<String, HashMap<String, Slots>>,
}

/// All registered watchers, by resource and bucket. Owned by the store state (so
/// registration and dispatch are ordered with commits).
pub(crate) struct WatchIndex {
    next_id: u64,
    resources: Vec<ResourceWatchers>,
}

impl WatchIndex {
    pub(crate) fn new(resource_count: usize) -> Self {
        WatchIndex {
            next_id: 1,
            resources: (0..resource_count)
                .map(|_| ResourceWatchers::default())
                .collect(),
        }
    }

    fn slots_mut(&mut self, resource: ResourceId, bucket: &Bucket) -> &mut Slots {
        let rw = &mut self.resources[resource.0];
        match bucket {
            Bucket::All => &mut rw.all,
            Bucket::Namespace(ns) => rw.by_namespace.entry(ns.clone()).or_default(),
            Bucket::Name(n) => rw.by_name.entry(n.clone()).or_default(),
            Bucket::NamespaceName(ns, n) => rw
                .by_namespace_name
                .entry(ns.clone())
                .or_default()
                .entry(n.clone())
                .or_default(),
        }
    }

    pub(crate) fn insert(
        &mut self,
        resource: ResourceId,
        bucket: &Bucket,
        filter: Arc<ObjectFilter>,
        tx: mpsc::Sender<DeliveryItem>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.slots_mut(resource, bucket)
            .insert(id, WatcherEntry { filter, tx });
        id
    }

    pub(crate) fn remove(&mut self, resource: ResourceId, bucket: &Bucket, id: u64) {
        let rw = &mut self.resources[resource.0];
        match bucket {
            Bucket::All => {
                rw.all.remove(&id);
            }
            Bucket::Namespace(ns) => {
                if let Some(s) = rw.by_namespace.get_mut(ns) {
                    s.remove(&id);
                    if s.is_empty() {
                        rw.by_namespace.remove(ns);
                    }
                }
            }
            Bucket::Name(n) => {
                if let Some(s) = rw.by_name.get_mut(n) {
                    s.remove(&id);
                    if s.is_empty() {
                        rw.by_name.remove(n);
                    }
                }
            }
            Bucket::NamespaceName(ns, n) => {
                if let Some(by_name) = rw.by_namespace_name.get_mut(ns) {
                    if let Some(s) = by_name.get_mut(n) {
                        s.remove(&id);
                        if s.is_empty() {
                            by_name.remove(n);
                        }
                    }
                    if by_name.is_empty() {
                        rw.by_namespace_name.remove(ns);
                    }
                }
            }
        }
    }

    /// Sends the event to every interested watcher without blocking. A watcher whose
    /// buffer is full is dropped from the index: its stream drains what it has and
    /// ends, and the client resumes from the last resourceVersion it saw.
    /// Returns the number of watchers terminated for being too slow.
    pub(crate) fn dispatch(&mut self, event: &Arc<StoredEvent>) -> usize {
        let mut dead: Vec<(Bucket, u64)> = Vec::new();
        let rw = &self.resources[event.resource.0];
        let mut visit = |slots: Option<&Slots>, bucket: &dyn Fn() -> Bucket| {
            let Some(slots) = slots else { return };
            for (id, w) in slots {
                if let Some(delivery) = event.delivery_for(&w.filter)
                    && w.tx.try_send((event.clone(), delivery)).is_err()
                {
                    dead.push((bucket(), *id));
                }
            }
        };
        visit(Some(&rw.all), &|| Bucket::All);
        visit(rw.by_namespace.get(&event.namespace), &|| {
            Bucket::Namespace(event.namespace.clone())
        });
        visit(rw.by_name.get(&event.name), &|| {
            Bucket::Name(event.name.clone())
        });
        visit(
            rw.by_namespace_name
                .get(&event.namespace)
                .and_then(|m| m.get(&event.name)),
            &|| Bucket::NamespaceName(event.namespace.clone(), event.name.clone()),
        );
        let terminated = dead.len();
        for (bucket, id) in dead {
            self.remove(event.resource, &bucket, id);
        }
        terminated
    }
}
