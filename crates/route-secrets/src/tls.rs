//! Validation of the TLS material in a `kubernetes.io/tls` secret, with the OpenShift
//! router's rules plus what HAProxy refuses.
//!
//! [`TlsValidator::validate`] admits what the router admits (openshift/router:
//! `routeapihelpers.ExtendedValidateRoute` after the secret's `tls.crt` and `tls.key` were
//! copied into the route) and, on top of that, rejects what would make HAProxy refuse the
//! whole crt-list, so that one tenant's secret cannot break TLS for every other one. The
//! checks run in this order and the first failure is reported as a [`TlsRejection`]:
//!
//! 1. the secret type is `kubernetes.io/tls`;
//! 2. `tls.crt` is present and not empty;
//! 3. every PEM block of `tls.crt` is of a kind the router knows (certificates, private
//!    keys, which are moved to the key side as the router does, and `EC PARAMETERS`,
//!    which are dropped); public keys do not belong there;
//! 4. it holds at least one `CERTIFICATE` block, and each parses as X.509;
//! 5. each certificate's public key is one the router can read (no elliptic curve other
//!    than P-224, P-256, P-384, P-521);
//! 6. no certificate that is not self-signed is signed with MD2, MD4, MD5 or SHA-1 (the
//!    router refuses MD2, MD5, SHA-1; HAProxy refuses all four);
//! 7. no certificate has a key weaker than HAProxy's OpenSSL loads at the validator's
//!    [`SecurityLevel`] (default the router image's, 1: RSA and DSA keys of 1024 bits
//!    and more; Debian's 2: 2048 bits and more), which the router does not check;
//! 8. every PEM block of `tls.key` is a private key (or `EC PARAMETERS`);
//! 9. every private key block (of `tls.crt`, then `tls.key`) is an unencrypted RSA or
//!    ECDSA key in PKCS#8, PKCS#1 or SEC1, whatever its label says, and there is one;
//! 10. the first private key belongs to the first certificate.
//!
//! As in the router, validity dates are not checked and the order of the chain is not
//! enforced. Admitted material carries [`TlsWarning`]s instead: expired, not yet valid,
//! expiring within the warning window (30 days by default), names that do not cover the
//! route's host (RFC 6125 wildcards), a chain served reordered (the server certificate,
//! then its issuers in issuing order, then any unrelated certificate), broken PEM blocks
//! that were skipped as Go's PEM decoder skips them, blocks left out.
//!
//! The served material is re-encoded from DER: the chain as `CERTIFICATE` blocks, leaf
//! first, and the key with the label of the encoding it really has. Nothing here puts key
//! bytes into an error, a warning or `Debug` output; the key is only reachable through
//! [`SecretPem::expose_secret`].

mod chain;
mod config;
pub(crate) mod der;
mod error;
mod host;
mod key;
mod level;
mod pem;
mod secret;

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;

use crate::route::TlsTermination;

pub use config::{CaField, CaProblem, TlsConfigProblem};
pub use error::{
    ROUTER_REASON_CERTIFICATE, ROUTER_REASON_SECRET, TlsCause, TlsRejection, TlsWarning,
};
pub use host::{dns_name_covers, names_cover};
pub use key::{KeyAlgorithm, KeyEncoding};
pub use level::{SecurityLevel, SecurityLevelError};
pub use pem::PemProblem;
pub use secret::TlsSecret;

use error::shorten;

/// The secret type that holds a certificate and its key.
pub const SECRET_TYPE_TLS: &str = "kubernetes.io/tls";
/// The data entry holding the PEM certificate chain.
pub const TLS_CERT_ENTRY: &str = "tls.crt";
/// The data entry holding the PEM private key.
pub const TLS_KEY_ENTRY: &str = "tls.key";
/// Reduces a secret to what serving it reads: `metadata.name`, `namespace`, `uid` and
/// `resourceVersion`, the `type`, and the [`TLS_CERT_ENTRY`] and [`TLS_KEY_ENTRY`] data
/// entries. Everything else goes: labels, annotations (among them
/// `kubectl.kubernetes.io/last-applied-configuration`, a whole copy of the secret's
/// data), managed fields, owner references and other data entries.
///
/// Meant as the transform of a monitor of full `Secret`s
/// ([`ObjectMonitor::with_transform`](secret_monitor::ObjectMonitor::with_transform)).
/// [`TlsSecret`] keeps the same fields and goes further: it is decoded without the
/// rest (never allocated) and holds the two entries without a map; the
/// [`SecretManager`](crate::api::manager::SecretManager)'s monitor caches that.
pub fn keep_tls_material(secret: &mut Secret) {
    let metadata = std::mem::take(&mut secret.metadata);
    secret.metadata = ObjectMeta {
        name: metadata.name,
        namespace: metadata.namespace,
        uid: metadata.uid,
        resource_version: metadata.resource_version,
        ..ObjectMeta::default()
    };
    secret.string_data = None;
    if let Some(data) = &mut secret.data {
        data.retain(|entry, _| entry == TLS_CERT_ENTRY || entry == TLS_KEY_ENTRY);
    }
}

