//! Private keys: which encodings and algorithms are served, and whether a key belongs to
//! a certificate.
//!
//! The router (openshift/router `routeapihelpers.sanitizePEM`) accepts the key blocks
//! `PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY` and `ECDSA PRIVATE KEY`, decodes
//! each as PKCS#8, then PKCS#1, then SEC1 whatever its label says, and serves only RSA and
//! ECDSA keys (on the curves Go knows: P-224, P-256, P-384, P-521). The same is done here;
//! the key is written back with the label of the encoding it really has.
//!
//! Structures are read with `asn1-rs` (already used by x509-parser). ring checks that the
//! private parts are consistent where it can: RSA keys of 2048..=4096 bits and P-256/P-384
//! keys; RustCrypto's `p224` and `p521` derive the public point of the curves ring lacks.
//! Whether a key matches a certificate is decided the way Go's `tls.X509KeyPair` and
//! OpenSSL's `X509_check_private_key` do, by comparing public components: the RSA modulus
//! and exponent, the EC point derived from the private scalar.
//!
//! Nothing here implements `Debug` or `Display` for key material.

use std::fmt;

use p224::elliptic_curve::sec1::ToEncodedPoint as _;
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_ASN1_SIGNING, ECDSA_P384_SHA384_ASN1_SIGNING, EcdsaKeyPair,
    EcdsaSigningAlgorithm, RsaKeyPair,
};
use x509_parser::asn1_rs::{Oid, Tag};
use x509_parser::certificate::X509Certificate;
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_DSA, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_NIST_EC_P521,
    OID_PKCS1_RSAENCRYPTION, OID_PKCS1_RSASSAPSS, OID_SIG_ED448, OID_SIG_ED25519,
};
use x509_parser::x509::SubjectPublicKeyInfo;

use super::der::{self, Elements};
use super::error::{TlsRejection, shorten};
use super::pem::{self, PemBlock};

const LABEL_PKCS8: &str = "PRIVATE KEY";
const LABEL_PKCS1: &str = "RSA PRIVATE KEY";
const LABEL_SEC1: &str = "EC PRIVATE KEY";
/// A label some tools write for SEC1 keys; the router accepts it.
const LABEL_ECDSA: &str = "ECDSA PRIVATE KEY";
const LABEL_ENCRYPTED_PKCS8: &str = "ENCRYPTED PRIVATE KEY";

/// Largest RSA modulus ring will check for consistency.
const MAX_RING_RSA_BITS: usize = 4096;
/// Object identifier of X25519 keys (RFC 8410), which cannot sign.
const OID_X25519_BYTES: &[u8] = &[0x2b, 0x65, 0x6e];
/// Object identifier of NIST P-224 (secp224r1, 1.3.132.0.33).
const OID_P224_BYTES: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x21];
/// Object identifier of secp256k1 (1.3.132.0.10), named in messages.
const OID_SECP256K1_BYTES: &[u8] = &[0x2b, 0x81, 0x04, 0x00, 0x0a];

/// The algorithm of a served private key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyAlgorithm {
    /// RSA with a modulus of `bits` bits.
    Rsa {
        /// Modulus size.
        bits: usize,
    },
    /// ECDSA on NIST P-224.
    EcdsaP224,
    /// ECDSA on NIST P-256.
    EcdsaP256,
    /// ECDSA on NIST P-384.
    EcdsaP384,
    /// ECDSA on NIST P-521.
    EcdsaP521,
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa { bits } => write!(f, "RSA {bits}-bit"),
            Self::EcdsaP224 => f.write_str("ECDSA P-224"),
            Self::EcdsaP256 => f.write_str("ECDSA P-256"),
            Self::EcdsaP384 => f.write_str("ECDSA P-384"),
            Self::EcdsaP521 => f.write_str("ECDSA P-521"),
        }
    }
}

/// How a private key is encoded.
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

/// The elliptic curves served: those Go's `crypto/x509` parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Curve {
    P224,
    P256,
    P384,
    P521,
}

