//! The registry of per-key entries: who holds which watch, and the first-sync rendezvous.
//!
//! This is the concurrency core of the crate and knows nothing about Kubernetes. An
//! entry is created by the first caller for a key and published in the map *before* its
//! first sync starts, so that every later caller for the key joins it instead of
//! starting a second watch. Callers then wait for the sync with no lock held. Whoever
//! drives the sync (the watch task, or a test's model task) reports the outcome through
//! a [`SyncDriver`].
//!
//! # Holders
//!
//! An entry is held by every caller waiting for its first sync (a [`Ticket`]) and by
//! every registered handler. The holder count lives next to the entry in the map, under
//! the map's lock, so that joining an entry and releasing the last hold on it are
//! totally ordered: an entry is removed from the map exactly when its count reaches
//! zero, or when its first sync fails. Removal stops the entry's driver, which closes
//! the watch.
//!
//! # Invariants
//!
//! * At most one live entry per key; every entry in the map has at least one holder.
//! * A failed first sync removes its entry (if it is still the key's entry) before the
//!   waiters are told, so a caller arriving afterwards starts afresh. It cannot remove an
//!   entry with registered handlers: handlers attach only after a successful sync, and a
//!   sync's outcome is reported once.
//! * A cancelled waiter (its [`Ticket`] dropped) releases only its own hold.
//!
//! # Lock order
//!
//! The map lock may be taken before an entry's lock, never the other way round.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use kube_common::hash::NameMap;
use tokio::sync::Notify;

use crate::event::{EventSink, ObjectEvent};
use crate::lock::{Lock, LockFamily};
use crate::{MonitorError, MonitorErrorKind, ObjectKey};

/// Identifies one incarnation of a key's entry. A key that is dropped and registered
/// again gets a new entry with a new id, so stale handles never touch the new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct EntryId(u64);

/// Identifies one registered handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct HandlerId(u64);

/// Where an entry's first sync stands.
#[derive(Clone, Debug)]
pub(crate) enum SyncState {
    Pending,
    Synced,
    Failed(MonitorError),
}

/// A handle to one registered handler, returned by a successful registration.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HandlerHandle {
    key: ObjectKey,
    entry: EntryId,
    handler: HandlerId,
}

impl HandlerHandle {
    /// The watched object this handler is registered for.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// A number that identifies the handler among all handlers of its monitor.
    pub fn id(&self) -> u64 {
        self.handler.0
    }
}

impl fmt::Display for HandlerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.key, self.handler.0)
    }
}

/// Per-key counts, for metrics and tests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyStatus {
    /// Registered handlers.
    pub handlers: usize,
    /// Callers still waiting for the first sync.
    pub waiting: usize,
    /// Whether the first sync has completed.
    pub synced: bool,
    /// Whether the object exists, as far as the watch cache knows.
    pub exists: bool,
}

/// How many keys are watched, and how many of them finished their first sync.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyCounts {
    /// Keys with a live entry.
    pub watched: usize,
    /// Of those, the ones whose first sync has completed.
    pub synced: usize,
}

/// The registry. Cheap to clone; clones share the same map.
pub(crate) struct Registry<K: Send + Sync + 'static, L: LockFamily> {
    inner: Arc<RegistryInner<K, L>>,
}

impl<K: Send + Sync + 'static, L: LockFamily> Clone for Registry<K, L> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct RegistryInner<K: Send + Sync + 'static, L: LockFamily> {
    /// Guards the set of live entries and each entry's holder count. See the module
    /// docs for why the count lives here and not in the entry.
    slots: L::Lock<NameMap<ObjectKey, Slot<K, L>>>,
    /// Source of entry and handler ids.
    next_id: AtomicU64,
    /// Plural resource name, for error messages.
    resource: String,
}

struct Slot<K: Send + Sync + 'static, L: LockFamily> {
    entry: Arc<Entry<K, L>>,
    /// Waiting tickets plus registered handlers. Never zero while in the map.
    holders: usize,
}