/// Default window before expiry in which [`TlsWarning::ExpiresSoon`] is raised.
pub const DEFAULT_EXPIRY_WARNING: SignedDuration = SignedDuration::from_hours(30 * 24);

const PEM_LABEL_CERTIFICATE: &str = "CERTIFICATE";
const SECONDS_PER_DAY: i64 = 24 * 60 * 60;

/// Where a piece of served PEM text lives.
///
/// Validation re-encodes the material from DER, and for most secrets the result is the
/// secret's own entry byte for byte (a canonical chain, leaf first). Such text is read
/// from the secret instead of being copied: the monitor caches that secret anyway, so
/// the material is held once instead of twice (at 10,000 routes, ~20 MB of heap), and
/// the encoding is compared with the entry as it is produced, never written out.
#[derive(Clone)]
enum PemText {
    /// Re-encoded text that differs from the secret's entry.
    Owned(Box<str>),
    /// The secret's `entry`, which was checked to be exactly the re-encoded text.
    InSecret {
        secret: Arc<TlsSecret>,
        entry: &'static str,
    },
}

impl PemText {
    fn as_str(&self) -> &str {
        match self {
            PemText::Owned(text) => text,
            PemText::InSecret { secret, entry } => secret
                .entry(entry)
                .and_then(|value| std::str::from_utf8(value).ok())
                // Only built from an entry equal to valid UTF-8 text, and the secret is
                // behind an `Arc` nobody can change: the fallback is never taken.
                .unwrap_or_default(),
        }
    }

    /// The PEM text of `blocks` (label, DER) as served: read from `secret`'s `entry`
    /// when that entry holds exactly their encoding (checked without writing it),
    /// otherwise encoded.
    fn of_blocks<'a>(
        blocks: impl Iterator<Item = (&'a str, &'a [u8])> + Clone,
        secret: Option<&Arc<TlsSecret>>,
        entry: &'static str,
    ) -> Self {
        if let Some(secret) = secret
            && secret
                .entry(entry)
                .is_some_and(|text| pem::is_encoding_of(text, blocks.clone()))
        {
            return PemText::InSecret {
                secret: Arc::clone(secret),
                entry,
            };
        }
        let text: String = blocks.map(|(label, der)| pem::encode(label, der)).collect();
        text.into()
    }
}

impl PartialEq for PemText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for PemText {}

impl From<String> for PemText {
    fn from(text: String) -> Self {
        PemText::Owned(text.into_boxed_str())
    }
}

/// PEM text that contains private key material. `Debug` shows only its length, and there
/// is no `Display`: reading the text takes an explicit [`SecretPem::expose_secret`].
#[derive(Clone, PartialEq, Eq)]
pub struct SecretPem(PemText);

impl SecretPem {
    /// The PEM text, key included. Do not log it.
    pub fn expose_secret(&self) -> &str {
        self.0.as_str()
    }

    /// Length of the text in bytes.
    pub fn len(&self) -> usize {
        self.expose_secret().len()
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.expose_secret().is_empty()
    }
}

impl fmt::Debug for SecretPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretPem(<redacted, {} bytes>)", self.len())
    }
}

/// SHA-256 digest of a DER certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256Fingerprint(pub [u8; 32]);

impl Sha256Fingerprint {
    /// Digests `der`.
    pub fn of(der: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut bytes = [0; 32];
        bytes.copy_from_slice(digest.as_ref());
        Self(bytes)
    }

    /// Lower-case hex without separators.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Upper-case hex pairs separated by colons, as `openssl x509 -fingerprint` prints.
impl fmt::Display for Sha256Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{byte:02X}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Sha256Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Fingerprint({self})")
    }
}

/// The inputs of a validation: the secret's type and its two data entries.
#[derive(Clone, Copy, Default)]
pub struct TlsMaterial<'a> {
    /// The secret's `type`.
    pub secret_type: Option<&'a str>,
    /// The bytes of `tls.crt`.
    pub certificate: Option<&'a [u8]>,
    /// The bytes of `tls.key`.
    pub key: Option<&'a [u8]>,
}

