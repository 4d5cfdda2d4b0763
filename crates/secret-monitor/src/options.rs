//! Tuning knobs and the observer hook.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use kube_common::adaptive::AdaptiveLimiter;
use kube_common::backoff::BackoffPolicy;
use kube_common::reconnect::Reconnect;

use crate::{MonitorError, ObjectKey};

/// The default of [`MonitorOptions::watch_renewals_per_second`]: at 30,000 keys and
/// fewer the watches renew every 5 to 10 minutes, as client-go's; at 100,000, every 17
/// to 33 minutes.
pub const DEFAULT_WATCH_RENEWALS_PER_SECOND: u32 = 100;

/// How a key's watch obtains the object's initial state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum InitialList {
    /// One watch request with `sendInitialEvents=true` (Kubernetes streaming lists):
    /// the first sync costs one request. When the server refuses it (400/422, e.g. a
    /// cluster without the `WatchList` feature), the monitor falls back to
    /// [`InitialList::ListThenWatch`] for this and every later key.
    #[default]
    Streaming,
    /// A LIST, then a WATCH from the list's resourceVersion: two requests.
    ListThenWatch,
}

/// Receives notifications for metrics. Every method has an empty default.
///
/// Methods are called from watch tasks and must return quickly.
pub trait MonitorObserver: Send + Sync + 'static {
    /// A key's first sync finished, successfully or not, `elapsed` after it started
    /// (waits for the [`MonitorOptions::limiter`]'s permits included).
    fn first_sync(&self, key: &ObjectKey, elapsed: Duration, outcome: Result<(), &MonitorError>) {
        let _ = (key, elapsed, outcome);
    }

    /// A watch request failed; the watch retries with backoff (or, during the first
    /// sync, the sync may fail with this error).
    fn watch_error(&self, key: &ObjectKey, error: &MonitorError) {
        let _ = (key, error);
    }
}

/// Options for an [`ObjectMonitor`](crate::ObjectMonitor).
#[derive(Clone)]
pub struct MonitorOptions {
    /// How long a first sync may take before every caller waiting for it fails with
    /// [`MonitorError::SyncTimeout`]. Counted from the start of the sync.
    pub sync_timeout: Duration,
    /// How the initial state is obtained.
    pub initial_list: InitialList,
    /// At most this many first syncs run at once (others wait for a slot); `None`
    /// means no bound. The upper bound of the monitor's own adaptive limiter (ignored
    /// when [`limiter`](Self::limiter) is given: that one's bound applies).
    pub max_concurrent_syncs: Option<usize>,
    /// The adaptive limiter that paces first syncs: each first-sync request takes a
    /// permit, a 429 or 5xx shrinks the window and re-queues the request in its place
    /// (after `Retry-After`), a completed first sync lets it grow. Give one to share its
    /// window with other bursts of requests (access reviews); `None`: the monitor makes
    /// its own, bounded by [`max_concurrent_syncs`](Self::max_concurrent_syncs), that
    /// re-queues refused work within [`backoff_min`](Self::backoff_min) and
    /// [`backoff_max`](Self::backoff_max) (a given limiter uses its own policy).
    pub limiter: Option<AdaptiveLimiter>,
    /// How many times a first sync tries before a transient error (5xx, connection
    /// failure) fails it. Permanent errors (401, 403, other 4xx) fail it at once; 429s
    /// are the server pacing the burst and never fail it (the
    /// [`sync_timeout`](Self::sync_timeout) still does).
    pub first_sync_attempts: u32,
    /// The first delay before retrying a failed watch request; later ones double up to
    /// [`backoff_max`](Self::backoff_max) (the project's policy,
    /// [`kube_common::backoff`], with these bounds). A server's `Retry-After` is
    /// honoured on top: no retry comes sooner.
    pub backoff_min: Duration,
    /// Largest delay between retries of a failed watch request.
    pub backoff_max: Duration,
    /// The shortest server-side timeout of a watch request (`timeoutSeconds`, drawn at
    /// random between this and twice this, so that watches opened together are renewed
    /// spread out); the watch is then resumed from its last resourceVersion. `None`:
    /// client-go's reflector's 300 s, longer once the monitor watches more keys than
    /// [`watch_renewals_per_second`](Self::watch_renewals_per_second) renew in 300 s
    /// (up to kube-apiserver's own 1,800 s).
    pub watch_timeout: Option<u32>,
    /// With the default [`watch_timeout`](Self::watch_timeout): the most watch renewals
    /// a second the monitor's keys make (on average two thirds of that). The minimum
    /// timeout follows the keys watched when each request is sent, so watches opened
    /// while the keys were still growing (a start-up) renew the first time at up to
    /// 1.7 times this. A renewal is one request to the API server and about a third of
    /// a millisecond of this process's CPU, for each watched key every 5 to 10 minutes
    /// at client-go's timeouts: at 100,000 keys, 200 to 333 a second whatever changes.
    pub watch_renewals_per_second: u32,
    /// Metrics hook.
    pub observer: Option<Arc<dyn MonitorObserver>>,
    /// The API server's prober ([`kube_common::reconnect`]): a watch whose request
    /// failed without an answer resumes as soon as the server answers again after an
    /// outage (its backoff started over, the resumption paced by the
    /// [`limiter`](Self::limiter)), instead of waiting out the backoff the outage grew.
    /// `None`: only the backoff.
    pub reconnect: Option<Reconnect>,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        Self {
            sync_timeout: Duration::from_secs(120),
            initial_list: InitialList::default(),
            max_concurrent_syncs: None,
            limiter: None,
            first_sync_attempts: 3,
            backoff_min: BackoffPolicy::default().initial,
            backoff_max: Duration::from_secs(30),
            watch_timeout: None,
            watch_renewals_per_second: DEFAULT_WATCH_RENEWALS_PER_SECOND,
            observer: None,
            reconnect: None,
        }
    }
}

impl fmt::Debug for MonitorOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MonitorOptions")
            .field("sync_timeout", &self.sync_timeout)
            .field("initial_list", &self.initial_list)
            .field("max_concurrent_syncs", &self.max_concurrent_syncs)
            .field("limiter", &self.limiter)
            .field("first_sync_attempts", &self.first_sync_attempts)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("watch_timeout", &self.watch_timeout)
            .field("watch_renewals_per_second", &self.watch_renewals_per_second)
            .field("observer", &self.observer.as_ref().map(|_| ".."))
            .field("reconnect", &self.reconnect)
            .finish()
    }
}
