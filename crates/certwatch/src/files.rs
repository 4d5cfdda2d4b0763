//! The cert directory's files: their names, permissions, and atomic replacement.
//!
//! - `<dir>/<namespace>:<route>.pem`: a route's bundle (chain, then key), mode 0600.
//! - `<dir>/crt-list`: one line per bundle for HAProxy's `crt-list`.
//! - `<dir>/links/<namespace>_<route>.pem`: a symlink to the bundle. HAProxy's runtime
//!   API reads `<file>:<line>` in `del ssl crt-list` and cuts the name at its *first*
//!   colon, so an entry naming `ns:route.pem` could never be removed without a reload.
//!   The crt-list therefore names each bundle through this colon-free link. `_` cannot
//!   appear in a namespace or route name, so the link name is unambiguous.
//!
//! **Long names.** A namespace may have 63 characters and a route 253, so
//! `<namespace>:<route>.pem` can exceed the 255-byte file-name limit of Linux file
//! systems. Names are kept as above whenever they fit with room for their temporary
//! sibling ([`MAX_FILE_NAME`]); a longer one is cut and made unique with a hash of the
//! whole route key: `<namespace>:<start of route>~<16 hex digits>.pem` (and the same
//! with `_` for its link). `~` never occurs in a Kubernetes name, so a shortened name
//! cannot collide with a name kept whole. Names are only ever computed from the route,
//! never parsed back: the cert directory is compared by file name.
//!
//! The directory is mode 0700 when certwatch owns it. A directory owned by someone
//! else (the root of a Kubernetes `emptyDir`, an operator's volume) keeps its mode:
//! changing it would fail (EPERM) under a random UID, and the bundles are 0600 anyway.
//! Such a directory is refused, though, when every user may write it and it has no
//! sticky bit ([`InsecureDir`]): any user could then rename or replace the bundles
//! and the crt-list a proxy serves. (A memory-backed `emptyDir` is a tmpfs, mode 1777,
//! or 3777 with an `fsGroup`: accepted.)
//! Every file is replaced atomically: written to a temporary file in the same
//! directory, flushed to disk, then renamed over the old one, so a reader sees the old
//! content or the new, never a mix.
//!
//! A batch of bundles is flushed with one `syncfs` instead of one `fsync` per file:
//! ext4 serialises fsyncs on its journal (about 1 ms each here, whatever the
//! parallelism), which would make writing 2,000 bundles cost seconds. The order is the
//! same as per file: every temporary file is durable before any rename.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use route_secrets::route::RouteKey;

/// Name of the crt-list file in the cert directory.
pub const CRT_LIST_FILE: &str = "crt-list";
/// Name of the file in the cert directory that lists the certificates HAProxy refused
/// (`<name in HAProxy> <SHA-256 of the refused bundle, hex>` per line), so that a
/// restarted certwatch leaves their lines out of its first crt-list.
pub const REFUSED_FILE: &str = "refused";
/// Sub-directory holding the colon-free links the crt-list names.
pub const LINKS_DIR: &str = "links";
/// Mode of the cert directory (when certwatch owns it) and its sub-directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file written (bundles hold private keys).
pub const FILE_MODE: u32 = 0o600;

const BUNDLE_SUFFIX: &str = ".pem";
const TEMP_MARKER: &str = ".tmp-";
/// What a temporary name adds to a file name: `.`, [`TEMP_MARKER`], 16 hex digits.
const TEMP_OVERHEAD: usize = 1 + TEMP_MARKER.len() + 16;
/// Longest file name certwatch gives a bundle or link: the file-name limit of Linux
/// file systems (255 bytes) less what its temporary sibling adds.
pub const MAX_FILE_NAME: usize = 255 - TEMP_OVERHEAD;
/// Marks a shortened name (never part of a Kubernetes name).
const HASH_MARKER: char = '~';
/// Hex digits of the route key's SHA-256 in a shortened name (64 bits).
const HASH_DIGITS: usize = 16;

/// A route whose namespace or name cannot be used in a file name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "route {route} cannot be written: its namespace and name must be DNS labels/subdomains \
     (lower-case letters, digits, '-' and '.')"
)]
pub struct UnsafeName {
    /// The route.
    pub route: RouteKey,
}