impl<'a> TlsMaterial<'a> {
    /// Reads the type and the `tls.crt` / `tls.key` entries of a secret's `data`.
    pub fn from_data(secret_type: Option<&'a str>, data: &'a BTreeMap<String, ByteString>) -> Self {
        Self {
            secret_type,
            certificate: data.get(TLS_CERT_ENTRY).map(|value| value.0.as_slice()),
            key: data.get(TLS_KEY_ENTRY).map(|value| value.0.as_slice()),
        }
    }

    /// Reads a secret as the API server returns it (`data`; `stringData` is write-only).
    pub fn from_secret(secret: &'a Secret) -> Self {
        let secret_type = secret.type_.as_deref();
        match &secret.data {
            Some(data) => Self::from_data(secret_type, data),
            None => Self {
                secret_type,
                ..Self::default()
            },
        }
    }
}

/// Shows lengths only.
impl fmt::Debug for TlsMaterial<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("secret_type", &self.secret_type)
            .field("certificate_len", &self.certificate.map(<[u8]>::len))
            .field("key_len", &self.key.map(<[u8]>::len))
            .finish()
    }
}

/// A route's TLS configuration, as [`TlsValidator::check_route_config`] reads it.
#[derive(Clone, Copy)]
pub struct RouteTlsConfig<'a> {
    /// `spec.tls.termination`.
    pub termination: &'a TlsTermination,
    /// Whether `spec.tls.externalCertificate` names a secret.
    pub external_certificate: bool,
    /// `spec.tls.certificate`.
    pub certificate: Option<&'a str>,
    /// `spec.tls.key` (only whether it is set is read here).
    pub key: Option<&'a str>,
    /// `spec.tls.caCertificate`.
    pub ca_certificate: Option<&'a str>,
    /// `spec.tls.destinationCACertificate`.
    pub destination_ca_certificate: Option<&'a str>,
}

/// Shows which fields are set; never the key.
impl fmt::Debug for RouteTlsConfig<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTlsConfig")
            .field("termination", self.termination)
            .field("external_certificate", &self.external_certificate)
            .field("certificate", &self.certificate.is_some())
            .field("key", &self.key.is_some())
            .field("ca_certificate", &self.ca_certificate.is_some())
            .field(
                "destination_ca_certificate",
                &self.destination_ca_certificate.is_some(),
            )
            .finish()
    }
}

/// TLS material that passed every check, normalized for serving.
#[derive(Clone, PartialEq, Eq)]
pub struct ValidatedTls {
    chain_pem: PemText,
    key: SecretPem,
    key_algorithm: KeyAlgorithm,
    key_encoding: KeyEncoding,
    chain_len: usize,
    // Boxed, exact: one validation is kept per secret, ten thousand of them, each
    // with one or two names and nearly always no warning.
    subject: Box<str>,
    not_before: Timestamp,
    not_after: Timestamp,
    fingerprint: Sha256Fingerprint,
    dns_names: Box<[String]>,
    ip_addresses: Box<[IpAddr]>,
    warnings: Box<[TlsWarning]>,
}

impl ValidatedTls {
    /// The certificate chain as PEM, server certificate first, re-encoded from DER (no
    /// comments or other blocks).
    pub fn chain_pem(&self) -> &str {
        self.chain_pem.as_str()
    }

    /// The server certificate's DER (the first block of [`chain_pem`](Self::chain_pem)).
    pub fn leaf_der(&self) -> Option<Vec<u8>> {
        pem::scan(self.chain_pem())
            .blocks
            .into_iter()
            .next()
            .map(|block| block.der)
    }

    /// The private key as PEM, with its original label (PKCS#8, PKCS#1 or SEC1).
    pub fn key_pem(&self) -> &SecretPem {
        &self.key
    }

    /// The same certificate and key with the certificates of `ca_pem` served after the
    /// chain, as the router appends a route's `spec.tls.caCertificate` to the
    /// certificate it serves (other PEM blocks are left out; the certificates are
    /// re-encoded from DER like the chain).
    pub fn with_ca_certificate(&self, ca_pem: &str) -> Self {
        let extra: Vec<pem::PemBlock> = pem::scan(ca_pem)
            .blocks
            .into_iter()
            .filter(|block| block.label == PEM_LABEL_CERTIFICATE)
            .collect();
        let mut chain = self.chain_pem().to_owned();
        for block in &extra {
            chain.push_str(&pem::encode(PEM_LABEL_CERTIFICATE, &block.der));
        }
        Self {
            chain_pem: chain.into(),
            chain_len: self.chain_len + extra.len(),
            ..self.clone()
        }
    }

