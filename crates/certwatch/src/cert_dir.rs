//! What the cert directory should hold, and bringing it there.
//!
//! [`CertDir`] keeps the desired bundle of every admitted route and what is on disk
//! (by file name and content digest), and the proxy's index: one line per served
//! bundle saying which names it is served for, in order. The index's syntax is the
//! proxy's ([`IndexFormat`], supplied when the directory is opened); what is in it and
//! when it is written is decided here. [`CertDir::flush`] brings the directory there in
//! an order that keeps the index truthful at every instant:
//!
//! 1. new and changed bundles are written (several at once, off the async threads,
//!    one `syncfs`, then renamed into place) and linked;
//! 2. the lines of the routes that changed are recomputed, from the bundles really on
//!    disk: a route whose write failed is not named (or keeps naming its older file,
//!    which is still there), and a route whose names the index cannot hold gets no
//!    line. The index is rewritten only when a line changed (a new certificate in the
//!    same file changes none);
//! 3. only once that index is on disk, and every load of the files that began before
//!    it was ([`FileLoads`]) has ended, are the bundles of routes no longer served
//!    removed (link first, then bundle). A proxy that reloads at any moment between
//!    these steps finds every file its index names, and a load that read an older
//!    index finds every file that one names.
//!
//! A flush costs work in proportion to what changed: bundles written, lines
//! recomputed and the [`CrtChange`]s handed to the proxies are those of the routes
//! changed since the last flush. Only a flush that changes a line renders the whole
//! index, from lines kept in order (oldest route first).
//!
//! Until [`CertDir::mark_complete`] (every route present at start-up decided) the
//! index is left as it was and no old bundle is removed: a proxy that reloads during
//! start-up keeps serving what it served before, instead of a half-built index. A
//! proxy already running may still learn the lines of the routes decided meanwhile
//! ([`FlushReport::decided`]), to add them before the rest is decided. An
//! index found at start that names missing files is repaired at once (the files may
//! have been removed by hand, or a previous version may have left it so).
//!
//! The certificates the proxy refused ([`CertDir::set_excluded`]) stay out of the
//! index while they hold the refused material; they are kept in
//! [`files::REFUSED_FILE`], written before the index that leaves them out, and read
//! back at [`CertDir::open`]: a restarted certwatch's first index leaves them out too,
//! so that a proxy that loads the files meanwhile does not fail on them.
//!
//! Failed writes and removals are counted in the [`FlushReport`] and retried by the
//! next flush; [`CertDir::is_current`] says whether everything desired is on disk.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jiff::Timestamp;
use kube_common::hash::{NameMap, NameSet};
use route_secrets::machine::Sni;
use route_secrets::route::RouteKey;
use route_secrets::tls::ValidatedTls;
use tracing::debug;

use crate::file_loads::FileLoads;
use crate::files::{self, BundleNames, LINKS_DIR, REFUSED_FILE};

/// The syntax of the proxy's index of served certificates, a text file of lines in the
/// cert directory: which certificate file is served for which names, the first line
/// winning a name two lines claim. The proxy supplies it; [`CertDir`] decides what the
/// index holds, in which order, and when it is written.
pub trait IndexFormat: fmt::Debug + Send + Sync {
    /// The index file's name in the cert directory.
    fn file_name(&self) -> &str;

    /// What a certificate's line says after its name: served for `sni`, its chain
    /// (digest `chain`, see [`chain_digest`]) used by `sharing` served routes, itself
    /// included. `None`: the index cannot hold these names, and the certificate gets
    /// no line (its bundle is still written).
    fn describe(&self, sni: &Sni, chain: &[u8; 32], sharing: usize) -> Option<String>;

    /// Appends the line of the certificate named `name` (its link's absolute path) and
    /// described as [`IndexFormat::describe`] said.
    fn write_line(&self, out: &mut String, name: &str, description: &str);

    /// The file a line of the index names; `None`: the line names none.
    fn file_named<'a>(&self, line: &'a str) -> Option<&'a str>;
}

/// A route to serve, with its certificate.
#[derive(Clone, Debug)]
pub struct ServedCert {
    /// The route.
    pub route: RouteKey,
    /// The server names it is served for. Names the index cannot hold
    /// ([`IndexFormat::describe`]; [`Sni::NoHost`] among them): the bundle is written
    /// but gets no line in the index (a line without names would capture every other
    /// route's hosts).
    pub sni: Sni,
    /// When the route was created: older routes come first in the index, so they win
    /// a host conflict, as in a router.
    pub created: Option<Timestamp>,
    /// The validated chain and key.
    pub tls: Arc<ValidatedTls>,
}

/// A served certificate's line in the index, as the proxy sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrtEntry {
    /// The route.
    pub route: RouteKey,
    /// The certificate's name in the proxy: the absolute path of the bundle's link.
    pub name: String,
    /// What follows the name on the line ([`IndexFormat::describe`]).
    pub line: String,
    /// The material in the file.
    pub tls: Arc<ValidatedTls>,
    /// SHA-256 of the bundle file (chain, then key).
    pub digest: [u8; 32],
}

/// A route's line changed (added, new material, new options or filter, or gone).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrtChange {
    /// The route.
    pub route: RouteKey,
    /// The certificate's name in the proxy.
    pub name: String,
    /// The line now; `None`: the route has no line any more.
    pub entry: Option<CrtEntry>,
}

