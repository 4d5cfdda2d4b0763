//! Adaptive concurrency for bursts of requests (first syncs, access reviews): as many
//! at once as the API server takes, found by AIMD, the way TCP finds a path's capacity.
//!
//! - The window **starts at the upper bound** (`--max-concurrent-syncs`, or unbounded):
//!   on a healthy server a burst costs the same round trips as without a limiter.
//! - A request the server refuses for load (429, or a 5xx: see [`is_overload_status`])
//!   **shrinks the window multiplicatively**, once per round trip (only a request
//!   started after the last decrease shrinks it again), to half of what was in flight,
//!   and then to no more than the server holds at once: what else was in flight at the
//!   round's first refusal, and at each further refusal of the round what is still in
//!   flight after it (the server was full then). Not the successes of the whole round:
//!   a burst that takes longer to send than a round trip succeeds with more than the
//!   server holds at once, since seats are freed and reused while it is being sent.
//!   A refusal while nothing else of ours is in flight leaves the window as it is: the
//!   server is full of others' work, which says nothing about how much of ours it holds
//!   (and one lone refused request would otherwise hold the window at 1).
//! - A refusal's **`Retry-After` delays that request only**: Priority and Fairness
//!   answers each request on its own, and the shrunk window already keeps the rest
//!   within what the server holds; pausing every start would idle seats the server
//!   has free.
//! - Each success of the current round **grows the window additively** (one permit per
//!   window's worth of successes), freely up to just below the level the server last
//!   refused, past it only after [`AdaptivePolicy::probe_after`]: the server's capacity is
//!   probed rarely instead of once per round trip, since each failed probe costs a
//!   request a `Retry-After` delay. The window never drops below 1.
//! - Permits are granted in **FIFO order** of [`AdaptiveLimiter::turn`]. Refused work
//!   keeps its place ([`Permit::refused`] gives its [`Turn`] back) and may start again
//!   after the server's `Retry-After` (or, without one, the [`backoff`](crate::backoff)
//!   policy's delay), lengthened by a random tenth so that refused work does not come
//!   back in lock-step.
//!
//! [`AdaptiveLimiter::snapshot`] gives the window and counters for metrics, logs and
//! progress displays. The limiter is cheap to clone; clones share one window.
//! [`AdaptiveLimiter::send`] runs the loop below for one kube request, telling each
//! attempt whether it is a retry ([`Attempt::mark`] puts that on the HTTP request, so
//! that the transport counts retries apart from first attempts).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//!
//! use kube_common::adaptive::{AdaptiveLimiter, is_overload_status};
//!
//! /// One request: `Ok`, or the status and `Retry-After` of a refusal.
//! async fn fetch(attempt: u32) -> Result<&'static str, (u16, Option<Duration>)> {
//!     if attempt == 0 { Err((429, Some(Duration::from_millis(5)))) } else { Ok("synced") }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limiter = AdaptiveLimiter::new(Some(100)); // --max-concurrent-syncs 100
//! let mut turn = limiter.turn();
//! let mut attempt = 0;
//! let body = loop {
//!     let permit = turn.acquire().await;
//!     match fetch(attempt).await {
//!         Ok(body) => {
//!             permit.succeeded();
//!             break body;
//!         }
//!         Err((status, retry_after)) if is_overload_status(status) => {
//!             turn = permit.refused(retry_after); // same place in line, later
//!             attempt += 1;
//!         }
//!         Err(_) => return, // not about load: dropping the permit frees the slot
//!     }
//! };
//! assert_eq!(body, "synced");
//! let snapshot = limiter.snapshot();
//! // The server refused the only request in flight, which says nothing about how many
//! // of ours it holds at once: the window is unchanged (the retry waited 5 ms).
//! assert_eq!((snapshot.refused, snapshot.succeeded, snapshot.window), (1, 1, Some(100)));
//! # }
//! ```

mod core;
#[cfg(test)]
mod model;
mod sequence;
mod state;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use sequence::{retry_after, sequential_client};

use crate::backoff::BackoffPolicy;

/// Which attempt at one request [`AdaptiveLimiter::send`] is making.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The first.
    First,
    /// Another after the server refused the previous one for load.
    Retry,
}

impl Attempt {
    /// `request`, marked with [`Retry`](crate::backoff::Retry) when this attempt is a
    /// retry: kube-h2's request accounting (and so `/metrics`) counts it as one.
    pub fn mark<B>(self, mut request: http::Request<B>) -> http::Request<B> {
        if self == Self::Retry {
            request.extensions_mut().insert(crate::backoff::Retry);
        }
        request
    }
}

/// Whether a response status means the server refused for load: 429, or any 5xx.
pub fn is_overload_status(status: u16) -> bool {
    status == 429 || (500..=599).contains(&status)
}

/// How the window moves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptivePolicy {
    /// On a refusal the window becomes this fraction of what was in flight.
    pub decrease_factor: f64,
    /// How long after a refusal the window may grow past the level that was refused.
    pub probe_after: Duration,
    /// Delays for work refused without a `Retry-After`.
    pub backoff: BackoffPolicy,
}

impl Default for AdaptivePolicy {
    /// Halve on refusal (as TCP does), probe past a refused level every 5 s, and the
    /// [`BackoffPolicy::default`] retry delays.
    fn default() -> Self {
        Self {
            decrease_factor: 0.5,
            probe_after: Duration::from_secs(5),
            backoff: BackoffPolicy::default(),
        }
    }
}