    /// The chain followed by the key, as HAProxy's `crt` files expect.
    pub fn pem_bundle(&self) -> SecretPem {
        SecretPem(format!("{}{}", self.chain_pem(), self.key.expose_secret()).into())
    }

    /// The key's algorithm.
    pub fn key_algorithm(&self) -> KeyAlgorithm {
        self.key_algorithm
    }

    /// How the key was encoded.
    pub fn key_encoding(&self) -> KeyEncoding {
        self.key_encoding
    }

    /// Number of certificates in the chain.
    pub fn chain_len(&self) -> usize {
        self.chain_len
    }

    /// Subject of the server certificate.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Start of the server certificate's validity.
    pub fn not_before(&self) -> Timestamp {
        self.not_before
    }

    /// End of the server certificate's validity (for an expiry metric).
    pub fn not_after(&self) -> Timestamp {
        self.not_after
    }

    /// SHA-256 fingerprint of the server certificate.
    pub fn fingerprint(&self) -> Sha256Fingerprint {
        self.fingerprint
    }

    /// The server certificate's DNS names: its SAN dNSNames, or its CN when it has no
    /// SAN extension.
    pub fn dns_names(&self) -> &[String] {
        &self.dns_names
    }

    /// The server certificate's SAN IP addresses.
    pub fn ip_addresses(&self) -> &[IpAddr] {
        &self.ip_addresses
    }

    /// Whether the server certificate covers `host` (RFC 6125).
    pub fn covers_host(&self, host: &str) -> bool {
        names_cover(&self.dns_names, &self.ip_addresses, host)
    }

    /// The [`TlsWarning::HostNotCovered`] warning for `host`, if the server certificate
    /// does not cover it (`None` for an empty host). Lets a caller validate a secret once
    /// without a host and check each route that shares it.
    pub fn host_warning(&self, host: &str) -> Option<TlsWarning> {
        host_warning(&self.dns_names, &self.ip_addresses, host)
    }

    /// What a person should know although the material is valid, as of the validation.
    pub fn warnings(&self) -> &[TlsWarning] {
        &self.warnings
    }

    /// The warning about the server certificate's validity at `now`, with `window` as the
    /// expiry warning window: [`TlsWarning::Expired`], [`TlsWarning::NotYetValid`],
    /// [`TlsWarning::ExpiresSoon`], or `None`. Time moves on after a validation (which is
    /// kept as long as the secret does not change): this tells what holds now.
    pub fn validity_warning(&self, now: Timestamp, window: SignedDuration) -> Option<TlsWarning> {
        validity_warning(self.not_before, self.not_after, now, window)
    }
}

/// Everything but the key.
impl fmt::Debug for ValidatedTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ValidatedTls")
            .field("subject", &self.subject)
            .field("chain_len", &self.chain_len)
            .field("key", &self.key)
            .field("key_algorithm", &self.key_algorithm)
            .field("key_encoding", &self.key_encoding)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("fingerprint", &self.fingerprint)
            .field("dns_names", &self.dns_names)
            .field("ip_addresses", &self.ip_addresses)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// Validates TLS material; see the [module documentation](self) for the checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsValidator {
    expiry_warning: SignedDuration,
    security_level: SecurityLevel,
}

impl Default for TlsValidator {
    fn default() -> Self {
        Self {
            expiry_warning: DEFAULT_EXPIRY_WARNING,
            security_level: SecurityLevel::default(),
        }
    }
}

impl TlsValidator {
    /// A validator that warns when the certificate expires within `window`.
    pub fn with_expiry_warning(window: SignedDuration) -> Self {
        Self {
            expiry_warning: window,
            ..Self::default()
        }
    }

    /// The same validator, for a HAProxy whose OpenSSL runs at `level`.
    pub fn security_level(self, level: SecurityLevel) -> Self {
        Self {
            security_level: level,
            ..self
        }
    }

    /// The expiry warning window.
    pub fn expiry_warning(&self) -> SignedDuration {
        self.expiry_warning
    }

    /// The OpenSSL security level keys are checked for.
    pub fn openssl_security_level(&self) -> SecurityLevel {
        self.security_level
    }

    /// Validates a secret's TLS material for a route whose host is `route_host` (no host
    /// check when `None` or empty), at time `now`.
    pub fn validate_secret(
        &self,
        secret: &Secret,
        route_host: Option<&str>,
        now: Timestamp,
    ) -> Result<ValidatedTls, TlsRejection> {
        self.validate(TlsMaterial::from_secret(secret), route_host, now)
    }

