//! The checks the router makes on a route's TLS configuration beyond its certificate and
//! key (openshift/router `routeapihelpers.ExtendedValidateRoute`): what the termination
//! allows, the CA certificate the served certificate must be issued by
//! (`spec.tls.caCertificate`), the backend's CA (`spec.tls.destinationCACertificate`).
//! A failure is the router's `ExtendedValidationFailed`.

use std::fmt;

use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::ParsedExtension;
use x509_parser::prelude::FromDer as _;

use super::chain;
use super::error::{TlsRejection, shorten};
use super::pem;

/// The PEM labels the router's sanitizer knows (others make it refuse the field).
const KNOWN_LABELS: [&str; 10] = [
    "RSA PRIVATE KEY",
    "ECDSA PRIVATE KEY",
    "EC PRIVATE KEY",
    "PRIVATE KEY",
    "PUBLIC KEY",
    "RSA PUBLIC KEY",
    "DSA PUBLIC KEY",
    "ECDSA PUBLIC KEY",
    "CERTIFICATE",
    "EC PARAMETERS",
];

/// Which CA certificate field a problem is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaField {
    /// `spec.tls.caCertificate`.
    CaCertificate,
    /// `spec.tls.destinationCACertificate`.
    DestinationCaCertificate,
}

impl fmt::Display for CaField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CaCertificate => "spec.tls.caCertificate",
            Self::DestinationCaCertificate => "spec.tls.destinationCACertificate",
        })
    }
}

/// What is wrong with a CA certificate field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaProblem {
    /// No `CERTIFICATE` block.
    #[error("it holds no certificate; put the CA certificate(s) there, PEM-encoded")]
    NoCertificate,
    /// A `CERTIFICATE` block that does not parse.
    #[error("its certificate #{position} does not parse as X.509")]
    Unparseable {
        /// 1-based, among its certificates.
        position: usize,
    },
    /// A block the router does not know.
    #[error("it holds a {label} block, which the router does not accept there")]
    UnrecognizedBlock {
        /// The block's label.
        label: String,
    },
    /// A CA-signed certificate with a digest the router refuses.
    #[error(
        "its certificate #{position} ({subject}) is CA-signed using {digest}, which the router \
         does not support; re-issue it with SHA-256 or better"
    )]
    WeakSignature {
        /// 1-based, among its certificates.
        position: usize,
        /// Its subject.
        subject: String,
        /// `MD2`, `MD4`, `MD5` or `SHA-1`.
        digest: &'static str,
    },
}

/// Why a route's TLS configuration is refused (the router's `ExtendedValidationFailed`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsConfigProblem {
    /// A passthrough route with a certificate of its own (external, inline or CA
    /// certificates): the router forwards TLS to the backend and serves none.
    #[error(
        "passthrough termination does not support certificates ({fields}); remove them, or \
         use edge or reencrypt termination"
    )]
    PassthroughWithCertificate {
        /// The fields set, e.g. `spec.tls.externalCertificate`.
        fields: String,
    },
    /// A termination the router does not know.
    #[error("spec.tls.termination {value:?} is not supported; use edge, passthrough or reencrypt")]
    UnknownTermination {
        /// The value, shortened.
        value: String,
    },
    /// An edge route with a destination CA certificate (edge talks plain HTTP to the
    /// backend).
    #[error(
        "edge termination does not support destination certificates \
         (spec.tls.destinationCACertificate); remove it, or use reencrypt termination"
    )]
    EdgeWithDestinationCa,
    /// The route's inline certificate and key (`spec.tls.certificate`, `spec.tls.key`,
    /// read as a secret's `tls.crt` and `tls.key`).
    #[error("spec.tls.certificate / spec.tls.key (checked as tls.crt / tls.key): {0}")]
    Inline(TlsRejection),
    /// A CA certificate field is unusable.
    #[error("{field} is not usable: {problem}")]
    Ca {
        /// Which field.
        field: CaField,
        /// What is wrong.
        problem: CaProblem,
    },
    /// The served certificate is not issued by `spec.tls.caCertificate` (dates are not
    /// looked at, as by the router).
    #[error(
        "the certificate ({subject}) is not issued by a certificate of spec.tls.caCertificate \
         ({detail}); put its issuing CA there, or remove caCertificate"
    )]
    NotIssuedByCa {
        /// The served certificate's subject.
        subject: String,
        /// Why not.
        detail: &'static str,
    },
}

