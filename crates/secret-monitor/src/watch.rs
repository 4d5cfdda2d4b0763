//! The task behind one key: a kube-runtime watcher on `metadata.name=<name>`, its first
//! sync, and the reconnect loop after it.
//!
//! The watch protocol itself (list/watch, resume from the last resourceVersion, re-list
//! after `410 Gone`, streaming lists) is kube-runtime's [`watcher`]; this module adds
//! what a shared per-object watch needs on top: classifying errors into "fail the
//! waiters now" and "retry", the fallback from streaming lists, a bound on concurrent
//! first syncs, a deadline, and backoff with jitter between failed requests.

use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Resource, core::Status};
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::lock::StdLocks;
use crate::options::{InitialList, MonitorOptions};
use crate::reconcile::{Reconciler, Step};
use crate::registry::SyncDriver;
use crate::{MonitorError, MonitorErrorKind, ObjectKey};
use kube_common::Verb;
use kube_common::backoff::{Backoff, BackoffPolicy};

/// State shared by all watch tasks of one monitor.
pub(crate) struct WatchContext {
    pub(crate) options: MonitorOptions,
    /// Plural resource name, for errors.
    pub(crate) resource: String,
    /// Set once a server refused a streaming list, so later keys go straight to
    /// list-then-watch instead of paying for a refused request each.
    streaming_refused: AtomicBool,
    /// Bounds concurrent first syncs, when configured.
    sync_permits: Option<Semaphore>,
}

impl WatchContext {
    pub(crate) fn new(options: MonitorOptions, resource: String) -> Self {
        let sync_permits = options
            .max_concurrent_syncs
            .map(|n| Semaphore::new(n.max(1)));
        Self {
            options,
            resource,
            streaming_refused: AtomicBool::new(false),
            sync_permits,
        }
    }

    fn streaming(&self) -> bool {
        self.options.initial_list == InitialList::Streaming
            && !self.streaming_refused.load(Ordering::Relaxed)
    }
}

/// What to do about an error.
#[derive(Debug, PartialEq, Eq)]
enum Disposition {
    /// Retrying cannot help until someone changes something (RBAC, the request).
    Permanent,
    /// Throttling, server errors, broken connections: retry after a backoff, and not
    /// before the server's `Retry-After`, when it gave one.
    Transient(Option<Duration>),
    /// `410 Gone`: the watcher re-lists on its own; no backoff needed.
    Resync,
    /// The server does not accept `sendInitialEvents`.
    StreamingRefused,
}

/// Runs the watch for the driver's key until the entry leaves the registry.
pub(crate) async fn run<K>(driver: SyncDriver<K, StdLocks>, api: Api<K>, ctx: Arc<WatchContext>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let stopped = driver.stopped();
    tokio::select! {
        biased;
        // Dropping `drive` drops the watcher stream, which closes its HTTP request.
        () = stopped => debug!(key = %driver.key(), "watch stopped: no handlers left"),
        () = drive(&driver, api, &ctx) => {}
    }
}

async fn drive<K>(driver: &SyncDriver<K, StdLocks>, api: Api<K>, ctx: &WatchContext)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let key = driver.key().clone();
    let mut reconciler = Reconciler::new(key.name.clone());

    let mut watch = KeyWatch::open(api, &key, ctx);
    // Boxed: the first sync's state is large and needed once; the task then lives on
    // for as long as the key is watched, so its size matters at thousands of keys.
    let first = Box::pin(bounded_first_sync(&mut watch, &mut reconciler, ctx)).await;
    match first {
        Ok(object) => driver.synced(object),
        Err(error) => {
            debug!(%key, %error, "first sync failed");
            driver.failed(error);
            return;
        }
    }

    // One sequence for the key's life: it starts over after a healthy period, not after
    // every success, so a watch that opens and breaks at once keeps backing off.
    let mut backoff = Backoff::new(backoff_policy(&ctx.options));
    loop {
        match watch.next(&reconciler).await {
            Ok(event) => {
                if let Step::Changed { object, events } = reconciler.step(event) {
                    driver.publish(object, &events);
                }
            }
            Err(err) => {
                // The error is reported and dropped before waiting, so that it takes no
                // room in the task while it sleeps.
                let delay = {
                    let (error, disposition) = classify(&err, &key, &ctx.resource);
                    drop(err);
                    if let Some(observer) = &ctx.options.observer {
                        observer.watch_error(&key, &error);
                    }
                    let retry_after = match disposition {
                        Disposition::Resync => {
                            debug!(%key, "watch expired (410); re-listing");
                            continue;
                        }
                        Disposition::Transient(retry_after) => retry_after,
                        Disposition::Permanent | Disposition::StreamingRefused => None,
                    };
                    let delay = retry_delay(&mut backoff, retry_after);
                    warn!(%key, %error, retry_in = ?delay, "watch failed; retrying");
                    delay
                };
                Box::pin(tokio::time::sleep(delay)).await;
            }
        }
    }
}