    /// Like [`validate_secret`](Self::validate_secret), for a [`TlsSecret`] shared
    /// behind an `Arc` (as the monitor's cache holds it): where the served text is the
    /// secret's entry byte for byte, the result reads it from the secret instead of
    /// holding a copy, and keeps the secret alive.
    pub fn validate_shared_secret(
        &self,
        secret: &Arc<TlsSecret>,
        route_host: Option<&str>,
        now: Timestamp,
    ) -> Result<ValidatedTls, TlsRejection> {
        self.validate_at(secret.material(), route_host, Some(now), Some(secret))
    }

    /// Validates `material`; see [`TlsValidator::validate_secret`].
    pub fn validate(
        &self,
        material: TlsMaterial<'_>,
        route_host: Option<&str>,
        now: Timestamp,
    ) -> Result<ValidatedTls, TlsRejection> {
        self.validate_at(material, route_host, Some(now), None)
    }

    /// Validates a route's inline certificate and key (`spec.tls.certificate`,
    /// `spec.tls.key`) as the router does (as a secret's `tls.crt` and `tls.key`), with
    /// no date warnings: the route's object holds them, and no clock is needed to
    /// decide it.
    pub fn validate_inline(
        &self,
        certificate: &str,
        key: Option<&str>,
        route_host: Option<&str>,
    ) -> Result<ValidatedTls, TlsRejection> {
        let material = TlsMaterial {
            secret_type: Some(SECRET_TYPE_TLS),
            certificate: Some(certificate.as_bytes()),
            key: key.map(str::as_bytes),
        };
        self.validate_at(material, route_host, None, None)
    }

    /// The router's checks of a route's TLS configuration around its certificate: what
    /// the termination allows, `spec.tls.caCertificate` (which must have issued `leaf`,
    /// the served certificate's DER, when there is one) and
    /// `spec.tls.destinationCACertificate`.
    pub fn check_route_config(
        &self,
        config: &RouteTlsConfig<'_>,
        leaf: Option<&[u8]>,
    ) -> Result<(), TlsConfigProblem> {
        let given = |value: Option<&str>| value.is_some_and(|text| !text.is_empty());
        match config.termination {
            TlsTermination::Passthrough => {
                let fields: Vec<&str> = [
                    (config.external_certificate, "spec.tls.externalCertificate"),
                    (given(config.certificate), "spec.tls.certificate"),
                    (given(config.key), "spec.tls.key"),
                    (given(config.ca_certificate), "spec.tls.caCertificate"),
                    (
                        given(config.destination_ca_certificate),
                        "spec.tls.destinationCACertificate",
                    ),
                ]
                .into_iter()
                .filter_map(|(set, field)| set.then_some(field))
                .collect();
                if !fields.is_empty() {
                    return Err(TlsConfigProblem::PassthroughWithCertificate {
                        fields: fields.join(", "),
                    });
                }
            }
            TlsTermination::Edge if given(config.destination_ca_certificate) => {
                return Err(TlsConfigProblem::EdgeWithDestinationCa);
            }
            TlsTermination::Other(value) => {
                return Err(TlsConfigProblem::UnknownTermination {
                    value: shorten(value.as_str()),
                });
            }
            TlsTermination::Edge | TlsTermination::Reencrypt => {}
        }
        if let Some(text) = config.ca_certificate.filter(|text| !text.is_empty()) {
            let authorities = config::ca_certificates(text, CaField::CaCertificate)?;
            if let Some(leaf) = leaf {
                config::issued_by(leaf, &authorities)?;
            }
        }
        if let Some(text) = config
            .destination_ca_certificate
            .filter(|text| !text.is_empty())
        {
            config::ca_certificates(text, CaField::DestinationCaCertificate)?;
        }
        Ok(())
    }

