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

/// Why the TLS material of a secret cannot be served. The checks run in the order of the
/// variants; the first failure is reported.
///
/// Certificate positions (`position`) are 1-based: 1 is the server certificate.
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
    /// `tls.crt` is not text.
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
    /// `tls.crt` has a malformed PEM block.
    #[error("tls.crt is not valid PEM: {problem}; re-export the certificate chain as PEM")]
    CertificatePemMalformed {
        /// What is wrong, and where.
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
    /// A certificate is not issued by the certificate that follows it.
    #[error(
        "tls.crt is out of order: certificate #{position} ({subject}) was issued by \
         \"{issuer}\", but certificate #{next} is \"{next_subject}\"; list the server \
         certificate first, then each issuer in turn",
        next = position + 1
    )]
    ChainOutOfOrder {
        /// Position of the certificate whose issuer does not follow it.
        position: usize,
        /// Its subject.
        subject: String,
        /// Its issuer.
        issuer: String,
        /// The subject of the certificate that follows it.
        next_subject: String,
    },
    /// A certificate names the next one as issuer, but its signature does not verify with
    /// that certificate's key.
    #[error(
        "tls.crt has a broken chain: certificate #{position} ({subject}) names \"{issuer}\" \
         as issuer but its signature does not verify with the key of certificate #{next}; \
         use the intermediate certificate that actually issued it",
        next = position + 1
    )]
    ChainSignatureInvalid {
        /// Position of the certificate whose signature fails.
        position: usize,
        /// Its subject.
        subject: String,
        /// Its issuer.
        issuer: String,
    },
    /// `tls.key` is not text.
    #[error(
        "tls.key is not PEM text: byte {offset} is not valid UTF-8; provide the key \
         PEM-encoded (`openssl pkey -outform pem`)"
    )]
    KeyNotText {
        /// Offset of the first invalid byte.
        offset: usize,
    },
    /// `tls.key` has a malformed PEM block.
    #[error("tls.key is not valid PEM: {problem}; re-export the private key as PEM")]
    KeyPemMalformed {
        /// What is wrong, and where.
        problem: PemProblem,
    },
    /// `tls.key` holds no private key block.
    #[error(
        "tls.key contains no private key ({labels}); put the unencrypted PEM private key \
         (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY) in it",
        labels = Labels(found_labels)
    )]
    NoPrivateKey {
        /// Labels of the blocks that were found.
        found_labels: Vec<String>,
    },
    /// The key is encrypted, or of an algorithm or format the router cannot serve.
    #[error(
        "tls.key holds an unsupported key ({label}: {detail}); supported are unencrypted \
         RSA (2048 bits or more), ECDSA P-256/P-384 and Ed25519 keys in PKCS#8, PKCS#1 or \
         SEC1 PEM"
    )]
    UnsupportedKey {
        /// The PEM label of the key block.
        label: String,
        /// What makes it unsupported.
        detail: String,
    },
    /// The key block does not decode as the structure its label announces.
    #[error("tls.key is corrupt ({label}: {detail}); re-export the private key")]
    KeyInvalid {
        /// The PEM label of the key block.
        label: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The key does not belong to the server certificate.
    #[error(
        "tls.key ({key} key) is not the private key of the certificate in tls.crt \
         ({subject}, {certificate} public key); put the key the certificate was issued for \
         in tls.key"
    )]
    KeyMismatch {
        /// The key's algorithm.
        key: String,
        /// The algorithm of the certificate's public key.
        certificate: String,
        /// Subject of the server certificate.
        subject: String,
    },
    /// The server certificate has expired.
    #[error("the certificate in tls.crt ({subject}) expired at {not_after} (now {now}); renew it")]
    CertificateExpired {
        /// Subject of the server certificate.
        subject: String,
        /// End of its validity.
        not_after: Timestamp,
        /// The time of the check.
        now: Timestamp,
    },
    /// The server certificate is not valid yet.
    #[error(
        "the certificate in tls.crt ({subject}) is not valid before {not_before} (now {now}); \
         check the issuer's and this machine's clocks"
    )]
    CertificateNotYetValid {
        /// Subject of the server certificate.
        subject: String,
        /// Start of its validity.
        not_before: Timestamp,
        /// The time of the check.
        now: Timestamp,
    },
}

impl TlsRejection {
    /// A short, stable identifier of the variant, for metric labels and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::WrongSecretType { .. } => "wrong_secret_type",
            Self::CertificateMissing => "certificate_missing",
            Self::CertificateEmpty => "certificate_empty",
            Self::KeyMissing => "key_missing",
            Self::KeyEmpty => "key_empty",
            Self::CertificateNotText { .. } => "certificate_not_text",
            Self::CertificatePemMalformed { .. } => "certificate_pem_malformed",
            Self::NoCertificate { .. } => "no_certificate",
            Self::CertificateUnparseable { .. } => "certificate_unparseable",
            Self::ChainOutOfOrder { .. } => "chain_out_of_order",
            Self::ChainSignatureInvalid { .. } => "chain_signature_invalid",
            Self::KeyNotText { .. } => "key_not_text",
            Self::KeyPemMalformed { .. } => "key_pem_malformed",
            Self::NoPrivateKey { .. } => "no_private_key",
            Self::UnsupportedKey { .. } => "unsupported_key",
            Self::KeyInvalid { .. } => "key_invalid",
            Self::KeyMismatch { .. } => "key_mismatch",
            Self::CertificateExpired { .. } => "certificate_expired",
            Self::CertificateNotYetValid { .. } => "certificate_not_yet_valid",
        }
    }
}

/// Something about valid TLS material that a person should know.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TlsWarning {
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
    /// PEM blocks that were not used and were left out of the served material.
    IgnoredPemBlocks {
        /// `tls.crt` or `tls.key`.
        entry: &'static str,
        /// Their labels.
        labels: Vec<String>,
    },
}

impl fmt::Display for TlsWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
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
            Self::ExpiresSoon { .. } => "expires_soon",
            Self::HostNotCovered { .. } => "host_not_covered",
            Self::IgnoredPemBlocks { .. } => "ignored_pem_blocks",
        }
    }
}
