//! Certificates from `tls.crt`: parsing, and the order of the chain.

use x509_parser::certificate::X509Certificate;
use x509_parser::error::X509Error;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::X509Name;

use super::der;
use super::error::{TlsRejection, shorten};

/// Parses each DER certificate; positions in errors are 1-based.
pub(crate) fn parse<'a>(ders: &[&'a [u8]]) -> Result<Vec<X509Certificate<'a>>, TlsRejection> {
    ders.iter()
        .enumerate()
        .map(|(index, der)| {
            let unparseable = |detail: String| TlsRejection::CertificateUnparseable {
                position: index + 1,
                detail: shorten(detail),
            };
            match x509_parser::parse_x509_certificate(der) {
                Ok((rest, _)) if !rest.is_empty() => Err(unparseable(format!(
                    "{} bytes follow the certificate inside its PEM block",
                    rest.len()
                ))),
                Ok((_, certificate)) => Ok(certificate),
                Err(err) => Err(unparseable(err.to_string())),
            }
        })
        .collect()
}

/// Distinguished names are compared as encoded first; equal text with a different string
/// encoding (PrintableString vs UTF8String) also counts as the same name.
fn same_name(a: &X509Name<'_>, b: &X509Name<'_>) -> bool {
    a.as_raw() == b.as_raw() || a.to_string() == b.to_string()
}

/// ring verifies RSA signatures only from keys of 2048 bits or more; for smaller issuer
/// keys a failed verification says nothing about the chain.
fn ring_can_verify_with(issuer: &X509Certificate<'_>) -> bool {
    match issuer.public_key().parsed() {
        Ok(PublicKey::RSA(rsa)) => der::bit_length(der::trim_leading_zeros(rsa.modulus)) >= 2048,
        _ => true,
    }
}

/// Checks that every certificate is issued by the one after it: names first, then the
/// signature where ring supports the algorithm.
pub(crate) fn check_order(certificates: &[X509Certificate<'_>]) -> Result<(), TlsRejection> {
    for (index, pair) in certificates.windows(2).enumerate() {
        let [certificate, issuer] = pair else {
            continue;
        };
        if !same_name(certificate.issuer(), issuer.subject()) {
            return Err(TlsRejection::ChainOutOfOrder {
                position: index + 1,
                subject: shorten(certificate.subject().to_string()),
                issuer: shorten(certificate.issuer().to_string()),
                next_subject: shorten(issuer.subject().to_string()),
            });
        }
        match certificate.verify_signature(Some(issuer.public_key())) {
            Err(X509Error::SignatureVerificationError) if ring_can_verify_with(issuer) => {
                return Err(TlsRejection::ChainSignatureInvalid {
                    position: index + 1,
                    subject: shorten(certificate.subject().to_string()),
                    issuer: shorten(certificate.issuer().to_string()),
                });
            }
            // Verified, or an algorithm ring cannot check: the names decide.
            _ => {}
        }
    }
    Ok(())
}
