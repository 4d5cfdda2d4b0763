//! Why TLS material was rejected, and what is merely worth a warning.
//!
//! Every message names the secret entry (`tls.crt`, `tls.key`) and says what to do. None
//! of these types ever holds secret bytes: only labels, positions, names and dates taken
//! from public certificate fields.

use std::fmt;

use jiff::Timestamp;

use super::pem::PemProblem;

/// Longest certificate name or value echoed back in a message.
const MAX_NAME_LEN: usize = 200;

/// Shortens a name for messages, on a character boundary.
pub(crate) fn shorten(name: impl Into<String>) -> String {
    let mut name = name.into();
    if name.len() > MAX_NAME_LEN {
        let mut cut = MAX_NAME_LEN;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
        name.push_str("...");
    }
    name
}

/// The labels of PEM blocks found, for a message.
struct Labels<'a>(&'a [String]);

impl fmt::Display for Labels<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no PEM block at all");
        }
        f.write_str("only ")?;
        for (i, label) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{label}")?;
        }
        f.write_str(" block(s)")
    }
}

fn found_type(found: &Option<String>) -> String {
    match found {
        Some(found) => format!("{:?}", shorten(found.as_str())),
        None => "not set".to_owned(),
    }
}

fn der_hint(looks_like_der: &bool) -> &'static str {
    if *looks_like_der {
        " (it looks like binary DER; convert it with `openssl x509 -inform der -outform pem`)"
    } else {
        ""
    }
}

fn swapped_hint(found_labels: &[String]) -> &'static str {
    if found_labels
        .iter()
        .any(|label| label.ends_with("PRIVATE KEY"))
    {
        "; tls.crt holds a private key, so tls.crt and tls.key may have been swapped"
    } else {
        ""
    }
}