struct Entry<K: Send + Sync + 'static, L: LockFamily> {
    id: EntryId,
    key: ObjectKey,
    /// Guards the cached object and the handler sinks. Events are delivered while it is
    /// held, which orders them per handler and makes "current object, then later
    /// events" atomic for a handler that attaches.
    state: L::Lock<EntryState<K>>,
    /// The first-sync outcome, set once from `Pending`. A lock of its own, taken only
    /// to read or set it (never while another is taken): waiters read it without the
    /// entry's lock.
    sync: std::sync::Mutex<SyncState>,
    /// Set when the entry leaves the map; its driver then stops the watch.
    stopped: AtomicBool,
    /// Wakes whoever waits on the entry: the callers waiting for the first sync's
    /// outcome, and the driver waiting to be stopped. One `Notify` rather than a
    /// `watch` channel and a cancellation token: their shared states take about ten
    /// times its size, per watched key, for two values that change once.
    changed: Notify,
}

struct EntryState<K> {
    object: Option<Arc<K>>,
    /// The registered handlers, by ascending id. Nearly always one: a vector holds it
    /// in its 24 bytes where a `BTreeMap` allocates a node of eleven.
    sinks: Vec<(HandlerId, Box<dyn EventSink<K>>)>,
}

impl<K> EntryState<K> {
    fn sink_index(&self, handler: HandlerId) -> Result<usize, usize> {
        self.sinks.binary_search_by_key(&handler, |(id, _)| *id)
    }
}

impl<K, L> Entry<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    /// The first sync's outcome so far.
    fn sync_state(&self) -> SyncState {
        kube_common::sync::lock(&self.sync).clone()
    }

    fn is_synced(&self) -> bool {
        matches!(*kube_common::sync::lock(&self.sync), SyncState::Synced)
    }

    fn is_pending(&self) -> bool {
        matches!(*kube_common::sync::lock(&self.sync), SyncState::Pending)
    }

    /// Sets the first sync's outcome to `outcome()` and wakes its waiters, unless it
    /// already has one.
    fn settle(&self, outcome: impl FnOnce() -> SyncState) {
        let settled = {
            let mut sync = kube_common::sync::lock(&self.sync);
            let pending = matches!(*sync, SyncState::Pending);
            if pending {
                *sync = outcome();
            }
            pending
        };
        if settled {
            self.changed.notify_waiters();
        }
    }

    /// Marks the entry stopped and wakes its driver.
    fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.changed.notify_waiters();
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }
}

