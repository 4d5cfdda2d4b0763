//! The route ⇄ secret manager: which route uses which secret, on top of one shared
//! watch per secret.
//!
//! Every registered route holds one handler on its secret's watch in the
//! [`SecretMonitor`], so routes sharing a secret share its watch, and the watch closes
//! when the last of them unregisters. Registration waits for the secret's first sync
//! with no lock held, so distinct routes register concurrently.
//!
//! A caller that applies routes one at a time (as a router does) would still wait one
//! sync per new secret. [`SecretManager::prefetch`] removes that wait: it starts the
//! registrations of every secret a batch of routes references at once, holding their
//! watches until [`SecretManager::release_prefetched`], so that each route's own
//! registration later joins a sync that is already under way or done.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::Secret;
use secret_monitor::{
    EventSink, HandlerHandle, KeyStatus, MonitorError, ObjectEvent, ObjectKey, SecretMonitor,
};
use tokio::task::AbortHandle;

/// Namespace and name of a route.
pub use crate::route::RouteKey;

/// Errors of the manager. Each names the route and, where known, the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// The route already has a secret registered (or a registration in flight).
    #[error("route {route} is already registered with secret {secret:?}")]
    AlreadyRegistered {
        /// The route.
        route: RouteKey,
        /// The secret it is registered with.
        secret: String,
    },
    /// The route has no registered secret.
    #[error("route {route} has no registered secret")]
    NotRegistered {
        /// The route.
        route: RouteKey,
    },
    /// The route was unregistered while its registration was waiting for the secret's
    /// first sync; the registration was undone.
    #[error("route {route} was unregistered while secret {secret:?} was being registered")]
    Unregistered {
        /// The route.
        route: RouteKey,
        /// The secret that was being registered.
        secret: String,
    },
    /// The secret's watch failed, or the secret is absent from the cache.
    #[error("secret {secret:?} of route {route}: {source}")]
    Secret {
        /// The route.
        route: RouteKey,
        /// The secret.
        secret: String,
        /// What the monitor reported.
        #[source]
        source: MonitorError,
    },
}

/// Route ⇄ secret bookkeeping over a [`SecretMonitor`]. Cheap to clone.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
}

struct Inner {
    monitor: SecretMonitor,
    /// Guards the route table: each route's secret and registration state. Never held
    /// across an `.await`.
    routes: Mutex<HashMap<RouteKey, RouteEntry>>,
    /// Guards the prefetched watches, keyed by secret. Never held across an `.await`.
    prefetched: Mutex<HashMap<ObjectKey, Prefetch>>,
    next_ticket: AtomicU64,
}

enum RouteEntry {
    /// Waiting for the secret's first sync; `ticket` identifies this attempt.
    Registering { secret: String, ticket: u64 },
    Registered {
        secret: String,
        handle: HandlerHandle,
    },
}

impl RouteEntry {
    fn secret(&self) -> &str {
        match self {
            Self::Registering { secret, .. } | Self::Registered { secret, .. } => secret,
        }
    }
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

impl EventSink<Secret> for Discard {
    fn deliver(&mut self, _event: ObjectEvent<Secret>) {}
}

impl std::fmt::Debug for SecretManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretManager").finish_non_exhaustive()
    }
}

impl SecretManager {
    /// A manager registering routes' secrets with `monitor`.
    pub fn new(monitor: SecretMonitor) -> Self {
        Self {
            inner: Arc::new(Inner {
                monitor,
                routes: Mutex::new(HashMap::new()),
                prefetched: Mutex::new(HashMap::new()),
                next_ticket: AtomicU64::new(1),
            }),
        }
    }