/// Whether `part` is safe in a file name and cannot collide with the separators used
/// here (`:`, `_` and `~`): what Kubernetes allows in namespace and route names.
fn is_dns_name(part: &str) -> bool {
    !part.is_empty()
        && part.len() <= 253
        && part != "."
        && part != ".."
        && part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn check(route: &RouteKey) -> Result<(), UnsafeName> {
    if is_dns_name(&route.namespace) && is_dns_name(&route.name) {
        Ok(())
    } else {
        Err(UnsafeName {
            route: route.clone(),
        })
    }
}

/// The file names of a route's bundle and of its link.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BundleNames {
    /// The bundle, in the cert directory: `<namespace>:<route>.pem` where it fits.
    pub bundle: String,
    /// Its link, in [`LINKS_DIR`]: `<namespace>_<route>.pem` where it fits.
    pub link: String,
}

/// The names of `route`'s bundle and link; see the [module documentation](self) for
/// names too long to keep whole.
pub fn bundle_names(route: &RouteKey) -> Result<BundleNames, UnsafeName> {
    check(route)?;
    let (namespace, name) = (&*route.namespace, &*route.name);
    let whole = namespace.len() + 1 + name.len() + BUNDLE_SUFFIX.len();
    if whole <= MAX_FILE_NAME {
        return Ok(BundleNames {
            bundle: format!("{namespace}:{name}{BUNDLE_SUFFIX}"),
            link: format!("{namespace}_{name}{BUNDLE_SUFFIX}"),
        });
    }
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{namespace}/{name}").as_bytes(),
    );
    let hash: String = digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect::<String>()[..HASH_DIGITS]
        .to_owned();
    // Namespaces are DNS labels (at most 63 characters): kept whole in practice.
    let fixed = 1 + 1 + HASH_DIGITS + BUNDLE_SUFFIX.len();
    let namespace = &namespace[..namespace.len().min(63)];
    let keep = MAX_FILE_NAME - fixed - namespace.len();
    // Kubernetes names are ASCII (checked above): any byte index is a boundary.
    let name = &name[..name.len().min(keep)];
    Ok(BundleNames {
        bundle: format!("{namespace}:{name}{HASH_MARKER}{hash}{BUNDLE_SUFFIX}"),
        link: format!("{namespace}_{name}{HASH_MARKER}{hash}{BUNDLE_SUFFIX}"),
    })
}

/// Whether `file_name`, in the cert directory, is a bundle certwatch wrote.
pub fn is_bundle_file_name(file_name: &str) -> bool {
    !file_name.starts_with('.') && file_name.ends_with(BUNDLE_SUFFIX) && file_name.contains(':')
}

/// Whether `file_name`, in [`LINKS_DIR`], is a link certwatch made.
pub fn is_link_file_name(file_name: &str) -> bool {
    !file_name.starts_with('.') && file_name.ends_with(BUNDLE_SUFFIX) && !file_name.contains(':')
}

/// The bundle a link in [`LINKS_DIR`] stands for (the first `_` back to `:`).
pub fn bundle_name_of_link(link: &str) -> String {
    link.replacen('_', ":", 1)
}

/// The link in [`LINKS_DIR`] of a bundle (the first `:` to `_`).
pub fn link_name_of_bundle(bundle: &str) -> String {
    bundle.replacen(':', "_", 1)
}

/// A prepared cert directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedDir {
    /// Its absolute path (as the crt-list must name files).
    pub path: PathBuf,
    /// Whether certwatch owns it (and so restricted it to [`DIR_MODE`]); when not, its
    /// mode is left as it was.
    pub owned: bool,
    /// Its permission bits now.
    pub mode: u32,
}

