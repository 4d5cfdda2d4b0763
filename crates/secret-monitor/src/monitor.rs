//! The public face of the crate: [`ObjectMonitor`].

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::sync::Arc;

use kube::Client;
use serde::de::DeserializeOwned;

use crate::event::{EventSink, EventStream, ObjectEvent};
use crate::lock::StdLocks;
use crate::options::MonitorOptions;
use crate::registry::{HandlerHandle, KeyCounts, KeyStatus, Registry};
use crate::watch::{self, Transform, WatchContext};
use crate::{MonitorError, MonitorErrorKind, ObjectKey, WatchedObject};

/// Watches individual namespaced objects, one shared watch per object.
///
/// Each key (namespace and name) gets one watch (`fieldSelector=metadata.name=<name>`
/// in its namespace), shared by every handler registered for it and stopped when the
/// last one is removed. Registrations of different keys run fully concurrently;
/// concurrent registrations of one key share a single first sync.
///
/// Cheap to clone: clones share the same watches. Dropping the last clone stops every
/// watch.
pub struct ObjectMonitor<K>
where
    K: Send + Sync + 'static,
{
    inner: Arc<MonitorInner<K>>,
}

impl<K: Send + Sync + 'static> Clone for ObjectMonitor<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct MonitorInner<K>
where
    K: Send + Sync + 'static,
{
    registry: Registry<K, StdLocks>,
    context: Arc<WatchContext>,
    /// Reshapes received objects before they are kept; `None`: kept as decoded.
    transform: Option<Transform<K>>,
}

impl<K: Send + Sync + 'static> Drop for MonitorInner<K> {
    fn drop(&mut self) {
        self.registry.shutdown();
    }
}

/// A successful registration made with [`ObjectMonitor::add_handler`].
pub struct Registration<K> {
    /// Identifies the handler, for [`ObjectMonitor::remove_handler`] and
    /// [`ObjectMonitor::get`].
    pub handle: HandlerHandle,
    /// The handler's events: first the object's current state (when it exists), then
    /// every change, in order.
    pub events: EventStream<K>,
}

impl<K> Debug for Registration<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("handle", &self.handle)
            .finish_non_exhaustive()
    }
}

/// Callbacks for [`ObjectMonitor::add_event_handler`], run on a task of their own so
/// that a slow handler delays only itself.
pub trait EventHandler<K>: Send + 'static {
    /// The object exists (first call: its state at registration), or was re-created.
    fn on_add(&mut self, object: &Arc<K>);
    /// The object changed.
    fn on_update(&mut self, old: &Arc<K>, new: &Arc<K>);
    /// The object was deleted.
    fn on_delete(&mut self, object: &Arc<K>);
}

