//! Shared, reference-counted watches on individual Kubernetes objects, with truly
//! concurrent registration.
//!
//! An ingress router may only watch the Secrets its routes reference, one by one: RBAC
//! grants it `get`, `list` and `watch` on those names (`resourceNames`), which Kubernetes
//! honours for a list or watch only when the request selects that one name. So each
//! secret needs a watch of its own. [`ObjectMonitor`] gives every handler of a key the
//! same watch, counts its holders, and closes the watch when the last handler goes.
//!
//! Registration is built so that a caller that registers keys one at a time still
//! starts up in about one API round trip per *batch*, not per key: the registry's lock
//! is held only for map bookkeeping, never while a sync is in flight, and a key's entry
//! is published before its first sync starts, so concurrent callers for one key share
//! one watch and one first sync.
//!
//! # Example
//!
//! ```no_run
//! use futures::StreamExt;
//! use secret_monitor::{ObjectEvent, ObjectKey, SecretMonitor};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! let client = kube::Client::try_default().await?;
//! let monitor = SecretMonitor::new(client);
//!
//! // Returns once the secret is in the cache (or known to be absent).
//! let mut registration = monitor.add_handler(ObjectKey::new("shop", "shop-tls")).await?;
//! let secret = monitor.get(&registration.handle)?;
//! println!("type: {:?}", secret.type_);
//!
//! while let Some(event) = registration.events.recv().await {
//!     match event {
//!         ObjectEvent::Added(s) | ObjectEvent::Updated { new: s, .. } => {
//!             println!("now at resourceVersion {:?}", s.metadata.resource_version)
//!         }
//!         ObjectEvent::Deleted(_) => println!("deleted"),
//!     }
//! }
//! monitor.remove_handler(&registration.handle)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Guarantees
//!
//! * One watch per key, however many handlers; it stops when the last is removed.
//! * A first sync that fails fails every caller waiting for it with the same error and
//!   leaves nothing behind, so the next caller starts a fresh watch. A caller that is
//!   cancelled while waiting affects no one else.
//! * Each handler sees its key's events in order, starting with the current object.
//!   Handlers never block the watch or each other.
//! * After disconnects, `410 Gone` and outages the watch re-lists and delivers what
//!   changed in between, including deletions and re-creations.

mod decode;
mod error;
mod event;
mod key;
mod lock;
mod machine;
mod monitor;
mod object;
mod options;
mod reconcile;
mod registry;
#[cfg(test)]
mod registry_model;
mod request;
mod watch;

pub use error::{MonitorError, MonitorErrorKind, SharedError, TransportError};
pub use event::{EventSink, EventStream, ObjectEvent, TaggedSink};
pub use key::ObjectKey;
pub use monitor::{EventHandler, ObjectMonitor, Registration};
pub use object::WatchedObject;
pub use options::{
    DEFAULT_WATCH_RENEWALS_PER_SECOND, InitialList, MonitorObserver, MonitorOptions,
};
pub use registry::{HandlerHandle, KeyCounts, KeyStatus};

/// A monitor of individual Secrets.
pub type SecretMonitor = ObjectMonitor<k8s_openapi::api::core::v1::Secret>;