/// A cert directory certwatch does not own that every user may write, without the
/// sticky bit: anyone could replace the files in it.
#[derive(Debug, thiserror::Error)]
#[error(
    "it is writable by every user and has no sticky bit (mode {mode:04o}, owner uid {owner}), \
so any user could rename or replace the bundles and the crt-list in it; set the sticky bit \
(`chmod +t {}`; a Kubernetes emptyDir with `medium: Memory` has it), or give certwatch a \
directory that only its user can write, or a path that does not exist yet (certwatch then \
creates it, mode 0700)",
    path.display()
)]
pub struct InsecureDir {
    /// The directory.
    pub path: PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// Its owner.
    pub owner: u32,
}

/// Restricts `dir` to [`DIR_MODE`] if this process owns it; returns whether it does and
/// the mode the directory has afterwards. A directory owned by another user that every
/// user may write without the sticky bit is refused ([`InsecureDir`], as an
/// [`io::ErrorKind::PermissionDenied`] error).
fn restrict_if_owned(dir: &Path) -> io::Result<(bool, u32)> {
    let metadata = fs::metadata(dir)?;
    let owned = metadata.uid() == rustix::process::geteuid().as_raw();
    let mode = metadata.mode() & 0o7777;
    if owned && mode != DIR_MODE {
        fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
        return Ok((true, DIR_MODE));
    }
    if !owned && mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            InsecureDir {
                path: dir.to_owned(),
                mode,
                owner: metadata.uid(),
            },
        ));
    }
    Ok((owned, mode))
}

/// Creates `dir` (and [`LINKS_DIR`] in it) if needed, restricts both to mode 0700 where
/// certwatch owns them, removes temporary files a crash left behind, and returns the
/// directory's absolute path.
pub fn prepare_dir(dir: &Path) -> io::Result<PreparedDir> {
    fs::create_dir_all(dir)?;
    let (owned, mode) = restrict_if_owned(dir)?;
    let dir = fs::canonicalize(dir)?;
    let links = dir.join(LINKS_DIR);
    fs::create_dir_all(&links)?;
    restrict_if_owned(&links)?;
    for parent in [&dir, &links] {
        for entry in fs::read_dir(parent)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().contains(TEMP_MARKER) {
                remove_if_present(&entry.path())?;
            }
        }
    }
    Ok(PreparedDir {
        path: dir,
        owned,
        mode,
    })
}

/// A temporary file written next to its final name, not yet durable nor in place.
#[derive(Debug)]
pub struct PendingFile {
    temp: PathBuf,
    target: PathBuf,
}

impl PendingFile {
    /// Puts the file in place (atomically replacing the old one). Its content must
    /// have been made durable first ([`sync_filesystem`] or `File::sync_all`).
    pub fn commit(self) -> io::Result<()> {
        fs::rename(&self.temp, &self.target).inspect_err(|_| {
            let _ = fs::remove_file(&self.temp);
        })
    }

    /// Drops the temporary file.
    pub fn discard(self) {
        let _ = fs::remove_file(&self.temp);
    }
}

fn write_temp(dir: &Path, name: &str, contents: &[u8], sync: bool) -> io::Result<PendingFile> {
    let temp = dir.join(format!(
        ".{name}{TEMP_MARKER}{:016x}",
        rand::random::<u64>()
    ));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&temp)?;
        // The umask can only remove bits: where it removes some of the file's, set
        // the mode exactly (one more system call per file, which a umask that leaves
        // them, 022 or 077 as usual, does not need).
        if !umask_keeps_file_mode() {
            file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
        }
        file.write_all(contents)?;
        if sync {
            file.sync_all()?;
        }
        Ok(())
    })();
    match result {
        Ok(()) => Ok(PendingFile {
            temp,
            target: dir.join(name),
        }),
        Err(error) => {
            let _ = fs::remove_file(&temp);
            Err(error)
        }
    }
}

/// Whether a file created with [`FILE_MODE`] gets exactly that mode: the process's
/// umask, read once (nothing in certwatch changes it), removes none of its bits. When
/// the umask cannot be read, `false`: the mode is then set after each create.
fn umask_keeps_file_mode() -> bool {
    static KEEPS: OnceLock<bool> = OnceLock::new();
    *KEEPS.get_or_init(|| {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| umask_of_status(&status))
            .is_some_and(|umask| umask & FILE_MODE == 0)
    })
}

