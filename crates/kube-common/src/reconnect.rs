//! When the API server answers again after an outage, requests that failed without an
//! answer go again at once, instead of waiting out the backoff the outage grew.
//!
//! An API server restart (an upgrade rolling the control plane) ends every watch and
//! refuses connections for a while. Were each watch to back off on its own, after 20 s
//! of refusals its next delay would be 13 to 26 s, and a change made right after the
//! restart would reach certwatch's outputs that much later. Here one prober per client
//! asks the server's `/readyz` every [`PROBE_INTERVAL`] once requests fail without an
//! answer; while the server is down ([`Reconnect::in_outage`]) callers hold their
//! retries back (only the prober asks), and when it answers again every waiting
//! request is told at once ([`Unanswered::wait`] returns [`Waited::ServerBack`]). The
//! caller then starts its backoff over and resumes, pacing the resumptions (e.g.
//! through the process's adaptive limiter) so that thousands of watches do not come
//! back in one burst.
//!
//! Only an outage wakes anyone: a request that failed without an answer while the
//! server still answered `/readyz` (one broken connection) keeps its backoff, so a
//! proxy that keeps resetting one stream does not turn backoff into a busy loop.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicBool, Ordering};
//! use std::time::Duration;
//!
//! use kube_common::reconnect::{ProbeAnswer, Reconnect, Waited};
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() {
//! let up = Arc::new(AtomicBool::new(false));
//! let server = Arc::clone(&up);
//! let reconnect = Reconnect::with_probe(
//!     move || {
//!         let answer = if server.load(Ordering::SeqCst) {
//!             ProbeAnswer::Ready
//!         } else {
//!             ProbeAnswer::Unanswered
//!         };
//!         Box::pin(async move { answer })
//!     },
//!     Duration::from_millis(500),
//! );
//! // A watch failed to connect: it would back off for 25 s.
//! let unanswered = reconnect.unanswered();
//! tokio::spawn(async move {
//!     tokio::time::sleep(Duration::from_secs(3)).await;
//!     up.store(true, Ordering::SeqCst); // the server is back
//! });
//! let started = tokio::time::Instant::now();
//! assert_eq!(unanswered.wait(Duration::from_secs(25)).await, Waited::ServerBack);
//! assert!(started.elapsed() <= Duration::from_millis(3_500));
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// How often the prober asks while the server does not answer.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// The longest one probe may take before it counts as unanswered.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A server that answers the probe, but not "ready", for this long counts as back all
/// the same: a cluster may refuse `/readyz` to this identity (a starting kube-apiserver
/// refuses it too, for a moment, until its authorizer has loaded the RBAC rules).
pub const NOT_READY_GRACE: Duration = Duration::from_secs(10);

/// What one probe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeAnswer {
    /// The server is ready (`/readyz` answered 200).
    Ready,
    /// The server answered, but not that it is ready (a 500 while it starts, a 403).
    NotReady,
    /// No answer: refused connection, broken stream, timeout.
    Unanswered,
}

/// One probe.
type Probe = dyn Fn() -> Pin<Box<dyn Future<Output = ProbeAnswer> + Send>> + Send + Sync;

/// The prober of one API server, shared by every request through one client; cheap to
/// clone. See the [module documentation](self).
#[derive(Clone)]
pub struct Reconnect {
    inner: Arc<Inner>,
}

struct Inner {
    probe: Box<Probe>,
    interval: Duration,
    /// Where the server stands, as the prober last found it.
    state: watch::Sender<State>,
    /// Wakes the prober: some request failed without an answer (or this went away).
    wanted: Arc<Notify>,
    /// Whether the prober task has been started (it starts with the first failure).
    started: std::sync::Once,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.wanted.notify_one();
    }
}

impl std::fmt::Debug for Reconnect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reconnect")
            .field("interval", &self.inner.interval)
            .field("state", &*self.inner.state.borrow())
            .finish_non_exhaustive()
    }
}

/// Where the server stands, as the prober last found it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct State {
    /// How many outages have ended (the server answered again after at least one
    /// probe went unanswered).
    ended: u64,
    /// A probe went unanswered and none has been answered since.
    down: bool,
}

/// How an [`Unanswered::wait`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The whole delay passed.
    Elapsed,
    /// The server answers again after an outage: retry now (and start the backoff
    /// sequence over: the outage was not the request's fault).
    ServerBack,
}