/// What a [`CertDir::flush`] did.
#[derive(Clone, Debug, Default)]
pub struct FlushReport {
    /// Bundles written.
    pub written: usize,
    /// Bundles removed.
    pub removed: usize,
    /// Writes, removals or index writes that failed (retried by the next flush).
    pub failed: usize,
    /// Whether the index was rewritten.
    pub index_written: bool,
    /// The kind of the first failure, if any (for readiness and logs).
    pub error: Option<io::ErrorKind>,
    /// A description of the first failure, naming the file (never its content).
    pub error_text: Option<String>,
    /// The lines that changed in this flush (once start-up is complete): what the
    /// proxies must learn.
    pub changes: Vec<CrtChange>,
    /// Whether `changes` holds every line: the first flush once start-up is complete.
    pub complete_listing: bool,
    /// Before start-up is complete (with [`CertDir::with_decided_report`]): the lines
    /// the routes set since the last flush would have, their bundles on disk. Nothing
    /// is removed or replaced by them; the complete listing names every line again.
    pub decided: Vec<CrtChange>,
}

impl FlushReport {
    /// Whether anything on disk changed.
    pub fn changed(&self) -> bool {
        self.written > 0 || self.removed > 0 || self.index_written
    }

    fn failure(&mut self, kind: io::ErrorKind, text: impl FnOnce() -> String) {
        self.failed += 1;
        if self.error.is_none() {
            self.error = Some(kind);
            self.error_text = Some(text());
        }
    }
}

/// A route to serve, with what its files are called and what they must hold.
#[derive(Debug)]
struct Desired {
    cert: ServedCert,
    names: BundleNames,
    /// SHA-256 of its bundle.
    digest: [u8; 32],
    /// SHA-256 of its chain: routes serving the same chain share a certificate.
    chain: [u8; 32],
}

/// A bundle on disk, with its link.
#[derive(Debug)]
struct OnDisk {
    digest: [u8; 32],
    /// The material written, when certwatch wrote it in this process (files found at
    /// start are known by digest only).
    tls: Option<Arc<ValidatedTls>>,
}

/// Where a line goes in the index: older routes first; routes without a creation
/// time (not from an API server) last.
type ListKey = (bool, Option<Timestamp>, RouteKey);

/// A route's line as listed.
#[derive(Debug)]
struct Listed {
    key: ListKey,
    entry: CrtEntry,
}

/// The cert directory's desired and actual content.
#[derive(Debug)]
pub struct CertDir {
    dir: PathBuf,
    links: PathBuf,
    /// Whether certwatch owns the directory (see [`files::prepare_dir`]).
    owned: bool,
    /// The directory's mode.
    mode: u32,
    /// The index's syntax.
    format: Arc<dyn IndexFormat>,
    /// Boxed, as the lines are: a map keeps up to as many spare slots as entries, and an
    /// entry of about 200 bytes inline cost that again in every spare slot.
    desired: NameMap<RouteKey, Box<Desired>>,
    /// Bundles known to be on disk with their link, by file name.
    on_disk: NameMap<String, OnDisk>,
    /// Bundle files on disk that no desired route names: removed once the index on
    /// disk no longer names them.
    unwanted: BTreeSet<String>,
    /// Unwanted bundles, with the [`FileLoads::mark`] taken once an index not
    /// naming them was on disk: removed once every load begun before it has ended.
    held: NameMap<String, u64>,
    /// The loads of these files in progress.
    loads: FileLoads,
    /// Links found at start whose bundle is missing or elsewhere: removed with the
    /// first removals.
    stray_links: BTreeSet<String>,
    /// Routes changed since the last flush (their bundle may need writing).
    dirty: BTreeSet<RouteKey>,
    /// Routes whose last write failed.
    failed: BTreeSet<RouteKey>,
    /// Routes whose line must be recomputed at the next flush.
    relist: NameSet<RouteKey>,
    /// Every route's line is recomputed at the next flush (start-up just completed).
    relist_all: bool,
    /// The lines, by route.
    lines: NameMap<RouteKey, Box<Listed>>,
    /// The lines in the index's order.
    order: BTreeMap<ListKey, RouteKey>,
    /// Desired routes per chain digest (for the ALPN rule: a shared certificate).
    by_chain: NameMap<[u8; 32], ChainRoutes>,
    /// Certificates (by name in the proxy: the link's path) whose material the proxy
    /// rejected, with that material's digest: their lines stay out of the index while
    /// they hold that material.
    excluded: HashMap<String, [u8; 32]>,
    /// Whether `excluded` changed since [`REFUSED_FILE`] was last written.
    excluded_dirty: bool,
    /// Whether a line changed since the index was last written.
    list_dirty: bool,
    /// SHA-256 of the index's content as last written (or found): a new rendering is
    /// compared with it, so the text itself (about 150 bytes per route) is not kept.
    index: Option<[u8; 32]>,
    /// Whether the last index write failed (the file on disk is behind).
    index_failed: bool,
    complete: bool,
    concurrency: usize,
    /// Whether a flush reports the changed lines ([`FlushReport::changes`]): only a
    /// proxy fed through an API at run time reads them, and the first complete listing
    /// copies every line.
    report_changes: bool,
    /// Whether a flush before start-up is complete reports the decided routes' lines
    /// ([`FlushReport::decided`]).
    report_decided: bool,
}

/// The desired routes serving one chain. Nearly every chain has one route: that one is
/// held inline, without a set of its own (a set per chain cost about 100 bytes per
/// route).
#[derive(Debug)]
enum ChainRoutes {
    One(RouteKey),
    Many(HashSet<RouteKey>),
}

impl ChainRoutes {
    fn len(&self) -> usize {
        match self {
            Self::One(_) => 1,
            Self::Many(routes) => routes.len(),
        }
    }

