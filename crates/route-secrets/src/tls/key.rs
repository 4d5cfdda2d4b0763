//! Private keys from `tls.key`: which encodings and algorithms are served, and whether a
//! key belongs to a certificate.
//!
//! Structures are read with `asn1-rs` (already used by x509-parser). ring checks that the
//! private parts are consistent where it can: RSA keys of 2048..=4096 bits and P-256/P-384
//! keys. Whether a key matches a certificate is decided the way OpenSSL's
//! `X509_check_private_key` does, by comparing public components: the RSA modulus and
//! exponent, the EC point (derived from the private scalar by ring when the key file does
//! not carry it), the Ed25519 public key (derived by ring).
//!
//! Nothing here implements `Debug` or `Display` for key material.

use std::fmt;

use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING, EcdsaKeyPair,
    EcdsaSigningAlgorithm, Ed25519KeyPair, KeyPair as _, RsaKeyPair,
};
use x509_parser::asn1_rs::{Oid, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_DSA, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_EC_P521,
    OID_PKCS1_RSAENCRYPTION, OID_PKCS1_RSASSAPSS, OID_SIG_ED448, OID_SIG_ED25519,
};
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use super::der::{self, Elements};
use super::error::{TlsRejection, TlsWarning, shorten};
use super::pem::{self, PemBlock};

const LABEL_PKCS8: &str = "PRIVATE KEY";
const LABEL_PKCS1: &str = "RSA PRIVATE KEY";
const LABEL_SEC1: &str = "EC PRIVATE KEY";
const LABEL_ENCRYPTED_PKCS8: &str = "ENCRYPTED PRIVATE KEY";
/// OpenSSL writes the curve parameters before a SEC1 key (`openssl ecparam -genkey`).
const LABEL_EC_PARAMETERS: &str = "EC PARAMETERS";

/// Smallest RSA modulus served; OpenSSL's default security level 2 refuses less.
const MIN_RSA_BITS: usize = 2048;
/// Largest RSA modulus ring will check for consistency.
const MAX_RING_RSA_BITS: usize = 4096;
/// Object identifier of X25519 keys (RFC 8410), which cannot sign.
const OID_X25519_BYTES: &[u8] = &[0x2b, 0x65, 0x6e];

/// The algorithm of a private or public key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// RSA with a modulus of `bits` bits.
    Rsa {
        /// Modulus size.
        bits: usize,
    },
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa { bits } => write!(f, "RSA {bits}-bit"),
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::Ed25519 => f.write_str("Ed25519"),
        }
    }
}

/// How a private key was encoded in `tls.key`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyEncoding {
    /// PKCS#8 `PRIVATE KEY` (RFC 5958).
    Pkcs8,
    /// PKCS#1 `RSA PRIVATE KEY` (RFC 8017).
    Pkcs1,
    /// SEC1 `EC PRIVATE KEY` (RFC 5915).
    Sec1,
}

impl KeyEncoding {
    /// The PEM label of this encoding.
    pub fn pem_label(self) -> &'static str {
        match self {
            Self::Pkcs8 => LABEL_PKCS8,
            Self::Pkcs1 => LABEL_PKCS1,
            Self::Sec1 => LABEL_SEC1,
        }
    }
}

/// The elliptic curves served.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Curve {
    P256,
    P384,
}

impl Curve {
    fn from_oid(oid: &[u8]) -> Result<Self, String> {
        if oid == OID_EC_P256.as_bytes() {
            Ok(Self::P256)
        } else if oid == OID_NIST_EC_P384.as_bytes() {
            Ok(Self::P384)
        } else if oid == OID_NIST_EC_P521.as_bytes() {
            Err("ECDSA P-521 keys cannot be served".to_owned())
        } else {
            Err(format!(
                "elliptic curve {} cannot be served",
                oid_string(oid)
            ))
        }
    }

    fn scalar_len(self) -> usize {
        match self {
            Self::P256 => 32,
            Self::P384 => 48,
        }
    }

    fn signing(self) -> &'static EcdsaSigningAlgorithm {
        match self {
            Self::P256 => &ECDSA_P256_SHA256_ASN1_SIGNING,
            Self::P384 => &ECDSA_P384_SHA384_ASN1_SIGNING,
        }
    }

    fn algorithm(self) -> KeyAlgorithm {
        match self {
            Self::P256 => KeyAlgorithm::EcdsaP256,
            Self::P384 => KeyAlgorithm::EcdsaP384,
        }
    }
}