/// The first sync within the configured bound on concurrent syncs and its deadline,
/// reported to the observer.
async fn bounded_first_sync<K>(
    watch: &mut KeyWatch<'_, K>,
    reconciler: &mut Reconciler<K>,
    ctx: &WatchContext,
) -> Result<Option<Arc<K>>, MonitorError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let _permit = match &ctx.sync_permits {
        // The semaphore is never closed, so acquiring only fails in theory.
        Some(permits) => permits.acquire().await.ok(),
        None => None,
    };
    let started = Instant::now();
    let first = tokio::time::timeout(ctx.options.sync_timeout, first_sync(watch, reconciler, ctx))
        .await
        .unwrap_or_else(|_elapsed| {
            Err(MonitorError::new(
                ctx.resource.as_str(),
                watch.key.clone(),
                MonitorErrorKind::SyncTimeout {
                    timeout: ctx.options.sync_timeout,
                },
            ))
        });
    if let Some(observer) = &ctx.options.observer {
        observer.first_sync(watch.key, started.elapsed(), first.as_ref().map(|_| ()));
    }
    first
}

/// Polls the watcher until the first complete listing. Returns the object (or `None`
/// when it does not exist).
async fn first_sync<K>(
    watch: &mut KeyWatch<'_, K>,
    reconciler: &mut Reconciler<K>,
    ctx: &WatchContext,
) -> Result<Option<Arc<K>>, MonitorError>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut backoff = Backoff::new(backoff_policy(&ctx.options));
    let mut failures = 0;
    loop {
        let err = match watch.next(reconciler).await {
            Ok(event) => match reconciler.step(event) {
                Step::FirstSync(object) => return Ok(object),
                Step::Unchanged | Step::Changed { .. } => continue,
            },
            Err(err) => err,
        };
        let (error, disposition) = classify(&err, watch.key, &ctx.resource);
        if let Some(observer) = &ctx.options.observer {
            observer.watch_error(watch.key, &error);
        }
        match disposition {
            Disposition::StreamingRefused if watch.streaming => {
                debug!(key = %watch.key, %error, "server refused a streaming list; using list then watch");
                ctx.streaming_refused.store(true, Ordering::Relaxed);
                watch.list_then_watch();
            }
            Disposition::Resync => {}
            Disposition::Permanent | Disposition::StreamingRefused => return Err(error),
            Disposition::Transient(retry_after) => {
                failures += 1;
                if failures >= ctx.options.first_sync_attempts.max(1) {
                    return Err(error);
                }
                let delay = retry_delay(&mut backoff, retry_after);
                debug!(key = %watch.key, %error, retry_in = ?delay, "first sync request failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One key's kube-runtime watcher, and how it lists.
struct KeyWatch<'a, K> {
    api: Api<K>,
    key: &'a ObjectKey,
    options: &'a MonitorOptions,
    streaming: bool,
    stream: BoxStream<'static, watcher::Result<watcher::Event<K>>>,
}

impl<'a, K> KeyWatch<'a, K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn open(api: Api<K>, key: &'a ObjectKey, ctx: &'a WatchContext) -> Self {
        let streaming = ctx.streaming();
        let stream = open(&api, &key.name, streaming, &ctx.options);
        Self {
            api,
            key,
            options: &ctx.options,
            streaming,
            stream,
        }
    }

    /// Restarts the watch with a plain list then watch.
    fn list_then_watch(&mut self) {
        self.streaming = false;
        self.stream = open(&self.api, &self.key.name, false, self.options);
    }

    /// The next watcher event.
    ///
    /// A streaming list that breaks before its initial-events bookmark is restarted by
    /// kube's watcher as another streaming list, which a connection that keeps breaking
    /// early would never finish; when that happens this key lists then watches instead
    /// (a plain list is one response, not a stream that can break half-way).
    async fn next(&mut self, reconciler: &Reconciler<K>) -> watcher::Result<watcher::Event<K>> {
        loop {
            match self.stream.next().await {
                Some(Ok(watcher::Event::Init)) if self.streaming && reconciler.is_relisting() => {
                    debug!(key = %self.key, "streaming list broke off; using list then watch for this key");
                    self.list_then_watch();
                }
                Some(item) => return item,
                // kube's watcher never ends on its own; reopen it if it does.
                None => self.stream = open(&self.api, &self.key.name, self.streaming, self.options),
            }
        }
    }
}

/// Opens a kube-runtime watcher on the one object called `name`.
fn open<K>(
    api: &Api<K>,
    name: &str,
    streaming: bool,
    options: &MonitorOptions,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    if streaming {
        config = config.streaming_lists();
    }
    if let Some(timeout) = options.watch_timeout {
        config = config.timeout(timeout);
    }
    watcher(api.clone(), config).boxed()
}

/// The project's retry policy (client-go's reflector shape) within the configured
/// bounds.
fn backoff_policy(options: &MonitorOptions) -> BackoffPolicy {
    BackoffPolicy::default().with_bounds(options.backoff_min, options.backoff_max)
}

/// The wait before retrying: the backoff's next delay, but never less than the server's
/// `Retry-After`. Past `Retry-After` the wait is spread over up to half as long again,
/// so that the many requests one throttled burst refused do not return in lock-step.
fn retry_delay(backoff: &mut Backoff, retry_after: Option<Duration>) -> Duration {
    let delay = backoff.next_delay();
    match retry_after {
        Some(floor) => delay.max(floor.mul_f64(1.0 + rand::random::<f64>() / 2.0)),
        None => delay,
    }
}

/// Names the failed verb and turns a watcher error into a [`MonitorError`].
fn classify(err: &watcher::Error, key: &ObjectKey, resource: &str) -> (MonitorError, Disposition) {
    let (verb, source) = match err {
        watcher::Error::InitialListFailed(source) => (Verb::List, source),
        watcher::Error::WatchStartFailed(source) | watcher::Error::WatchFailed(source) => {
            (Verb::Watch, source)
        }
        watcher::Error::WatchError(status) => {
            return from_status(status, Verb::Watch, key, resource);
        }
        watcher::Error::NoResourceVersion => {
            let error = MonitorError::new(
                resource,
                key.clone(),
                MonitorErrorKind::Api {
                    verb: Verb::List,
                    code: 500,
                    reason: "NoResourceVersion".into(),
                    message: "the list response carried no metadata.resourceVersion".into(),
                },
            );
            return (error, Disposition::Transient(None));
        }
    };
    let streaming_start = matches!(err, watcher::Error::WatchStartFailed(_));
    match source {
        kube::Error::Api(status) => {
            let (error, disposition) = from_status(status, verb, key, resource);
            let refused = streaming_start && matches!(status.code, 400 | 422);
            (
                error,
                if refused {
                    Disposition::StreamingRefused
                } else {
                    disposition
                },
            )
        }
        other => {
            let error = MonitorError::new(
                resource,
                key.clone(),
                MonitorErrorKind::Transport {
                    verb,
                    message: transport_message(other),
                },
            );
            (error, Disposition::Transient(None))
        }
    }
}

fn from_status(
    status: &Status,
    verb: Verb,
    key: &ObjectKey,
    resource: &str,
) -> (MonitorError, Disposition) {
    let error = |kind| MonitorError::new(resource, key.clone(), kind);
    let message = status.message.clone();
    match status.code {
        401 => (
            error(MonitorErrorKind::Unauthorized { verb, message }),
            Disposition::Permanent,
        ),
        403 => (
            error(MonitorErrorKind::Forbidden { verb, message }),
            Disposition::Permanent,
        ),
        code => {
            let disposition = match code {
                410 => Disposition::Resync,
                408 | 409 | 429 | 500..=599 => Disposition::Transient(retry_after(status)),
                _ => Disposition::Permanent,
            };
            let error = error(MonitorErrorKind::Api {
                verb,
                code,
                reason: status.reason.clone(),
                message,
            });
            (error, disposition)
        }
    }
}

/// The server's `Retry-After`, as kube-apiserver also puts it in the Status details.
fn retry_after(status: &Status) -> Option<Duration> {
    let seconds = status.details.as_ref()?.retry_after_seconds;
    (seconds > 0).then(|| Duration::from_secs(u64::from(seconds)))
}

/// Describes a failure that is not an API status. Decoding errors are described by
/// position only: serde's own messages may quote the offending value, which for a
/// Secret could be its data.
fn transport_message(err: &kube::Error) -> String {
    match err {
        kube::Error::SerdeError(e) => format!(
            "could not decode the response ({:?} error at line {}, column {})",
            e.classify(),
            e.line(),
            e.column()
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Secret;

    use super::*;
    use crate::registry::Registry;

    /// A watch task lives as long as its key is watched, ten thousand of them at a
    /// time: its size is memory per watched object. Guards against a change that
    /// quietly keeps a large value (an object, an error, a first-sync state) inline.
    #[tokio::test]
    async fn a_watch_task_stays_small() {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::empty()))
        });
        let api: Api<Secret> = Api::namespaced(kube::Client::new(service, "default"), "ns");
        let registry: Registry<Secret, StdLocks> = Registry::new("secrets");
        let (_ticket, driver) = registry.join(&ObjectKey::new("ns", "a"));
        let ctx = Arc::new(WatchContext::new(
            MonitorOptions::default(),
            "secrets".into(),
        ));
        let task = run(driver.expect("a new entry has a driver"), api, ctx);
        let size = std::mem::size_of_val(&task);
        assert!(
            size <= 2_200,
            "the watch task's future grew to {size} bytes"
        );
    }
}