/// Why the TLS material of a secret cannot be served. The first failure is reported, in
/// the order of the checks listed in the [module documentation](super).
///
/// Certificate positions (`position`) are 1-based, in the order of `tls.crt`: 1 is the
/// server certificate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsRejection {
    /// The secret is not of type `kubernetes.io/tls`.
    #[error(
        "the secret's type is {found}, expected \"kubernetes.io/tls\"; recreate it with \
         `kubectl create secret tls NAME --cert=... --key=...`",
        found = found_type(found)
    )]
    WrongSecretType {
        /// The type the secret has, if any.
        found: Option<String>,
    },
    /// There is no `tls.crt` entry.
    #[error("the secret has no tls.crt entry; put the PEM certificate chain under the key tls.crt")]
    CertificateMissing,
    /// `tls.crt` is empty.
    #[error("tls.crt is empty; put the PEM certificate chain (server certificate first) in it")]
    CertificateEmpty,
    /// There is no `tls.key` entry.
    #[error("the secret has no tls.key entry; put the PEM private key under the key tls.key")]
    KeyMissing,
    /// `tls.key` is empty.
    #[error("tls.key is empty; put the unencrypted PEM private key of the certificate in it")]
    KeyEmpty,
    /// `tls.crt` holds a PEM block of a kind the router does not know.
    #[error(
        "{entry} contains a {label} block, which the router does not accept; keep only \
         CERTIFICATE blocks in tls.crt and the PRIVATE KEY block in tls.key"
    )]
    UnrecognizedPemBlock {
        /// `tls.crt` or `tls.key`.
        entry: &'static str,
        /// The block's label.
        label: String,
    },
    /// A PEM block of a known kind in the wrong entry: a public key in `tls.crt`, a
    /// certificate or public key in `tls.key`.
    #[error(
        "{entry} contains a {label} block where only {expected} blocks belong; move or \
         remove it"
    )]
    UnexpectedPemBlock {
        /// `tls.crt` or `tls.key`.
        entry: &'static str,
        /// The block's label.
        label: String,
        /// What belongs there.
        expected: &'static str,
    },
    /// `tls.crt` holds no certificate and is not text.
    #[error(
        "tls.crt is not PEM text: byte {offset} is not valid UTF-8{hint}",
        hint = der_hint(looks_like_der)
    )]
    CertificateNotText {
        /// Offset of the first invalid byte.
        offset: usize,
        /// Whether the content starts like a DER SEQUENCE.
        looks_like_der: bool,
    },
    /// `tls.crt` holds no certificate, and a block that might have been one is broken.
    #[error("tls.crt is not valid PEM: {problem}; re-export the certificate chain as PEM")]
    CertificatePemMalformed {
        /// What is wrong with the first broken block, and where.
        problem: PemProblem,
    },
    /// `tls.crt` holds no `CERTIFICATE` block.
    #[error(
        "tls.crt contains no CERTIFICATE block ({labels}){hint}",
        labels = Labels(found_labels),
        hint = swapped_hint(found_labels)
    )]
    NoCertificate {
        /// Labels of the blocks that were found.
        found_labels: Vec<String>,
    },
    /// A certificate does not parse as X.509.
    #[error(
        "certificate #{position} in tls.crt is not a valid X.509 certificate ({detail}); \
         re-issue or re-export it"
    )]
    CertificateUnparseable {
        /// Position in tls.crt.
        position: usize,
        /// The parser's complaint.
        detail: String,
    },
    /// A certificate's public key is of a kind the router cannot parse (an elliptic curve
    /// other than P-224, P-256, P-384 and P-521).
    #[error(
        "certificate #{position} in tls.crt ({subject}) has an {algorithm} public key, which \
         the router cannot read (it knows RSA, DSA, Ed25519 and ECDSA on P-224, P-256, \
         P-384 and P-521); re-issue it with a supported key"
    )]
    UnsupportedCertificateKey {
        /// Position in tls.crt.
        position: usize,
        /// Its subject.
        subject: String,
        /// Its public key algorithm.
        algorithm: String,
    },
    /// A certificate that is not self-signed carries a signature with a digest HAProxy
    /// refuses (MD2, MD4, MD5 or SHA-1). The router refuses MD2, MD5 and SHA-1 ("router
    /// does not support CA-signed certs using SHA1").
    #[error(
        "certificate #{position} in tls.crt ({subject}) is CA-signed using {digest}, which \
         the router does not support and HAProxy refuses to load; re-issue it with SHA-256 \
         or better"
    )]
    WeakSignature {
        /// Position in tls.crt.
        position: usize,
        /// Its subject.
        subject: String,
        /// The digest: `MD2`, `MD4`, `MD5` or `SHA-1`.
        digest: &'static str,
    },
    /// A certificate's key is weaker than HAProxy's OpenSSL loads at its security level
    /// (RSA and DSA under 1024 bits at level 1, 2048 at level 2, ...; elliptic curves
    /// under 256 bits from level 3), for the server certificate and for every chain
    /// certificate, self-signed or not. The router itself would admit it.
    #[error(
        "certificate #{position} in tls.crt ({subject}) has an {algorithm} key, which \
         HAProxy refuses to load at OpenSSL security level {level} (certwatch's \
         --openssl-security-level, which must be the level of the HAProxy it feeds); \
         re-issue it with a larger key"
    )]
    WeakKey {
        /// Position in tls.crt.
        position: usize,
        /// Its subject.
        subject: String,
        /// The key, e.g. `RSA 1024-bit`.
        algorithm: String,
        /// The security level it was checked at.
        level: u8,
    },
    /// `tls.key` holds no private key and is not text.
    #[error(
        "tls.key is not PEM text: byte {offset} is not valid UTF-8; provide the key \
         PEM-encoded (`openssl pkey -outform pem`)"
    )]
    KeyNotText {
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// `tls.key` holds no private key, and a block that might have been one is broken.
    #[error("tls.key is not valid PEM: {problem}; re-export the private key as PEM")]
    KeyPemMalformed {
        /// What is wrong with the first broken block, and where.
        problem: PemProblem,
    },
    /// Neither `tls.key` nor `tls.crt` holds a private key block.
    #[error(
        "tls.key contains no private key ({labels}); put the unencrypted PEM private key \
         (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in it",
        labels = Labels(found_labels)
    )]
    NoPrivateKey {
        /// Labels of the blocks that were found in tls.key.
        found_labels: Vec<String>,
    },
    /// A private key is encrypted, or of an algorithm or format the router cannot serve.
    #[error(
        "tls.key holds an unsupported key ({label}: {detail}); supported are unencrypted \
         RSA and ECDSA (P-224, P-256, P-384, P-521) keys in PKCS#8, PKCS#1 or SEC1 PEM"
    )]
    UnsupportedKey {
        /// The PEM label of the key block.
        label: String,
        /// What makes it unsupported.
        detail: String,
    },
    /// A private key block does not decode as any private key structure.
    #[error("tls.key is corrupt ({label}: {detail}); re-export the private key")]
    KeyInvalid {
        /// The PEM label of the key block.
        label: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The key does not belong to the server (first) certificate.
    #[error(
        "tls.key ({key} key) is not the private key of the first certificate in tls.crt \
         ({subject}, {certificate} public key){hint}",
        hint = mismatch_hint(*matching_position)
    )]
    KeyMismatch {
        /// The key's algorithm.
        key: String,
        /// The algorithm of the certificate's public key.
        certificate: String,
        /// Subject of the server certificate.
        subject: String,
        /// The position of another certificate in tls.crt that the key does belong to.
        matching_position: Option<usize>,
    },
}