    /// Validates `material`; when it is `shared`'s, the served text is read from the
    /// secret where its entry is already that text.
    fn validate_at(
        &self,
        material: TlsMaterial<'_>,
        route_host: Option<&str>,
        now: Option<Timestamp>,
        shared: Option<&Arc<TlsSecret>>,
    ) -> Result<ValidatedTls, TlsRejection> {
        if material.secret_type != Some(SECRET_TYPE_TLS) {
            return Err(TlsRejection::WrongSecretType {
                found: material.secret_type.map(str::to_owned),
            });
        }
        let certificate_bytes = match material.certificate {
            None => return Err(TlsRejection::CertificateMissing),
            Some([]) => return Err(TlsRejection::CertificateEmpty),
            Some(bytes) => bytes,
        };
        let mut warnings = Vec::new();

        let crt = read_entry(certificate_bytes, TLS_CERT_ENTRY)?;
        if crt.certificates.is_empty() {
            return Err(no_certificate(certificate_bytes, &crt));
        }
        if !crt.skipped.is_empty() {
            warnings.push(TlsWarning::SkippedPemBlocks {
                entry: TLS_CERT_ENTRY,
                problems: crt.skipped.clone(),
            });
        }
        let ders: Vec<&[u8]> = crt
            .certificates
            .iter()
            .map(|block| block.der.as_slice())
            .collect();
        let certificates = chain::parse(&ders)?;
        chain::check_each(&certificates, self.security_level)?;
        let Some(leaf) = certificates.first() else {
            return Err(no_certificate(certificate_bytes, &crt));
        };

        let private_key = private_key(&crt, material.key, &mut warnings)?;
        if !key::matches(&private_key, leaf) {
            return Err(TlsRejection::KeyMismatch {
                key: private_key.algorithm.to_string(),
                certificate: key::CertificateKey::of(leaf.public_key()).to_string(),
                subject: shorten(leaf.subject().to_string()),
                matching_position: certificates
                    .iter()
                    .position(|certificate| key::matches(&private_key, certificate))
                    .map(|index| index + 1),
            });
        }

        let (order, unrelated) = chain::serving_order(&certificates);
        if order.windows(2).any(|pair| pair[0] > pair[1]) {
            warnings.push(TlsWarning::ChainReordered {
                order: order.iter().map(|index| index + 1).collect(),
            });
        }
        if !unrelated.is_empty() {
            warnings.push(TlsWarning::UnrelatedCertificates {
                positions: unrelated.iter().map(|index| index + 1).collect(),
            });
        }

        let subject = shorten(leaf.subject().to_string());
        let not_before = timestamp(leaf.validity().not_before.timestamp())?;
        let not_after = timestamp(leaf.validity().not_after.timestamp())?;
        if let Some(now) = now {
            warnings.extend(validity_warning(
                not_before,
                not_after,
                now,
                self.expiry_warning,
            ));
        }
        let (dns_names, ip_addresses) = identities(leaf);
        if let Some(warning) =
            route_host.and_then(|host| host_warning(&dns_names, &ip_addresses, host))
        {
            warnings.push(warning);
        }

        let chain_pem = PemText::of_blocks(
            order
                .iter()
                .map(|&index| (PEM_LABEL_CERTIFICATE, ders[index])),
            shared,
            TLS_CERT_ENTRY,
        );
        let key = PemText::of_blocks(
            std::iter::once((private_key.encoding.pem_label(), private_key.der())),
            shared,
            TLS_KEY_ENTRY,
        );
        Ok(ValidatedTls {
            chain_pem,
            key: SecretPem(key),
            key_algorithm: private_key.algorithm,
            key_encoding: private_key.encoding,
            chain_len: certificates.len(),
            subject: subject.into_boxed_str(),
            not_before,
            not_after,
            fingerprint: Sha256Fingerprint::of(leaf.as_raw()),
            dns_names: dns_names.into_boxed_slice(),
            ip_addresses: ip_addresses.into_boxed_slice(),
            warnings: warnings.into_boxed_slice(),
        })
    }
}

/// Reads every private key block, those `tls.crt` holds first (the router moves them to
/// the key), and returns the first; every one must be of a served kind.
fn private_key(
    crt: &EntryBlocks,
    key_bytes: Option<&[u8]>,
    warnings: &mut Vec<TlsWarning>,
) -> Result<key::PrivateKey, TlsRejection> {
    let key_file = match key_bytes {
        Some(bytes) if !bytes.is_empty() => Some(read_entry(bytes, TLS_KEY_ENTRY)?),
        _ => None,
    };
    let blocks: Vec<&pem::PemBlock> = crt
        .keys
        .iter()
        .chain(key_file.iter().flat_map(|entry| &entry.keys))
        .collect();
    let mut keys = blocks
        .iter()
        .map(|block| key::parse_key_block(block))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    let Some(first) = keys.next() else {
        return Err(match (key_bytes, &key_file) {
            (None, _) => TlsRejection::KeyMissing,
            (Some(bytes), Some(entry)) => no_private_key(bytes, entry),
            (Some(_), None) => TlsRejection::KeyEmpty,
        });
    };
    if !crt.keys.is_empty() {
        warnings.push(TlsWarning::KeyFromCertificateEntry);
    }
    if let Some(entry) = key_file.as_ref().filter(|entry| !entry.skipped.is_empty()) {
        warnings.push(TlsWarning::SkippedPemBlocks {
            entry: TLS_KEY_ENTRY,
            problems: entry.skipped.clone(),
        });
    }
    // Key blocks after the one used, wherever they were.
    let unused: Vec<String> = blocks[1..]
        .iter()
        .map(|block| block.display_label())
        .collect();
    if !unused.is_empty() {
        warnings.push(TlsWarning::IgnoredPemBlocks {
            entry: if key_file
                .as_ref()
                .is_some_and(|entry| !entry.keys.is_empty())
            {
                TLS_KEY_ENTRY
            } else {
                TLS_CERT_ENTRY
            },
            labels: unused,
        });
    }
    Ok(first)
}