impl<K, L> Registry<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    /// An empty registry for objects of the named (plural) resource.
    pub(crate) fn new(resource: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(RegistryInner {
                slots: L::Lock::new(NameMap::default()),
                next_id: AtomicU64::new(1),
                resource: resource.into(),
            }),
        }
    }

    fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Joins the key's entry, creating it if there is none.
    ///
    /// Returns the caller's ticket and, when this call created the entry, the driver
    /// that must run its first sync. The driver is returned rather than started here so
    /// that nothing but map bookkeeping happens under the map lock.
    pub(crate) fn join(&self, key: &ObjectKey) -> (Ticket<K, L>, Option<SyncDriver<K, L>>) {
        let fresh_id = EntryId(self.next_id());
        let (entry, created) = self.inner.slots.with(|slots| match slots.get_mut(key) {
            Some(slot) => {
                slot.holders += 1;
                (Arc::clone(&slot.entry), false)
            }
            None => {
                let entry = Arc::new(Entry {
                    id: fresh_id,
                    key: key.clone(),
                    state: L::Lock::new(EntryState {
                        object: None,
                        sinks: Vec::new(),
                    }),
                    sync: std::sync::Mutex::new(SyncState::Pending),
                    stopped: AtomicBool::new(false),
                    changed: Notify::new(),
                });
                slots.insert(
                    key.clone(),
                    Slot {
                        entry: Arc::clone(&entry),
                        holders: 1,
                    },
                );
                (entry, true)
            }
        });
        let driver = created.then(|| SyncDriver {
            registry: Arc::downgrade(&self.inner),
            entry: Arc::clone(&entry),
        });
        let ticket = Ticket {
            registry: self.clone(),
            entry: Some(entry),
        };
        (ticket, driver)
    }

    /// Releases one hold on the entry `id` of `key`, removing and stopping the entry
    /// when it was the last. A no-op when that entry is no longer in the map (its sync
    /// failed, or the monitor shut down).
    fn release(&self, key: &ObjectKey, id: EntryId) {
        let removed = self.inner.slots.with(|slots| {
            let slot = slots.get_mut(key).filter(|slot| slot.entry.id == id)?;
            slot.holders -= 1;
            if slot.holders == 0 {
                slots.remove(key).map(|slot| slot.entry)
            } else {
                None
            }
        });
        if let Some(entry) = removed {
            entry.stop();
        }
    }

    /// Removes a registered handler. Its event sink is dropped, which ends an
    /// [`EventStream`](crate::EventStream).
    pub(crate) fn remove(&self, handle: &HandlerHandle) -> Result<(), MonitorError> {
        let outcome = self.inner.slots.with(|slots| {
            let slot = slots
                .get_mut(&handle.key)
                .filter(|slot| slot.entry.id == handle.entry)?;
            let sink = slot.entry.state.with(|state| {
                let index = state.sink_index(handle.handler).ok()?;
                let (_, sink) = state.sinks.remove(index);
                if state.sinks.is_empty() {
                    state.sinks = Vec::new();
                }
                Some(sink)
            })?;
            slot.holders -= 1;
            let removed = if slot.holders == 0 {
                slots.remove(&handle.key).map(|slot| slot.entry)
            } else {
                None
            };
            Some((sink, removed))
        });
        match outcome {
            Some((sink, removed)) => {
                // Dropped outside the lock: a sink's drop may wake its consumer.
                drop(sink);
                if let Some(entry) = removed {
                    entry.stop();
                }
                Ok(())
            }
            None => Err(self.not_registered(handle)),
        }
    }

    /// The cached object for a registered handler: `Ok(None)` when the object is known
    /// to be absent.
    pub(crate) fn get(&self, handle: &HandlerHandle) -> Result<Option<Arc<K>>, MonitorError> {
        self.inner
            .slots
            .with(|slots| {
                let slot = slots
                    .get(&handle.key)
                    .filter(|slot| slot.entry.id == handle.entry)?;
                slot.entry.state.with(|state| {
                    state
                        .sink_index(handle.handler)
                        .is_ok()
                        .then(|| state.object.clone())
                })
            })
            .ok_or_else(|| self.not_registered(handle))
    }

    /// Per-key counts of every live entry.
    pub(crate) fn snapshot(&self) -> BTreeMap<ObjectKey, KeyStatus> {
        self.inner.slots.with(|slots| {
            slots
                .iter()
                .map(|(key, slot)| {
                    let (handlers, exists) = slot
                        .entry
                        .state
                        .with(|state| (state.sinks.len(), state.object.is_some()));
                    let synced = slot.entry.is_synced();
                    let status = KeyStatus {
                        handlers,
                        waiting: slot.holders - handlers,
                        synced,
                        exists,
                    };
                    (key.clone(), status)
                })
                .collect()
        })
    }

    /// The counts of [`snapshot`](Self::snapshot), without copying a key: metrics read
    /// them on every scrape, under the same lock the registrations take.
    pub(crate) fn counts(&self) -> KeyCounts {
        self.inner.slots.with(|slots| KeyCounts {
            watched: slots.len(),
            synced: slots.values().filter(|slot| slot.entry.is_synced()).count(),
        })
    }

    /// Stops and forgets every entry. Waiting callers fail with
    /// [`MonitorErrorKind::Cancelled`].
    pub(crate) fn shutdown(&self) {
        let entries: Vec<_> = self
            .inner
            .slots
            .with(|slots| slots.drain().map(|(_, slot)| slot.entry).collect());
        for entry in entries {
            entry.settle(|| {
                SyncState::Failed(MonitorError::new(
                    self.inner.resource.as_str(),
                    entry.key.clone(),
                    MonitorErrorKind::Cancelled,
                ))
            });
            entry.stop();
        }
    }

    fn not_registered(&self, handle: &HandlerHandle) -> MonitorError {
        MonitorError::new(
            self.inner.resource.as_str(),
            handle.key.clone(),
            MonitorErrorKind::NotRegistered {
                handler: handle.handler.0,
            },
        )
    }
}

