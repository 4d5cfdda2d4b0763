//! What a registered handler receives.

use std::sync::Arc;

use tokio::sync::mpsc;

/// A change to a watched object, as seen by one handler.
///
/// Objects are shared (`Arc`) between all handlers of a key: fan-out never copies an
/// object.
#[derive(Debug)]
pub enum ObjectEvent<K> {
    /// The object exists. A handler's first event is an `Added` carrying the object's
    /// state at registration time, when the object exists then.
    Added(Arc<K>),
    /// The object changed.
    Updated {
        /// The state the handler saw last.
        old: Arc<K>,
        /// The new state.
        new: Arc<K>,
    },
    /// The object was deleted; carries its last known state.
    Deleted(Arc<K>),
}

impl<K> Clone for ObjectEvent<K> {
    fn clone(&self) -> Self {
        match self {
            Self::Added(obj) => Self::Added(Arc::clone(obj)),
            Self::Updated { old, new } => Self::Updated {
                old: Arc::clone(old),
                new: Arc::clone(new),
            },
            Self::Deleted(obj) => Self::Deleted(Arc::clone(obj)),
        }
    }
}

impl<K> ObjectEvent<K> {
    /// The object's state after this event (for `Deleted`: its last state).
    pub fn object(&self) -> &Arc<K> {
        match self {
            Self::Added(obj) | Self::Deleted(obj) => obj,
            Self::Updated { new, .. } => new,
        }
    }
}

/// Where the monitor delivers one handler's events.
///
/// `deliver` is called while the key's entry is locked, so that every handler sees its
/// key's events in order and a handler added later sees the current object exactly once
/// before any later event. It must therefore return at once: hand the event to a
/// channel or queue, never process it inline. A slow consumer then never blocks the
/// watch or other handlers.
///
/// This is why the channels the crate provides sinks for are unbounded: a sink may not
/// wait for room, and dropping an event would lose a change. A consumer that needs a
/// bound keeps the latest change per handler instead (route-secrets' pipeline keeps
/// one per registration), which a sink of its own can do without waiting.
pub trait EventSink<K>: Send + 'static {
    /// Hands over one event. The return value is ignored by the monitor; a sink whose
    /// consumer has gone away simply drops events until its handler is removed.
    fn deliver(&mut self, event: ObjectEvent<K>);
}

impl<K: Send + Sync + 'static> EventSink<K> for mpsc::UnboundedSender<ObjectEvent<K>> {
    fn deliver(&mut self, event: ObjectEvent<K>) {
        // The receiver may be gone (the caller dropped its stream but has not removed the
        // handler yet); the event is then of no use to anyone.
        let _ = self.send(event);
    }
}

/// A sink that tags every event with a caller-chosen value and sends it into one shared
/// channel, so that many registrations can feed one consumer without a task each.
#[derive(Debug)]
pub struct TaggedSink<T, K> {
    tag: T,
    sender: mpsc::UnboundedSender<(T, ObjectEvent<K>)>,
}

impl<T, K> TaggedSink<T, K> {
    /// Events delivered to this sink arrive on `sender` as `(tag, event)`.
    pub fn new(tag: T, sender: mpsc::UnboundedSender<(T, ObjectEvent<K>)>) -> Self {
        Self { tag, sender }
    }
}

impl<T, K> EventSink<K> for TaggedSink<T, K>
where
    T: Clone + Send + 'static,
    K: Send + Sync + 'static,
{
    fn deliver(&mut self, event: ObjectEvent<K>) {
        // See the impl for `UnboundedSender`: a gone consumer drops events.
        let _ = self.sender.send((self.tag.clone(), event));
    }
}

/// The stream of events for one registration made with
/// [`ObjectMonitor::add_handler`](crate::ObjectMonitor::add_handler).
///
/// It ends when the handler is removed or the monitor is dropped.
pub type EventStream<K> = mpsc::UnboundedReceiver<ObjectEvent<K>>;