impl TlsConfigProblem {
    /// The class of an inline certificate problem (`None` for the configuration's own
    /// problems).
    pub fn tls_cause(&self) -> Option<super::TlsCause> {
        match self {
            Self::Inline(rejection) => Some(rejection.cause()),
            _ => None,
        }
    }
}

/// The parsed certificates of a CA field, checked as the router checks them: at least
/// one certificate, each parses, only known PEM blocks, no CA-signed certificate with a
/// digest the router refuses.
pub(crate) fn ca_certificates(
    text: &str,
    field: CaField,
) -> Result<Vec<Vec<u8>>, TlsConfigProblem> {
    let problem = |problem| TlsConfigProblem::Ca { field, problem };
    let scan = pem::scan(text);
    if let Some(block) = scan
        .blocks
        .iter()
        .find(|block| !KNOWN_LABELS.contains(&block.label.as_str()))
    {
        return Err(problem(CaProblem::UnrecognizedBlock {
            label: block.display_label(),
        }));
    }
    let ders: Vec<Vec<u8>> = scan
        .blocks
        .into_iter()
        .filter(|block| block.label == "CERTIFICATE")
        .map(|block| block.der)
        .collect();
    if ders.is_empty() {
        return Err(problem(CaProblem::NoCertificate));
    }
    for (index, der) in ders.iter().enumerate() {
        let Ok((_, certificate)) = X509Certificate::from_der(der) else {
            return Err(problem(CaProblem::Unparseable {
                position: index + 1,
            }));
        };
        if let Some(digest) = chain::weak_digest(&certificate)
            && !chain::is_self_signed(&certificate)
        {
            return Err(problem(CaProblem::WeakSignature {
                position: index + 1,
                subject: shorten(certificate.subject().to_string()),
                digest,
            }));
        }
    }
    Ok(ders)
}

/// Whether the served certificate `leaf` (DER) is issued by one of `authorities` (DER,
/// from `spec.tls.caCertificate`), as Go's `Verify` decides it with those certificates as
/// roots and intermediates, dates ignored: one of them (a CA) signed it, or it is one of
/// them; a leaf with extended key usages must allow server authentication.
pub(crate) fn issued_by(leaf: &[u8], authorities: &[Vec<u8>]) -> Result<(), TlsConfigProblem> {
    let Ok((_, certificate)) = X509Certificate::from_der(leaf) else {
        return Err(TlsConfigProblem::NotIssuedByCa {
            subject: "unparseable".to_owned(),
            detail: "the certificate does not parse",
        });
    };
    let refused = |detail| TlsConfigProblem::NotIssuedByCa {
        subject: shorten(certificate.subject().to_string()),
        detail,
    };
    if !allows_server_auth(&certificate) {
        return Err(refused(
            "its extended key usage does not allow server authentication",
        ));
    }
    if authorities
        .iter()
        .any(|authority| authority.as_slice() == leaf)
    {
        return Ok(());
    }
    let issuers: Vec<X509Certificate<'_>> = authorities
        .iter()
        .filter_map(|der| {
            X509Certificate::from_der(der)
                .ok()
                .map(|(_, parsed)| parsed)
        })
        .filter(|authority| authority.subject().as_raw() == certificate.issuer().as_raw())
        .collect();
    if issuers.is_empty() {
        return Err(refused("no certificate there has its issuer's name"));
    }
    let signed: Vec<&X509Certificate<'_>> = issuers
        .iter()
        .filter(|issuer| chain::signature_fits(&certificate, issuer))
        .collect();
    if signed.is_empty() {
        return Err(refused(
            "the certificate there with its issuer's name did not sign it",
        ));
    }
    if !signed.iter().any(|issuer| is_ca(issuer)) {
        return Err(refused("its issuer there is not a CA certificate"));
    }
    Ok(())
}

/// Whether a certificate may issue others: basic constraints say it is a CA (or a
/// version 1 certificate, which has none).
fn is_ca(certificate: &X509Certificate<'_>) -> bool {
    if certificate.version().0 < 2 {
        return true;
    }
    certificate.iter_extensions().any(|extension| {
        matches!(extension.parsed_extension(), ParsedExtension::BasicConstraints(constraints) if constraints.ca)
    })
}

/// Whether the certificate's extended key usage (when it has one) allows server
/// authentication.
fn allows_server_auth(certificate: &X509Certificate<'_>) -> bool {
    certificate
        .iter_extensions()
        .all(|extension| match extension.parsed_extension() {
            ParsedExtension::ExtendedKeyUsage(usage) => usage.any || usage.server_auth,
            _ => true,
        })
}