/// The window and counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimiterSnapshot {
    /// Permits that may be out at once; `None` while unbounded (no upper bound and
    /// nothing refused yet).
    pub window: Option<usize>,
    /// The upper bound the limiter was made with.
    pub upper_bound: Option<usize>,
    /// Permits out now.
    pub in_flight: usize,
    /// Acquisitions waiting for a permit (re-queued work included).
    pub waiting: usize,
    /// How long until the last refused request still waiting out its `Retry-After` (or
    /// backoff delay) may be sent again.
    pub paused_for: Option<Duration>,
    /// Work is being held back by the server's load: refused work waits out its delay, or work waits
    /// while the window is below the upper bound.
    pub throttled: bool,
    /// Permits granted so far.
    pub started: u64,
    /// Permits that came back [`Permit::succeeded`].
    pub succeeded: u64,
    /// Permits that came back [`Permit::refused`].
    pub refused: u64,
    /// Times the window was shrunk.
    pub decreases: u64,
}

/// An AIMD limiter (see the [module docs](self)).
#[derive(Clone)]
pub struct AdaptiveLimiter {
    inner: core::Limiter<core::StdLock>,
}

impl std::fmt::Debug for AdaptiveLimiter {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("AdaptiveLimiter")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl AdaptiveLimiter {
    /// A limiter whose window starts at, and never exceeds, `upper_bound` (`None`:
    /// unbounded until the server refuses something), with the default policy.
    pub fn new(upper_bound: Option<usize>) -> Self {
        Self::with_policy(upper_bound, AdaptivePolicy::default())
    }

    /// A limiter with another policy.
    pub fn with_policy(upper_bound: Option<usize>, policy: AdaptivePolicy) -> Self {
        Self {
            inner: core::Limiter::new(upper_bound, policy),
        }
    }

    /// Takes a place in line for one piece of work. Places are served in the order
    /// they were taken, whenever they are [acquired](Turn::acquire).
    pub fn turn(&self) -> Turn {
        Turn {
            inner: self.inner.turn(),
        }
    }

    /// Takes a place in line and waits for a permit.
    pub async fn acquire(&self) -> Permit {
        self.turn().acquire().await
    }

    /// The window and counters now.
    pub fn snapshot(&self) -> LimiterSnapshot {
        self.inner.snapshot()
    }

    /// Sends one Kubernetes API request under the limiter: waits for a permit, and
    /// while the server refuses for load ([`is_overload_status`]) re-queues the request
    /// in its place (after the `Retry-After` of the refusal's Status, or the backoff
    /// delay), at most `max_refusals` times; the refusal after that is returned. Any
    /// other error frees the slot and is returned at once. `send` makes one attempt,
    /// told whether it is the first or a retry (to [mark](Attempt::mark) its request).
    pub async fn send<T, F, Fut>(&self, max_refusals: u32, mut send: F) -> Result<T, kube::Error>
    where
        F: FnMut(Attempt) -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut turn = self.turn();
        let mut refusals = 0;
        loop {
            let permit = turn.acquire().await;
            let attempt = if refusals == 0 {
                Attempt::First
            } else {
                Attempt::Retry
            };
            match send(attempt).await {
                Ok(answer) => {
                    permit.succeeded();
                    return Ok(answer);
                }
                Err(kube::Error::Api(status)) if is_overload_status(status.code) => {
                    let retry_after = status
                        .details
                        .as_ref()
                        .map(|details| details.retry_after_seconds)
                        .filter(|seconds| *seconds > 0)
                        .map(|seconds| Duration::from_secs(seconds.into()));
                    turn = permit.refused(retry_after);
                    if refusals == max_refusals {
                        return Err(kube::Error::Api(status));
                    }
                    refusals += 1;
                }
                Err(other) => return Err(other),
            }
        }
    }
}

/// A place in line for one piece of work (see [`AdaptiveLimiter::turn`]).
pub struct Turn {
    inner: core::Turn<core::StdLock>,
}

impl std::fmt::Debug for Turn {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Turn")
            .field("retry_at", &self.retry_at())
            .finish()
    }
}

impl Turn {
    /// When refused work may start again (`None` for work never refused).
    pub fn retry_at(&self) -> Option<tokio::time::Instant> {
        self.inner.retry_at()
    }

    /// Waits for a permit. Cancel-safe: dropping the future gives the place back (and
    /// a permit granted but not yet collected).
    pub async fn acquire(self) -> Permit {
        Permit {
            inner: self.inner.acquire().await,
        }
    }
}

/// The right to send one request. Report how it ended with [`succeeded`](Self::succeeded)
/// or [`refused`](Self::refused); dropping it frees the slot and teaches the window
/// nothing (for failures that are not about load, or a cancelled request).
pub struct Permit {
    inner: core::Permit<core::StdLock>,
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Permit").finish_non_exhaustive()
    }
}

impl Permit {
    /// The server did the work: the window may grow.
    pub fn succeeded(self) {
        self.inner.succeeded();
    }

    /// The server refused for load (see [`is_overload_status`]), with the response's
    /// `Retry-After` if it had one. Shrinks the window and gives back the work's place
    /// in line, due again after the delay plus jitter (other work is not delayed).
    pub fn refused(self, retry_after: Option<Duration>) -> Turn {
        Turn {
            inner: self.inner.refused(retry_after, rand::random::<f64>()),
        }
    }
}