/// One caller's hold on an entry while it waits for the first sync.
///
/// Dropping it (the caller was cancelled, timed out, or the sync failed) releases the
/// hold; [`Ticket::attach`] turns it into a registered handler instead.
pub(crate) struct Ticket<K, L: LockFamily>
where
    K: Send + Sync + 'static,
{
    registry: Registry<K, L>,
    /// `None` once converted into a handler.
    entry: Option<Arc<Entry<K, L>>>,
}

impl<K, L> Ticket<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    /// Waits, holding no lock, until the entry's first sync has an outcome.
    pub(crate) async fn synced(&self) -> Result<(), MonitorError> {
        let Some(entry) = &self.entry else {
            return Ok(());
        };
        loop {
            // Created before the state is read: `notify_waiters` reaches every
            // `Notified` that exists when it is called, polled or not, so an outcome
            // set between the read and the wait still wakes this one.
            let changed = entry.changed.notified();
            match entry.sync_state() {
                SyncState::Pending => changed.await,
                SyncState::Synced => return Ok(()),
                SyncState::Failed(err) => return Err(err),
            }
        }
    }

    /// Registers `sink` as a handler of the (synced) entry. The sink first receives the
    /// current object, if there is one, before any later event.
    pub(crate) fn attach(
        mut self,
        sink: Box<dyn EventSink<K>>,
    ) -> Result<HandlerHandle, MonitorError> {
        let Some(entry) = self.entry.take() else {
            unreachable_attached()
        };
        if entry.is_stopped() {
            // The monitor shut down between the sync and this call.
            let err = self.cancelled(&entry);
            self.entry = Some(entry);
            return Err(err);
        }
        let handler = HandlerId(self.registry.next_id());
        entry.state.with(|state| {
            let mut sink = sink;
            if let Some(object) = &state.object {
                sink.deliver(ObjectEvent::Added(Arc::clone(object)));
            }
            // Ids are taken before the lock: a concurrent attach may have put a
            // later one in first.
            let index = state.sink_index(handler).unwrap_or_else(|index| index);
            state.sinks.reserve_exact(1);
            state.sinks.insert(index, (handler, sink));
        });
        Ok(HandlerHandle {
            key: entry.key.clone(),
            entry: entry.id,
            handler,
        })
    }

    /// The entry's first-sync state, for the model checker.
    #[cfg(test)]
    pub(crate) fn state(&self) -> SyncState {
        self.entry
            .as_ref()
            .map_or(SyncState::Synced, |entry| entry.sync_state())
    }

    fn cancelled(&self, entry: &Entry<K, L>) -> MonitorError {
        MonitorError::new(
            self.registry.inner.resource.as_str(),
            entry.key.clone(),
            MonitorErrorKind::Cancelled,
        )
    }
}

#[cold]
fn unreachable_attached() -> ! {
    // `attach` consumes the ticket, so a ticket without an entry cannot reach it.
    unreachable!("a ticket is attached at most once")
}

impl<K, L> Drop for Ticket<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    fn drop(&mut self) {
        if let Some(entry) = self.entry.take() {
            self.registry.release(&entry.key, entry.id);
        }
    }
}

/// The side of an entry that runs its watch: reports the first sync's outcome and
/// publishes later changes to the handlers.
pub(crate) struct SyncDriver<K: Send + Sync + 'static, L: LockFamily> {
    /// Weak, so that running watches do not keep a dropped monitor alive.
    registry: Weak<RegistryInner<K, L>>,
    entry: Arc<Entry<K, L>>,
}

