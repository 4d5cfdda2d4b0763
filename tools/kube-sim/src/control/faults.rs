//! Fault injection: closing watches, failing chosen requests, outages and history
//! compaction. [`FaultControl`] is the public handle; the admin API maps onto it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kube_common::sync::lock;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::control::stats::{RequestVerb, Stats};
use crate::error::ApiError;
use crate::storage::store::Store;

/// Fail the next `count` requests matching `verb` and `resource` (and, if set,
/// `namespace` and `name`) with HTTP status `code`. `"*"` matches any verb or resource.
///
/// `verb` is a pattern, not a [`kube_common::Verb`]: `"*"`, or the word a request is
/// logged under ([`crate::RequestRecord::verb`]), so that a rule can also fail a
/// discovery `get`. The admin API refuses words that are neither.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailRule {
    /// Verb to match (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`) or `*`.
    pub verb: String,
    /// Resource to match, with subresource (`secrets`, `routes/status`) or `*`.
    pub resource: String,
    /// HTTP status code to answer with (a matching `Status` reason is chosen).
    pub code: u16,
    /// How many matching requests to fail.
    #[serde(default = "one")]
    pub count: u64,
    /// Only requests in this namespace.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Only requests for this object name (URL name or `metadata.name` selector).
    #[serde(default)]
    pub name: Option<String>,
}

fn one() -> u64 {
    1
}

impl FailRule {
    /// A rule failing the next `count` `verb` requests on `resource` with `code`.
    pub fn new(verb: &str, resource: &str, code: u16, count: u64) -> FailRule {
        FailRule {
            verb: verb.to_string(),
            resource: resource.to_string(),
            code,
            count,
            namespace: None,
            name: None,
        }
    }

    fn matches(
        &self,
        verb: &RequestVerb,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> bool {
        (self.verb == "*" || *verb == *self.verb)
            && (self.resource == "*" || self.resource == resource)
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| Some(ns) == namespace)
            && self.name.as_deref().is_none_or(|n| Some(n) == name)
    }
}

/// How an outage looks to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutageMode {
    /// Every open connection is closed and new connections are reset at once
    /// (the admin API is unreachable too; use [`FaultControl::clear`] in-process).
    Refuse,
    /// Connections are accepted but requests get no answer and open watches deliver
    /// nothing until the outage ends; then everything proceeds.
    Hang,
}

/// The current fault settings (`GET /sim/faults`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultState {
    /// Pending fail rules.
    pub fail_rules: Vec<FailRule>,
    /// Watches close after this many events (`None`: never).
    pub close_watches_after: Option<u64>,
    /// The outage in progress, if any.
    pub outage: Option<OutageMode>,
    /// Milliseconds until the outage ends.
    pub outage_remaining_ms: Option<u64>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Outage {
    pub mode: Option<OutageMode>,
    pub until: Option<Instant>,
    pub generation: u64,
}

/// Fault state shared by the server.
pub(crate) struct Faults {
    /// Guards the pending fail rules.
    rules: Mutex<Vec<FailRule>>,
    /// Events after which a watch closes; 0 means never.
    close_after: AtomicU64,
    /// Guards the token every open watch listens on; cancelled and replaced to close
    /// all watches at once.
    watch_close: Mutex<CancellationToken>,
    /// Guards the token every open connection listens on.
    connection_close: Mutex<CancellationToken>,
    outage: watch::Sender<Outage>,
    hanging: AtomicBool,
    refusing: AtomicBool,
}

impl Faults {
    pub(crate) fn new() -> Faults {
        Faults {
            rules: Mutex::new(Vec::new()),
            close_after: AtomicU64::new(0),
            watch_close: Mutex::new(CancellationToken::new()),
            connection_close: Mutex::new(CancellationToken::new()),
            outage: watch::channel(Outage::default()).0,
            hanging: AtomicBool::new(false),
            refusing: AtomicBool::new(false),
        }
    }

    /// Consumes one matching fail rule, returning the error to answer with.
    pub(crate) fn take_failure(
        &self,
        verb: &RequestVerb,
        resource: &str,
        namespace: Option<&str>,
        name: Option<&str>,
    ) -> Option<ApiError> {
        let mut rules = lock(&self.rules);
        let pos = rules
            .iter()
            .position(|r| r.count > 0 && r.matches(verb, resource, namespace, name))?;
        let code = rules[pos].code;
        rules[pos].count -= 1;
        if rules[pos].count == 0 {
            rules.remove(pos);
        }
        Some(ApiError::for_code(
            code,
            format!("kube-sim injected fault: {verb} {resource} answered with {code}"),
        ))
    }

