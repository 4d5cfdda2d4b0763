//! Registrations on per-secret watches, on top of one shared watch per secret.
//!
//! Each [`SecretRegistration`] holds one handler on its secret's watch in the
//! [`TlsSecretMonitor`], so registrations of one secret share its watch, and the watch
//! closes when the last of them is dropped. Registering waits for the secret's first
//! sync with no lock held, so distinct secrets register concurrently; dropping the
//! future cancels the registration and leaves nothing behind.
//!
//! The manager does not know routes or any other consumer: which consumer holds which
//! registration is decided and remembered by the state machine ([`crate::machine`],
//! with [`crate::consumer`]) alone.
//!
//! A caller that applies routes one at a time (as a router does) would still wait one
//! sync per new secret. [`SecretManager::prefetch`] removes that wait: it starts the
//! registrations of every secret a batch of routes references at once, holding their
//! watches until [`SecretManager::release_prefetched`], so that each route's own
//! registration later joins a sync that is already under way or done.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kube_common::hash::NameMap;
use secret_monitor::{
    EventSink, HandlerHandle, KeyCounts, KeyStatus, MonitorError, ObjectEvent, ObjectKey,
    ObjectMonitor,
};
use tokio::task::AbortHandle;

use crate::tls::TlsSecret;

/// The monitor whose watches the manager registers on: it caches each secret as a
/// [`TlsSecret`] (identity, type and the two TLS entries), decoded without the rest.
pub type TlsSecretMonitor = ObjectMonitor<TlsSecret>;

/// Registrations on per-secret watches over a [`TlsSecretMonitor`]. Cheap to clone.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
}

struct Inner {
    monitor: TlsSecretMonitor,
    /// Guards the prefetch holds, keyed by secret. Never held across an `.await`.
    prefetched: Mutex<NameMap<ObjectKey, Prefetch>>,
    next_ticket: AtomicU64,
    /// Registrations alive (prefetch holds not counted).
    registrations: AtomicUsize,
}

enum Prefetch {
    Pending {
        ticket: u64,
        task: AbortHandle,
    },
    Held(HandlerHandle),
    /// Remembered until release, so that the routes of the same batch fail at once
    /// instead of asking the API server again.
    Failed(MonitorError),
}

/// A sink for prefetch handlers, which only keep a watch alive.
struct Discard;

impl EventSink<TlsSecret> for Discard {
    fn deliver(&mut self, _event: ObjectEvent<TlsSecret>) {}
}

impl fmt::Debug for SecretManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretManager")
            .field(
                "registrations",
                &self.inner.registrations.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// One handler on a secret's watch. Dropping it releases the handler, and the watch
/// closes when no one else holds it.
pub struct SecretRegistration {
    manager: SecretManager,
    handle: HandlerHandle,
}

impl SecretRegistration {
    /// The secret registered for.
    pub fn key(&self) -> &ObjectKey {
        self.handle.key()
    }

    /// The secret, from the watch cache (no API call). Fails with
    /// [`MonitorErrorKind::NotFound`](secret_monitor::MonitorErrorKind::NotFound)
    /// when it does not exist.
    pub fn secret(&self) -> Result<Arc<TlsSecret>, MonitorError> {
        self.manager.inner.monitor.get(&self.handle)
    }
}

impl fmt::Debug for SecretRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretRegistration")
            .field("key", self.key())
            .finish_non_exhaustive()
    }
}

impl Drop for SecretRegistration {
    fn drop(&mut self) {
        self.manager
            .inner
            .registrations
            .fetch_sub(1, Ordering::Relaxed);
        // The handler can only be gone already if the monitor shut down: nothing to do.
        let _ = self.manager.inner.monitor.remove_handler(&self.handle);
    }
}

impl SecretManager {
    /// A manager registering on `monitor`'s watches.
    pub fn new(monitor: TlsSecretMonitor) -> Self {
        Self {
            inner: Arc::new(Inner {
                monitor,
                prefetched: Mutex::new(NameMap::default()),
                next_ticket: AtomicU64::new(1),
                registrations: AtomicUsize::new(0),
            }),
        }
    }

    /// The monitor underneath.
    pub fn monitor(&self) -> &TlsSecretMonitor {
        &self.inner.monitor
    }

