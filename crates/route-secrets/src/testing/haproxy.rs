//! Asks a real HAProxy whether it loads TLS material: `haproxy -c` on a configuration
//! whose `bind` loads a crt-list.
//!
//! HAProxy refuses the whole configuration, every certificate of every route, when one
//! line of a crt-list names a bundle it cannot load: a weak key or signature for its
//! OpenSSL, a key that does not match, a broken chain. [`HaproxyCheck::bundles`] writes
//! bundles as certwatch's daemon does (chain then key in one PEM file, one crt-list line
//! `<file> <sni>` each) and checks them; [`HaproxyCheck::crt_list`] checks a crt-list
//! written by someone else (the daemon's cert dir). Both need Debian's `haproxy` on the
//! PATH (or the binary named by `CERTWATCH_HAPROXY`); without it they return an error,
//! so that a test fails rather than passes without having asked.
//!
//! Files go to a fresh private directory under the system temporary directory, removed
//! afterwards. The verdict's message is HAProxy's own (its `[ALERT]` lines).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use rcgen::{CertificateParams, KeyPair};

use crate::tls::SecurityLevel;

/// Environment variable naming the HAProxy binary to use instead of `haproxy`.
pub const HAPROXY_BINARY_ENV: &str = "CERTWATCH_HAPROXY";

/// Distinguishes the scratch directories of concurrent checks in one process.
static SCRATCH_COUNTER: AtomicU64 = AtomicU64::new(0);

/// What `haproxy -c` said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The configuration, and so every certificate, loads.
    Accepted,
    /// HAProxy refuses the configuration.
    Refused {
        /// HAProxy's `[ALERT]` lines (or its whole output when there are none).
        message: String,
    },
}

impl Verdict {
    /// Whether HAProxy loads the configuration.
    pub fn is_accepted(&self) -> bool {
        matches!(self, Self::Accepted)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Accepted => f.write_str("accepted"),
            Self::Refused { message } => write!(f, "refused: {message}"),
        }
    }
}

/// A bundle to load: the PEM file's content and the SNI filter of its crt-list line.
#[derive(Clone, Copy)]
pub struct Bundle<'a> {
    /// Chain then key, as one PEM text.
    pub pem: &'a str,
    /// The SNI filter (a host name, or `*.<domain>`); `None` for a line without one.
    pub sni: Option<&'a str>,
}

/// Shows the SNI only: the PEM holds a private key.
impl fmt::Debug for Bundle<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bundle")
            .field("pem_len", &self.pem.len())
            .field("sni", &self.sni)
            .finish()
    }
}

/// A HAProxy binary that answers `-v`, and a default certificate for its `bind` lines.
#[derive(Debug, Clone)]
pub struct HaproxyCheck {
    binary: PathBuf,
    version: String,
    /// A self-signed certificate and key, so that a `bind` always has a certificate even
    /// when the crt-list under test is empty (as HAProxy requires).
    default_pem: String,
    /// The OpenSSL security level HAProxy runs at (through `OPENSSL_CONF`); `None`: its
    /// OpenSSL's own default (Debian's: 2).
    level: Option<SecurityLevel>,
}

impl HaproxyCheck {
    /// Finds HAProxy (`$CERTWATCH_HAPROXY`, else `haproxy` on the PATH) and asks its
    /// version; an error if it cannot be run.
    pub fn new() -> io::Result<Self> {
        let binary = std::env::var_os(HAPROXY_BINARY_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("haproxy"));
        let output = Command::new(&binary).arg("-v").output().map_err(|error| {
            io::Error::new(
                error.kind(),
                format!(
                    "cannot run {} (install Debian's haproxy, or set {HAPROXY_BINARY_ENV}): {error}",
                    binary.display()
                ),
            )
        })?;
        let version = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        if !output.status.success() || !version.starts_with("HAProxy version") {
            return Err(io::Error::other(format!(
                "{} -v did not answer like HAProxy: {version:?}",
                binary.display()
            )));
        }
        let default_pem = default_certificate()?;
        Ok(Self {
            binary,
            version,
            default_pem,
            level: None,
        })
    }

