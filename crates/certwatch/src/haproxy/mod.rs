//! Keeping a running HAProxy's certificates equal to the crt-list, through its runtime
//! API, without a reload.
//!
//! The cert directory's entries are published to a [`HaproxySync`] after every change
//! (from the moment start-up is complete, so that a half-built set never removes
//! anything). Its task brings HAProxy there:
//!
//! - a certificate HAProxy does not have: `new ssl cert`, `set ssl cert` (chain and key
//!   as payload), `commit ssl cert`, then `add ssl crt-list` with the route's host as
//!   SNI filter;
//! - a changed certificate: `set ssl cert` + `commit ssl cert` (every SNI using it
//!   switches at once);
//! - a changed host: `del ssl crt-list` + `add ssl crt-list`;
//! - a route no longer served: `del ssl crt-list`, then `del ssl cert`.
//!
//! Only certificates under the cert directory's `links/` are touched; anything else
//! in HAProxy (a default certificate, other lists) is left alone.
//!
//! What HAProxy holds is learnt when the task first reaches it, and again whenever its
//! process changes (restart or reload, seen through `show info`): `show ssl cert`,
//! each certificate's SHA-1 fingerprint, and `show ssl crt-list -n`. Between those, the
//! task trusts its own successful commands. Any failure forgets what it knew and
//! retries with backoff, so the next pass starts from HAProxy's real state.
//!
//! Runtime additions are appended to HAProxy's copy of the list, so after changes its
//! order can differ from the file's (oldest route first) until HAProxy next loads the
//! file; this matters only for two routes claiming one host.

pub mod client;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kube_common::backoff::{Backoff, BackoffPolicy};
use route_secrets::tls::ValidatedTls;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use self::client::{CrtListLine, HaproxyError, Instance, RuntimeApi};
use crate::cert_dir::CrtEntry;
use crate::files::first_certificate_der;
use crate::metrics::Metrics;

/// Settings of the HAProxy synchronisation.
#[derive(Clone, Debug)]
pub struct HaproxyOptions {
    /// Path of HAProxy's stats socket (`stats socket ... level admin`).
    pub socket: PathBuf,
    /// Deadline of each runtime API command.
    pub command_timeout: Duration,
    /// Delays between retries after a failure (client-go's backoff: 0.8 s doubling
    /// to 30 s).
    pub retry: BackoffPolicy,
    /// How often HAProxy's process identity is checked when nothing changes (to
    /// notice a restart that loaded other files).
    pub check_interval: Duration,
}

impl HaproxyOptions {
    /// Defaults for the socket at `socket`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            command_timeout: Duration::from_secs(10),
            retry: BackoffPolicy::default(),
            check_interval: Duration::from_secs(30),
        }
    }
}

type Snapshot = Option<Arc<Vec<CrtEntry>>>;

/// Handle of the synchronisation task.
#[derive(Debug)]
pub struct HaproxySync {
    snapshots: watch::Sender<Snapshot>,
    /// Counts requests to read HAProxy's state afresh ([`HaproxySync::resync`]).
    resyncs: watch::Sender<u64>,
    task: JoinHandle<()>,
}

impl HaproxySync {
    /// Starts the task. `crt_list` is the list's path as HAProxy's configuration names
    /// it; certificates whose names start with `managed_prefix` are certwatch's.
    pub fn spawn(
        options: HaproxyOptions,
        crt_list: String,
        managed_prefix: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        let (snapshots, receiver) = watch::channel(None);
        let (resyncs, resync_requests) = watch::channel(0);
        let worker = Worker {
            api: RuntimeApi::new(options.socket.clone(), options.command_timeout),
            options,
            crt_list,
            managed_prefix,
            metrics,
        };
        let task = tokio::spawn(worker.run(receiver, resync_requests));
        Self {
            snapshots,
            resyncs,
            task,
        }
    }

    /// Forget what HAProxy is believed to hold, read it again and bring it to the
    /// last published entries.
    pub fn resync(&self) {
        self.resyncs.send_modify(|count| *count += 1);
    }

    /// The crt-list's entries changed: bring HAProxy there.
    pub fn publish(&self, entries: Arc<Vec<CrtEntry>>) {
        self.snapshots.send_replace(Some(entries));
    }

    /// Finishes the pass in progress (with the last entries published) and stops.
    pub async fn close(self) {
        let Self {
            snapshots, task, ..
        } = self;
        drop(snapshots);
        let _ = task.await;
    }
}