/// Validates with the default [`TlsValidator`] (30-day expiry warning).
pub fn validate(
    secret_type: Option<&str>,
    data: &BTreeMap<String, ByteString>,
    route_host: Option<&str>,
    now: Timestamp,
) -> Result<ValidatedTls, TlsRejection> {
    TlsValidator::default().validate(TlsMaterial::from_data(secret_type, data), route_host, now)
}

/// The PEM blocks of one entry, sorted by kind.
struct EntryBlocks {
    certificates: Vec<pem::PemBlock>,
    keys: Vec<pem::PemBlock>,
    /// The labels of every block, in order (for messages).
    labels: Vec<String>,
    /// Broken blocks that were skipped.
    skipped: Vec<PemProblem>,
}

/// PEM labels of public keys the router recognizes, and refuses where they are.
const PUBLIC_KEY_LABELS: [&str; 4] = [
    "PUBLIC KEY",
    "RSA PUBLIC KEY",
    "DSA PUBLIC KEY",
    "ECDSA PUBLIC KEY",
];
/// Curve parameters that OpenSSL writes before SEC1 keys; the router drops them.
const PEM_LABEL_EC_PARAMETERS: &str = "EC PARAMETERS";

/// Scans one entry (`tls.crt` or `tls.key`) as the router's PEM sanitizer does: text
/// outside blocks is dropped (bytes that are not UTF-8 too), broken blocks are skipped,
/// and a block of an unknown kind, or of a kind that does not belong in this entry, is a
/// rejection.
fn read_entry(bytes: &[u8], entry: &'static str) -> Result<EntryBlocks, TlsRejection> {
    let scan = pem::scan(&entry_text(bytes));
    let is_crt = entry == TLS_CERT_ENTRY;
    let mut blocks = EntryBlocks {
        certificates: Vec::new(),
        keys: Vec::new(),
        labels: scan
            .blocks
            .iter()
            .map(pem::PemBlock::display_label)
            .collect(),
        skipped: scan.skipped,
    };
    for block in scan.blocks {
        let label = block.label.as_str();
        if key::is_private_key_label(label) {
            blocks.keys.push(block);
        } else if label == PEM_LABEL_CERTIFICATE && is_crt {
            blocks.certificates.push(block);
        } else if label == PEM_LABEL_CERTIFICATE || PUBLIC_KEY_LABELS.contains(&label) {
            return Err(TlsRejection::UnexpectedPemBlock {
                entry,
                label: block.display_label(),
                expected: if is_crt { "CERTIFICATE" } else { "PRIVATE KEY" },
            });
        } else if label != PEM_LABEL_EC_PARAMETERS {
            return Err(TlsRejection::UnrecognizedPemBlock {
                entry,
                label: block.display_label(),
            });
        }
    }
    Ok(blocks)
}

