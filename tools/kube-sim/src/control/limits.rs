//! The server's concurrency limit, a model of API Priority and Fairness: at most
//! `max_inflight` requests in flight, then a bounded FIFO queue, then 429.
//!
//! The limiter also counts in-flight requests when no limit is set, so
//! `inflight`/`peak_inflight` in the stats always come from here.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::config::LimitsConfig;

struct LimiterState {
    config: LimitsConfig,
    inflight: usize,
    peak_inflight: usize,
    peak_queued: usize,
    next_waiter: u64,
    /// Waiting requests, oldest first. A slot is handed over by sending on the
    /// waiter's channel while holding the lock, so "not in the queue" means "granted".
    queue: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// See the module documentation.
pub(crate) struct Limiter {
    /// Guards the counters, the configuration and the wait queue.
    state: Mutex<LimiterState>,
}

/// One in-flight slot; released (or handed to the next waiter) on drop.
pub(crate) struct InflightPermit {
    limiter: Arc<Limiter>,
}

impl std::fmt::Debug for InflightPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InflightPermit")
    }
}

impl Drop for InflightPermit {
    fn drop(&mut self) {
        let mut st = self.limiter.lock();
        Limiter::release_locked(&mut st);
    }
}

/// A queued request. If it is dropped after being granted a slot, it passes the
/// slot on; if before, it leaves the queue.
struct Waiter {
    limiter: Arc<Limiter>,
    id: u64,
    rx: oneshot::Receiver<()>,
    settled: bool,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut st = self.limiter.lock();
        if let Some(pos) = st.queue.iter().position(|(id, _)| *id == self.id) {
            st.queue.remove(pos);
        } else {
            Limiter::release_locked(&mut st);
        }
    }
}

/// The 429's `Retry-After` in whole seconds.
pub(crate) struct Rejected {
    pub retry_after_secs: u64,
}

impl Limiter {
    pub(crate) fn new(config: LimitsConfig) -> Arc<Limiter> {
        Arc::new(Limiter {
            state: Mutex::new(LimiterState {
                config,
                inflight: 0,
                peak_inflight: 0,
                peak_queued: 0,
                next_waiter: 0,
                queue: VecDeque::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LimiterState> {
        kube_common::sync::lock(&self.state)
    }

    fn release_locked(st: &mut LimiterState) {
        let over_limit = st.config.max_inflight.is_some_and(|m| st.inflight > m);
        if !over_limit {
            while let Some((_, tx)) = st.queue.pop_front() {
                if tx.send(()).is_ok() {
                    return;
                }
            }
        }
        st.inflight = st.inflight.saturating_sub(1);
    }

    fn grant_waiting(st: &mut LimiterState) {
        while st.config.max_inflight.is_none_or(|m| st.inflight < m) {
            let Some((_, tx)) = st.queue.pop_front() else {
                break;
            };
            if tx.send(()).is_ok() {
                st.inflight += 1;
                st.peak_inflight = st.peak_inflight.max(st.inflight);
            }
        }
    }

    /// Waits for a slot, or rejects when the queue is full.
    pub(crate) async fn acquire(self: &Arc<Self>) -> Result<InflightPermit, Rejected> {
        let waiter = {
            let mut st = self.lock();
            let free = st.config.max_inflight.is_none_or(|m| st.inflight < m);
            if free && st.queue.is_empty() {
                st.inflight += 1;
                st.peak_inflight = st.peak_inflight.max(st.inflight);
                return Ok(InflightPermit {
                    limiter: self.clone(),
                });
            }
            if st.queue.len() >= st.config.queue_len {
                let secs = st.config.retry_after.as_secs_f64().ceil().max(1.0) as u64;
                return Err(Rejected {
                    retry_after_secs: secs,
                });
            }
            let (tx, rx) = oneshot::channel();
            let id = st.next_waiter;
            st.next_waiter += 1;
            st.queue.push_back((id, tx));
            st.peak_queued = st.peak_queued.max(st.queue.len());
            Waiter {
                limiter: self.clone(),
                id,
                rx,
                settled: false,
            }
        };
        let mut waiter = waiter;
        // The sender lives in the queue until it is used, so this only completes
        // when a slot is handed over.
        let _ = (&mut waiter.rx).await;
        waiter.settled = true;
        Ok(InflightPermit {
            limiter: self.clone(),
        })
    }

    /// Replaces the configuration; waiters are admitted at once if the new limit
    /// allows.
    pub(crate) fn set_config(&self, config: LimitsConfig) {
        let mut st = self.lock();
        st.config = config;
        Self::grant_waiting(&mut st);
    }

    pub(crate) fn config(&self) -> LimitsConfig {
        self.lock().config.clone()
    }

    /// (inflight, peak_inflight, peak_queued).
    pub(crate) fn counters(&self) -> (u64, u64, u64) {
        let st = self.lock();
        (
            st.inflight as u64,
            st.peak_inflight as u64,
            st.peak_queued as u64,
        )
    }

    /// Restarts the peaks from the current values.
    pub(crate) fn reset_peaks(&self) {
        let mut st = self.lock();
        st.peak_inflight = st.inflight;
        st.peak_queued = st.queue.len();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn queue_then_reject_then_hand_over() {
        let limiter = Limiter::new(LimitsConfig {
            max_inflight: Some(1),
            queue_len: 1,
            retry_after: Duration::from_millis(1500),
        });
        let first = limiter.acquire().await.ok().unwrap();
        let l2 = limiter.clone();
        let queued = tokio::spawn(async move { l2.acquire().await.ok().map(|_p| ()) });
        // Wait until the second request is queued.
        while limiter.lock().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        let rejected = limiter.acquire().await.err().unwrap();
        assert_eq!(rejected.retry_after_secs, 2);
        drop(first);
        assert!(queued.await.unwrap().is_some());
        assert_eq!(limiter.counters(), (0, 1, 1));
    }

    #[tokio::test]
    async fn cancelled_waiter_leaves_queue() {
        let limiter = Limiter::new(LimitsConfig {
            max_inflight: Some(1),
            queue_len: 5,
            retry_after: Duration::from_secs(1),
        });
        let first = limiter.acquire().await.ok().unwrap();
        let l2 = limiter.clone();
        let queued = tokio::spawn(async move { l2.acquire().await.ok().map(|_p| ()) });
        while limiter.lock().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        queued.abort();
        let _ = queued.await;
        assert!(limiter.lock().queue.is_empty());
        drop(first);
        assert_eq!(limiter.counters().0, 0);
    }

    #[tokio::test]
    async fn raising_the_limit_admits_waiters() {
        let limiter = Limiter::new(LimitsConfig {
            max_inflight: Some(1),
            queue_len: 5,
            retry_after: Duration::from_secs(1),
        });
        let _first = limiter.acquire().await.ok().unwrap();
        let l2 = limiter.clone();
        let queued = tokio::spawn(async move { l2.acquire().await.ok() });
        while limiter.lock().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        limiter.set_config(LimitsConfig {
            max_inflight: None,
            ..LimitsConfig::default()
        });
        let second = queued.await.unwrap();
        assert!(second.is_some());
        assert_eq!(limiter.counters().0, 2);
    }
}