/// The public side of a private key, or what is needed to derive it.
enum PublicPart {
    Rsa {
        modulus: Vec<u8>,
        exponent: Vec<u8>,
    },
    Ec {
        curve: Curve,
        /// Left-padded to the curve's scalar length.
        scalar: Vec<u8>,
        /// Uncompressed point, when the key file carries one (already checked against
        /// the scalar).
        point: Option<Vec<u8>>,
    },
    Ed25519 {
        public: Vec<u8>,
    },
}

/// A parsed private key. Deliberately neither `Debug` nor `Display`.
pub(crate) struct PrivateKey {
    pub(crate) algorithm: KeyAlgorithm,
    pub(crate) encoding: KeyEncoding,
    /// The key block's DER, re-encoded as PEM for serving.
    der: Vec<u8>,
    public: PublicPart,
}

impl PrivateKey {
    /// The key as PEM, with its original label and without surrounding text.
    pub(crate) fn to_pem(&self) -> String {
        pem::encode(self.encoding.pem_label(), &self.der)
    }
}

fn unsupported(label: &str, detail: impl Into<String>) -> TlsRejection {
    TlsRejection::UnsupportedKey {
        label: pem::display_label(label),
        detail: detail.into(),
    }
}

fn invalid(label: &str, detail: impl Into<String>) -> TlsRejection {
    TlsRejection::KeyInvalid {
        label: pem::display_label(label),
        detail: detail.into(),
    }
}

fn oid_string(oid: &[u8]) -> String {
    shorten(Oid::new(oid.into()).to_id_string())
}

/// Reads the private key from the bytes of `tls.key`.
///
/// Like Go's `tls.X509KeyPair`, the first block labelled `PRIVATE KEY` or `... PRIVATE
/// KEY` is the key; other blocks are reported as ignored (except `EC PARAMETERS`, which
/// OpenSSL legitimately writes before SEC1 keys).
pub(crate) fn parse_key_file(bytes: &[u8]) -> Result<(PrivateKey, Vec<TlsWarning>), TlsRejection> {
    let text = std::str::from_utf8(bytes).map_err(|err| TlsRejection::KeyNotText {
        offset: err.valid_up_to(),
    })?;
    let blocks = pem::parse(text).map_err(|problem| TlsRejection::KeyPemMalformed { problem })?;
    let is_key =
        |block: &PemBlock| block.label == LABEL_PKCS8 || block.label.ends_with(" PRIVATE KEY");
    let Some(key_index) = blocks.iter().position(is_key) else {
        return Err(TlsRejection::NoPrivateKey {
            found_labels: blocks.iter().map(PemBlock::display_label).collect(),
        });
    };
    let ignored: Vec<String> = blocks
        .iter()
        .enumerate()
        .filter(|(i, block)| *i != key_index && block.label != LABEL_EC_PARAMETERS)
        .map(|(_, block)| block.display_label())
        .collect();
    let warnings = if ignored.is_empty() {
        Vec::new()
    } else {
        vec![TlsWarning::IgnoredPemBlocks {
            entry: "tls.key",
            labels: ignored,
        }]
    };
    let block = &blocks[key_index];
    if block.label == LABEL_ENCRYPTED_PKCS8 || block.is_encrypted() {
        return Err(unsupported(
            &block.label,
            "the key is encrypted; store it decrypted (`openssl pkey -in key.pem -out plain.pem`)",
        ));
    }
    let key = match block.label.as_str() {
        LABEL_PKCS8 => parse_pkcs8(&block.der)?,
        LABEL_PKCS1 => parse_pkcs1(&block.der, LABEL_PKCS1, KeyEncoding::Pkcs1)?,
        LABEL_SEC1 => parse_sec1(&block.der, None, LABEL_SEC1, KeyEncoding::Sec1)?,
        other => return Err(unsupported(other, "this key format cannot be served")),
    };
    Ok((key, warnings))
}