impl<K, L> SyncDriver<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    /// The key this driver watches.
    pub(crate) fn key(&self) -> &ObjectKey {
        &self.entry.key
    }

    /// Completes when the entry has left the registry and the watch must stop.
    pub(crate) async fn stopped(&self) {
        loop {
            // Created before the flag is read, so that a stop in between wakes it.
            let changed = self.entry.changed.notified();
            if self.entry.is_stopped() {
                return;
            }
            changed.await;
        }
    }

    /// Whether the entry has left the registry.
    #[cfg(test)]
    pub(crate) fn is_stopped(&self) -> bool {
        self.entry.is_stopped()
    }

    /// Reports a successful first sync: `object` is the object's state, `None` when it
    /// does not exist. Wakes every waiter.
    pub(crate) fn synced(&self, object: Option<Arc<K>>) {
        self.entry.state.with(|state| state.object = object);
        *kube_common::sync::lock(&self.entry.sync) = SyncState::Synced;
        self.entry.changed.notify_waiters();
    }

    /// Reports a failed first sync: removes the entry, so the next caller starts a
    /// fresh watch, then fails every waiter with `error`. A no-op after a success.
    pub(crate) fn failed(&self, error: MonitorError) {
        self.fail_pending(|_| error);
    }

    fn fail_pending(&self, make_error: impl FnOnce(&str) -> MonitorError) {
        if !self.entry.is_pending() {
            return;
        }
        let registry = self.registry.upgrade();
        if let Some(registry) = &registry {
            registry.slots.with(|slots| {
                if slots
                    .get(&self.entry.key)
                    .is_some_and(|slot| slot.entry.id == self.entry.id)
                {
                    slots.remove(&self.entry.key);
                }
            });
        }
        self.entry.stop();
        let error = make_error(registry.as_ref().map_or("", |r| r.resource.as_str()));
        self.entry.settle(|| SyncState::Failed(error));
    }

    /// Publishes the object's new state and delivers `events` to every handler, in
    /// order, atomically with respect to handlers attaching.
    pub(crate) fn publish(&self, object: Option<Arc<K>>, events: &[ObjectEvent<K>]) {
        self.entry.state.with(|state| {
            state.object = object;
            for (_, sink) in &mut state.sinks {
                for event in events {
                    sink.deliver(event.clone());
                }
            }
        });
    }
}

impl<K, L> Drop for SyncDriver<K, L>
where
    K: Send + Sync + 'static,
    L: LockFamily,
{
    fn drop(&mut self) {
        // A driver that ends without reporting (its task was aborted or panicked) must
        // not leave waiters hanging or a dead entry in the map: treat it as a failed
        // first sync. After a reported outcome this is a no-op.
        let key = self.entry.key.clone();
        self.fail_pending(|resource| MonitorError::new(resource, key, MonitorErrorKind::Cancelled));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::StdLocks;

    struct Ignore;

    impl EventSink<u32> for Ignore {
        fn deliver(&mut self, _event: ObjectEvent<u32>) {}
    }

    /// An entry lives as long as its key is watched, ten thousand of them at a time:
    /// its size is memory per watched object. Guards against per-key state growing
    /// back (a `watch` channel and a cancellation token took 460 bytes more, a
    /// `BTreeMap` of handlers a node of 280 bytes).
    #[test]
    fn a_watched_key_with_two_handlers_stays_small() {
        let registry: Registry<u32, StdLocks> = Registry::new("things");
        let key = ObjectKey::new("ns", "a");
        let (first, driver) = registry.join(&key);
        let (second, _) = registry.join(&key);
        let driver = driver.expect("a new entry has a driver");
        driver.synced(Some(Arc::new(7)));
        let handles = [
            first.attach(Box::new(Ignore)).expect("attached"),
            second.attach(Box::new(Ignore)).expect("attached"),
        ];
        let entry_size = std::mem::size_of::<Entry<u32, StdLocks>>();
        let sinks = driver
            .entry
            .state
            .with(|state| (state.sinks.len(), state.sinks.capacity()));
        println!("entry: {entry_size} bytes, sinks (len, capacity): {sinks:?}");
        assert!(entry_size <= 200, "an entry grew to {entry_size} bytes");
        assert_eq!(sinks, (2, 2), "handlers kept with room to spare");
        for handle in &handles {
            assert_eq!(registry.get(handle).expect("registered"), Some(Arc::new(7)));
        }
        registry.remove(&handles[0]).expect("removed");
        assert!(!driver.is_stopped(), "one handler is left");
        registry.remove(&handles[1]).expect("removed");
        assert!(driver.is_stopped(), "the last removal stops the watch");
    }
}