impl Curve {
    fn from_oid(oid: &[u8]) -> Option<Self> {
        if oid == OID_P224_BYTES {
            Some(Self::P224)
        } else if oid == OID_EC_P256.as_bytes() {
            Some(Self::P256)
        } else if oid == OID_NIST_EC_P384.as_bytes() {
            Some(Self::P384)
        } else if oid == OID_NIST_EC_P521.as_bytes() {
            Some(Self::P521)
        } else {
            None
        }
    }

    /// The curve's size in bits (its order's).
    pub(crate) fn bits(self) -> usize {
        match self {
            Self::P224 => 224,
            Self::P256 => 256,
            Self::P384 => 384,
            Self::P521 => 521,
        }
    }

    fn scalar_len(self) -> usize {
        match self {
            Self::P224 => 28,
            Self::P256 => 32,
            Self::P384 => 48,
            Self::P521 => 66,
        }
    }

    fn algorithm(self) -> KeyAlgorithm {
        match self {
            Self::P224 => KeyAlgorithm::EcdsaP224,
            Self::P256 => KeyAlgorithm::EcdsaP256,
            Self::P384 => KeyAlgorithm::EcdsaP384,
            Self::P521 => KeyAlgorithm::EcdsaP521,
        }
    }

    /// ring's signing algorithm for the curves ring has.
    fn ring_signing(self) -> Option<&'static EcdsaSigningAlgorithm> {
        match self {
            Self::P256 => Some(&ECDSA_P256_SHA256_ASN1_SIGNING),
            Self::P384 => Some(&ECDSA_P384_SHA384_ASN1_SIGNING),
            Self::P224 | Self::P521 => None,
        }
    }

    /// The uncompressed public point of `scalar`, for the curves ring lacks.
    fn derive_point(self, scalar: &[u8]) -> Option<Vec<u8>> {
        match self {
            Self::P224 => p224::SecretKey::from_slice(scalar).ok().map(|secret| {
                secret
                    .public_key()
                    .to_encoded_point(false)
                    .as_bytes()
                    .to_vec()
            }),
            Self::P521 => p521::SecretKey::from_slice(scalar).ok().map(|secret| {
                secret
                    .public_key()
                    .to_encoded_point(false)
                    .as_bytes()
                    .to_vec()
            }),
            Self::P256 | Self::P384 => None,
        }
    }
}

/// A curve's name for messages: the served ones by their NIST names, two common others
/// by theirs, any other by its object identifier.
fn curve_name(oid: &[u8]) -> String {
    match Curve::from_oid(oid) {
        Some(curve) => curve.algorithm().to_string().replace("ECDSA ", ""),
        None if oid == OID_SECP256K1_BYTES => "secp256k1".to_owned(),
        None if oid.starts_with(&[0x2b, 0x24, 0x03, 0x03, 0x02, 0x08, 0x01, 0x01]) => {
            "a brainpool curve".to_owned()
        }
        None => format!("curve {}", oid_string(oid)),
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
        /// Uncompressed point: derived (P-224, P-521) or carried by the key file (then
        /// already checked against the scalar); `None` when ring must check a candidate.
        point: Option<Vec<u8>>,
    },
}

/// A parsed private key. Deliberately neither `Debug` nor `Display`.
pub(crate) struct PrivateKey {
    pub(crate) algorithm: KeyAlgorithm,
    pub(crate) encoding: KeyEncoding,
    /// The key's DER, re-encoded as PEM for serving.
    der: Vec<u8>,
    public: PublicPart,
}