fn mismatch_hint(matching_position: Option<usize>) -> String {
    match matching_position {
        Some(position) => format!(
            "; the key belongs to certificate #{position}: list that certificate first in \
             tls.crt"
        ),
        None => "; put the key the certificate was issued for in tls.key".to_owned(),
    }
}

/// The class of a [`TlsRejection`]: few and stable, for metric labels and alerts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TlsCause {
    /// The secret is not of type `kubernetes.io/tls`.
    WrongType,
    /// `tls.crt` or `tls.key` is missing or empty.
    MissingData,
    /// The entries are not usable PEM: broken or foreign blocks, unparseable
    /// certificates, corrupt keys, nothing where a certificate or key should be.
    BadPem,
    /// The key is not the server certificate's.
    KeyMismatch,
    /// A key of a kind that is not served (encrypted, Ed25519, DSA, another curve...).
    UnsupportedKey,
    /// A key somewhere in the chain that HAProxy refuses at its OpenSSL security level.
    WeakKey,
    /// A CA signature with MD2, MD4, MD5 or SHA-1 (the router and HAProxy refuse it).
    WeakSignature,
}

impl TlsCause {
    /// Every class, for metric label sets.
    pub const ALL: [Self; 7] = [
        Self::WrongType,
        Self::MissingData,
        Self::BadPem,
        Self::KeyMismatch,
        Self::UnsupportedKey,
        Self::WeakKey,
        Self::WeakSignature,
    ];

    /// The class as a lowercase label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WrongType => "wrong_type",
            Self::MissingData => "missing_data",
            Self::BadPem => "bad_pem",
            Self::KeyMismatch => "key_mismatch",
            Self::UnsupportedKey => "unsupported_key",
            Self::WeakKey => "weak_key",
            Self::WeakSignature => "weak_signature",
        }
    }
}

impl fmt::Display for TlsCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reason the OpenShift router records when the secret's type is wrong.
pub const ROUTER_REASON_SECRET: &str = "ExternalCertificateValidationFailed";
/// The reason the OpenShift router records for certificate and key problems.
pub const ROUTER_REASON_CERTIFICATE: &str = "ExtendedValidationFailed";