    pub(crate) fn close_after(&self) -> Option<u64> {
        match self.close_after.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    pub(crate) fn watch_close_token(&self) -> CancellationToken {
        lock(&self.watch_close).clone()
    }

    pub(crate) fn connection_close_token(&self) -> CancellationToken {
        lock(&self.connection_close).clone()
    }

    fn close_connections(&self) {
        let mut t = lock(&self.connection_close);
        t.cancel();
        *t = CancellationToken::new();
    }

    pub(crate) fn is_refusing(&self) -> bool {
        self.refusing.load(Ordering::Acquire)
    }

    pub(crate) fn is_hanging(&self) -> bool {
        self.hanging.load(Ordering::Acquire)
    }

    /// Waits while a `Hang` outage is in progress.
    pub(crate) async fn wait_while_hanging(&self) {
        if !self.is_hanging() {
            return;
        }
        let mut rx = self.outage.subscribe();
        loop {
            if rx.borrow_and_update().mode != Some(OutageMode::Hang) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn set_outage(&self, mode: Option<OutageMode>, until: Option<Instant>) -> u64 {
        let mut generation = 0;
        self.outage.send_modify(|o| {
            o.generation += 1;
            o.mode = mode;
            o.until = until;
            generation = o.generation;
        });
        self.hanging
            .store(mode == Some(OutageMode::Hang), Ordering::Release);
        self.refusing
            .store(mode == Some(OutageMode::Refuse), Ordering::Release);
        generation
    }

    fn end_outage_if(&self, generation: u64) {
        let current = self.outage.borrow().generation;
        if current == generation {
            self.set_outage(None, None);
        }
    }

    fn state(&self) -> FaultState {
        let o = self.outage.borrow().clone();
        FaultState {
            fail_rules: lock(&self.rules).clone(),
            close_watches_after: self.close_after(),
            outage: o.mode,
            outage_remaining_ms: o
                .until
                .filter(|_| o.mode.is_some())
                .map(|u| u.saturating_duration_since(Instant::now()).as_millis() as u64),
        }
    }
}

/// Handle for injecting faults into a running simulator.
#[derive(Clone)]
pub struct FaultControl {
    pub(crate) faults: Arc<Faults>,
    /// Counts the open watches that `close_all_watches` reports.
    pub(crate) stats: Arc<Stats>,
    /// Compacted by `compact_history`.
    pub(crate) store: Arc<Store>,
    /// Where an outage's end is scheduled (callers need not be inside the runtime).
    pub(crate) runtime: tokio::runtime::Handle,
}

impl FaultControl {
    /// Closes every open watch now (cleanly: the streams end). Returns how many were
    /// open.
    pub fn close_all_watches(&self) -> u64 {
        let open = self.stats.open_watches();
        let mut t = lock(&self.faults.watch_close);
        t.cancel();
        *t = CancellationToken::new();
        open
    }

    /// Makes every watch close after it has sent `events` events (ADDED, MODIFIED,
    /// DELETED; bookmarks do not count). `None` turns this off.
    pub fn close_watches_after(&self, events: Option<u64>) {
        self.faults
            .close_after
            .store(events.unwrap_or(0), Ordering::Relaxed);
    }

    /// Fails the next matching requests (see [`FailRule`]).
    pub fn fail_next(&self, rule: FailRule) {
        if rule.count > 0 {
            lock(&self.faults.rules).push(rule);
        }
    }

    /// Starts an outage lasting `duration` (see [`OutageMode`]).
    pub fn outage(&self, duration: Duration, mode: OutageMode) {
        let faults = &self.faults;
        let generation = faults.set_outage(Some(mode), Some(Instant::now() + duration));
        if mode == OutageMode::Refuse {
            faults.close_connections();
        }
        let faults = self.faults.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(duration).await;
            faults.end_outage_if(generation);
        });
    }

    /// Drops the whole event history: every watch or exact list from an older
    /// resourceVersion now gets 410 Expired. Returns the current resourceVersion.
    pub fn compact_history(&self) -> u64 {
        self.store.compact()
    }

    /// Removes every fault: fail rules, close-after and any outage.
    pub fn clear(&self) {
        let faults = &self.faults;
        lock(&faults.rules).clear();
        faults.close_after.store(0, Ordering::Relaxed);
        faults.set_outage(None, None);
    }

    /// The current fault settings.
    pub fn state(&self) -> FaultState {
        self.faults.state()
    }
}
