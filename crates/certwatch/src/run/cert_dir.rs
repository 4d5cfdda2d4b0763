//! What the cert directory should hold, and bringing it there.
//!
//! [`CertDir`] keeps the desired bundle of every admitted route and what is on disk
//! (by content digest). [`CertDir::flush`] writes the bundles that changed (several at
//! once, off the async threads), removes those of routes no longer served, and rewrites
//! the crt-list when its content changed.
//!
//! Until [`CertDir::mark_complete`] (every route present at start-up decided) the
//! crt-list is left as it was and no old bundle is removed: a proxy that reloads during
//! start-up keeps serving what it served before, instead of a half-built list.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt;
use jiff::Timestamp;
use route_secrets::route::RouteKey;
use route_secrets::tls::{SecretPem, ValidatedTls};
use tracing::{debug, warn};

use super::files::{self, CRT_LIST_FILE, LINKS_DIR};

/// A route to serve, with its certificate.
#[derive(Clone, Debug)]
pub struct ServedCert {
    /// The route.
    pub route: RouteKey,
    /// Its `spec.host`: the crt-list's SNI filter.
    pub host: Option<String>,
    /// When the route was created: older routes come first in the crt-list, so they
    /// win a host conflict, as in a router.
    pub created: Option<Timestamp>,
    /// The validated chain and key.
    pub tls: Arc<ValidatedTls>,
}

/// One line of the crt-list, as HAProxy sees it.
#[derive(Clone, Debug)]
pub struct CrtEntry {
    /// The route.
    pub route: RouteKey,
    /// The certificate's name in HAProxy: the absolute path of the bundle's link.
    pub name: String,
    /// The SNI filter, when the route has a usable host.
    pub sni: Option<String>,
    /// The material.
    pub tls: Arc<ValidatedTls>,
}

/// What a [`CertDir::flush`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Bundles written.
    pub written: usize,
    /// Bundles removed.
    pub removed: usize,
    /// Writes or removals that failed (retried by the next flush).
    pub failed: usize,
    /// Whether the crt-list was rewritten.
    pub crt_list_written: bool,
}

impl FlushReport {
    /// Whether anything on disk changed.
    pub fn changed(&self) -> bool {
        self.written > 0 || self.removed > 0 || self.crt_list_written
    }
}

/// What a flush will do; see [`CertDir::plan`].
#[derive(Debug)]
pub struct FlushPlan {
    jobs: Vec<Job>,
    crt_list_changes: bool,
}

impl FlushPlan {
    /// Whether carrying it out is expected to change anything on disk (if every
    /// write succeeds; with the crt-list as the entries would render now).
    pub fn changes(&self) -> bool {
        !self.jobs.is_empty() || self.crt_list_changes
    }
}

#[derive(Debug)]
enum Job {
    Write {
        route: RouteKey,
        digest: [u8; 32],
        bundle: SecretPem,
    },
    Remove {
        route: RouteKey,
    },
}

/// The cert directory's desired and actual content.
#[derive(Debug)]
pub struct CertDir {
    dir: PathBuf,
    links: PathBuf,
    desired: HashMap<RouteKey, ServedCert>,
    /// Digest of each bundle known to be on disk.
    on_disk: HashMap<RouteKey, [u8; 32]>,
    /// Routes changed since the last flush.
    dirty: BTreeSet<RouteKey>,
    /// Routes whose last write or removal failed.
    failed: BTreeSet<RouteKey>,
    /// The crt-list's content as last written (or found).
    crt_list: Option<String>,
    complete: bool,
    concurrency: usize,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// Whether `host` can be written as a crt-list SNI filter as it is.
fn usable_sni(host: &str) -> bool {
    !host.is_empty()
        && !host.starts_with('!')
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'*')
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| Err(io::Error::other(join)))
}