impl TlsRejection {
    /// A short, stable identifier of the variant, for logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::WrongSecretType { .. } => "wrong_secret_type",
            Self::CertificateMissing => "certificate_missing",
            Self::CertificateEmpty => "certificate_empty",
            Self::KeyMissing => "key_missing",
            Self::KeyEmpty => "key_empty",
            Self::UnrecognizedPemBlock { .. } => "unrecognized_pem_block",
            Self::UnexpectedPemBlock { .. } => "unexpected_pem_block",
            Self::CertificateNotText { .. } => "certificate_not_text",
            Self::CertificatePemMalformed { .. } => "certificate_pem_malformed",
            Self::NoCertificate { .. } => "no_certificate",
            Self::CertificateUnparseable { .. } => "certificate_unparseable",
            Self::UnsupportedCertificateKey { .. } => "unsupported_certificate_key",
            Self::WeakSignature { .. } => "weak_signature",
            Self::WeakKey { .. } => "weak_key",
            Self::KeyNotText { .. } => "key_not_text",
            Self::KeyPemMalformed { .. } => "key_pem_malformed",
            Self::NoPrivateKey { .. } => "no_private_key",
            Self::UnsupportedKey { .. } => "unsupported_key",
            Self::KeyInvalid { .. } => "key_invalid",
            Self::KeyMismatch { .. } => "key_mismatch",
        }
    }

    /// The class of the cause, for metric labels.
    pub fn cause(&self) -> TlsCause {
        match self {
            Self::WrongSecretType { .. } => TlsCause::WrongType,
            Self::CertificateMissing
            | Self::CertificateEmpty
            | Self::KeyMissing
            | Self::KeyEmpty => TlsCause::MissingData,
            Self::UnrecognizedPemBlock { .. }
            | Self::UnexpectedPemBlock { .. }
            | Self::CertificateNotText { .. }
            | Self::CertificatePemMalformed { .. }
            | Self::NoCertificate { .. }
            | Self::CertificateUnparseable { .. }
            | Self::KeyNotText { .. }
            | Self::KeyPemMalformed { .. }
            | Self::NoPrivateKey { .. }
            | Self::KeyInvalid { .. } => TlsCause::BadPem,
            Self::UnsupportedCertificateKey { .. } | Self::UnsupportedKey { .. } => {
                TlsCause::UnsupportedKey
            }
            Self::WeakSignature { .. } => TlsCause::WeakSignature,
            Self::WeakKey { .. } => TlsCause::WeakKey,
            Self::KeyMismatch { .. } => TlsCause::KeyMismatch,
        }
    }

    /// The reason the OpenShift router records for this problem:
    /// [`ROUTER_REASON_SECRET`] for a secret of the wrong type (checked with the access
    /// rights), [`ROUTER_REASON_CERTIFICATE`] for everything about the certificate and key.
    pub fn router_reason(&self) -> &'static str {
        match self {
            Self::WrongSecretType { .. } => ROUTER_REASON_SECRET,
            _ => ROUTER_REASON_CERTIFICATE,
        }
    }
}

/// Something about valid TLS material that a person should know. The material is served
/// all the same, as the router would serve it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsWarning {
    /// The server certificate has expired. The router serves expired certificates on
    /// purpose (a route keeps its own certificate rather than falling back to the default
    /// one); clients that check dates will refuse it.
    Expired {
        /// End of its validity.
        not_after: Timestamp,
    },
    /// The server certificate is not valid yet; served all the same, as by the router.
    NotYetValid {
        /// Start of its validity.
        not_before: Timestamp,
    },
    /// The server certificate expires within the warning window.
    ExpiresSoon {
        /// End of its validity.
        not_after: Timestamp,
        /// Whole days left at the time of the check.
        days_left: i64,
    },
    /// The server certificate's names do not cover the route's host.
    HostNotCovered {
        /// The route's host.
        host: String,
        /// The certificate's DNS names (SANs, or the CN when there are none).
        names: Vec<String>,
    },
    /// The chain in `tls.crt` was not in issuing order; it is served reordered.
    ChainReordered {
        /// The served order, as positions in tls.crt (1-based).
        order: Vec<usize>,
    },
    /// Certificates in `tls.crt` that do not belong to the server certificate's issuer
    /// path; served after it, as given.
    UnrelatedCertificates {
        /// Their positions in tls.crt (1-based).
        positions: Vec<usize>,
    },
    /// The private key was taken from `tls.crt` (the router moves private key blocks found
    /// there to the key).
    KeyFromCertificateEntry,
    /// Broken PEM blocks that were skipped, as the router's PEM decoder skips them.
    SkippedPemBlocks {
        /// `tls.crt` or `tls.key`.
        entry: &'static str,
        /// Why each was skipped.
        problems: Vec<PemProblem>,
    },
    /// PEM blocks that were not used and were left out of the served material.
    IgnoredPemBlocks {
        /// `tls.crt` or `tls.key`.
        entry: &'static str,
        /// Their labels.
        labels: Vec<String>,
    },
}

