//! The metrics endpoint's serving certificate: from files (`--metrics-tls-cert`,
//! `--metrics-tls-key`, e.g. OpenShift's service CA's serving-cert secret), read again
//! when they change (the service CA rotates them, the kubelet swaps the mounted
//! files), or, without files, a self-signed one made at start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use kube_common::sync;
use rustls::crypto::ring::sign::any_supported_type;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_util::sync::CancellationToken;

/// How often the certificate files are compared with what is served.
const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// Why a serving certificate cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ServingCertError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{path} holds no PEM certificate: {detail}")]
    NoCertificate {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        detail: String,
    },
    /// The key file holds no usable PEM private key.
    #[error("{path} holds no usable PEM private key (PKCS#8, PKCS#1 or SEC1): {detail}")]
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM reader or rustls said (never the key).
        detail: String,
    },
    /// The key does not belong to the certificate.
    #[error("the key in {key} does not match the certificate in {cert}: {detail}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// The self-signed certificate could not be made.
    #[error("cannot make a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

/// The certificate and key files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertFiles {
    /// The certificate chain (PEM), leaf first.
    pub cert: PathBuf,
    /// The private key (PEM).
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, ServingCertError> {
    std::fs::read(path).map_err(|source| ServingCertError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Parses the files' contents into a certified key.
fn certified_key(
    files: &CertFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<CertifiedKey, ServingCertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|error| ServingCertError::NoCertificate {
            path: files.cert.clone(),
            detail: error.to_string(),
        })?;
    if chain.is_empty() {
        return Err(ServingCertError::NoCertificate {
            path: files.cert.clone(),
            detail: "no CERTIFICATE block".to_owned(),
        });
    }
    let no_key = |detail: String| ServingCertError::NoKey {
        path: files.key.clone(),
        detail,
    };
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| no_key(error.to_string()))?;
    let key = any_supported_type(&key).map_err(|error| no_key(error.to_string()))?;
    let certified = CertifiedKey::new(chain, key);
    certified
        .keys_match()
        .map_err(|error| ServingCertError::Mismatch {
            cert: files.cert.clone(),
            key: files.key.clone(),
            detail: error.to_string(),
        })?;
    Ok(certified)
}

/// A self-signed certificate for `localhost`, `127.0.0.1` and this host's name.
fn self_signed() -> Result<CertifiedKey, ServingCertError> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && host != "localhost" {
            names.push(host.to_owned());
        }
    }
    let key = rcgen::KeyPair::generate()?;
    let params = rcgen::CertificateParams::new(names)?;
    let cert = params.self_signed(&key)?;
    let der =
        PrivateKeyDer::try_from(key.serialize_der()).map_err(|error| ServingCertError::NoKey {
            path: PathBuf::from("(self-signed)"),
            detail: error.to_owned(),
        })?;
    let signing = any_supported_type(&der).map_err(|error| ServingCertError::NoKey {
        path: PathBuf::from("(self-signed)"),
        detail: error.to_string(),
    })?;
    Ok(CertifiedKey::new(vec![cert.der().clone()], signing))
}

/// The SHA-256 fingerprint of a certificate, as `openssl x509 -fingerprint -sha256`
/// prints it.
pub fn fingerprint(cert: &CertificateDer<'_>) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, cert.as_ref());
    digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Hands rustls the current serving certificate.
#[derive(Debug)]
pub struct ServingCert {
    /// Guards the certificate served now; replaced when the files change. Held only
    /// to clone or swap the `Arc`.
    current: RwLock<Arc<CertifiedKey>>,
    files: Option<CertFiles>,
}

impl ServingCert {
    /// The certificate in `files`, or a self-signed one without.
    pub fn load(files: Option<CertFiles>) -> Result<Arc<Self>, ServingCertError> {
        let key = match &files {
            Some(files) => certified_key(files, &read(&files.cert)?, &read(&files.key)?)?,
            None => self_signed()?,
        };
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(key)),
            files,
        }))
    }

    /// The leaf certificate served now.
    pub fn leaf(&self) -> Option<CertificateDer<'static>> {
        self.current().cert.first().cloned()
    }

    /// Whether the certificate is self-signed (no files given).
    pub fn is_self_signed(&self) -> bool {
        self.files.is_none()
    }

    fn current(&self) -> Arc<CertifiedKey> {
        sync::read(&self.current).clone()
    }

    /// Reads the files again; replaces the served certificate when they hold another
    /// valid one. `Ok(true)`: replaced.
    pub fn reload(&self) -> Result<bool, ServingCertError> {
        let Some(files) = &self.files else {
            return Ok(false);
        };
        let key = certified_key(files, &read(&files.cert)?, &read(&files.key)?)?;
        if key.cert == self.current().cert {
            return Ok(false);
        }
        *sync::write(&self.current) = Arc::new(key);
        Ok(true)
    }

    /// Compares the files with what is served every [`RELOAD_INTERVAL`] until
    /// `shutdown`; a file that cannot be used leaves the current certificate in place
    /// and is logged once per distinct problem.
    pub fn spawn_reloads(self: &Arc<Self>, shutdown: CancellationToken) {
        if self.files.is_none() {
            return;
        }
        let cert = Arc::clone(self);
        tokio::spawn(async move {
            let mut last_problem = None;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(RELOAD_INTERVAL) => {}
                }
                match cert.reload() {
                    Ok(true) => {
                        last_problem = None;
                        if let Some(leaf) = cert.leaf() {
                            tracing::info!(
                                sha256 = %fingerprint(&leaf),
                                "the metrics endpoint serves a new certificate"
                            );
                        }
                    }
                    Ok(false) => last_problem = None,
                    Err(error) => {
                        let text = error.to_string();
                        if last_problem.as_ref() != Some(&text) {
                            tracing::warn!(%error, "the metrics endpoint keeps its certificate");
                            last_problem = Some(text);
                        }
                    }
                }
            }
        });
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}