    /// Adds `route`; returns the routes now serving the chain.
    fn insert(&mut self, route: &RouteKey) -> usize {
        match self {
            Self::One(one) if one == route => {}
            Self::One(one) => {
                let routes = HashSet::from([one.clone(), route.clone()]);
                *self = Self::Many(routes);
            }
            Self::Many(routes) => {
                routes.insert(route.clone());
            }
        }
        self.len()
    }

    /// Removes `route`; `None` when no route is left.
    fn remove(mut self, route: &RouteKey) -> Option<Self> {
        match &mut self {
            Self::One(one) => (one != route).then_some(self),
            Self::Many(routes) => {
                routes.remove(route);
                match routes.len() {
                    0 => None,
                    1 => routes.iter().next().cloned().map(Self::One),
                    _ => Some(self),
                }
            }
        }
    }

    fn routes(&self) -> Vec<RouteKey> {
        match self {
            Self::One(one) => vec![one.clone()],
            Self::Many(routes) => routes.iter().cloned().collect(),
        }
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    digest_of_parts(&[bytes])
}

/// The digest of `parts` written one after the other: what [`digest`] gives for the
/// file they make, without putting the file together in memory.
fn digest_of_parts(parts: &[&[u8]]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part);
    }
    let digest = context.finish();
    let mut out = [0; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// The digest of the bundle [`ValidatedTls::pem_bundle`] renders (chain, then key).
pub fn bundle_digest(tls: &ValidatedTls) -> [u8; 32] {
    digest_of_parts(&[
        tls.chain_pem().as_bytes(),
        tls.key_pem().expose_secret().as_bytes(),
    ])
}

/// The digest of a chain as certwatch renders it: what tells a shared certificate.
pub fn chain_digest(tls: &ValidatedTls) -> [u8; 32] {
    digest(tls.chain_pem().as_bytes())
}

/// [`bundle_digest`] and [`chain_digest`] together, in one pass over the chain: the
/// bundle's digest continues from the chain's state.
fn bundle_and_chain_digests(tls: &ValidatedTls) -> ([u8; 32], [u8; 32]) {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(tls.chain_pem().as_bytes());
    let chain = context.clone().finish();
    context.update(tls.key_pem().expose_secret().as_bytes());
    let bundle = context.finish();
    let array = |digest: ring::digest::Digest| {
        let mut out = [0; 32];
        out.copy_from_slice(digest.as_ref());
        out
    };
    (array(bundle), array(chain))
}

/// Runs `work` on the blocking pool. A panic or cancellation of the blocking task is an
/// error like any other, never an empty result.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join| Err(io::Error::other(format!("the write task failed: {join}"))))
}

/// What was found in the cert directory at start.
struct Found {
    prepared: files::PreparedDir,
    on_disk: NameMap<String, OnDisk>,
    unlinked: BTreeSet<String>,
    stray_links: BTreeSet<String>,
    index: Option<String>,
    refused: HashMap<String, [u8; 32]>,
}

/// Reads the bundles and links in `dir`, repairing an index that names missing files.
fn scan(dir: &Path, format: &dyn IndexFormat) -> io::Result<Found> {
    let prepared = files::prepare_dir(dir)?;
    let dir = &prepared.path;
    let links = dir.join(LINKS_DIR);
    let mut bundles = HashMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !files::is_bundle_file_name(&name) {
            continue;
        }
        if let Ok(content) = std::fs::read(entry.path()) {
            bundles.insert(name, digest(&content));
        }
    }
    let mut on_disk = NameMap::default();
    let mut stray_links = BTreeSet::new();
    for entry in std::fs::read_dir(&links)? {
        let entry = entry?;
        let link = entry.file_name().to_string_lossy().into_owned();
        if !files::is_link_file_name(&link) {
            continue;
        }
        let bundle = files::bundle_name_of_link(&link);
        let points_right = std::fs::read_link(entry.path())
            .is_ok_and(|target| target == Path::new("..").join(&bundle));
        match bundles.remove(&bundle) {
            Some(digest) if points_right => {
                on_disk.insert(bundle, OnDisk { digest, tls: None });
            }
            other => {
                if let Some(digest) = other {
                    bundles.insert(bundle, digest);
                }
                stray_links.insert(link);
            }
        }
    }
    let unlinked = bundles.into_keys().collect();
    let index = match std::fs::read_to_string(dir.join(format.file_name())) {
        Ok(text) => Some(repair_index(dir, format, text)?),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let refused = match std::fs::read_to_string(dir.join(REFUSED_FILE)) {
        Ok(text) => parse_refused(&text),
        Err(error) if error.kind() == io::ErrorKind::NotFound => HashMap::new(),
        Err(error) => return Err(error),
    };
    Ok(Found {
        prepared,
        on_disk,
        unlinked,
        stray_links,
        index,
        refused,
    })
}

/// The refusals [`REFUSED_FILE`] holds: `<name> <hex digest>` per line; other lines
/// are skipped (a refusal lost is tried again, and refused again).
fn parse_refused(text: &str) -> HashMap<String, [u8; 32]> {
    text.lines()
        .filter_map(|line| {
            let (name, hex) = line.rsplit_once(' ')?;
            let mut digest = [0; 32];
            if hex.len() != 64 {
                return None;
            }
            for (i, byte) in digest.iter_mut().enumerate() {
                *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
            }
            Some((name.to_owned(), digest))
        })
        .collect()
}

/// The content of [`REFUSED_FILE`] for `refused`, sorted by name.
fn render_refused(refused: &HashMap<String, [u8; 32]>) -> String {
    let mut lines: Vec<String> = refused
        .iter()
        .map(|(name, digest)| {
            let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
            format!("{name} {hex}\n")
        })
        .collect();
    lines.sort();
    lines.concat()
}