impl PrivateKey {
    /// The key's DER, in the encoding it has ([`KeyEncoding::pem_label`] labels it).
    pub(crate) fn der(&self) -> &[u8] {
        &self.der
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

/// Whether a PEM label announces a private key (`PRIVATE KEY` or `... PRIVATE KEY`).
pub(crate) fn is_private_key_label(label: &str) -> bool {
    label == LABEL_PKCS8 || label.ends_with(" PRIVATE KEY")
}

/// Reads one private key block.
///
/// Like the router, the four key labels it knows are decoded as PKCS#8, PKCS#1 or SEC1,
/// whichever fits; the label's own encoding is tried first, and its error is the one
/// reported when none fits. Encrypted keys and other key labels are unsupported.
pub(crate) fn parse_key_block(block: &PemBlock) -> Result<PrivateKey, TlsRejection> {
    let label = block.label.as_str();
    if label == LABEL_ENCRYPTED_PKCS8 || block.is_encrypted() {
        return Err(unsupported(
            label,
            "the key is encrypted; store it decrypted (`openssl pkey -in key.pem -out plain.pem`)",
        ));
    }
    let encodings = match label {
        LABEL_PKCS8 => [KeyEncoding::Pkcs8, KeyEncoding::Pkcs1, KeyEncoding::Sec1],
        LABEL_PKCS1 => [KeyEncoding::Pkcs1, KeyEncoding::Pkcs8, KeyEncoding::Sec1],
        LABEL_SEC1 | LABEL_ECDSA => [KeyEncoding::Sec1, KeyEncoding::Pkcs8, KeyEncoding::Pkcs1],
        other if other.starts_with("DSA ") => {
            return Err(unsupported(other, "DSA keys cannot be served"));
        }
        other => return Err(unsupported(other, "this key format cannot be served")),
    };
    let mut first_error = None;
    for encoding in encodings {
        let parsed = match encoding {
            KeyEncoding::Pkcs8 => parse_pkcs8(&block.der, label),
            KeyEncoding::Pkcs1 => parse_pkcs1(&block.der, label, KeyEncoding::Pkcs1),
            KeyEncoding::Sec1 => parse_sec1(&block.der, None, label, KeyEncoding::Sec1),
        };
        match parsed {
            Ok(key) => return Ok(key),
            Err(error) => {
                first_error.get_or_insert(error);
            }
        }
    }
    Err(first_error.unwrap_or_else(|| invalid(label, "not a private key")))
}

/// PKCS#8 `PrivateKeyInfo` / `OneAsymmetricKey` (RFC 5958).
fn parse_pkcs8(block: &[u8], label: &str) -> Result<PrivateKey, TlsRejection> {
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
        let curve =
            Curve::from_oid(curve_oid).ok_or_else(|| unsupported_curve(label, curve_oid))?;
        let mut key = parse_sec1(private_key, Some(curve), label, KeyEncoding::Pkcs8)?;
        key.der = block.to_vec();
        Ok(key)
    } else {
        let name = if oid == OID_SIG_ED25519.as_bytes() {
            "Ed25519 keys cannot be served (the OpenShift router serves only RSA and ECDSA \
             keys)"
                .to_owned()
        } else if oid == OID_SIG_ED448.as_bytes() {
            "Ed448 keys cannot be served".to_owned()
        } else if oid == OID_X25519_BYTES {
            "X25519 keys cannot be served (a key-agreement key, it cannot sign)".to_owned()
        } else if oid == OID_KEY_TYPE_DSA.as_bytes() {
            "DSA keys cannot be served".to_owned()
        } else if oid == OID_PKCS1_RSASSAPSS.as_bytes() {
            "RSASSA-PSS-only RSA keys cannot be served".to_owned()
        } else {
            format!("keys of algorithm {} cannot be served", oid_string(oid))
        };
        Err(unsupported(label, name))
    }
}

fn unsupported_curve(label: &str, oid: &[u8]) -> TlsRejection {
    unsupported(
        label,
        format!(
            "ECDSA keys on {} cannot be served (the router knows P-224, P-256, P-384 and P-521)",
            curve_name(oid)
        ),
    )
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
    if exponent.last().is_none_or(|low| low & 1 == 0) || exponent == [1] {
        return Err(invalid(
            label,
            "the RSA public exponent is not a valid odd number",
        ));
    }
    if (2048..=MAX_RING_RSA_BITS).contains(&bits) {
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
                    Some(Curve::from_oid(oid).ok_or_else(|| unsupported_curve(label, oid))?);
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
    // treated as absent, and the point is derived (or checked by ring) instead.
    let carried = point.filter(|p| p.first() == Some(&4)).map(<[u8]>::to_vec);
    let point = match curve.derive_point(&scalar) {
        Some(derived) => {
            if carried.as_ref().is_some_and(|carried| *carried != derived) {
                return Err(mismatched_parts(
                    label,
                    "the public key is not the scalar's",
                ));
            }
            Some(derived)
        }
        None if curve.ring_signing().is_none() => {
            return Err(invalid(
                label,
                "the private scalar is not valid for its curve",
            ));
        }
        None => {
            if let Some(carried) = &carried {
                check_ring_pair(curve, &scalar, carried)
                    .map_err(|verdict| mismatched_parts(label, &verdict))?;
            }
            carried
        }
    };
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

fn mismatched_parts(label: &str, verdict: &str) -> TlsRejection {
    invalid(
        label,
        format!("the private and public parts do not belong together ({verdict})"),
    )
}

/// Whether `point` is the public point of `scalar`, for the curves ring has.
fn check_ring_pair(curve: Curve, scalar: &[u8], point: &[u8]) -> Result<(), String> {
    let signing = curve
        .ring_signing()
        .ok_or_else(|| "no ring implementation of the curve".to_owned())?;
    EcdsaKeyPair::from_private_key_and_public_key(signing, scalar, point, &SystemRandom::new())
        .map(|_| ())
        .map_err(|rejected| rejected.to_string())
}

/// A certificate's public key, as far as serving it is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CertificateKey {
    /// RSA (`rsaEncryption` or RSASSA-PSS) with a modulus of `bits` bits.
    Rsa { bits: usize, pss: bool },
    /// ECDSA on a named curve the router knows.
    Ec(Curve),
    /// ECDSA on another curve, or with explicit parameters: Go cannot parse it.
    UnsupportedEc(String),
    /// DSA with a prime `p` of `bits` bits.
    Dsa { bits: usize },
    /// Ed25519.
    Ed25519,
    /// Ed448.
    Ed448,
    /// Anything else, named by its object identifier.
    Other(String),
}

impl CertificateKey {
    /// Reads the public key of a certificate.
    pub(crate) fn of(spki: &SubjectPublicKeyInfo<'_>) -> Self {
        let oid = spki.algorithm.algorithm.as_bytes();
        let key = spki.subject_public_key.data.as_ref();
        if oid == OID_PKCS1_RSAENCRYPTION.as_bytes() || oid == OID_PKCS1_RSASSAPSS.as_bytes() {
            let modulus = der::whole_sequence(key)
                .and_then(|fields| Elements::new(fields).next_unsigned())
                .unwrap_or_default();
            Self::Rsa {
                bits: der::bit_length(modulus),
                pss: oid == OID_PKCS1_RSASSAPSS.as_bytes(),
            }
        } else if oid == OID_KEY_TYPE_EC_PUBLIC_KEY.as_bytes() {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .filter(|p| p.tag() == Tag::Oid)
                .map(|p| p.data);
            match curve {
                Some(oid) => match Curve::from_oid(oid) {
                    Some(curve) => Self::Ec(curve),
                    None => Self::UnsupportedEc(curve_name(oid)),
                },
                None => Self::UnsupportedEc("explicit curve parameters".to_owned()),
            }
        } else if oid == OID_KEY_TYPE_DSA.as_bytes() {
            let prime = spki
                .algorithm
                .parameters
                .as_ref()
                .filter(|p| p.tag() == Tag::Sequence)
                .and_then(|p| Elements::new(p.data).next_unsigned())
                .unwrap_or_default();
            Self::Dsa {
                bits: der::bit_length(prime),
            }
        } else if oid == OID_SIG_ED25519.as_bytes() {
            Self::Ed25519
        } else if oid == OID_SIG_ED448.as_bytes() {
            Self::Ed448
        } else {
            Self::Other(oid_string(oid))
        }
    }
}

impl fmt::Display for CertificateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Rsa { bits, pss: false } => KeyAlgorithm::Rsa { bits: *bits }.fmt(f),
            Self::Rsa { bits, pss: true } => write!(f, "RSASSA-PSS {bits}-bit"),
            Self::Ec(curve) => curve.algorithm().fmt(f),
            Self::UnsupportedEc(curve) => write!(f, "ECDSA on {curve}"),
            Self::Dsa { bits } => write!(f, "DSA {bits}-bit"),
            Self::Ed25519 => f.write_str("Ed25519"),
            Self::Ed448 => f.write_str("Ed448"),
            Self::Other(oid) => write!(f, "algorithm {oid}"),
        }
    }
}