/// PKCS#8 `PrivateKeyInfo` / `OneAsymmetricKey` (RFC 5958).
fn parse_pkcs8(block: &[u8]) -> Result<PrivateKey, TlsRejection> {
    let label = LABEL_PKCS8;
    let broken = || invalid(label, "not a PKCS#8 PrivateKeyInfo structure");
    let mut fields = Elements::new(der::whole_sequence(block).ok_or_else(broken)?);
    let version = fields.next_unsigned().ok_or_else(broken)?;
    if version.len() > 1 || version.first().is_some_and(|v| *v > 1) {
        return Err(unsupported(label, "unknown PKCS#8 version"));
    }
    let mut algorithm = Elements::new(fields.next_universal(Tag::Sequence).ok_or_else(broken)?);
    let oid = algorithm.next_universal(Tag::Oid).ok_or_else(broken)?;
    let parameters = algorithm.next_any();
    let private_key = fields.next_universal(Tag::OctetString).ok_or_else(broken)?;
    // Attributes [0] and the v2 public key [1] may follow; nothing else may.
    fields.context_tagged().ok_or_else(broken)?;

    if oid == OID_PKCS1_RSAENCRYPTION.as_bytes() {
        let mut key = parse_pkcs1(private_key, label, KeyEncoding::Pkcs8)?;
        key.der = block.to_vec();
        Ok(key)
    } else if oid == OID_KEY_TYPE_EC_PUBLIC_KEY.as_bytes() {
        let curve_oid = parameters
            .filter(|p| p.tag() == Tag::Oid)
            .map(|p| p.data)
            .ok_or_else(|| invalid(label, "the EC key names no curve"))?;
        let curve = Curve::from_oid(curve_oid).map_err(|detail| unsupported(label, detail))?;
        let mut key = parse_sec1(private_key, Some(curve), label, KeyEncoding::Pkcs8)?;
        key.der = block.to_vec();
        Ok(key)
    } else if oid == OID_SIG_ED25519.as_bytes() {
        // Accepts v1 (no public key) and v2 (public key, checked against the seed).
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(block)
            .map_err(|rejected| invalid(label, format!("Ed25519 key rejected: {rejected}")))?;
        Ok(PrivateKey {
            algorithm: KeyAlgorithm::Ed25519,
            encoding: KeyEncoding::Pkcs8,
            der: block.to_vec(),
            public: PublicPart::Ed25519 {
                public: pair.public_key().as_ref().to_vec(),
            },
        })
    } else {
        let name = if oid == OID_SIG_ED448.as_bytes() {
            "Ed448".to_owned()
        } else if oid == OID_X25519_BYTES {
            "X25519 (a key-agreement key, it cannot sign)".to_owned()
        } else if oid == OID_KEY_TYPE_DSA.as_bytes() {
            "DSA".to_owned()
        } else if oid == OID_PKCS1_RSASSAPSS.as_bytes() {
            "RSASSA-PSS-only RSA".to_owned()
        } else {
            format!("algorithm {}", oid_string(oid))
        };
        Err(unsupported(label, format!("{name} keys cannot be served")))
    }
}

/// PKCS#1 `RSAPrivateKey` (RFC 8017 appendix A.1.2).
fn parse_pkcs1(
    body: &[u8],
    label: &str,
    encoding: KeyEncoding,
) -> Result<PrivateKey, TlsRejection> {
    let broken = || invalid(label, "not a PKCS#1 RSAPrivateKey structure");
    let mut fields = Elements::new(der::whole_sequence(body).ok_or_else(broken)?);
    let version = fields.next_unsigned().ok_or_else(broken)?;
    if !version.is_empty() {
        return Err(unsupported(label, "multi-prime RSA keys cannot be served"));
    }
    let modulus = fields.next_unsigned().ok_or_else(broken)?;
    let exponent = fields.next_unsigned().ok_or_else(broken)?;
    // privateExponent, prime1, prime2, exponent1, exponent2, coefficient.
    for _ in 0..6 {
        fields.next_unsigned().ok_or_else(broken)?;
    }
    if !fields.is_empty() {
        return Err(broken());
    }
    let bits = der::bit_length(modulus);
    if bits < MIN_RSA_BITS {
        return Err(unsupported(
            label,
            format!("an RSA key of {bits} bits is too small; use {MIN_RSA_BITS} bits or more"),
        ));
    }
    if exponent.last().is_none_or(|low| low & 1 == 0) || exponent == [1] {
        return Err(invalid(
            label,
            "the RSA public exponent is not a valid odd number",
        ));
    }
    if bits <= MAX_RING_RSA_BITS {
        // ring also refuses some legitimate shapes (exponent 3, unusual prime sizes);
        // only its verdicts about broken components are reasons to reject.
        if let Err(rejected) = RsaKeyPair::from_der(body) {
            let verdict = rejected.to_string();
            if verdict == "InconsistentComponents" || verdict == "InvalidComponent" {
                return Err(invalid(
                    label,
                    format!("the RSA key's components do not belong together ({verdict})"),
                ));
            }
        }
    }
    Ok(PrivateKey {
        algorithm: KeyAlgorithm::Rsa { bits },
        encoding,
        der: body.to_vec(),
        public: PublicPart::Rsa {
            modulus: modulus.to_vec(),
            exponent: exponent.to_vec(),
        },
    })
}