    /// The monitor underneath.
    pub fn monitor(&self) -> &SecretMonitor {
        &self.inner.monitor
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<RouteKey, RouteEntry>> {
        self.inner
            .routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn prefetched(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectKey, Prefetch>> {
        self.inner
            .prefetched
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers `route` with the secret called `secret` in the route's namespace and
    /// returns once the secret's first sync is done. The secret's events go to `sink`,
    /// starting with its current state when it exists.
    ///
    /// Fails with [`ManagerError::AlreadyRegistered`] when the route is registered (or
    /// registering) already. Dropping the future cancels the registration.
    pub async fn register_route(
        &self,
        route: &RouteKey,
        secret: &str,
        sink: impl EventSink<Secret>,
    ) -> Result<(), ManagerError> {
        let ticket = self.inner.next_ticket.fetch_add(1, Ordering::Relaxed);
        {
            let mut routes = self.routes();
            if let Some(entry) = routes.get(route) {
                return Err(ManagerError::AlreadyRegistered {
                    route: route.clone(),
                    secret: entry.secret().to_owned(),
                });
            }
            routes.insert(
                route.clone(),
                RouteEntry::Registering {
                    secret: secret.to_owned(),
                    ticket,
                },
            );
        }
        // Undoes the reservation if this future is dropped or fails.
        let reservation = Reservation {
            manager: self,
            route,
            ticket,
            armed: true,
        };
        let key = ObjectKey::new(route.namespace.clone(), secret);
        if let Some(Prefetch::Failed(source)) = self.prefetched().get(&key) {
            return Err(ManagerError::Secret {
                route: route.clone(),
                secret: secret.to_owned(),
                source: source.clone(),
            });
        }
        let handle = self
            .inner
            .monitor
            .add_sink(key, sink)
            .await
            .map_err(|source| ManagerError::Secret {
                route: route.clone(),
                secret: secret.to_owned(),
                source,
            })?;
        reservation.disarm();
        let mut routes = self.routes();
        let ours = matches!(routes.get(route), Some(RouteEntry::Registering { ticket: t, .. }) if *t == ticket);
        if ours {
            routes.insert(
                route.clone(),
                RouteEntry::Registered {
                    secret: secret.to_owned(),
                    handle,
                },
            );
            return Ok(());
        }
        drop(routes);
        // Unregistered while waiting: give the handler back.
        let _ = self.inner.monitor.remove_handler(&handle);
        Err(ManagerError::Unregistered {
            route: route.clone(),
            secret: secret.to_owned(),
        })
    }

    /// Unregisters `route`, releasing its hold on its secret's watch. A registration in
    /// flight for the route is undone when it completes.
    pub fn unregister_route(&self, route: &RouteKey) -> Result<(), ManagerError> {
        let entry = self.routes().remove(route);
        match entry {
            None => Err(ManagerError::NotRegistered {
                route: route.clone(),
            }),
            Some(RouteEntry::Registering { .. }) => Ok(()),
            Some(RouteEntry::Registered { secret, handle }) => self
                .inner
                .monitor
                .remove_handler(&handle)
                .map_err(|source| ManagerError::Secret {
                    route: route.clone(),
                    secret,
                    source,
                }),
        }
    }

    /// The route's secret, from the watch cache (no API call).
    ///
    /// Fails with [`ManagerError::Secret`] carrying [`MonitorErrorKind::NotFound`](secret_monitor::MonitorErrorKind::NotFound) when the
    /// secret does not exist, and [`ManagerError::NotRegistered`] for an unknown route.
    pub fn get_secret(&self, route: &RouteKey) -> Result<Arc<Secret>, ManagerError> {
        let (secret, handle) = match self.routes().get(route) {
            Some(RouteEntry::Registered { secret, handle }) => (secret.clone(), handle.clone()),
            _ => {
                return Err(ManagerError::NotRegistered {
                    route: route.clone(),
                });
            }
        };
        self.inner
            .monitor
            .get(&handle)
            .map_err(|source| ManagerError::Secret {
                route: route.clone(),
                secret,
                source,
            })
    }

    /// The name of the secret the route is registered (or registering) with.
    pub fn secret_of(&self, route: &RouteKey) -> Option<String> {
        self.routes()
            .get(route)
            .map(|entry| entry.secret().to_owned())
    }

    /// Number of routes registered or registering.
    pub fn route_count(&self) -> usize {
        self.routes().len()
    }

    /// Every watched secret with its handler counts (prefetch holds included).
    pub fn watched_secrets(&self) -> BTreeMap<ObjectKey, KeyStatus> {
        self.inner.monitor.watched_keys()
    }

    /// Starts registering `namespace/secret` in the background and keeps its watch until
    /// [`release_prefetched`](Self::release_prefetched), so that routes registered later
    /// join a sync already under way. Idempotent per secret.
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
        on_synced: impl FnOnce(Arc<Secret>) + Send + 'static,
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

    /// Drops every prefetch hold: watches that no route registered with close, and
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

/// A route's "registering" mark, removed again unless the registration completes.
struct Reservation<'a> {
    manager: &'a SecretManager,
    route: &'a RouteKey,
    ticket: u64,
    armed: bool,
}

impl Reservation<'_> {
    /// The registration completed: the caller takes over the route's entry.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let mut routes = self.manager.routes();
        if matches!(routes.get(self.route), Some(RouteEntry::Registering { ticket, .. }) if *ticket == self.ticket)
        {
            routes.remove(self.route);
        }
    }
}