/// Drops the lines of an index found at start that name files that are not there,
/// and writes it back if any was dropped.
fn repair_index(dir: &Path, format: &dyn IndexFormat, text: String) -> io::Result<String> {
    let kept: String = text
        .lines()
        .filter(|line| {
            format
                .file_named(line)
                .is_none_or(|path| std::fs::metadata(path).is_ok())
        })
        .map(|line| format!("{line}\n"))
        .collect();
    if kept.lines().count() == text.lines().count() {
        return Ok(text);
    }
    tracing::warn!(
        dropped = text.lines().count() - kept.lines().count(),
        index = format.file_name(),
        "the index found at start named missing files; rewrote it without them"
    );
    files::write_atomic(dir, format.file_name(), kept.as_bytes())?;
    files::sync_dir(dir)?;
    Ok(kept)
}

/// A bundle to write: the route, its names and its material.
type Write = (RouteKey, BundleNames, Arc<ValidatedTls>);

/// A route's result in a committed batch.
type Committed = (RouteKey, BundleNames, io::Result<()>);

/// A route's staged bundle (or why it could not be staged).
type Staged = (RouteKey, BundleNames, io::Result<files::PendingFile>);

impl CertDir {
    /// Prepares `dir` (see [`files::prepare_dir`]) and reads what it already holds, so
    /// that unchanged bundles are not rewritten after a restart. `concurrency` bounds
    /// the writes in flight; `format` is the index's syntax.
    pub async fn open(
        dir: &Path,
        concurrency: usize,
        format: Arc<dyn IndexFormat>,
    ) -> io::Result<Self> {
        let dir = dir.to_owned();
        let scanning = Arc::clone(&format);
        let found = blocking(move || scan(&dir, scanning.as_ref())).await?;
        let mut unwanted: BTreeSet<String> = found.on_disk.keys().cloned().collect();
        unwanted.extend(found.unlinked);
        Ok(Self {
            links: found.prepared.path.join(LINKS_DIR),
            dir: found.prepared.path,
            owned: found.prepared.owned,
            mode: found.prepared.mode,
            format,
            desired: NameMap::default(),
            on_disk: found.on_disk,
            unwanted,
            held: NameMap::default(),
            loads: FileLoads::new(),
            stray_links: found.stray_links,
            dirty: BTreeSet::new(),
            failed: BTreeSet::new(),
            relist: NameSet::default(),
            relist_all: false,
            lines: NameMap::default(),
            order: BTreeMap::new(),
            by_chain: NameMap::default(),
            excluded: found.refused,
            excluded_dirty: false,
            list_dirty: false,
            index: found.index.as_deref().map(|text| digest(text.as_bytes())),
            index_failed: false,
            complete: false,
            concurrency: concurrency.max(1),
            report_changes: true,
            report_decided: false,
        })
    }

    /// Whether flushes report the changed lines (default: yes). Without a reader of
    /// [`FlushReport::changes`] they are left empty, which spares a copy of every line
    /// at the end of start-up.
    pub fn with_change_report(mut self, report: bool) -> Self {
        self.report_changes = report;
        self
    }

    /// Whether flushes before start-up is complete report the lines of the routes
    /// decided meanwhile (default: no): for a proxy already running, which may serve
    /// them before the rest is decided.
    pub fn with_decided_report(mut self, report: bool) -> Self {
        self.report_decided = report;
        self
    }

    /// The directory (absolute).
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The directory of the bundles' links (absolute): certificate names in the proxy
    /// start with it.
    pub fn links_path(&self) -> &Path {
        &self.links
    }

    /// Whether certwatch owns the directory, and its mode (a directory owned by
    /// someone else keeps its mode).
    pub fn ownership(&self) -> (bool, u32) {
        (self.owned, self.mode)
    }

    /// The index's path.
    pub fn index_path(&self) -> PathBuf {
        self.dir.join(self.format.file_name())
    }

    /// The loads of these files: whoever makes the proxy load them (start or reload)
    /// holds a [`FileLoads::begin`] guard while it does, so that no file a load may
    /// have read in the index is removed under it.
    pub fn file_loads(&self) -> FileLoads {
        self.loads.clone()
    }

    /// Whether a bundle no longer wanted waits for a load in progress to end before
    /// it is removed (a [`FileLoads`] change is then worth a [`CertDir::flush`]).
    pub fn removals_waiting(&self) -> bool {
        self.unwanted.iter().any(|bundle| {
            self.held
                .get(bundle)
                .is_some_and(|mark| !self.loads.ended_before(*mark))
        })
    }

    /// Whether `bundle`, unwanted, may be removed now.
    fn removable(&self, bundle: &str) -> bool {
        self.held
            .get(bundle)
            .is_none_or(|mark| self.loads.ended_before(*mark))
    }

    /// Serve `cert` for its route (replacing earlier material). A route whose name
    /// cannot be a file name is refused (never the case for names an API server
    /// accepts).
    pub fn set(&mut self, cert: ServedCert) -> Result<(), files::UnsafeName> {
        let names = files::bundle_names(&cert.route)?;
        let (digest, chain) = bundle_and_chain_digests(&cert.tls);
        self.unwanted.remove(&names.bundle);
        self.held.remove(&names.bundle);
        self.dirty.insert(cert.route.clone());
        if self.relisting() {
            self.relist.insert(cert.route.clone());
        }
        let route = cert.route.clone();
        let old = self.desired.insert(
            route.clone(),
            Box::new(Desired {
                cert,
                names: names.clone(),
                digest,
                chain,
            }),
        );
        match old {
            Some(old) => {
                if old.names.bundle != names.bundle {
                    self.unwanted.insert(old.names.bundle);
                }
                if old.chain != chain {
                    self.unshare(&route, old.chain);
                    self.share(&route, chain);
                }
            }
            None => self.share(&route, chain),
        }
        Ok(())
    }