/// A request that failed without an answer, waiting to be retried.
#[derive(Debug)]
pub struct Unanswered {
    state: watch::Receiver<State>,
    seen: u64,
}

impl Reconnect {
    /// The prober of the API server `client` talks to: `GET /readyz`, back when the
    /// server says it is ready (200). A starting kube-apiserver answers before it is
    /// ready: 500 from `/readyz`, and 403 to everything until its authorizer has
    /// loaded the RBAC rules (which would fail every resumed watch). Any other answer
    /// held for [`NOT_READY_GRACE`] counts as back too (a cluster that refuses
    /// `/readyz` to this identity).
    pub fn new(client: kube::Client) -> Self {
        Self::with_probe(
            move || {
                let client = client.clone();
                Box::pin(async move { readyz(&client).await })
            },
            PROBE_INTERVAL,
        )
    }

    /// A prober with its own probe and interval (tests).
    pub fn with_probe(
        probe: impl Fn() -> Pin<Box<dyn Future<Output = ProbeAnswer> + Send>> + Send + Sync + 'static,
        interval: Duration,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                probe: Box::new(probe),
                interval,
                state: watch::Sender::new(State::default()),
                wanted: Arc::new(Notify::new()),
                started: std::sync::Once::new(),
            }),
        }
    }

    /// Records that a request failed without an answer (refused connection, broken
    /// stream, timeout) and starts probing; wait on the result before retrying.
    pub fn unanswered(&self) -> Unanswered {
        let state = self.inner.state.subscribe();
        let seen = state.borrow().ended;
        self.inner.started.call_once(|| {
            tokio::spawn(prober(
                Arc::downgrade(&self.inner),
                Arc::clone(&self.inner.wanted),
            ));
        });
        self.inner.wanted.notify_one();
        Unanswered { state, seen }
    }

    /// Whether the server is in an outage: a probe went unanswered and none has been
    /// answered since. A request that failed *with* an answer meanwhile (a starting
    /// kube-apiserver refuses everything for a moment) should wait for the outage's end
    /// too ([`Reconnect::unanswered`]).
    pub fn in_outage(&self) -> bool {
        self.inner.state.borrow().down
    }

    /// How many outages have ended so far.
    pub fn outages_ended(&self) -> u64 {
        self.inner.state.borrow().ended
    }
}

impl Unanswered {
    /// Waits `delay` (the request's backoff), or less: until the server answers again
    /// after an outage that began before this request failed.
    pub async fn wait(mut self, delay: Duration) -> Waited {
        let seen = self.seen;
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        let back = async {
            // `Ok` when an outage ended since; `Err` when the prober is gone with its
            // client (then only the delay is left).
            self.state
                .wait_for(|state| state.ended > seen)
                .await
                .is_ok()
        };
        tokio::select! {
            () = &mut sleep => Waited::Elapsed,
            back = back => {
                if !back {
                    sleep.await;
                    return Waited::Elapsed;
                }
                Waited::ServerBack
            }
        }
    }
}

/// Probes whenever some request failed without an answer, until the server answers:
/// ready, or not ready for [`NOT_READY_GRACE`]. The first probe that finds it down
/// starts an outage; the answer that follows ends it. Ends with the last [`Reconnect`].
async fn prober(inner: std::sync::Weak<Inner>, wanted: Arc<Notify>) {
    loop {
        // No strong reference is held while waiting: the last clone going away
        // notifies once more, and the task ends.
        wanted.notified().await;
        let mut down = 0u32;
        let mut not_ready_since: Option<tokio::time::Instant> = None;
        loop {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let answer = tokio::time::timeout(PROBE_TIMEOUT, (strong.probe)())
                .await
                .unwrap_or(ProbeAnswer::Unanswered);
            let back = match answer {
                ProbeAnswer::Ready => true,
                ProbeAnswer::NotReady => {
                    let since = *not_ready_since.get_or_insert_with(tokio::time::Instant::now);
                    since.elapsed() >= NOT_READY_GRACE
                }
                ProbeAnswer::Unanswered => {
                    not_ready_since = None;
                    false
                }
            };
            if back {
                if down > 0 {
                    strong.state.send_modify(|state| {
                        state.ended += 1;
                        state.down = false;
                    });
                    tracing::info!(
                        probes_down = down,
                        ?answer,
                        "the API server answers again; resuming every watch"
                    );
                }
                break;
            }
            if down == 0 {
                strong.state.send_modify(|state| state.down = true);
            }
            down += 1;
            let interval = strong.interval;
            drop(strong);
            tokio::time::sleep(interval).await;
        }
    }
}