/// What HAProxy holds of certwatch's certificates, as last learnt or done.
struct Known {
    instance: Instance,
    /// Certificate name → SHA-1 of its server certificate (`None`: empty store).
    certificates: HashMap<String, Option<[u8; 20]>>,
    /// Certificate name → its crt-list lines.
    lines: HashMap<String, Vec<CrtListLine>>,
}

#[derive(Debug, Default)]
struct PassReport {
    added: usize,
    updated: usize,
    relisted: usize,
    removed: usize,
}

struct Worker {
    api: RuntimeApi,
    options: HaproxyOptions,
    crt_list: String,
    managed_prefix: String,
    metrics: Arc<Metrics>,
}

impl Worker {
    async fn run(
        self,
        mut snapshots: watch::Receiver<Snapshot>,
        mut resyncs: watch::Receiver<u64>,
    ) {
        let mut known: Option<Known> = None;
        let mut resync_open = true;
        let mut backoff = Backoff::new(self.options.retry);
        let mut failures: u32 = 0;
        let mut retry_at: Option<Instant> = None;
        let mut next_check = Instant::now() + self.options.check_interval;
        loop {
            tokio::select! {
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                () = sleep_until(retry_at), if retry_at.is_some() => {}
                () = tokio::time::sleep_until(next_check) => {}
                changed = resyncs.changed(), if resync_open => {
                    resync_open = changed.is_ok();
                    if resync_open {
                        info!(socket = %self.api.socket().display(), "re-reading HAProxy's certificates");
                        known = None;
                    }
                }
            }
            next_check = Instant::now() + self.options.check_interval;
            let Some(desired) = snapshots.borrow_and_update().clone() else {
                continue;
            };
            match self.pass(&mut known, &desired).await {
                Ok(report) => {
                    if failures > 0 {
                        info!(socket = %self.api.socket().display(), "HAProxy reachable again");
                    }
                    failures = 0;
                    retry_at = None;
                    self.metrics.haproxy.synced(true);
                    if report.added + report.updated + report.relisted + report.removed > 0 {
                        info!(
                            added = report.added,
                            updated = report.updated,
                            relisted = report.relisted,
                            removed = report.removed,
                            "HAProxy certificates updated through the runtime API"
                        );
                    }
                }
                Err(error) => {
                    known = None;
                    failures = failures.saturating_add(1);
                    self.metrics.haproxy.synced(false);
                    let delay = backoff.next_delay();
                    if failures == 1 {
                        warn!(%error, retry_in = ?delay, "cannot synchronise HAProxy; retrying");
                    } else {
                        debug!(%error, retry_in = ?delay, "cannot synchronise HAProxy; retrying");
                    }
                    retry_at = Some(Instant::now() + delay);
                }
            }
        }
    }

    fn managed(&self, name: &str) -> bool {
        name.starts_with(&self.managed_prefix)
    }

    /// Records a command's result in the metrics.
    fn count<T>(
        &self,
        command: &'static str,
        result: Result<T, HaproxyError>,
    ) -> Result<T, HaproxyError> {
        self.metrics.haproxy.command(command, result.is_ok());
        result
    }

    async fn pass(
        &self,
        known: &mut Option<Known>,
        desired: &[CrtEntry],
    ) -> Result<PassReport, HaproxyError> {
        let instance = self.count("show info", self.api.instance().await)?;
        let state = match known.take() {
            Some(state) if state.instance.same_as(&instance) => state,
            Some(_) => {
                info!(
                    pid = instance.pid,
                    "HAProxy restarted or reloaded; re-reading its certificates"
                );
                self.discover(instance).await?
            }
            None => self.discover(instance).await?,
        };
        let state = known.insert(state);
        let mut report = PassReport::default();

        let mut wanted = BTreeSet::new();
        for entry in desired {
            wanted.insert(entry.name.as_str());
            let sha1 = leaf_sha1(&entry.tls);
            match state.certificates.get(&entry.name) {
                None => {
                    self.count("new ssl cert", self.api.new_certificate(&entry.name).await)?;
                    state.certificates.insert(entry.name.clone(), None);
                    self.upload(&entry.name, &entry.tls).await?;
                    state.certificates.insert(entry.name.clone(), sha1);
                    report.added += 1;
                }
                Some(current) if sha1.is_none() || *current != sha1 => {
                    self.upload(&entry.name, &entry.tls).await?;
                    state.certificates.insert(entry.name.clone(), sha1);
                    report.updated += 1;
                }
                Some(_) => {}
            }
            let rest = entry.sni.clone();
            let lines = state.lines.get(&entry.name).map_or(&[][..], Vec::as_slice);
            if lines.len() == 1 && lines[0].rest == rest {
                continue;
            }
            if !lines.is_empty() {
                self.delete_lines(&entry.name, lines.len()).await?;
                state.lines.remove(&entry.name);
                report.relisted += 1;
            }
            // Every entry has an SNI filter: a line without one would capture every
            // other route's hosts.
            let line = format!("{} {rest}", entry.name);
            self.count(
                "add ssl crt-list",
                self.api.add_crt_list_line(&self.crt_list, &line).await,
            )?;
            state.lines.insert(
                entry.name.clone(),
                vec![CrtListLine {
                    name: entry.name.clone(),
                    line: 0,
                    rest,
                }],
            );
        }

        let unwanted: BTreeSet<String> = state
            .certificates
            .keys()
            .chain(state.lines.keys())
            .filter(|name| self.managed(name) && !wanted.contains(name.as_str()))
            .cloned()
            .collect();
        for name in unwanted {
            let lines = state.lines.get(&name).map_or(0, Vec::len);
            if lines > 0 {
                self.delete_lines(&name, lines).await?;
                state.lines.remove(&name);
            }
            if state.certificates.contains_key(&name) {
                self.count("del ssl cert", self.api.delete_certificate(&name).await)?;
                state.certificates.remove(&name);
            }
            report.removed += 1;
        }
        Ok(report)
    }

