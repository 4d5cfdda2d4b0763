//! The machine's memory: one entry per route, the apply queue, start-up progress.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use kube_common::backoff::Backoff;

use super::inputs::{RegistrationId, SecretVersionId};
use super::outcome::Sni;
use crate::route::{Route, RouteKey};

/// Everything the machine knows about one route.
#[derive(Debug)]
pub(super) struct RouteEntry {
    /// The latest copy from the route watch; `None` once the route is deleted (its
    /// teardown then waits in the queue, behind the routes before it).
    pub latest: Option<Arc<Route>>,
    /// Where the route stands.
    pub state: RouteState,
    /// What the consumer was last told, so that it is not told the same twice. Boxed:
    /// the map's table keeps room for an entry in each of its (up to twice as many as
    /// routes) slots, and a told summary is larger than the rest of the entry.
    pub told: Option<Box<Told>>,
    /// Transient failures back off along this sequence; it lives across states, and
    /// time (not success) starts it over. Boxed: only routes that failed have one.
    pub backoff: Option<Box<Backoff>>,
    /// When the route is applied again, if a retry is scheduled.
    pub retry_at: Option<Instant>,
}

impl RouteEntry {
    pub fn new(route: Arc<Route>) -> Self {
        Self {
            latest: Some(route),
            state: RouteState::Pending,
            told: None,
            backoff: None,
            retry_at: None,
        }
    }

    /// The registration the route holds, if any.
    pub fn registration(&self) -> Option<RegistrationId> {
        match &self.state {
            RouteState::Applied {
                stand: Stand::Registered { registration, .. },
                ..
            } => Some(*registration),
            _ => None,
        }
    }

    /// The secret the route holds a registration on, if any.
    pub fn registered_secret(&self) -> Option<&str> {
        match &self.state {
            RouteState::Applied {
                stand: Stand::Registered { secret, .. },
                ..
            } => Some(secret),
            _ => None,
        }
    }

    /// The copy of the route last applied.
    pub fn applied(&self) -> Option<&Arc<Route>> {
        match &self.state {
            RouteState::Pending => None,
            RouteState::Applied { route, .. } => Some(route),
        }
    }
}

/// Where a route stands.
#[derive(Debug)]
pub(super) enum RouteState {
    /// Seen on the route watch, never applied.
    Pending,
    /// Applied, as `route`.
    Applied {
        /// The copy applied. A later copy with the same uid and spec changed nothing
        /// the router cares about (e.g. the router's own status write).
        route: Arc<Route>,
        /// What the apply led to.
        stand: Stand,
    },
}

/// What an applied route holds and waits for.
#[derive(Debug)]
pub(super) enum Stand {
    /// No external certificate the router serves: nothing held, nothing to tell.
    Unmanaged,
    /// Rejected before registering (bad reference, access denied, registration
    /// failed): nothing held.
    Refused,
    /// Its apply is at the head of the queue, registering: nothing held yet.
    Registering,
    /// Registered with the secret's watch; the outcome follows the secret.
    Registered {
        /// The secret's name, in the route's namespace.
        secret: Arc<str>,
        /// The registration.
        registration: RegistrationId,
        /// What is known of the secret.
        seen: SecretSeen,
    },
}

/// What a registered route knows of its secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum SecretSeen {
    /// Just registered: the apply reads the secret next.
    Pending,
    /// Absent from the cache when the route registered: creating it admits the route.
    Missing,
    /// This version was evaluated (`None`: a version without uid/resourceVersion).
    Evaluated(Option<SecretVersionId>),
    /// Deleted after it was seen: a re-creation is reported as such.
    Deleted,
}

/// A summary of an outcome the consumer was told, about which object (uid) of the
/// route: a route created again under the same name is told anew.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Told {
    Admitted {
        object: Option<String>,
        fingerprint: [u8; 32],
        host: Option<String>,
        sni: Sni,
        warnings: Vec<String>,
    },
    Rejected {
        object: Option<String>,
        reason: &'static str,
        message: String,
    },
}

/// Routes waiting to be applied, in order, each at most once (later events for a
/// queued route coalesce into its place).
#[derive(Debug, Default)]
pub(super) struct ApplyQueue {
    order: VecDeque<RouteKey>,
    /// Queued routes, and whether to apply them even if their spec did not change
    /// (retries, claims that changed, applies overtaken by a newer event).
    forced: HashMap<RouteKey, bool>,
}

impl ApplyQueue {
    pub fn push(&mut self, key: RouteKey, forced: bool) {
        match self.forced.get_mut(&key) {
            Some(queued) => *queued |= forced,
            None => {
                self.forced.insert(key.clone(), forced);
                self.order.push_back(key);
            }
        }
    }

    /// Queues `key` first: an apply overtaken by a newer copy of its route is redone
    /// before the routes behind it.
    pub fn push_front(&mut self, key: RouteKey, forced: bool) {
        match self.forced.get_mut(&key) {
            Some(queued) => *queued |= forced,
            None => {
                self.forced.insert(key.clone(), forced);
                self.order.push_front(key);
            }
        }
    }

    pub fn pop(&mut self) -> Option<(RouteKey, bool)> {
        let key = self.order.pop_front()?;
        let forced = self.forced.remove(&key).unwrap_or(false);
        Some((key, forced))
    }

    pub fn contains(&self, key: &RouteKey) -> bool {
        self.forced.contains_key(key)
    }
}

/// Start-up: which routes of the first listing still lack an outcome.
#[derive(Debug, Default)]
pub(super) enum Startup {
    /// The first listing has not arrived.
    #[default]
    Unlisted,
    /// Listed; these routes are not decided yet.
    Deciding {
        initial: usize,
        undecided: HashSet<RouteKey>,
    },
}

/// A small deterministic random source for retry jitter (splitmix64): the machine
/// draws no randomness from the outside world, so a seed replays a run exactly.
#[derive(Debug)]
pub(super) struct Jitter(u64);

impl Jitter {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A draw in `[0, 1]`.
    pub fn draw(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // The top 53 bits as a fraction.
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}