    /// Stop serving `route`.
    pub fn remove(&mut self, route: &RouteKey) {
        if let Some(old) = self.desired.remove(route) {
            self.failed.remove(route);
            if self.relisting() {
                self.relist.insert(route.clone());
            }
            self.unshare(route, old.chain);
            if self.on_disk.contains_key(&old.names.bundle) {
                self.unwanted.insert(old.names.bundle);
            }
        }
    }

    /// Whether a changed route must be remembered for the next flush's listing. Until
    /// start-up is complete, and until the first complete listing is made, every line
    /// is computed anyway: remembering each route meanwhile held a set of every route.
    fn relisting(&self) -> bool {
        self.complete && !self.relist_all
    }

    /// `route` now serves `chain`. When the chain becomes shared (one route to two),
    /// the other route's line loses its ALPN.
    fn share(&mut self, route: &RouteKey, chain: [u8; 32]) {
        let routes = match self.by_chain.entry(chain) {
            std::collections::hash_map::Entry::Occupied(mut entry) => {
                if entry.get_mut().insert(route) == 2 {
                    entry.get().routes()
                } else {
                    Vec::new()
                }
            }
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(ChainRoutes::One(route.clone()));
                Vec::new()
            }
        };
        if self.relisting() {
            self.relist.extend(routes);
        }
    }

    /// `route` no longer serves `chain`. When one route is left with it, its line gets
    /// its ALPN back.
    fn unshare(&mut self, route: &RouteKey, chain: [u8; 32]) {
        let Some(routes) = self.by_chain.remove(&chain) else {
            return;
        };
        if let Some(left) = routes.remove(route) {
            if left.len() == 1 && self.relisting() {
                self.relist.extend(left.routes());
            }
            self.by_chain.insert(chain, left);
        }
    }

    /// The certificates the proxy rejected, as known (from [`REFUSED_FILE`] at start, then
    /// from [`CertDir::set_excluded`]): name in the proxy → the rejected material's digest.
    pub fn excluded(&self) -> &HashMap<String, [u8; 32]> {
        &self.excluded
    }

    /// Leaves out of the index the certificates the proxy rejected (name in the proxy
    /// → the rejected material's digest), as long as they hold that material; the lines
    /// of certificates no longer rejected come back. Applied (and kept in
    /// [`REFUSED_FILE`]) at the next flush.
    pub fn set_excluded(&mut self, excluded: HashMap<String, [u8; 32]>) {
        if excluded == self.excluded {
            return;
        }
        self.excluded_dirty = true;
        let mut names: HashSet<&String> = excluded.keys().collect();
        names.extend(self.excluded.keys());
        for (route, desired) in &self.desired {
            let name = self.links.join(&desired.names.link);
            if names.contains(&name.to_string_lossy().into_owned()) {
                self.relist.insert(route.clone());
            }
        }
        self.excluded = excluded;
    }

    /// Routes being served.
    pub fn served(&self) -> usize {
        self.desired.len()
    }

    /// Bundles on disk (with their link).
    pub fn bundles_on_disk(&self) -> usize {
        self.on_disk.len()
    }

    /// Lines of the index (once start-up is complete).
    pub fn listed(&self) -> usize {
        self.lines.len()
    }

    /// Served routes whose bundle on disk holds their current material.
    pub fn served_on_disk(&self) -> usize {
        self.desired
            .values()
            .filter(|desired| {
                self.on_disk
                    .get(&desired.names.bundle)
                    .is_some_and(|disk| disk.digest == desired.digest)
            })
            .count()
    }

    /// Whether some write, removal or index write is waiting for a retry (a
    /// removal that waits for a load to end is not: see [`CertDir::removals_waiting`]).
    pub fn has_pending_work(&self) -> bool {
        !self.failed.is_empty()
            || (self.complete
                && (self.index_failed
                    || self.excluded_dirty
                    || self.unwanted.iter().any(|bundle| self.removable(bundle))
                    || !self.stray_links.is_empty()))
    }

    /// Whether the directory holds everything desired: start-up is complete, every
    /// served route's bundle is on disk with its current material, and the index
    /// naming them is written. (Leftovers waiting for removal do not count: the index
    /// no longer names them.)
    pub fn is_current(&self) -> bool {
        self.complete && self.failed.is_empty() && self.index_current()
    }

    /// Whether the index on disk is the one the served bundles call for.
    pub fn index_current(&self) -> bool {
        self.complete && !self.index_failed && self.index.is_some()
    }

    /// Every route present at start-up has been decided: from now on the index is
    /// written, and bundles of routes not served are removed.
    pub fn mark_complete(&mut self) {
        if !self.complete {
            self.complete = true;
            self.relist_all = true;
            // The list found at start is compared with the one the routes call for.
            self.list_dirty = true;
        }
    }

    /// Brings the directory to the desired state (see the [module
    /// documentation](self)); failures are counted in the report and retried by the
    /// next flush.
    pub async fn flush(&mut self) -> FlushReport {
        let mut report = FlushReport::default();
        let decided: Vec<RouteKey> = if !self.complete && self.report_decided {
            self.dirty.iter().chain(&self.failed).cloned().collect()
        } else {
            Vec::new()
        };
        self.write_bundles(&mut report).await;
        if !self.complete {
            report.decided = self.decided_lines(decided);
            return report;
        }
        if self.excluded_dirty {
            self.write_refused(&mut report).await;
        }
        report.complete_listing = self.relist_all;
        report.changes = self.relist_changed();
        if self.list_dirty || self.index.is_none() || self.index_failed {
            self.write_index(&mut report).await;
        }
        if !self.index_failed {
            self.remove_unwanted(&mut report).await;
        }
        report
    }

    /// The lines `routes` would have now (those with one), kept nowhere: before
    /// start-up is complete the lines are computed once, at its end.
    fn decided_lines(&self, routes: Vec<RouteKey>) -> Vec<CrtChange> {
        routes
            .into_iter()
            .filter_map(|route| {
                let listed = self.listing_of(&route)?;
                Some(CrtChange {
                    route,
                    name: listed.entry.name.clone(),
                    entry: Some(listed.entry),
                })
            })
            .collect()
    }

    /// Recomputes the lines of the routes changed since the last flush (of every route
    /// after start-up) and returns the changes.
    fn relist_changed(&mut self) -> Vec<CrtChange> {
        let routes: Vec<RouteKey> = if std::mem::take(&mut self.relist_all) {
            self.relist.clear();
            // Every desired route, then the listed ones no longer desired; the lines
            // are sized for the listing at once instead of growing step by step.
            self.lines
                .reserve(self.desired.len().saturating_sub(self.lines.len()));
            let gone = self
                .lines
                .keys()
                .filter(|route| !self.desired.contains_key(*route));
            self.desired.keys().chain(gone).cloned().collect()
        } else {
            self.relist.drain().collect()
        };
        let mut changes = Vec::with_capacity(if self.report_changes { routes.len() } else { 0 });
        for route in routes {
            let listed = self.listing_of(&route);
            let old = self.lines.get(&route);
            let same = match (old, &listed) {
                (Some(old), Some(new)) => old.key == new.key && old.entry == new.entry,
                (None, None) => true,
                _ => false,
            };
            if same {
                continue;
            }
            // A new certificate in the same file changes no line of the file.
            let text_changed = match (old, &listed) {
                (Some(old), Some(new)) => {
                    old.key != new.key
                        || old.entry.name != new.entry.name
                        || old.entry.line != new.entry.line
                }
                _ => true,
            };
            self.list_dirty |= text_changed;
            let change = self.report_changes.then(|| {
                let name = listed
                    .as_ref()
                    .map(|listed| listed.entry.name.clone())
                    .or_else(|| old.map(|old| old.entry.name.clone()))
                    .unwrap_or_default();
                let entry = listed.as_ref().map(|listed| listed.entry.clone());
                (name, entry)
            });
            if let Some(old) = self.lines.remove(&route) {
                self.order.remove(&old.key);
            }
            if let Some(listed) = listed {
                self.order.insert(listed.key.clone(), route.clone());
                self.lines.insert(route.clone(), Box::new(listed));
            }
            if let Some((name, entry)) = change {
                changes.push(CrtChange { route, name, entry });
            }
        }
        changes
    }

    /// The line `route` should have now: served, with an SNI, its bundle on disk. A
    /// route whose newest write failed keeps its older bundle (and is served with that
    /// material).
    fn listing_of(&self, route: &RouteKey) -> Option<Listed> {
        let desired = self.desired.get(route)?;
        let disk = self.on_disk.get(&desired.names.bundle)?;
        let sharing = self
            .by_chain
            .get(&desired.chain)
            .map_or(1, ChainRoutes::len);
        let line = self
            .format
            .describe(&desired.cert.sni, &desired.chain, sharing)?;
        let tls = if disk.digest == desired.digest {
            Arc::clone(&desired.cert.tls)
        } else {
            disk.tls
                .clone()
                .unwrap_or_else(|| Arc::clone(&desired.cert.tls))
        };
        let key = (
            desired.cert.created.is_none(),
            desired.cert.created,
            route.clone(),
        );
        let name = self
            .links
            .join(&desired.names.link)
            .to_string_lossy()
            .into_owned();
        if self.excluded.get(&name) == Some(&disk.digest) {
            return None;
        }
        Some(Listed {
            key,
            entry: CrtEntry {
                route: route.clone(),
                name,
                line,
                tls,
                digest: disk.digest,
            },
        })
    }

    /// Renders the index from the lines in order and writes it if it differs from the
    /// file on disk.
    async fn write_index(&mut self, report: &mut FlushReport) {
        let content = self.render_index();
        self.list_dirty = false;
        let content_digest = digest(content.as_bytes());
        if self.index == Some(content_digest) && !self.index_failed {
            return;
        }
        let dir = self.dir.clone();
        let file_name = self.format.file_name().to_owned();
        let lines = self.lines.len();
        match blocking(move || {
            files::write_atomic(&dir, &file_name, content.as_bytes())?;
            files::sync_dir(&dir)
        })
        .await
        {
            Ok(()) => {
                debug!(lines, index = self.format.file_name(), "index written");
                self.index = Some(content_digest);
                self.index_failed = false;
                report.index_written = true;
            }
            Err(error) => {
                self.index_failed = true;
                report.failure(error.kind(), || {
                    format!("cannot write {}: {error}", self.index_path().display())
                });
            }
        }
    }

    /// Writes [`REFUSED_FILE`] (before the index that leaves the refusals out).
    async fn write_refused(&mut self, report: &mut FlushReport) {
        let dir = self.dir.clone();
        let content = render_refused(&self.excluded);
        match blocking(move || files::write_atomic(&dir, REFUSED_FILE, content.as_bytes())).await {
            Ok(()) => self.excluded_dirty = false,
            Err(error) => report.failure(error.kind(), || {
                format!(
                    "cannot write {}: {error}",
                    self.dir.join(REFUSED_FILE).display()
                )
            }),
        }
    }

    fn render_index(&self) -> String {
        let mut out = String::with_capacity(self.lines.len() * 128);
        for route in self.order.values() {
            if let Some(listed) = self.lines.get(route) {
                self.format
                    .write_line(&mut out, &listed.entry.name, &listed.entry.line);
            }
        }
        out
    }

    /// Checks that every file the index names is there (its link and the bundle it
    /// points to); a route whose files were removed by others is written again at the
    /// next [`CertDir::flush`] (until then, or if that write fails, its line leaves the
    /// index). Returns the names of the routes found missing. A proxy that failed to
    /// load the files asks for this: an index naming a missing file stops a load.
    pub fn verify_files(&mut self) -> Vec<String> {
        let missing: Vec<RouteKey> = self
            .lines
            .iter()
            .filter(|(_, listed)| std::fs::metadata(&listed.entry.name).is_err())
            .map(|(route, _)| route.clone())
            .collect();
        for route in &missing {
            if let Some(desired) = self.desired.get(route) {
                self.on_disk.remove(&desired.names.bundle);
            }
            self.relist.insert(route.clone());
            self.dirty.insert(route.clone());
        }
        missing.iter().map(ToString::to_string).collect()
    }

    /// The index's lines, oldest route first.
    pub fn entries(&self) -> Vec<CrtEntry> {
        self.order
            .values()
            .filter_map(|route| self.lines.get(route))
            .map(|listed| listed.entry.clone())
            .collect()
    }

    /// Phase 1: every new or changed bundle into a temporary file (in parallel), one
    /// flush to disk, then the renames and links.
    async fn write_bundles(&mut self, report: &mut FlushReport) {
        let writes = self.bundles_to_write();
        if writes.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let pending = self.stage(writes, report).await;
        let staged_after = started.elapsed();
        if pending.is_empty() {
            return;
        }
        let files = pending.len();
        self.commit(pending, report).await;
        debug!(
            files,
            staged = ?staged_after,
            committed = ?started.elapsed().saturating_sub(staged_after),
            "cert dir batch written"
        );
    }

    /// The routes changed since the last flush (and those whose write failed) whose
    /// bundle on disk is not their current one.
    fn bundles_to_write(&mut self) -> Vec<Write> {
        let mut routes = std::mem::take(&mut self.dirty);
        routes.append(&mut self.failed);
        let mut writes = Vec::new();
        for route in routes {
            let Some(desired) = self.desired.get(&route) else {
                continue;
            };
            if self
                .on_disk
                .get(&desired.names.bundle)
                .is_some_and(|disk| disk.digest == desired.digest)
            {
                continue;
            }
            // The material, not its bundle: a bundle (chain and key, about 2 KB) is
            // rendered only when its write starts, so at most `concurrency` of them
            // exist at once. Rendering all of a 10,000-route start-up's here held 20 MB
            // at the daemon's peak.
            writes.push((route, desired.names.clone(), Arc::clone(&desired.cert.tls)));
        }
        writes
    }

    /// Writes every bundle of `writes` to its temporary file, in shares on the blocking
    /// pool; returns the staged files (failures are recorded).
    async fn stage(
        &mut self,
        writes: Vec<Write>,
        report: &mut FlushReport,
    ) -> Vec<(RouteKey, BundleNames, files::PendingFile)> {
        // One blocking task per share of the batch, not one per bundle: handing 10,000
        // bundles to the blocking pool one at a time cost more than writing them on
        // tmpfs. Each task renders one bundle at a time (chain and key, about 2 KB), so
        // at most `concurrency` bundles exist at once.
        let share = writes.len().div_ceil(self.concurrency.max(1));
        let mut shares = Vec::new();
        let mut writes = writes.into_iter().peekable();
        while writes.peek().is_some() {
            let batch: Vec<Write> = writes.by_ref().take(share).collect();
            let routes: Vec<(RouteKey, BundleNames)> = batch
                .iter()
                .map(|(route, names, _)| (route.clone(), names.clone()))
                .collect();
            let dir = self.dir.clone();
            let staging = blocking(move || Ok(stage_share(&dir, batch)));
            shares.push(async move { (routes, staging.await) });
        }
        let mut pending = Vec::new();
        let mut failures = Vec::new();
        for (routes, staged) in futures::future::join_all(shares).await {
            match staged {
                Ok(staged) => {
                    for (route, names, file) in staged {
                        match file {
                            Ok(file) => pending.push((route, names, file)),
                            Err(error) => failures.push((route, names, error)),
                        }
                    }
                }
                // The task failed as a whole: every write of its share counts as failed.
                Err(error) => {
                    for (route, names) in routes {
                        let error = io::Error::new(error.kind(), error.to_string());
                        failures.push((route, names, error));
                    }
                }
            }
        }
        for (route, names, error) in failures {
            self.write_failed(report, route, &names, &error);
        }
        pending
    }

    /// Makes the staged files durable and puts them in place with their links; records
    /// what is on disk now.
    async fn commit(
        &mut self,
        pending: Vec<(RouteKey, BundleNames, files::PendingFile)>,
        report: &mut FlushReport,
    ) {
        let (dir, links) = (self.dir.clone(), self.links.clone());
        let routes: Vec<(RouteKey, BundleNames)> = pending
            .iter()
            .map(|(route, names, _)| (route.clone(), names.clone()))
            .collect();
        let committed = blocking(move || Ok(commit_batch(&dir, &links, pending))).await;
        let results = match committed {
            Ok(results) => results,
            // The batch's task failed as a whole: every write in it counts as failed.
            Err(error) => routes
                .into_iter()
                .map(|(route, names)| {
                    (
                        route,
                        names,
                        Err(io::Error::new(error.kind(), error.to_string())),
                    )
                })
                .collect(),
        };
        for (route, names, result) in results {
            match result {
                Ok(()) => {
                    if let Some(desired) = self.desired.get(&route) {
                        self.on_disk.insert(
                            names.bundle,
                            OnDisk {
                                digest: desired.digest,
                                tls: Some(Arc::clone(&desired.cert.tls)),
                            },
                        );
                    }
                    if self.relisting() {
                        self.relist.insert(route);
                    }
                    report.written += 1;
                }
                Err(error) => self.write_failed(report, route, &names, &error),
            }
        }
    }

    fn write_failed(
        &mut self,
        report: &mut FlushReport,
        route: RouteKey,
        names: &BundleNames,
        error: &io::Error,
    ) {
        report.failure(error.kind(), || {
            format!(
                "cannot write {}: {error}",
                self.dir.join(&names.bundle).display()
            )
        });
        self.failed.insert(route);
    }

    /// Phase 3: removes the bundles (and links) no desired route names, once the index
    /// on disk no longer names them and no load that may have read an older index is
    /// in progress.
    async fn remove_unwanted(&mut self, report: &mut FlushReport) {
        // The index on disk names no unwanted bundle now: loads that begin from now
        // on do not read them.
        let mark = self.loads.mark();
        for bundle in &self.unwanted {
            self.held.entry(bundle.clone()).or_insert(mark);
        }
        let bundles: Vec<String> = self
            .unwanted
            .iter()
            .filter(|bundle| self.removable(bundle))
            .cloned()
            .collect();
        if bundles.is_empty() && self.stray_links.is_empty() {
            return;
        }
        let stray_links: Vec<String> = self.stray_links.iter().cloned().collect();
        let (dir, links) = (self.dir.clone(), self.links.clone());
        let result = blocking(move || {
            let mut outcomes = Vec::with_capacity(bundles.len());
            for bundle in bundles {
                let link = files::link_name_of_bundle(&bundle);
                let removed = files::remove_if_present(&links.join(&link))
                    .and_then(|_| files::remove_if_present(&dir.join(&bundle)));
                outcomes.push((bundle, removed));
            }
            let mut link_outcomes = Vec::with_capacity(stray_links.len());
            for link in stray_links {
                let removed = files::remove_if_present(&links.join(&link));
                link_outcomes.push((link, removed));
            }
            for directory in [&dir, &links] {
                files::sync_dir(directory)?;
            }
            Ok((outcomes, link_outcomes))
        })
        .await;
        match result {
            Ok((outcomes, link_outcomes)) => {
                for (bundle, removed) in outcomes {
                    match removed {
                        Ok(existed) => {
                            self.unwanted.remove(&bundle);
                            self.held.remove(&bundle);
                            if self.on_disk.remove(&bundle).is_some() || existed {
                                report.removed += 1;
                            }
                        }
                        Err(error) => report.failure(error.kind(), || {
                            format!(
                                "cannot remove {}: {error}",
                                self.dir.join(&bundle).display()
                            )
                        }),
                    }
                }
                for (link, removed) in link_outcomes {
                    match removed {
                        Ok(_) => {
                            self.stray_links.remove(&link);
                        }
                        Err(error) => report.failure(error.kind(), || {
                            format!(
                                "cannot remove {}: {error}",
                                self.links.join(&link).display()
                            )
                        }),
                    }
                }
            }
            Err(error) => report.failure(error.kind(), || {
                format!("cannot remove files in {}: {error}", self.dir.display())
            }),
        }
    }
}