/// SEC1 `ECPrivateKey` (RFC 5915), standalone or inside PKCS#8 (then `outer_curve`).
fn parse_sec1(
    body: &[u8],
    outer_curve: Option<Curve>,
    label: &str,
    encoding: KeyEncoding,
) -> Result<PrivateKey, TlsRejection> {
    let broken = || invalid(label, "not an ECPrivateKey structure");
    let mut fields = Elements::new(der::whole_sequence(body).ok_or_else(broken)?);
    if fields.next_unsigned().ok_or_else(broken)? != [1] {
        return Err(invalid(label, "unknown ECPrivateKey version"));
    }
    let private = fields.next_universal(Tag::OctetString).ok_or_else(broken)?;
    let mut inner_curve = None;
    let mut point = None;
    for (tag, contents) in fields.context_tagged().ok_or_else(broken)? {
        match tag {
            0 => {
                let oid = der::single(contents, Tag::Oid).ok_or_else(|| {
                    unsupported(
                        label,
                        "explicit curve parameters cannot be served; use a named curve",
                    )
                })?;
                inner_curve =
                    Some(Curve::from_oid(oid).map_err(|detail| unsupported(label, detail))?);
            }
            1 => {
                let bits = der::single(contents, Tag::BitString).ok_or_else(broken)?;
                point = Some(der::bit_string_bytes(bits).ok_or_else(broken)?);
            }
            _ => return Err(broken()),
        }
    }
    let curve = match (outer_curve, inner_curve) {
        (Some(outer), Some(inner)) if outer != inner => {
            return Err(invalid(label, "the key names two different curves"));
        }
        (Some(curve), _) | (None, Some(curve)) => curve,
        (None, None) => return Err(invalid(label, "the EC key names no curve")),
    };
    let private = der::trim_leading_zeros(private);
    if private.is_empty() || private.len() > curve.scalar_len() {
        return Err(invalid(
            label,
            "the private scalar has the wrong size for its curve",
        ));
    }
    let mut scalar = vec![0; curve.scalar_len() - private.len()];
    scalar.extend_from_slice(private);
    // Only an uncompressed point can be compared byte for byte; a compressed one is
    // treated as absent and the point is derived when matching.
    let point = point.filter(|p| p.first() == Some(&4)).map(<[u8]>::to_vec);
    if let Some(point) = &point {
        check_ec_pair(curve, &scalar, point).map_err(|verdict| {
            invalid(
                label,
                format!("the private and public parts do not belong together ({verdict})"),
            )
        })?;
    }
    Ok(PrivateKey {
        algorithm: curve.algorithm(),
        encoding,
        der: body.to_vec(),
        public: PublicPart::Ec {
            curve,
            scalar,
            point,
        },
    })
}

/// Whether `point` is the public point of `scalar`; ring derives it and compares.
fn check_ec_pair(curve: Curve, scalar: &[u8], point: &[u8]) -> Result<(), String> {
    EcdsaKeyPair::from_private_key_and_public_key(
        curve.signing(),
        scalar,
        point,
        &SystemRandom::new(),
    )
    .map(|_| ())
    .map_err(|rejected| rejected.to_string())
}

/// A person-readable name of a certificate's public key algorithm.
pub(crate) fn describe_public_key(spki: &SubjectPublicKeyInfo<'_>) -> String {
    let oid = spki.algorithm.algorithm.as_bytes();
    if oid == OID_PKCS1_RSAENCRYPTION.as_bytes() {
        match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => {
                let bits = der::bit_length(der::trim_leading_zeros(rsa.modulus));
                KeyAlgorithm::Rsa { bits }.to_string()
            }
            _ => "RSA (unreadable)".to_owned(),
        }
    } else if oid == OID_KEY_TYPE_EC_PUBLIC_KEY.as_bytes() {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .filter(|p| p.tag() == Tag::Oid)
            .map(|p| p.data);
        match curve.map(Curve::from_oid) {
            Some(Ok(curve)) => curve.algorithm().to_string(),
            Some(Err(_)) if curve == Some(OID_NIST_EC_P521.as_bytes()) => "ECDSA P-521".to_owned(),
            _ => "ECDSA on another curve".to_owned(),
        }
    } else if oid == OID_SIG_ED25519.as_bytes() {
        KeyAlgorithm::Ed25519.to_string()
    } else if oid == OID_SIG_ED448.as_bytes() {
        "Ed448".to_owned()
    } else {
        format!("algorithm {}", oid_string(oid))
    }
}