    /// `set ssl cert` + `commit ssl cert`; an open transaction is aborted on failure.
    async fn upload(&self, name: &str, tls: &ValidatedTls) -> Result<(), HaproxyError> {
        let bundle = tls.pem_bundle();
        self.count(
            "set ssl cert",
            self.api.set_certificate(name, &bundle).await,
        )?;
        let committed = self.count("commit ssl cert", self.api.commit_certificate(name).await);
        if committed.is_err() {
            // Best effort; the next pass starts from HAProxy's state anyway.
            let _ = self.api.abort_certificate(name).await;
        }
        committed
    }

    /// Deletes every crt-list line of `name` (`count` known to exist).
    async fn delete_lines(&self, name: &str, count: usize) -> Result<(), HaproxyError> {
        if count == 1 {
            return self.count(
                "del ssl crt-list",
                self.api
                    .delete_crt_list_entry(&self.crt_list, name, None)
                    .await,
            );
        }
        // Duplicates must be deleted one line at a time, by number.
        let mut lines: Vec<u32> = self
            .count("show ssl crt-list", self.api.crt_list(&self.crt_list).await)?
            .into_iter()
            .filter(|line| line.name == name)
            .map(|line| line.line)
            .collect();
        lines.sort_unstable_by(|a, b| b.cmp(a));
        for line in lines {
            self.count(
                "del ssl crt-list",
                self.api
                    .delete_crt_list_entry(&self.crt_list, name, Some(line))
                    .await,
            )?;
        }
        Ok(())
    }

    /// Reads what HAProxy holds of certwatch's certificates.
    async fn discover(&self, instance: Instance) -> Result<Known, HaproxyError> {
        let (committed, transactions) =
            self.count("show ssl cert", self.api.certificates().await)?;
        for name in transactions.iter().filter(|name| self.managed(name)) {
            // Left by an interrupted update; it would block the next `set ssl cert`.
            self.count("abort ssl cert", self.api.abort_certificate(name).await)?;
        }
        let mut certificates = HashMap::new();
        for name in committed.into_iter().filter(|name| self.managed(name)) {
            let sha1 = self.count("show ssl cert", self.api.certificate_sha1(&name).await)?;
            certificates.insert(name, sha1);
        }
        let mut lines: HashMap<String, Vec<CrtListLine>> = HashMap::new();
        let listed = self
            .count("show ssl crt-list", self.api.crt_list(&self.crt_list).await)
            .map_err(|error| match error {
                HaproxyError::Refused { command, message } => HaproxyError::Refused {
                    command,
                    message: format!(
                        "{message} (HAProxy's configuration must load this crt-list by this exact path)"
                    ),
                },
                other => other,
            })?;
        for line in listed.into_iter().filter(|line| self.managed(&line.name)) {
            lines.entry(line.name.clone()).or_default().push(line);
        }
        debug!(
            pid = instance.pid,
            certificates = certificates.len(),
            lines = lines.len(),
            "read HAProxy's certificates"
        );
        Ok(Known {
            instance,
            certificates,
            lines,
        })
    }
}

/// SHA-1 of the server certificate's DER, as `show ssl cert` prints it.
fn leaf_sha1(tls: &ValidatedTls) -> Option<[u8; 20]> {
    let der = first_certificate_der(tls.chain_pem())?;
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &der);
    let mut out = [0; 20];
    out.copy_from_slice(digest.as_ref());
    Some(out)
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
