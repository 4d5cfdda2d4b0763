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
//! The directory is mode 0700. Every file is replaced atomically: written to a
//! temporary file in the same directory, flushed to disk, then renamed over the old
//! one, so a reader sees the old content or the new, never a mix.
//!
//! A batch of bundles is flushed with one `syncfs` instead of one `fsync` per file:
//! ext4 serialises fsyncs on its journal (about 1 ms each here, whatever the
//! parallelism), which would make writing 2,000 bundles cost seconds. The order is the
//! same as per file: every temporary file is durable before any rename.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use route_secrets::route::RouteKey;

/// Name of the crt-list file in the cert directory.
pub const CRT_LIST_FILE: &str = "crt-list";
/// Sub-directory holding the colon-free links the crt-list names.
pub const LINKS_DIR: &str = "links";
/// Mode of the cert directory and its sub-directory.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file written (bundles hold private keys).
pub const FILE_MODE: u32 = 0o600;

const BUNDLE_SUFFIX: &str = ".pem";
const TEMP_MARKER: &str = ".tmp-";

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
/// here (`:` and `_`): what Kubernetes allows in namespace and route names.
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

/// `<namespace>:<route>.pem`.
pub fn bundle_file_name(route: &RouteKey) -> Result<String, UnsafeName> {
    check(route)?;
    Ok(format!("{}:{}{BUNDLE_SUFFIX}", route.namespace, route.name))
}

/// `<namespace>_<route>.pem`, the link's name in [`LINKS_DIR`].
pub fn link_file_name(route: &RouteKey) -> Result<String, UnsafeName> {
    check(route)?;
    Ok(format!("{}_{}{BUNDLE_SUFFIX}", route.namespace, route.name))
}

/// The route a bundle file name belongs to, if it is one.
pub fn parse_bundle_file_name(file_name: &str) -> Option<RouteKey> {
    let stem = file_name.strip_suffix(BUNDLE_SUFFIX)?;
    let (namespace, name) = stem.split_once(':')?;
    let route = RouteKey::new(namespace, name);
    check(&route).ok().map(|()| route)
}

/// The route a link file name belongs to, if it is one.
pub fn parse_link_file_name(file_name: &str) -> Option<RouteKey> {
    let stem = file_name.strip_suffix(BUNDLE_SUFFIX)?;
    let (namespace, name) = stem.split_once('_')?;
    let route = RouteKey::new(namespace, name);
    check(&route).ok().map(|()| route)
}

/// Creates `dir` (and [`LINKS_DIR`] in it) if needed, restricts both to mode 0700,
/// removes temporary files a crash left behind, and returns the directory's absolute
/// path (as the crt-list must name files).
pub fn prepare_dir(dir: &Path) -> io::Result<PathBuf> {
    fs::create_dir_all(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(DIR_MODE))?;
    let dir = fs::canonicalize(dir)?;
    let links = dir.join(LINKS_DIR);
    fs::create_dir_all(&links)?;
    fs::set_permissions(&links, fs::Permissions::from_mode(DIR_MODE))?;
    for parent in [&dir, &links] {
        for entry in fs::read_dir(parent)? {
            let entry = entry?;
            if entry.file_name().to_string_lossy().contains(TEMP_MARKER) {
                remove_if_present(&entry.path())?;
            }
        }
    }
    Ok(dir)
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
        // The umask can only remove bits; make the mode exact anyway.
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))?;
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
    fn names_round_trip() {
        let route = RouteKey::new("team-a", "shop.v2");
        assert_eq!(bundle_file_name(&route).unwrap(), "team-a:shop.v2.pem");
        assert_eq!(link_file_name(&route).unwrap(), "team-a_shop.v2.pem");
        assert_eq!(
            parse_bundle_file_name("team-a:shop.v2.pem"),
            Some(route.clone())
        );
        assert_eq!(parse_link_file_name("team-a_shop.v2.pem"), Some(route));
        assert_eq!(parse_bundle_file_name("crt-list"), None);
        assert_eq!(parse_bundle_file_name(".team-a:x.pem.tmp-1"), None);
    }

    #[test]
    fn unsafe_names_are_refused() {
        for (namespace, name) in [
            ("a", "../b"),
            ("a/b", "c"),
            ("", "c"),
            ("a", "B"),
            ("a_b", "c"),
        ] {
            assert!(bundle_file_name(&RouteKey::new(namespace, name)).is_err());
        }
    }

    #[test]
    fn atomic_write_sets_mode_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let root = prepare_dir(&dir.path().join("certs")).unwrap();
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
    fn leftover_temp_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let stale = dir.path().join(".x:y.pem.tmp-00");
        fs::write(&stale, b"partial").unwrap();
        prepare_dir(dir.path()).unwrap();
        assert!(!stale.exists());
    }
}