async fn readyz(client: &kube::Client) -> ProbeAnswer {
    let Ok(request) = http::Request::get("/readyz").body(Vec::new()) else {
        return ProbeAnswer::Unanswered;
    };
    let request = request.map(kube::client::Body::from);
    match client.send(request).await {
        Ok(response) if response.status() == http::StatusCode::OK => ProbeAnswer::Ready,
        Ok(_not_ready) => ProbeAnswer::NotReady,
        Err(_unanswered) => ProbeAnswer::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    use super::*;

    fn server(up: bool) -> (Arc<AtomicBool>, Arc<AtomicU32>, Reconnect) {
        let state = Arc::new(AtomicBool::new(up));
        let probes = Arc::new(AtomicU32::new(0));
        let (s, p) = (Arc::clone(&state), Arc::clone(&probes));
        let reconnect = Reconnect::with_probe(
            move || {
                p.fetch_add(1, Ordering::SeqCst);
                let answer = if s.load(Ordering::SeqCst) {
                    ProbeAnswer::Ready
                } else {
                    ProbeAnswer::Unanswered
                };
                Box::pin(async move { answer })
            },
            Duration::from_millis(500),
        );
        (state, probes, reconnect)
    }

    #[tokio::test(start_paused = true)]
    async fn every_waiter_resumes_when_the_server_is_back() {
        let (up, probes, reconnect) = server(false);
        let waiters: Vec<_> = (0..3)
            .map(|_| tokio::spawn(reconnect.unanswered().wait(Duration::from_secs(30))))
            .collect();
        tokio::time::sleep(Duration::from_secs(10)).await;
        up.store(true, Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), Waited::ServerBack);
        }
        assert!(started.elapsed() <= Duration::from_millis(500));
        // One prober for all of them: one probe per interval, not one per waiter.
        let count = probes.load(Ordering::SeqCst);
        assert!((20..=23).contains(&count), "{count} probes");
        assert_eq!(reconnect.outages_ended(), 1);
    }

    /// A server that answers, but never "ready" (a cluster refusing `/readyz` to this
    /// identity), ends the outage once it has answered so for the grace period.
    #[tokio::test(start_paused = true)]
    async fn answers_without_ready_end_the_outage_after_the_grace() {
        let answers = Arc::new(AtomicU32::new(0));
        let counted = Arc::clone(&answers);
        let reconnect = Reconnect::with_probe(
            move || {
                // Down for the first two probes, then 403s for ever.
                let answer = if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                    ProbeAnswer::Unanswered
                } else {
                    ProbeAnswer::NotReady
                };
                Box::pin(async move { answer })
            },
            Duration::from_millis(500),
        );
        let waiter = tokio::spawn(reconnect.unanswered().wait(Duration::from_secs(60)));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(reconnect.in_outage());
        let started = tokio::time::Instant::now();
        assert_eq!(waiter.await.unwrap(), Waited::ServerBack);
        assert!(!reconnect.in_outage());
        // Not ready since the third probe (1 s in): back at 11 s, 6 s after `started`.
        assert!(
            started.elapsed() <= Duration::from_secs(7),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_while_the_server_answers_keeps_its_backoff() {
        let (_up, probes, reconnect) = server(true);
        let waited = reconnect.unanswered().wait(Duration::from_secs(2)).await;
        assert_eq!(waited, Waited::Elapsed);
        assert_eq!(probes.load(Ordering::SeqCst), 1);
        assert_eq!(reconnect.outages_ended(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn no_probe_without_a_failure_and_none_after_the_server_answered() {
        let (up, probes, reconnect) = server(false);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(probes.load(Ordering::SeqCst), 0);
        let waiter = tokio::spawn(reconnect.unanswered().wait(Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_secs(2)).await;
        up.store(true, Ordering::SeqCst);
        assert_eq!(waiter.await.unwrap(), Waited::ServerBack);
        let after = probes.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(probes.load(Ordering::SeqCst), after, "probing went on");
    }
}