/// An entry as text, bytes that are not UTF-8 replaced (they are never inside a block
/// that decodes). Valid UTF-8, nearly every entry, is borrowed after the standard
/// library's validation, which checks ASCII a word at a time; `String::from_utf8_lossy`
/// gives the same result but checks byte by byte even then.
fn entry_text(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => std::borrow::Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// Why an entry yielded nothing usable, most telling first.
enum NothingUsable {
    /// The bytes are not text: the first invalid byte.
    NotText { offset: usize },
    /// A block was broken: the first one's problem.
    Broken(PemProblem),
    /// Only other blocks, or none: their labels.
    OtherBlocks(Vec<String>),
}

fn nothing_usable(bytes: &[u8], blocks: &EntryBlocks) -> NothingUsable {
    if let Err(err) = std::str::from_utf8(bytes) {
        NothingUsable::NotText {
            offset: err.valid_up_to(),
        }
    } else if let Some(problem) = blocks.skipped.first() {
        NothingUsable::Broken(problem.clone())
    } else {
        NothingUsable::OtherBlocks(blocks.labels.clone())
    }
}

/// Why `tls.crt` (`bytes`, scanned into `blocks`) yielded no certificate.
fn no_certificate(bytes: &[u8], blocks: &EntryBlocks) -> TlsRejection {
    match nothing_usable(bytes, blocks) {
        NothingUsable::NotText { offset } => TlsRejection::CertificateNotText {
            offset,
            // A DER SEQUENCE with a long-form length: someone stored the binary certificate.
            looks_like_der: bytes.first() == Some(&0x30)
                && bytes.get(1).is_some_and(|b| b & 0x80 != 0),
        },
        NothingUsable::Broken(problem) => TlsRejection::CertificatePemMalformed { problem },
        NothingUsable::OtherBlocks(found_labels) => TlsRejection::NoCertificate { found_labels },
    }
}

/// Why `tls.key` (`bytes`, scanned into `blocks`) yielded no private key.
fn no_private_key(bytes: &[u8], blocks: &EntryBlocks) -> TlsRejection {
    match nothing_usable(bytes, blocks) {
        NothingUsable::NotText { offset } => TlsRejection::KeyNotText { offset },
        NothingUsable::Broken(problem) => TlsRejection::KeyPemMalformed { problem },
        NothingUsable::OtherBlocks(found_labels) => TlsRejection::NoPrivateKey { found_labels },
    }
}

/// The warning about a validity period at `now`, if any.
fn validity_warning(
    not_before: Timestamp,
    not_after: Timestamp,
    now: Timestamp,
    window: SignedDuration,
) -> Option<TlsWarning> {
    if now < not_before {
        return Some(TlsWarning::NotYetValid { not_before });
    }
    if now > not_after {
        return Some(TlsWarning::Expired { not_after });
    }
    let remaining = now.duration_until(not_after);
    (remaining <= window).then(|| TlsWarning::ExpiresSoon {
        not_after,
        days_left: remaining.as_secs() / SECONDS_PER_DAY,
    })
}

fn timestamp(seconds: i64) -> Result<Timestamp, TlsRejection> {
    Timestamp::from_second(seconds).map_err(|_| TlsRejection::CertificateUnparseable {
        position: 1,
        detail: "its validity dates are out of range".to_owned(),
    })
}

fn host_warning(dns_names: &[String], ip_addresses: &[IpAddr], host: &str) -> Option<TlsWarning> {
    let host = host.trim();
    if host.is_empty() || names_cover(dns_names, ip_addresses, host) {
        return None;
    }
    Some(TlsWarning::HostNotCovered {
        host: shorten(host),
        names: dns_names
            .iter()
            .map(|name| shorten(name.as_str()))
            .collect(),
    })
}

/// The DNS names and IP addresses a certificate is for: SAN entries, or the CN when there
/// is no SAN extension.
fn identities(certificate: &X509Certificate<'_>) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns_names = Vec::new();
    let mut ip_addresses = Vec::new();
    match certificate.subject_alternative_name() {
        Ok(Some(san)) => {
            for name in &san.value.general_names {
                match name {
                    GeneralName::DNSName(dns) => dns_names.push((*dns).to_owned()),
                    GeneralName::IPAddress(bytes) => {
                        if let Ok(octets) = <[u8; 4]>::try_from(*bytes) {
                            ip_addresses.push(IpAddr::from(octets));
                        } else if let Ok(octets) = <[u8; 16]>::try_from(*bytes) {
                            ip_addresses.push(IpAddr::from(octets));
                        }
                    }
                    _ => {}
                }
            }
        }
        // No SAN extension (or an unreadable one): fall back to the common name.
        _ => {
            dns_names.extend(
                certificate
                    .subject()
                    .iter_common_name()
                    .filter_map(|cn| cn.as_str().ok())
                    .map(str::to_owned),
            );
        }
    }
    (dns_names, ip_addresses)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One validation is kept per secret (shared, in an `Arc` with 16 bytes of counts):
    /// 208 bytes with its names and warnings boxed to their exact length, 240 with
    /// growable vectors and a `String`; within 208 the `Arc` takes jemalloc's 224-byte
    /// class, not the 256-byte one.
    #[test]
    fn a_validation_stays_small() {
        let size = std::mem::size_of::<ValidatedTls>();
        println!("ValidatedTls: {size} bytes");
        assert!(size <= 208, "ValidatedTls grew to {size} bytes");
    }

    #[test]
    fn entry_text_borrows_utf8_and_replaces_what_is_not() {
        let valid = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let text = entry_text(valid.as_bytes());
        assert!(matches!(text, std::borrow::Cow::Borrowed(_)));
        assert_eq!(text, valid);
        for bytes in [
            b"abc\xffdef".as_slice(),
            b"\xc3".as_slice(),
            b"\xe2\x82".as_slice(),
            b"ok \xf0\x9f\x92\x96 then \xed\xa0\x80 end".as_slice(),
        ] {
            assert_eq!(
                entry_text(bytes),
                String::from_utf8_lossy(bytes),
                "{bytes:?}"
            );
        }
    }
}
