//! Where the control plane's binaries come from, and unpacking them once per machine.
//!
//! The shared tool directory (`<workspace>/../shared/tools/kube-apiserver`, or the one
//! named by `CERTWATCH_TEST_CONTROL_PLANE`) holds `bin/kube-apiserver.xz`,
//! `bin/etcd.xz` and `route.crd.yaml`. Unpacked, the two binaries take about 145 MB, so
//! they are unpacked into a cache directory keyed by the hash of each `.xz`: every test,
//! every test binary and every worktree on the machine shares one copy, and a new
//! version of the tool gets a new key instead of a stale binary.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use crate::error::TestEnvError;

/// The variable naming another tool directory than the shared one.
pub const CONTROL_PLANE_ENV: &str = "CERTWATCH_TEST_CONTROL_PLANE";

/// The executables and the Route CRD a control plane is started from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binaries {
    /// The tool directory they were found in.
    pub tool_dir: PathBuf,
    /// The kube-apiserver executable.
    pub kube_apiserver: PathBuf,
    /// The etcd executable (the tool's own, single-member etcd 3.6).
    pub etcd: PathBuf,
    /// The Route CRD as MicroShift installs it.
    pub route_crd: PathBuf,
}

/// The shared tool directory beside the workspace, as the project lays it out.
pub fn default_tool_dir() -> PathBuf {
    // CARGO_MANIFEST_DIR is <workspace>/crates/testenv.
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/kube-apiserver")
}

/// The tool directory this run uses: `CERTWATCH_TEST_CONTROL_PLANE` if set, else the
/// shared one. Fails, saying how to get one, when it holds no control plane.
pub fn tool_dir() -> Result<PathBuf, TestEnvError> {
    match std::env::var_os(CONTROL_PLANE_ENV) {
        Some(dir) if !dir.is_empty() => check_tool_dir(PathBuf::from(dir), true),
        _ => check_tool_dir(default_tool_dir(), false),
    }
}

/// `dir` if it holds a control plane (`from_env` says where it came from, for the
/// message when it does not).
pub fn check_tool_dir(dir: PathBuf, from_env: bool) -> Result<PathBuf, TestEnvError> {
    let has_binaries = ["kube-apiserver", "etcd"].iter().all(|name| {
        let bin = dir.join("bin");
        bin.join(name).is_file() || bin.join(format!("{name}.xz")).is_file()
    });
    if !has_binaries || !dir.join("route.crd.yaml").is_file() {
        return Err(TestEnvError::ControlPlaneNotFound { dir, from_env });
    }
    Ok(dir.canonicalize().unwrap_or(dir))
}

/// Tool directories already unpacked by this process, with their binaries. A test
/// binary runs many control planes; only the first pays for hashing the archives.
static UNPACKED: Mutex<Vec<Binaries>> = Mutex::new(Vec::new());

/// The binaries of the tool directory, unpacked into the machine-wide cache if they
/// are not yet. Blocking (hashing and `xz`): call it from a blocking context.
pub fn binaries() -> Result<Binaries, TestEnvError> {
    let tool_dir = tool_dir()?;
    // Guards the list of unpacked tool directories. Held while unpacking (blocking
    // work, never an await) so that concurrent tests of one binary unpack once.
    let mut unpacked = kube_common::sync::lock(&UNPACKED);
    if let Some(found) = unpacked.iter().find(|found| found.tool_dir == tool_dir) {
        return Ok(found.clone());
    }
    let binaries = Binaries {
        kube_apiserver: executable(&tool_dir, "kube-apiserver")?,
        etcd: executable(&tool_dir, "etcd")?,
        route_crd: tool_dir.join("route.crd.yaml"),
        tool_dir,
    };
    unpacked.push(binaries.clone());
    Ok(binaries)
}

/// `bin/<name>` if the tool directory ships it unpacked, else `bin/<name>.xz` unpacked
/// into the cache.
fn executable(tool_dir: &Path, name: &str) -> Result<PathBuf, TestEnvError> {
    let plain = tool_dir.join("bin").join(name);
    if plain.is_file() {
        return Ok(plain);
    }
    let archive = tool_dir.join("bin").join(format!("{name}.xz"));
    let key = sha256_hex(&archive)?;
    let cache = std::env::temp_dir()
        .join("certwatch-testenv")
        .join(&key[..16]);
    let target = cache.join(name);
    if target.is_file() {
        return Ok(target);
    }
    unpack(&archive, &cache, &target)?;
    Ok(target)
}

/// Unpacks `archive` to `target` through a temporary file in the same directory, renamed
/// into place only when complete: another process unpacking at the same time, or one
/// killed half-way, never leaves a truncated binary under the final name.
fn unpack(archive: &Path, cache: &Path, target: &Path) -> Result<(), TestEnvError> {
    let io = |what: &str, source| TestEnvError::Io {
        what: format!("{what} {}", target.display()),
        source,
    };
    std::fs::create_dir_all(cache).map_err(|source| io("creating the directory of", source))?;
    let partial = tempfile::NamedTempFile::new_in(cache)
        .map_err(|source| io("creating a temporary file for", source))?;
    let output = partial
        .reopen()
        .map_err(|source| io("opening a temporary file for", source))?;
    let status = Command::new("xz")
        .arg("-dc")
        .arg(archive)
        .stdin(Stdio::null())
        .stdout(output)
        .stderr(Stdio::piped())
        .output()
        .map_err(|source| TestEnvError::Unpack {
            archive: archive.to_path_buf(),
            reason: format!("cannot run xz ({source}); install it, e.g. apt-get install xz-utils"),
        })?;
    if !status.status.success() {
        return Err(TestEnvError::Unpack {
            archive: archive.to_path_buf(),
            reason: String::from_utf8_lossy(&status.stderr).trim().to_owned(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(partial.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|source| io("making executable", source))?;
    }
    partial
        .persist(target)
        .map_err(|error| io("moving into place", error.error))?;
    Ok(())
}

/// The SHA-256 of a file, in hex.
fn sha256_hex(path: &Path) -> Result<String, TestEnvError> {
    let io = |source| TestEnvError::Io {
        what: format!("reading {}", path.display()),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = file.read(&mut buffer).map_err(io)?;
        if read == 0 {
            break;
        }
        context.update(&buffer[..read]);
    }
    Ok(context
        .finish()
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}