    fn prefetched(&self) -> std::sync::MutexGuard<'_, NameMap<ObjectKey, Prefetch>> {
        // Every critical section is a single map operation: a poisoned map is intact.
        kube_common::sync::lock(&self.inner.prefetched)
    }

    /// Registers on the watch of the secret `namespace/secret` and returns once its
    /// first sync is done. The secret's events go to `sink`, starting with its current
    /// state when it exists. Dropping the future cancels the registration.
    pub async fn register(
        &self,
        namespace: &str,
        secret: &str,
        sink: impl EventSink<TlsSecret>,
    ) -> Result<SecretRegistration, MonitorError> {
        let key = ObjectKey::new(namespace, secret);
        if let Some(Prefetch::Failed(error)) = self.prefetched().get(&key) {
            return Err(error.clone());
        }
        let handle = self.inner.monitor.add_sink(key, sink).await?;
        self.inner.registrations.fetch_add(1, Ordering::Relaxed);
        Ok(SecretRegistration {
            manager: self.clone(),
            handle,
        })
    }

    /// Number of registrations alive: one per registered route (prefetch holds are not
    /// counted).
    pub fn route_count(&self) -> usize {
        self.inner.registrations.load(Ordering::Relaxed)
    }

    /// Every watched secret with its handler counts (prefetch holds included).
    pub fn watched_secrets(&self) -> BTreeMap<ObjectKey, KeyStatus> {
        self.inner.monitor.watched_keys()
    }

    /// How many secrets are watched, and how many of them synced (prefetch holds
    /// included), without copying their names.
    pub fn watched_counts(&self) -> KeyCounts {
        self.inner.monitor.watched_counts()
    }

    /// Starts registering `namespace/secret` in the background and keeps its watch until
    /// [`release_prefetched`](Self::release_prefetched), so that registrations made
    /// later join a sync already under way. Idempotent per secret.
    pub fn prefetch(&self, namespace: &str, secret: &str) {
        self.prefetch_then(namespace, secret, |_| {});
    }

    /// Like [`prefetch`](Self::prefetch), then calls `on_synced` with the secret once
    /// its first sync has found it (not when it is absent or the sync failed), on the
    /// prefetch's own task: work done there runs in parallel with the caller. Only the
    /// first prefetch of a secret calls its callback.
    pub fn prefetch_then(
        &self,
        namespace: &str,
        secret: &str,
        on_synced: impl FnOnce(Arc<TlsSecret>) + Send + 'static,
    ) {
        let key = ObjectKey::new(namespace, secret);
        let mut prefetched = self.prefetched();
        if prefetched.contains_key(&key) {
            return;
        }
        let ticket = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
        let this = self.clone();
        let task_key = key.clone();
        let task = tokio::spawn(async move {
            let outcome = this.inner.monitor.add_sink(task_key.clone(), Discard).await;
            let mut prefetched = this.prefetched();
            let ours = matches!(prefetched.get(&task_key), Some(Prefetch::Pending { ticket: t, .. }) if *t == ticket);
            match outcome {
                Ok(handle) if ours => {
                    let object = this.inner.monitor.get(&handle).ok();
                    prefetched.insert(task_key, Prefetch::Held(handle));
                    drop(prefetched);
                    if let Some(object) = object {
                        on_synced(object);
                    }
                }
                Ok(handle) => {
                    drop(prefetched);
                    let _ = this.inner.monitor.remove_handler(&handle);
                }
                Err(error) if ours => {
                    prefetched.insert(task_key, Prefetch::Failed(error));
                }
                Err(_) => {}
            }
        });
        prefetched.insert(
            key,
            Prefetch::Pending {
                ticket,
                task: task.abort_handle(),
            },
        );
    }

    /// Drops every prefetch hold: watches that no registration holds close, and
    /// prefetches still in flight are cancelled.
    pub fn release_prefetched(&self) {
        let released: Vec<Prefetch> = self.prefetched().drain().map(|(_, p)| p).collect();
        for prefetch in released {
            match prefetch {
                Prefetch::Pending { task, .. } => task.abort(),
                Prefetch::Held(handle) => {
                    let _ = self.inner.monitor.remove_handler(&handle);
                }
                Prefetch::Failed(_) => {}
            }
        }
    }
}