/// The `Umask:` field of `/proc/<pid>/status` (Linux 4.7 and later), in octal.
fn umask_of_status(status: &str) -> Option<u32> {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix("Umask:"))?;
    u32::from_str_radix(value.trim(), 8).ok()
}

/// Writes `contents` to a temporary file for `dir/name`, mode 0600, without flushing
/// it: flush a batch with [`sync_filesystem`], then [`PendingFile::commit`] each.
pub fn write_pending(dir: &Path, name: &str, contents: &[u8]) -> io::Result<PendingFile> {
    write_temp(dir, name, contents, false)
}

/// Replaces `dir/name` with `contents` atomically, mode 0600: temporary file, fsync,
/// rename. The directory entry is durable only after [`sync_dir`].
pub fn write_atomic(dir: &Path, name: &str, contents: &[u8]) -> io::Result<()> {
    write_temp(dir, name, contents, true)?.commit()
}

/// Flushes every file of the filesystem holding `dir` to disk (`syncfs`).
pub fn sync_filesystem(dir: &Path) -> io::Result<()> {
    let handle = File::open(dir)?;
    rustix::fs::syncfs(&handle).map_err(io::Error::from)
}

/// Points `links_dir/link` at `../target` (relative, so the directory can be mounted
/// anywhere), replacing whatever was there.
pub fn ensure_link(links_dir: &Path, link: &str, target: &str) -> io::Result<()> {
    let path = links_dir.join(link);
    let wanted = Path::new("..").join(target);
    // A link that does not exist yet (every route's, at a first start) is created in
    // place: `symlink` is atomic and refuses to replace anything, so one call suffices.
    match std::os::unix::fs::symlink(&wanted, &path) {
        Ok(()) => return Ok(()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    if fs::read_link(&path).is_ok_and(|current| current == wanted) {
        return Ok(());
    }
    let temp = links_dir.join(format!(
        ".{link}{TEMP_MARKER}{:016x}",
        rand::random::<u64>()
    ));
    std::os::unix::fs::symlink(&wanted, &temp)?;
    fs::rename(&temp, &path).inspect_err(|_| {
        let _ = fs::remove_file(&temp);
    })
}

/// Removes `path`; a file that is already gone is not an error. Returns whether it
/// existed.
pub fn remove_if_present(path: &Path) -> io::Result<bool> {
    match fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Flushes `dir`'s entries (renames, removals) to disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// A temporary directory for bundles, memory-backed (`/dev/shm`) where the system has
/// one, as a deployment's `emptyDir` should be: bundles hold keys, and a disk adds its
/// metadata latency to every file (about 1 ms per created file on this project's CI
/// disks, so seconds at thousands of routes).
pub fn memory_backed_tempdir(prefix: &str) -> io::Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    let shm = Path::new("/dev/shm");
    match shm.is_dir().then(|| builder.tempdir_in(shm)) {
        Some(Ok(temp)) => Ok(temp),
        _ => builder.tempdir(),
    }
}

/// The DER of the first `CERTIFICATE` block in `pem` (the server certificate of a
/// bundle).
pub fn first_certificate_der(pem: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let start = pem.find(BEGIN)? + BEGIN.len();
    let end = start + pem[start..].find(END)?;
    let body: String = pem[start..end]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD.decode(body).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_ordinary_routes_are_kept_whole() {
        let names = bundle_names(&RouteKey::new("team-a", "shop.v2")).unwrap();
        assert_eq!(names.bundle, "team-a:shop.v2.pem");
        assert_eq!(names.link, "team-a_shop.v2.pem");
        assert!(is_bundle_file_name(&names.bundle));
        assert!(is_link_file_name(&names.link));
        assert!(!is_bundle_file_name("crt-list"));
        assert!(!is_bundle_file_name(".team-a:x.pem.tmp-1"));
    }

    /// (namespace length, route length): the longest valid names, and the edges of
    /// the limit.
    #[test]
    fn long_names_fit_and_stay_distinct() {
        let whole_limit = MAX_FILE_NAME - 1 - BUNDLE_SUFFIX.len();
        let cases = [
            (63, 253),
            (63, whole_limit - 63),
            (63, whole_limit - 63 + 1),
            (1, 253),
            (63, 200),
        ];
        let mut seen = std::collections::HashSet::new();
        for (namespace_len, name_len) in cases {
            let route = RouteKey::new("n".repeat(namespace_len), "r".repeat(name_len));
            let names = bundle_names(&route).unwrap();
            let temp = format!(".{}{TEMP_MARKER}{:016x}", names.bundle, u64::MAX);
            assert!(
                temp.len() <= 255,
                "{namespace_len}+{name_len}: {}",
                temp.len()
            );
            assert_eq!(names.bundle.len(), names.link.len());
            let whole = namespace_len + 1 + name_len + BUNDLE_SUFFIX.len() <= MAX_FILE_NAME;
            assert_eq!(
                !names.bundle.contains(HASH_MARKER),
                whole,
                "{}",
                names.bundle
            );
            assert!(is_bundle_file_name(&names.bundle));
            assert_eq!(bundle_name_of_link(&names.link), names.bundle);
            assert_eq!(link_name_of_bundle(&names.bundle), names.link);
            assert!(seen.insert(names.bundle));
        }
        // Two long routes that share their first 200 characters get different names.
        let prefix = "x".repeat(200);
        let a = bundle_names(&RouteKey::new("ns", format!("{prefix}-a"))).unwrap();
        let b = bundle_names(&RouteKey::new("ns", format!("{prefix}-b"))).unwrap();
        assert_ne!(a, b);
        // The 255-byte limit, on a real directory: the name and its temporary sibling.
        let dir = tempfile::tempdir().unwrap();
        let route = RouteKey::new("n".repeat(63), "r".repeat(253));
        let names = bundle_names(&route).unwrap();
        write_atomic(dir.path(), &names.bundle, b"x").unwrap();
    }

    #[test]
    fn unsafe_names_are_refused() {
        for (namespace, name) in [
            ("a", "../b"),
            ("a/b", "c"),
            ("", "c"),
            ("a", "B"),
            ("a_b", "c"),
            ("a", "b~c"),
        ] {
            assert!(bundle_names(&RouteKey::new(namespace, name)).is_err());
        }
    }

    #[test]
    fn atomic_write_sets_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let root = prepare_dir(&dir.path().join("certs")).unwrap().path;
        assert_eq!(
            fs::metadata(&root).unwrap().permissions().mode() & 0o777,
            DIR_MODE
        );
        write_atomic(&root, "a:b.pem", b"one").unwrap();
        write_atomic(&root, "a:b.pem", b"two").unwrap();
        let path = root.join("a:b.pem");
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            FILE_MODE
        );
        let names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(names.iter().all(|n| !n.contains(TEMP_MARKER)), "{names:?}");

        ensure_link(&root.join(LINKS_DIR), "a_b.pem", "a:b.pem").unwrap();
        ensure_link(&root.join(LINKS_DIR), "a_b.pem", "a:b.pem").unwrap();
        assert_eq!(
            fs::read(root.join(LINKS_DIR).join("a_b.pem")).unwrap(),
            b"two"
        );
    }

    #[test]
    fn the_umask_is_read_from_the_process_status() {
        let status = "Name:\tcertwatch\nUmask:\t0022\nState:\tR (running)\n";
        assert_eq!(umask_of_status(status), Some(0o022));
        assert_eq!(umask_of_status("Umask:\t0077\n"), Some(0o077));
        assert_eq!(umask_of_status("Umask:\t0277"), Some(0o277));
        assert_eq!(umask_of_status("Name:\tx\n"), None);
        assert_eq!(umask_of_status("Umask:\t08\n"), None);
        // This process's own: the kernel has the field, and the decision follows it.
        let own = fs::read_to_string("/proc/self/status").unwrap();
        let umask = umask_of_status(&own).unwrap();
        assert_eq!(umask_keeps_file_mode(), umask & FILE_MODE == 0);
    }

    #[test]
    fn leftover_temp_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".x:y.pem.tmp-00");
        fs::write(&stale, b"partial").unwrap();
        prepare_dir(dir.path()).unwrap();
        assert!(!stale.exists());
    }
}