/// Checks that `key` belongs to `certificate` (the server certificate).
pub(crate) fn check_matches(
    key: &PrivateKey,
    certificate: &X509Certificate<'_>,
) -> Result<(), TlsRejection> {
    let spki = certificate.public_key();
    let oid = spki.algorithm.algorithm.as_bytes();
    let point = spki.subject_public_key.data.as_ref();
    let matches = match &key.public {
        PublicPart::Rsa { modulus, exponent } => {
            oid == OID_PKCS1_RSAENCRYPTION.as_bytes()
                && matches!(spki.parsed(), Ok(PublicKey::RSA(rsa))
                    if der::trim_leading_zeros(rsa.modulus) == modulus.as_slice()
                        && der::trim_leading_zeros(rsa.exponent) == exponent.as_slice())
        }
        PublicPart::Ec {
            curve,
            scalar,
            point: own_point,
        } => {
            let cert_curve = spki
                .algorithm
                .parameters
                .as_ref()
                .filter(|p| p.tag() == Tag::Oid)
                .and_then(|p| Curve::from_oid(p.data).ok());
            oid == OID_KEY_TYPE_EC_PUBLIC_KEY.as_bytes()
                && cert_curve == Some(*curve)
                && match own_point {
                    Some(own_point) => own_point.as_slice() == point,
                    None => check_ec_pair(*curve, scalar, point).is_ok(),
                }
        }
        PublicPart::Ed25519 { public } => {
            oid == OID_SIG_ED25519.as_bytes() && public.as_slice() == point
        }
    };
    if matches {
        Ok(())
    } else {
        Err(TlsRejection::KeyMismatch {
            key: key.algorithm.to_string(),
            certificate: describe_public_key(spki),
            subject: shorten(certificate.subject().to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
        assert!(contents.len() < 0x80);
        let mut out = vec![tag, contents.len() as u8];
        out.extend_from_slice(contents);
        out
    }

    fn sec1_with_parameters(parameters: &[u8]) -> Vec<u8> {
        let fields = [tlv(0x02, &[1]), tlv(0x04, &[7; 32]), tlv(0xa0, parameters)].concat();
        tlv(0x30, &fields)
    }

    fn rejection(result: Result<PrivateKey, TlsRejection>) -> TlsRejection {
        match result {
            Ok(_) => panic!("expected a rejection"),
            Err(err) => err,
        }
    }

    #[test]
    fn explicit_or_unknown_curves_are_unsupported() {
        let explicit = sec1_with_parameters(&tlv(0x30, &tlv(0x02, &[1])));
        let err = rejection(parse_sec1(&explicit, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("named curve")),
            "{err}"
        );

        // secp256k1, 1.3.132.0.10
        let unknown = sec1_with_parameters(&tlv(0x06, &[0x2b, 0x81, 0x04, 0x00, 0x0a]));
        let err = rejection(parse_sec1(&unknown, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("1.3.132.0.10")),
            "{err}"
        );
    }

    #[test]
    fn curve_must_be_named_once() {
        let p256 = sec1_with_parameters(&tlv(0x06, OID_EC_P256.as_bytes()));
        let err = rejection(parse_sec1(
            &p256,
            Some(Curve::P384),
            LABEL_PKCS8,
            KeyEncoding::Pkcs8,
        ));
        assert!(
            matches!(&err, TlsRejection::KeyInvalid { detail, .. } if detail.contains("two different curves")),
            "{err}"
        );

        let unnamed = tlv(0x30, &[tlv(0x02, &[1]), tlv(0x04, &[7; 32])].concat());
        let err = rejection(parse_sec1(&unnamed, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(
            matches!(&err, TlsRejection::KeyInvalid { detail, .. } if detail.contains("no curve")),
            "{err}"
        );
    }

    #[test]
    fn unknown_pkcs8_algorithms_are_named() {
        let algorithm = tlv(0x30, &tlv(0x06, &[0x2a, 0x03, 0x04]));
        let pkcs8 = tlv(
            0x30,
            &[tlv(0x02, &[0]), algorithm, tlv(0x04, &[0; 4])].concat(),
        );
        let err = rejection(parse_pkcs8(&pkcs8));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("1.2.3.4")),
            "{err}"
        );
    }

    #[test]
    fn trailing_garbage_in_a_key_is_invalid() {
        let mut p256 = sec1_with_parameters(&tlv(0x06, OID_EC_P256.as_bytes()));
        p256.push(0);
        let err = rejection(parse_sec1(&p256, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(matches!(err, TlsRejection::KeyInvalid { .. }), "{err}");
    }
}