impl CertDir {
    /// Prepares `dir` (see [`files::prepare_dir`]) and reads what it already holds, so
    /// that unchanged bundles are not rewritten after a restart. `concurrency` bounds
    /// the writes in flight.
    pub async fn open(dir: &Path, concurrency: usize) -> io::Result<Self> {
        let dir = dir.to_owned();
        let (dir, on_disk, crt_list) = blocking(move || {
            let dir = files::prepare_dir(&dir)?;
            let mut on_disk = HashMap::new();
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let Some(route) =
                    files::parse_bundle_file_name(&entry.file_name().to_string_lossy())
                else {
                    continue;
                };
                if let Ok(content) = std::fs::read(entry.path()) {
                    on_disk.insert(route, digest(&content));
                }
            }
            let crt_list = std::fs::read_to_string(dir.join(CRT_LIST_FILE)).ok();
            Ok((dir, on_disk, crt_list))
        })
        .await?;
        Ok(Self {
            links: dir.join(LINKS_DIR),
            dir,
            desired: HashMap::new(),
            dirty: BTreeSet::new(),
            on_disk,
            failed: BTreeSet::new(),
            crt_list,
            complete: false,
            concurrency: concurrency.max(1),
        })
    }

    /// The directory (absolute).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The crt-list's path.
    pub fn crt_list_path(&self) -> PathBuf {
        self.dir.join(CRT_LIST_FILE)
    }

    /// Serve `cert` for its route (replacing earlier material).
    pub fn set(&mut self, cert: ServedCert) {
        self.dirty.insert(cert.route.clone());
        self.desired.insert(cert.route.clone(), cert);
    }

    /// Stop serving `route`.
    pub fn remove(&mut self, route: &RouteKey) {
        if self.desired.remove(route).is_some() || self.on_disk.contains_key(route) {
            self.dirty.insert(route.clone());
        }
    }

    /// Routes being served.
    pub fn served(&self) -> usize {
        self.desired.len()
    }

    /// Whether some write or removal is waiting for a retry.
    pub fn has_failures(&self) -> bool {
        !self.failed.is_empty()
    }

    /// Every route present at start-up has been decided: from now on the crt-list is
    /// written, and bundles of routes not served are removed.
    pub fn mark_complete(&mut self) {
        self.complete = true;
        let stale: Vec<RouteKey> = self
            .on_disk
            .keys()
            .filter(|route| !self.desired.contains_key(*route))
            .cloned()
            .collect();
        self.dirty.extend(stale);
    }

    /// Brings the directory to the desired state; failures are logged, counted and
    /// retried by the next flush.
    pub async fn flush(&mut self) -> FlushReport {
        let plan = self.plan();
        self.execute(plan).await
    }

    /// Decides what a flush has to do (taking the changed routes).
    pub fn plan(&mut self) -> FlushPlan {
        let mut routes = std::mem::take(&mut self.dirty);
        routes.append(&mut self.failed);
        let mut jobs = Vec::new();
        for route in routes {
            match self.desired.get(&route) {
                Some(cert) => {
                    let bundle = cert.tls.pem_bundle();
                    let digest = digest(bundle.expose_secret().as_bytes());
                    if self.on_disk.get(&route) != Some(&digest) {
                        jobs.push(Job::Write {
                            route,
                            digest,
                            bundle,
                        });
                    }
                }
                None if self.on_disk.contains_key(&route) && self.complete => {
                    jobs.push(Job::Remove { route });
                }
                None => {}
            }
        }
        let crt_list_changes =
            self.complete && self.crt_list.as_deref() != Some(self.render_crt_list().as_str());
        FlushPlan {
            jobs,
            crt_list_changes,
        }
    }

    /// Carries out `plan`.
    pub async fn execute(&mut self, plan: FlushPlan) -> FlushReport {
        let mut report = FlushReport::default();
        let jobs = plan.jobs;

        // Phase 1, in parallel: every new bundle into a temporary file.
        let mut writes = Vec::new();
        let mut removals = Vec::new();
        for job in jobs {
            match job {
                Job::Write {
                    route,
                    digest,
                    bundle,
                } => writes.push((route, digest, bundle)),
                Job::Remove { route } => removals.push(route),
            }
        }
        let started = std::time::Instant::now();
        let dir = self.dir.clone();
        let mut pending = Vec::with_capacity(writes.len());
        let mut staged = futures::stream::iter(writes)
            .map(|(route, digest, bundle)| {
                let dir = dir.clone();
                async move {
                    let staged = stage_bundle(dir, route.clone(), bundle).await;
                    (route, digest, staged)
                }
            })
            .buffer_unordered(self.concurrency);
        while let Some((route, digest, staged)) = staged.next().await {
            match staged {
                Ok(file) => pending.push((route, digest, file)),
                Err(error) => self.write_failed(&mut report, route, "write", error),
            }
        }
        drop(staged);
        let staged_after = started.elapsed();

        // Phase 2, on one thread: one flush to disk, then the renames, links and
        // removals, then the directory entries.
        if !pending.is_empty() || !removals.is_empty() {
            let (dir, links) = (self.dir.clone(), self.links.clone());
            let results = blocking(move || Ok(commit_batch(&dir, &links, pending, removals)))
                .await
                .unwrap_or_default();
            debug!(
                files = results.len(),
                staged = ?staged_after,
                committed = ?started.elapsed().saturating_sub(staged_after),
                "cert dir batch written"
            );
            for (route, digest, result) in results {
                match (result, digest) {
                    (Ok(()), Some(digest)) => {
                        self.on_disk.insert(route, digest);
                        report.written += 1;
                    }
                    (Ok(()), None) => {
                        self.on_disk.remove(&route);
                        report.removed += 1;
                    }
                    (Err(error), digest) => {
                        let action = if digest.is_some() { "write" } else { "remove" };
                        self.write_failed(&mut report, route, action, error);
                    }
                }
            }
        }

        if self.complete {
            let content = self.render_crt_list();
            if self.crt_list.as_deref() != Some(content.as_str()) {
                let dir = self.dir.clone();
                let bytes = content.clone();
                match blocking(move || {
                    files::write_atomic(&dir, CRT_LIST_FILE, bytes.as_bytes())?;
                    files::sync_dir(&dir)
                })
                .await
                {
                    Ok(()) => {
                        debug!(lines = content.lines().count(), "crt-list written");
                        self.crt_list = Some(content);
                        report.crt_list_written = true;
                    }
                    Err(error) => {
                        warn!(path = %self.crt_list_path().display(), %error, "cannot write the crt-list; will retry");
                        report.failed += 1;
                    }
                }
            }
        }
        report
    }

    fn write_failed(
        &mut self,
        report: &mut FlushReport,
        route: RouteKey,
        action: &str,
        error: WriteError,
    ) {
        report.failed += 1;
        match error {
            // Permanent: the name never changes, so no retry.
            WriteError::Name(error) => warn!(%error, "bundle not written"),
            WriteError::Io(error) => {
                warn!(route = %route, %error, "cannot {action} the bundle; will retry");
                self.failed.insert(route);
            }
        }
    }

    /// Whether the crt-list on disk is behind (its last write failed).
    pub fn crt_list_stale(&self) -> bool {
        self.complete && self.crt_list.as_deref() != Some(self.render_crt_list().as_str())
    }

    /// The crt-list's entries, oldest route first: served routes whose bundle is on
    /// disk.
    pub fn entries(&self) -> Vec<CrtEntry> {
        let mut served: Vec<&ServedCert> = self
            .desired
            .values()
            .filter(|cert| self.on_disk.contains_key(&cert.route))
            .collect();
        // Routes without a creation time (not from an API server) go last.
        served.sort_by(|a, b| {
            (a.created.is_none(), a.created, &a.route).cmp(&(
                b.created.is_none(),
                b.created,
                &b.route,
            ))
        });
        served
            .into_iter()
            .filter_map(|cert| {
                let link = files::link_file_name(&cert.route).ok()?;
                Some(CrtEntry {
                    route: cert.route.clone(),
                    name: self.links.join(link).to_string_lossy().into_owned(),
                    sni: cert.host.clone().filter(|host| usable_sni(host)),
                    tls: Arc::clone(&cert.tls),
                })
            })
            .collect()
    }

    fn render_crt_list(&self) -> String {
        let mut out = String::new();
        for entry in self.entries() {
            match &entry.sni {
                Some(sni) => {
                    let _ = writeln!(out, "{} {sni}", entry.name);
                }
                None => {
                    let _ = writeln!(out, "{}", entry.name);
                }
            }
        }
        out
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error(transparent)]
    Name(#[from] files::UnsafeName),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A route's result in a committed batch: its new digest (`None` for a removal).
type Committed = (RouteKey, Option<[u8; 32]>, Result<(), WriteError>);

async fn stage_bundle(
    dir: PathBuf,
    route: RouteKey,
    bundle: SecretPem,
) -> Result<files::PendingFile, WriteError> {
    let name = files::bundle_file_name(&route)?;
    Ok(
        blocking(move || files::write_pending(&dir, &name, bundle.expose_secret().as_bytes()))
            .await?,
    )
}

/// Makes the staged files durable and puts them in place, removes the bundles of
/// `removals`, and flushes the directory entries.
fn commit_batch(
    dir: &Path,
    links: &Path,
    pending: Vec<(RouteKey, [u8; 32], files::PendingFile)>,
    removals: Vec<RouteKey>,
) -> Vec<Committed> {
    let mut results = Vec::with_capacity(pending.len() + removals.len());
    let started = std::time::Instant::now();
    let synced = if pending.is_empty() {
        Ok(())
    } else {
        files::sync_filesystem(dir)
    };
    debug!(files = pending.len(), elapsed = ?started.elapsed(), "flushed the staged bundles to disk");
    if let Err(error) = synced {
        // Without a flush the renames could expose empty files after a crash.
        for (route, digest, file) in pending {
            file.discard();
            let error = io::Error::new(error.kind(), format!("flushing to disk: {error}"));
            results.push((route, Some(digest), Err(WriteError::Io(error))));
        }
        return results;
    }
    for (route, digest, file) in pending {
        let result = file.commit().map_err(WriteError::from).and_then(|()| {
            let name = files::bundle_file_name(&route)?;
            let link = files::link_file_name(&route)?;
            files::ensure_link(links, &link, &name)?;
            Ok(())
        });
        results.push((route, Some(digest), result));
    }
    for route in removals {
        let result = (|| {
            let name = files::bundle_file_name(&route)?;
            let link = files::link_file_name(&route)?;
            files::remove_if_present(&links.join(link))?;
            files::remove_if_present(&dir.join(name))?;
            Ok(())
        })();
        results.push((route, None, result));
    }
    for directory in [dir, links] {
        if let Err(error) = files::sync_dir(directory) {
            warn!(dir = %directory.display(), %error, "cannot flush the directory's entries");
        }
    }
    results
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use route_secrets::testing::{LeafSpec, Pki};
    use route_secrets::tls::TlsValidator;

    use super::*;

    fn served(pki: &Pki, namespace: &str, name: &str, created: i64) -> ServedCert {
        let now = Timestamp::now();
        let host = format!("{name}.example.com");
        let secret = pki.issue(&LeafSpec::new(&host, now)).secret(namespace, "s");
        let tls = TlsValidator::default()
            .validate_secret(&secret, Some(&host), now)
            .unwrap();
        ServedCert {
            route: RouteKey::new(namespace, name),
            host: Some(host),
            created: Some(Timestamp::from_second(created).unwrap()),
            tls: Arc::new(tls),
        }
    }

    #[tokio::test]
    async fn start_up_restart_and_stale_files() {
        let temp = tempfile::tempdir().unwrap();
        let root = temp.path().join("certs");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("old:gone.pem"), b"stale").unwrap();
        let pki = Pki::new(Timestamp::now());
        let (a, b) = (
            served(&pki, "ns", "a", 2_000),
            served(&pki, "ns", "b", 1_000),
        );

        let mut dir = CertDir::open(&root, 4).await.unwrap();
        dir.set(a.clone());
        dir.set(b.clone());
        let report = dir.flush().await;
        assert_eq!((report.written, report.crt_list_written), (2, false));
        // Until start-up is complete, nothing is removed and no crt-list is written.
        assert!(root.join("old:gone.pem").exists());
        assert!(!root.join(CRT_LIST_FILE).exists());

        dir.mark_complete();
        let report = dir.flush().await;
        assert_eq!((report.written, report.removed), (0, 1));
        assert!(report.crt_list_written);
        assert!(!root.join("old:gone.pem").exists());
        let root = root.canonicalize().unwrap();
        let list = std::fs::read_to_string(root.join(CRT_LIST_FILE)).unwrap();
        let links = root.join(LINKS_DIR);
        assert_eq!(
            list,
            format!(
                "{}/ns_b.pem b.example.com\n{}/ns_a.pem a.example.com\n",
                links.display(),
                links.display()
            ),
            "the older route first"
        );
        let bundle = root.join("ns:a.pem");
        assert_eq!(
            std::fs::read(&bundle).unwrap(),
            a.tls.pem_bundle().expose_secret().as_bytes()
        );
        assert_eq!(
            std::fs::metadata(&bundle).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(dir.flush().await, FlushReport::default());

        // After a restart, identical bundles are not rewritten.
        let mut dir = CertDir::open(&root, 4).await.unwrap();
        dir.set(a);
        dir.set(b.clone());
        dir.mark_complete();
        assert_eq!(dir.flush().await, FlushReport::default());

        // A removed route loses its bundle, link and line.
        dir.remove(&b.route);
        let report = dir.flush().await;
        assert_eq!((report.removed, report.crt_list_written), (1, true));
        assert!(!root.join("ns:b.pem").exists());
        assert!(!links.join("ns_b.pem").exists());
        assert_eq!(dir.entries().len(), 1);
    }
}