impl<K> ObjectMonitor<K>
where
    K: WatchedObject + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// A monitor with default options.
    pub fn new(client: Client) -> Self {
        Self::with_options(client, MonitorOptions::default())
    }

    /// A monitor with the given options.
    pub fn with_options(client: Client, options: MonitorOptions) -> Self {
        Self::build(client, options, None)
    }

    /// A monitor that keeps each object as `transform` leaves it: called on every
    /// object received (listed, added, modified or deleted) before the cache, the
    /// events or the change detection see it, like client-go's informer
    /// `SetTransform`. Use it to drop what the consumer never reads (managed fields,
    /// annotations such as `kubectl.kubernetes.io/last-applied-configuration`, which
    /// holds a whole copy of the object, unused data entries): at thousands of
    /// watched objects the cache is a large part of the process's memory.
    ///
    /// A change to a dropped field still arrives as an update (the object's
    /// resourceVersion changed), now with equal content. The transform must leave
    /// `metadata.name`, `metadata.namespace`, `metadata.uid` and
    /// `metadata.resourceVersion` alone: the watch relies on them.
    pub fn with_transform(
        client: Client,
        options: MonitorOptions,
        transform: impl Fn(&mut K) + Send + Sync + 'static,
    ) -> Self {
        Self::build(client, options, Some(Arc::new(transform)))
    }

    fn build(client: Client, options: MonitorOptions, transform: Option<Transform<K>>) -> Self {
        let resource = K::resource_plural().into_owned();
        Self {
            inner: Arc::new(MonitorInner {
                registry: Registry::new(resource.clone()),
                context: Arc::new(WatchContext::new(client, options, resource)),
                transform,
            }),
        }
    }

    /// Registers a handler for `key` and returns once the key's first sync is done
    /// (the object is in the cache, or known to be absent).
    ///
    /// The handler's events arrive on [`Registration::events`]. Dropping the returned
    /// future while it waits cancels this registration only.
    pub async fn add_handler(&self, key: ObjectKey) -> Result<Registration<K>, MonitorError> {
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let handle = self.add_sink(key, sender).await?;
        Ok(Registration { handle, events })
    }

    /// Like [`add_handler`](Self::add_handler), delivering events to `sink`.
    pub async fn add_sink(
        &self,
        key: ObjectKey,
        sink: impl EventSink<K>,
    ) -> Result<HandlerHandle, MonitorError> {
        let (ticket, driver) = self.inner.registry.join(&key);
        if let Some(driver) = driver {
            tokio::spawn(watch::run(
                driver,
                Arc::clone(&self.inner.context),
                self.inner.transform.clone(),
            ));
        }
        // No lock is held here: other registrations proceed while this one waits.
        ticket.synced().await?;
        ticket.attach(Box::new(sink))
    }

    /// Like [`add_handler`](Self::add_handler), calling `handler`'s methods on a task
    /// of its own. The task ends when the handler is removed.
    pub async fn add_event_handler(
        &self,
        key: ObjectKey,
        mut handler: impl EventHandler<K>,
    ) -> Result<HandlerHandle, MonitorError> {
        let Registration { handle, mut events } = self.add_handler(key).await?;
        tokio::spawn(async move {
            while let Some(event) = events.recv().await {
                match &event {
                    ObjectEvent::Added(object) => handler.on_add(object),
                    ObjectEvent::Updated { old, new } => handler.on_update(old, new),
                    ObjectEvent::Deleted(object) => handler.on_delete(object),
                }
            }
        });
        Ok(handle)
    }

    /// Removes a handler. The key's watch stops when its last handler is removed.
    ///
    /// Fails with [`MonitorErrorKind::NotRegistered`] when the handle was already removed.
    pub fn remove_handler(&self, handle: &HandlerHandle) -> Result<(), MonitorError> {
        self.inner.registry.remove(handle)
    }

    /// The cached object for a registered handler, without an API call.
    ///
    /// Fails with [`MonitorErrorKind::NotFound`] when the object does not exist and with
    /// [`MonitorErrorKind::NotRegistered`] for an unknown handle.
    pub fn get(&self, handle: &HandlerHandle) -> Result<Arc<K>, MonitorError> {
        self.inner.registry.get(handle)?.ok_or_else(|| {
            MonitorError::new(
                self.inner.context.resource.as_str(),
                handle.key().clone(),
                MonitorErrorKind::NotFound,
            )
        })
    }

    /// Asks the API server, once and in the background, whether it serves streaming
    /// lists, with a streaming list of the collection at `collection_path` (e.g.
    /// `/apis/route.openshift.io/v1/routes`) narrowed to `name`: best a name that does
    /// not exist, in a collection this client may watch. Until it is answered, first
    /// syncs hold their streaming lists (and only those); a refusal turns streaming
    /// lists off before any key asks, so that a server without them refuses one
    /// request instead of every first sync of a start-up burst. Any other answer
    /// (403, 5xx, none within the sync timeout) teaches nothing and lets them go.
    ///
    /// Start it while the caller does something that costs a round trip anyway (the
    /// router lists its routes before it knows any secret), so that the wait costs
    /// nothing. Does nothing when streaming lists are off already.
    pub fn probe_streaming(&self, collection_path: impl Into<String>, name: impl Into<String>) {
        let context = Arc::clone(&self.inner.context);
        let (path, name) = (collection_path.into(), name.into());
        // Marked out before the task runs, so that a key registered right after this
        // call already waits for the answer.
        if context.probe_starting() {
            tokio::spawn(watch::probe_streaming::<K>(context, path, name));
        }
    }

    /// Every watched key with its handler counts.
    pub fn watched_keys(&self) -> BTreeMap<ObjectKey, KeyStatus> {
        self.inner.registry.snapshot()
    }

    /// How many keys are watched and synced: [`watched_keys`](Self::watched_keys)'
    /// counts, without copying the keys.
    pub fn watched_counts(&self) -> KeyCounts {
        self.inner.registry.counts()
    }
}