/// Positions as `#1, #3`.
struct Positions<'a>(&'a [usize]);

impl fmt::Display for Positions<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, position) in self.0.iter().enumerate() {
            write!(f, "{}#{position}", if i == 0 { "" } else { ", " })?;
        }
        Ok(())
    }
}

impl fmt::Display for TlsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired { not_after } => write!(
                f,
                "the certificate in tls.crt expired at {not_after}; it is served anyway (as \
                 by the OpenShift router) but clients will refuse it: renew it"
            ),
            Self::NotYetValid { not_before } => write!(
                f,
                "the certificate in tls.crt is not valid before {not_before}; it is served \
                 anyway (as by the OpenShift router) but clients will refuse it until then: \
                 check the issuer's clock"
            ),
            Self::ExpiresSoon {
                not_after,
                days_left,
            } => write!(
                f,
                "the certificate in tls.crt expires at {not_after} ({days_left} days left); renew it"
            ),
            Self::HostNotCovered { host, names } => {
                write!(
                    f,
                    "the certificate in tls.crt does not cover the route host {host:?} (it covers"
                )?;
                if names.is_empty() {
                    f.write_str(" no DNS name")?;
                }
                for (i, name) in names.iter().take(10).enumerate() {
                    write!(f, "{}{name:?}", if i == 0 { " " } else { ", " })?;
                }
                if names.len() > 10 {
                    write!(f, " and {} more", names.len() - 10)?;
                }
                f.write_str("); clients will reject it unless they skip host name checks")
            }
            Self::ChainReordered { order } => write!(
                f,
                "the certificates in tls.crt are not in issuing order; they are served as {}: \
                 list each issuer after the certificate it issued",
                Positions(order)
            ),
            Self::UnrelatedCertificates { positions } => write!(
                f,
                "certificates {} in tls.crt did not issue the server certificate nor its \
                 issuers; remove them, or add the intermediate that links them",
                Positions(positions)
            ),
            Self::KeyFromCertificateEntry => {
                f.write_str("the private key was taken from tls.crt; keep it in tls.key only")
            }
            Self::SkippedPemBlocks { entry, problems } => {
                write!(f, "{entry} has broken PEM blocks that were skipped (")?;
                for (i, problem) in problems.iter().take(3).enumerate() {
                    write!(f, "{}{problem}", if i == 0 { "" } else { "; " })?;
                }
                if problems.len() > 3 {
                    write!(f, "; and {} more", problems.len() - 3)?;
                }
                f.write_str("); fix or remove them")
            }
            Self::IgnoredPemBlocks { entry, labels } => write!(
                f,
                "{entry} has blocks that were ignored ({}); remove them",
                labels.join(", ")
            ),
        }
    }
}

impl TlsWarning {
    /// A short, stable identifier of the variant, for metric labels and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Expired { .. } => "expired",
            Self::NotYetValid { .. } => "not_yet_valid",
            Self::ExpiresSoon { .. } => "expires_soon",
            Self::HostNotCovered { .. } => "host_not_covered",
            Self::ChainReordered { .. } => "chain_reordered",
            Self::UnrelatedCertificates { .. } => "unrelated_certificates",
            Self::KeyFromCertificateEntry => "key_from_certificate_entry",
            Self::SkippedPemBlocks { .. } => "skipped_pem_blocks",
            Self::IgnoredPemBlocks { .. } => "ignored_pem_blocks",
        }
    }

    /// Whether the warning belongs in the route's status message, next to
    /// `Admitted=True`: the certificate is served only because the router ignores its
    /// dates on purpose, and clients that check dates refuse it, so the route's owner
    /// must learn it where they look. The other warnings are advice, for the log.
    pub fn shown_in_status(&self) -> bool {
        matches!(self, Self::Expired { .. } | Self::NotYetValid { .. })
    }
}