    /// The same HAProxy, run at OpenSSL security `level` (as the router image runs
    /// HAProxy at 1), through an `OPENSSL_CONF` written for each check.
    pub fn at_level(self, level: SecurityLevel) -> Self {
        Self {
            level: Some(level),
            ..self
        }
    }

    /// The first line of `haproxy -v`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Writes each bundle to its own file, a crt-list naming them in order, and checks a
    /// configuration loading that crt-list.
    pub fn bundles(&self, bundles: &[Bundle<'_>]) -> io::Result<Verdict> {
        let scratch = Scratch::new()?;
        let mut crt_list = String::new();
        for (index, bundle) in bundles.iter().enumerate() {
            let path = scratch.path.join(format!("bundle-{index}.pem"));
            write_private(&path, bundle.pem)?;
            crt_list.push_str(&path.to_string_lossy());
            if let Some(sni) = bundle.sni {
                crt_list.push(' ');
                crt_list.push_str(sni);
            }
            crt_list.push('\n');
        }
        let list_path = scratch.path.join("crt-list");
        write_private(&list_path, &crt_list)?;
        self.check(&scratch, &list_path)
    }

    /// Checks a configuration loading an existing crt-list (and the bundles it names).
    pub fn crt_list(&self, crt_list: &Path) -> io::Result<Verdict> {
        let scratch = Scratch::new()?;
        self.check(&scratch, crt_list)
    }

    fn check(&self, scratch: &Scratch, crt_list: &Path) -> io::Result<Verdict> {
        let default = scratch.path.join("default.pem");
        write_private(&default, &self.default_pem)?;
        let config = scratch.path.join("haproxy.cfg");
        // `haproxy -c` parses and loads every certificate but binds nothing, so the port
        // is never opened.
        write_private(
            &config,
            &format!(
                "global\n  log stderr format raw local0\n\
                 defaults\n  mode tcp\n  timeout connect 5s\n  timeout client 5s\n  timeout server 5s\n\
                 frontend tls\n  bind 127.0.0.1:8443 ssl crt {default} crt-list {list}\n  default_backend nowhere\n\
                 backend nowhere\n  server nowhere 127.0.0.1:9\n",
                default = default.display(),
                list = crt_list.display(),
            ),
        )?;
        let mut command = Command::new(&self.binary);
        command.arg("-c").arg("-f").arg(&config);
        if let Some(level) = self.level {
            let openssl_conf = scratch.path.join("openssl.cnf");
            write_private(&openssl_conf, &level.openssl_conf())?;
            command.env("OPENSSL_CONF", &openssl_conf);
        }
        let output = command.output()?;
        if output.status.success() {
            return Ok(Verdict::Accepted);
        }
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let alerts: Vec<&str> = text
            .lines()
            .filter(|line| line.contains("[ALERT]"))
            .collect();
        let message = if alerts.is_empty() {
            text.trim().to_owned()
        } else {
            alerts.join("\n")
        };
        Ok(Verdict::Refused { message })
    }
}

/// A self-signed P-256 certificate and its key, as one PEM.
fn default_certificate() -> io::Result<String> {
    let key = KeyPair::generate().map_err(io::Error::other)?;
    let certificate = CertificateParams::new(vec!["default.invalid".to_owned()])
        .and_then(|params| params.self_signed(&key))
        .map_err(io::Error::other)?;
    Ok(format!("{}{}", certificate.pem(), key.serialize_pem()))
}

/// Writes a file readable by its owner only: it may hold a private key.
fn write_private(path: &Path, contents: &str) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents.as_bytes())
}

/// A private scratch directory, removed when dropped.
struct Scratch {
    path: PathBuf,
}

impl Scratch {
    fn new() -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        let path = std::env::temp_dir().join(format!(
            "certwatch-haproxy-check-{}-{}",
            std::process::id(),
            SCRATCH_COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // Best effort: a leftover directory under /tmp is harmless.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