/// Writes each route's bundle to its temporary file, one after the other (runs on the
/// blocking pool).
fn stage_share(dir: &Path, share: Vec<(RouteKey, BundleNames, Arc<ValidatedTls>)>) -> Vec<Staged> {
    share
        .into_iter()
        .map(|(route, names, tls)| {
            let bundle = tls.pem_bundle();
            let file = files::write_pending(dir, &names.bundle, bundle.expose_secret().as_bytes());
            (route, names, file)
        })
        .collect()
}

/// Makes the staged files durable and puts them in place with their links, then
/// flushes the directory entries.
fn commit_batch(
    dir: &Path,
    links: &Path,
    pending: Vec<(RouteKey, BundleNames, files::PendingFile)>,
) -> Vec<Committed> {
    let mut results = Vec::with_capacity(pending.len());
    let started = std::time::Instant::now();
    let synced = files::sync_filesystem(dir);
    debug!(files = pending.len(), elapsed = ?started.elapsed(), "flushed the staged bundles to disk");
    if let Err(error) = synced {
        // Without a flush the renames could expose empty files after a crash.
        for (route, names, file) in pending {
            file.discard();
            let error = io::Error::new(error.kind(), format!("flushing to disk: {error}"));
            results.push((route, names, Err(error)));
        }
        return results;
    }
    for (route, names, file) in pending {
        let result = file
            .commit()
            .and_then(|()| files::ensure_link(links, &names.link, &names.bundle));
        results.push((route, names, result));
    }
    for directory in [dir, links] {
        if let Err(error) = files::sync_dir(directory) {
            // The renames happened; only their durability across a crash is in doubt.
            tracing::warn!(dir = %directory.display(), %error, "cannot flush the directory's entries");
        }
    }
    results
}

#[cfg(test)]
mod tests;