/// Whether `key` belongs to `certificate`: the same public key, as Go's `tls.X509KeyPair`
/// decides it.
pub(crate) fn matches(key: &PrivateKey, certificate: &X509Certificate<'_>) -> bool {
    let spki = certificate.public_key();
    let oid = spki.algorithm.algorithm.as_bytes();
    let cert_point = spki.subject_public_key.data.as_ref();
    match &key.public {
        PublicPart::Rsa { modulus, exponent } => {
            oid == OID_PKCS1_RSAENCRYPTION.as_bytes()
                && der::whole_sequence(cert_point).is_some_and(|fields| {
                    let mut fields = Elements::new(fields);
                    fields.next_unsigned() == Some(modulus.as_slice())
                        && fields.next_unsigned() == Some(exponent.as_slice())
                })
        }
        PublicPart::Ec {
            curve,
            scalar,
            point,
        } => {
            CertificateKey::of(spki) == CertificateKey::Ec(*curve)
                && match point {
                    Some(point) => point.as_slice() == cert_point,
                    None => check_ring_pair(*curve, scalar, cert_point).is_ok(),
                }
        }
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

        let secp256k1 = sec1_with_parameters(&tlv(0x06, OID_SECP256K1_BYTES));
        let err = rejection(parse_sec1(&secp256k1, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("secp256k1")),
            "{err}"
        );
        // sect163k1, 1.3.132.0.1: named by its identifier.
        let unknown = sec1_with_parameters(&tlv(0x06, &[0x2b, 0x81, 0x04, 0x00, 0x01]));
        let err = rejection(parse_sec1(&unknown, None, LABEL_SEC1, KeyEncoding::Sec1));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("1.3.132.0.1")),
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
        let err = rejection(parse_pkcs8(&pkcs8, LABEL_PKCS8));
        assert!(
            matches!(&err, TlsRejection::UnsupportedKey { detail, .. } if detail.contains("1.2.3.4")),
            "{err}"
        );
    }

    #[test]
    fn a_key_is_read_whatever_its_label_says() {
        // A P-256 SEC1 key under the PKCS#8 label is still read, and written back with
        // the SEC1 label.
        let sec1 = sec1_with_parameters(&tlv(0x06, OID_EC_P256.as_bytes()));
        let block = PemBlock {
            label: LABEL_PKCS8.to_owned(),
            headers: Vec::new(),
            der: sec1,
        };
        let key = match parse_key_block(&block) {
            Ok(key) => key,
            Err(err) => panic!("{err}"),
        };
        assert_eq!(key.encoding, KeyEncoding::Sec1);
        assert!(
            pem::encode(key.encoding.pem_label(), key.der())
                .starts_with("-----BEGIN EC PRIVATE KEY-----\n")
        );

        // Nothing fits: the error is the label's own.
        let block = PemBlock {
            label: LABEL_PKCS1.to_owned(),
            headers: Vec::new(),
            der: tlv(0x30, &tlv(0x02, &[0])),
        };
        let err = rejection(parse_key_block(&block));
        assert!(
            matches!(&err, TlsRejection::KeyInvalid { detail, .. } if detail.contains("PKCS#1")),
            "{err}"
        );
    }

    #[test]
    fn p224_and_p521_points_are_derived() {
        // The scalar 1 has the generator as its point.
        let mut one = vec![0; 66];
        one[65] = 1;
        let point = Curve::P521.derive_point(&one).expect("P-521 point");
        assert_eq!(point.len(), 1 + 2 * 66);
        assert_eq!(point[0], 4);
        assert_eq!(Curve::P521.derive_point(&[0; 66]), None, "zero is no key");
        let mut one = vec![0; 28];
        one[27] = 1;
        assert_eq!(Curve::P224.derive_point(&one).map(|p| p.len()), Some(57));
        assert_eq!(
            Curve::P256.derive_point(&[1; 32]),
            None,
            "ring's curves are checked by ring"
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
