//! Certificate, key, secret and route fixtures for tests (cargo feature `test-support`).
//!
//! Certificates are made with rcgen: a [`Pki`] (root and intermediate CA, ECDSA P-256)
//! issues [`Leaf`] certificates for any [`KeyKind`], valid or not, in any chain order.
//! ECDSA and Ed25519 keys are generated fresh; RSA keys come from a fixed set under
//! `src/testing/keys/` because ring, the project's only crypto back-end, cannot generate
//! RSA keys. PKCS#1 and SEC1 encodings are derived from PKCS#8 here. What rcgen cannot
//! make (weak signatures, other key types and sizes) was made once with OpenSSL:
//! [`openssl`]. [`haproxy`] asks a real HAProxy whether it loads a bundle.
//!
//! Functions panic when a fixture cannot be built: that is a bug in the test, never a
//! property of the input under test.

// Fixtures are built from constants; a failure is a test bug and should stop the test.
#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SignatureAlgorithm,
};
use x509_parser::asn1_rs::Tag;
use x509_parser::time::ASN1Time;

pub mod haproxy;
pub mod openssl;

use crate::route::{
    ExternalCertificateReference, Route, RouteSpec, RouteTargetReference, TlsConfig, TlsTermination,
};
use crate::tls::der::{self, Elements};
use crate::tls::{KeyAlgorithm, KeyEncoding, SECRET_TYPE_TLS, TLS_CERT_ENTRY, TLS_KEY_ENTRY};

/// The API server's limit on the size of a secret.
pub const SECRET_SIZE_LIMIT: usize = 1024 * 1024;

const RSA_2048_A: &str = include_str!("testing/keys/rsa-2048-a.pkcs8.pem");
const RSA_2048_B: &str = include_str!("testing/keys/rsa-2048-b.pkcs8.pem");
/// An RSA key of 1024 bits, PKCS#8 (too small for HAProxy).
pub const RSA_1024_KEY_PEM: &str = include_str!("testing/keys/rsa-1024.pkcs8.pem");
/// An ECDSA P-521 key, PKCS#8 (the key of [`openssl::LEAF_EC_P521`]).
pub const EC_P521_KEY_PEM: &str = include_str!("testing/keys/ec-p521.pkcs8.pem");
/// An Ed448 key, PKCS#8 (an algorithm that is not served).
pub const ED448_KEY_PEM: &str = include_str!("testing/keys/ed448.pkcs8.pem");
/// A password-protected P-256 key, `ENCRYPTED PRIVATE KEY` (PKCS#8 / PBES2).
pub const ENCRYPTED_PKCS8_KEY_PEM: &str = include_str!("testing/keys/ec-p256-encrypted.pkcs8.pem");
/// A password-protected P-256 key, legacy OpenSSL PEM encryption (`Proc-Type: 4,ENCRYPTED`).
pub const ENCRYPTED_SEC1_KEY_PEM: &str = include_str!("testing/keys/ec-p256-encrypted.sec1.pem");

/// `EC PARAMETERS` for P-256, as `openssl ecparam -genkey` writes before the key.
const EC_PARAMETERS_P256_PEM: &str =
    "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n";

/// DER tags used to re-encode keys.
const DER_INTEGER: u8 = 0x02;
const DER_OCTET_STRING: u8 = 0x04;
const DER_SEQUENCE: u8 = 0x30;
const DER_CONTEXT_0: u8 = 0xa0;
const DER_CONTEXT_1: u8 = 0xa1;
const DER_OID: u8 = 0x06;

/// A key algorithm in a specific encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// RSA 2048, `PRIVATE KEY`.
    RsaPkcs8,
    /// RSA 2048, `RSA PRIVATE KEY`.
    RsaPkcs1,
    /// ECDSA P-256, `PRIVATE KEY`.
    EcdsaP256Pkcs8,
    /// ECDSA P-256, `EC PRIVATE KEY`.
    EcdsaP256Sec1,
    /// ECDSA P-384, `PRIVATE KEY`.
    EcdsaP384Pkcs8,
    /// ECDSA P-384, `EC PRIVATE KEY`.
    EcdsaP384Sec1,
    /// Ed25519, `PRIVATE KEY`: not served (the router serves only RSA and ECDSA keys).
    Ed25519Pkcs8,
}

impl KeyKind {
    /// Every kind that is served (all but [`KeyKind::Ed25519Pkcs8`]).
    pub const ALL: [Self; 6] = [
        Self::RsaPkcs8,
        Self::RsaPkcs1,
        Self::EcdsaP256Pkcs8,
        Self::EcdsaP256Sec1,
        Self::EcdsaP384Pkcs8,
        Self::EcdsaP384Sec1,
    ];

    fn signature_algorithm(self) -> &'static SignatureAlgorithm {
        match self {
            Self::RsaPkcs8 | Self::RsaPkcs1 => &rcgen::PKCS_RSA_SHA256,
            Self::EcdsaP256Pkcs8 | Self::EcdsaP256Sec1 => &rcgen::PKCS_ECDSA_P256_SHA256,
            Self::EcdsaP384Pkcs8 | Self::EcdsaP384Sec1 => &rcgen::PKCS_ECDSA_P384_SHA384,
            Self::Ed25519Pkcs8 => &rcgen::PKCS_ED25519,
        }
    }

    /// The algorithm validation reports for this kind (`None`: not served).
    pub fn algorithm(self) -> Option<KeyAlgorithm> {
        match self {
            Self::RsaPkcs8 | Self::RsaPkcs1 => Some(KeyAlgorithm::Rsa { bits: 2048 }),
            Self::EcdsaP256Pkcs8 | Self::EcdsaP256Sec1 => Some(KeyAlgorithm::EcdsaP256),
            Self::EcdsaP384Pkcs8 | Self::EcdsaP384Sec1 => Some(KeyAlgorithm::EcdsaP384),
            Self::Ed25519Pkcs8 => None,
        }
    }

    /// The encoding validation reports for this kind.
    pub fn encoding(self) -> KeyEncoding {
        match self {
            Self::RsaPkcs1 => KeyEncoding::Pkcs1,
            Self::EcdsaP256Sec1 | Self::EcdsaP384Sec1 => KeyEncoding::Sec1,
            _ => KeyEncoding::Pkcs8,
        }
    }

    fn is_rsa(self) -> bool {
        matches!(self, Self::RsaPkcs8 | Self::RsaPkcs1)
    }

    fn is_ecdsa(self) -> bool {
        matches!(
            self,
            Self::EcdsaP256Pkcs8 | Self::EcdsaP256Sec1 | Self::EcdsaP384Pkcs8 | Self::EcdsaP384Sec1
        )
    }
}

/// A private key for fixtures. `Debug` does not show the key.
pub struct TestKey {
    kind: KeyKind,
    pair: KeyPair,
    /// Which fixed RSA key this is (0 or 1); unused for other kinds.
    rsa_index: usize,
}

impl fmt::Debug for TestKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestKey")
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl TestKey {
    /// A key of `kind`: fresh for ECDSA and Ed25519, the first fixed key for RSA.
    pub fn generate(kind: KeyKind) -> Self {
        if kind.is_rsa() {
            return Self::rsa(kind, 0);
        }
        let pair = KeyPair::generate_for(kind.signature_algorithm()).expect("generate key");
        Self {
            kind,
            pair,
            rsa_index: 0,
        }
    }

    fn rsa(kind: KeyKind, index: usize) -> Self {
        let pem = if index == 0 { RSA_2048_A } else { RSA_2048_B };
        let pair = KeyPair::from_pkcs8_pem_and_sign_algo(pem, &rcgen::PKCS_RSA_SHA256)
            .expect("load RSA key");
        Self {
            kind,
            pair,
            rsa_index: index,
        }
    }

    /// A different key of the same kind (for mismatches).
    pub fn another(&self) -> Self {
        if self.kind.is_rsa() {
            Self::rsa(self.kind, 1 - self.rsa_index)
        } else {
            Self::generate(self.kind)
        }
    }

    /// The key's kind.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The rcgen key pair (to sign with).
    pub fn key_pair(&self) -> &KeyPair {
        &self.pair
    }

    /// The key as PKCS#8 PEM.
    pub fn pkcs8_pem(&self) -> String {
        self.pair.serialize_pem()
    }

    /// The key as PEM in its kind's encoding.
    pub fn pem(&self) -> String {
        pkcs8_key_as(&self.pkcs8_pem(), self.kind.encoding())
    }

    /// The base64 lines of the key's PEM, to search output for leaks.
    pub fn base64_body(&self) -> String {
        self.pem()
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect()
    }

    /// For ECDSA kinds: the key in its encoding, but without the embedded public key, so
    /// that the public key must be derived. Panics for other kinds.
    pub fn pem_without_public_key(&self) -> String {
        assert!(self.kind.is_ecdsa(), "an ECDSA key kind");
        ec_key_without_public_key(&self.pkcs8_pem(), self.kind.encoding())
    }

    /// For P-256 SEC1 keys: the PEM preceded by an `EC PARAMETERS` block, as
    /// `openssl ecparam -genkey` writes it.
    pub fn pem_with_ec_parameters(&self) -> String {
        assert_eq!(
            self.kind,
            KeyKind::EcdsaP256Sec1,
            "EC PARAMETERS fixture is for P-256 SEC1"
        );
        format!("{EC_PARAMETERS_P256_PEM}{}", self.pem())
    }
}

/// The parts of a PKCS#8 `PrivateKeyInfo`.
struct Pkcs8Parts {
    /// The AlgorithmIdentifier, as DER.
    algorithm: Vec<u8>,
    /// For EC keys: the contents of the curve's object identifier.
    curve: Option<Vec<u8>>,
    /// The contents of the privateKey OCTET STRING (PKCS#1 or SEC1 DER).
    private_key: Vec<u8>,
}

impl Pkcs8Parts {
    fn of(pkcs8: &[u8]) -> Self {
        let mut fields = Elements::new(der::whole_sequence(pkcs8).expect("PKCS#8 sequence"));
        fields.next_unsigned().expect("version");
        let algorithm = fields.next_universal(Tag::Sequence).expect("algorithm");
        let mut algorithm_fields = Elements::new(algorithm);
        algorithm_fields
            .next_universal(Tag::Oid)
            .expect("algorithm OID");
        let curve = algorithm_fields
            .next_any()
            .filter(|parameters| parameters.tag() == Tag::Oid)
            .map(|parameters| parameters.data.to_vec());
        let private_key = fields
            .next_universal(Tag::OctetString)
            .expect("private key");
        Self {
            algorithm: tlv(DER_SEQUENCE, algorithm),
            curve,
            private_key: private_key.to_vec(),
        }
    }

    /// The ECPrivateKey's fields: the scalar and, if present, the public key's contents.
    fn ec_fields(&self) -> (Vec<u8>, Option<Vec<u8>>) {
        let mut fields =
            Elements::new(der::whole_sequence(&self.private_key).expect("ECPrivateKey"));
        fields.next_unsigned().expect("version");
        let scalar = fields.next_universal(Tag::OctetString).expect("scalar");
        let point = fields
            .context_tagged()
            .expect("tagged fields")
            .into_iter()
            .find(|(tag, _)| *tag == 1)
            .map(|(_, public)| public.to_vec());
        (scalar.to_vec(), point)
    }

    fn ec_scalar(&self) -> Vec<u8> {
        self.ec_fields().0
    }

    /// A standalone SEC1 ECPrivateKey with the curve in `[0]` and, optionally (and when
    /// the PKCS#8 form has one), the public key in `[1]`.
    fn sec1(&self, with_public_key: bool) -> Vec<u8> {
        let curve = self.curve.as_deref().expect("an EC key names its curve");
        let (scalar, point) = self.ec_fields();
        let mut fields = vec![
            tlv(DER_INTEGER, &[1]),
            tlv(DER_OCTET_STRING, &scalar),
            tlv(DER_CONTEXT_0, &tlv(DER_OID, curve)),
        ];
        if let Some(point) = point.filter(|_| with_public_key) {
            fields.push(tlv(DER_CONTEXT_1, &point));
        }
        der_sequence(&fields)
    }
}

/// Re-encodes a PKCS#8 `PRIVATE KEY` PEM: as it is, as PKCS#1 `RSA PRIVATE KEY` (RSA
/// keys) or as SEC1 `EC PRIVATE KEY` (EC keys, curve named, public key kept).
pub fn pkcs8_key_as(pkcs8_pem: &str, encoding: KeyEncoding) -> String {
    let der = pem_der(pkcs8_pem);
    match encoding {
        KeyEncoding::Pkcs8 => pem_block("PRIVATE KEY", &der),
        KeyEncoding::Pkcs1 => pem_block("RSA PRIVATE KEY", &Pkcs8Parts::of(&der).private_key),
        KeyEncoding::Sec1 => pem_block("EC PRIVATE KEY", &Pkcs8Parts::of(&der).sec1(true)),
    }
}

/// An EC key given as PKCS#8 PEM, in `encoding` (PKCS#8 or SEC1) but without its public
/// key, so that a reader must derive the public key from the private scalar.
pub fn ec_key_without_public_key(pkcs8_pem: &str, encoding: KeyEncoding) -> String {
    let parts = Pkcs8Parts::of(&pem_der(pkcs8_pem));
    match encoding {
        KeyEncoding::Sec1 => pem_block("EC PRIVATE KEY", &parts.sec1(false)),
        KeyEncoding::Pkcs8 => {
            let inner = der_sequence(&[
                tlv(DER_INTEGER, &[1]),
                tlv(DER_OCTET_STRING, &parts.ec_scalar()),
            ]);
            pem_block(
                "PRIVATE KEY",
                &der_sequence(&[
                    tlv(DER_INTEGER, &[0]),
                    parts.algorithm,
                    tlv(DER_OCTET_STRING, &inner),
                ]),
            )
        }
        KeyEncoding::Pkcs1 => panic!("PKCS#1 holds RSA keys only"),
    }
}

/// The DER of the first PEM block in `pem`.
pub fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .skip_while(|line| !line.starts_with("-----BEGIN"))
        .skip(1)
        .take_while(|line| !line.starts_with("-----END"))
        .collect();
    STANDARD.decode(body).expect("valid PEM")
}

/// One DER element.
fn tlv(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = contents.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(contents);
    out
}

fn der_sequence(fields: &[Vec<u8>]) -> Vec<u8> {
    tlv(DER_SEQUENCE, &fields.concat())
}

/// A PEM block with 64-character lines.
pub fn pem_block(label: &str, der: &[u8]) -> String {
    let body = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in body.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(chunk).expect("base64 is ASCII"));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn asn1_time(at: Timestamp) -> ASN1Time {
    ASN1Time::from_timestamp(at.as_second()).expect("time in range")
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "certwatch tests");
    name.push(DnType::CommonName, common_name);
    name
}

/// A root CA and an intermediate CA (ECDSA P-256) that issue leaf certificates.
pub struct Pki {
    root_pem: String,
    intermediate_params: CertificateParams,
    intermediate_key: KeyPair,
    intermediate_pem: String,
}

impl fmt::Debug for Pki {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

impl Pki {
    /// CAs valid from a year before `now` to ten years after.
    pub fn new(now: Timestamp) -> Self {
        let ca_params = |common_name: &str, path_len: Option<u8>| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.distinguished_name = distinguished_name(common_name);
            params.is_ca = IsCa::Ca(match path_len {
                Some(len) => BasicConstraints::Constrained(len),
                None => BasicConstraints::Unconstrained,
            });
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params.not_before = asn1_time(now - SignedDuration::from_hours(365 * 24)).to_datetime();
            params.not_after = asn1_time(now + SignedDuration::from_hours(3650 * 24)).to_datetime();
            params
        };
        let root_params = ca_params("certwatch test root CA", None);
        let root_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("root key");
        let root_pem = root_params.self_signed(&root_key).expect("root cert").pem();
        let intermediate_params = ca_params("certwatch test intermediate CA", Some(0));
        let intermediate_key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("intermediate key");
        let intermediate_pem = intermediate_params
            .signed_by(
                &intermediate_key,
                &Issuer::from_params(&root_params, &root_key),
            )
            .expect("intermediate cert")
            .pem();
        Self {
            root_pem,
            intermediate_params,
            intermediate_key,
            intermediate_pem,
        }
    }

    /// The root CA certificate.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// The intermediate CA certificate.
    pub fn intermediate_pem(&self) -> &str {
        &self.intermediate_pem
    }

    /// Issues a leaf certificate from the intermediate CA with a fresh key.
    pub fn issue(&self, spec: &LeafSpec) -> Leaf {
        self.issue_for_key(spec, TestKey::generate(spec.key))
    }

    /// Issues a leaf certificate from the intermediate CA for `key`.
    pub fn issue_for_key(&self, spec: &LeafSpec, key: TestKey) -> Leaf {
        let mut params = CertificateParams::new(spec.dns_names.clone()).expect("leaf names");
        let common_name = spec
            .common_name
            .clone()
            .or_else(|| spec.dns_names.first().cloned())
            .unwrap_or_else(|| "certwatch test leaf".to_owned());
        params.distinguished_name = distinguished_name(&common_name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = asn1_time(spec.not_before).to_datetime();
        params.not_after = asn1_time(spec.not_after).to_datetime();
        params.use_authority_key_identifier_extension = true;
        let issuer = Issuer::from_params(&self.intermediate_params, &self.intermediate_key);
        let leaf_pem = params
            .signed_by(key.key_pair(), &issuer)
            .expect("leaf cert")
            .pem();
        Leaf {
            key,
            leaf_pem,
            intermediate_pem: self.intermediate_pem.clone(),
            root_pem: self.root_pem.clone(),
        }
    }

    /// Issues a self-signed leaf certificate (chain of one).
    pub fn self_signed(spec: &LeafSpec) -> Leaf {
        let key = TestKey::generate(spec.key);
        let mut params = CertificateParams::new(spec.dns_names.clone()).expect("leaf names");
        params.not_before = asn1_time(spec.not_before).to_datetime();
        params.not_after = asn1_time(spec.not_after).to_datetime();
        let leaf_pem = params
            .self_signed(key.key_pair())
            .expect("self-signed cert")
            .pem();
        Leaf {
            key,
            leaf_pem,
            intermediate_pem: String::new(),
            root_pem: String::new(),
        }
    }
}

/// What leaf certificate to issue.
#[derive(Clone, Debug)]
pub struct LeafSpec {
    /// SAN DNS names (and IP addresses, when they parse as such).
    pub dns_names: Vec<String>,
    /// Subject CN; the first DNS name when `None`.
    pub common_name: Option<String>,
    /// Key kind.
    pub key: KeyKind,
    /// Start of validity.
    pub not_before: Timestamp,
    /// End of validity.
    pub not_after: Timestamp,
}

impl LeafSpec {
    /// A P-256 certificate for `host`, valid from a day before `now` to 90 days after.
    pub fn new(host: &str, now: Timestamp) -> Self {
        Self {
            dns_names: vec![host.to_owned()],
            common_name: None,
            key: KeyKind::EcdsaP256Pkcs8,
            not_before: now - SignedDuration::from_hours(24),
            not_after: now + SignedDuration::from_hours(90 * 24),
        }
    }

    /// With another key kind.
    pub fn key(mut self, kind: KeyKind) -> Self {
        self.key = kind;
        self
    }

    /// With another validity period.
    pub fn valid(mut self, not_before: Timestamp, not_after: Timestamp) -> Self {
        self.not_before = not_before;
        self.not_after = not_after;
        self
    }

    /// Expired a day before `now`.
    pub fn expired(self, now: Timestamp) -> Self {
        self.valid(
            now - SignedDuration::from_hours(48 * 24),
            now - SignedDuration::from_hours(24),
        )
    }

    /// Valid only from a day after `now`.
    pub fn not_yet_valid(self, now: Timestamp) -> Self {
        self.valid(
            now + SignedDuration::from_hours(24),
            now + SignedDuration::from_hours(90 * 24),
        )
    }

    /// With these SAN names.
    pub fn names(mut self, names: &[&str]) -> Self {
        self.dns_names = names.iter().map(|name| (*name).to_owned()).collect();
        self
    }

    /// Without SAN extension, identified by the CN only.
    pub fn common_name_only(mut self, common_name: &str) -> Self {
        self.dns_names.clear();
        self.common_name = Some(common_name.to_owned());
        self
    }
}

/// A leaf certificate with its key and issuing chain.
#[derive(Debug)]
pub struct Leaf {
    /// The leaf's private key.
    pub key: TestKey,
    leaf_pem: String,
    intermediate_pem: String,
    root_pem: String,
}

impl Leaf {
    /// The leaf certificate alone.
    pub fn leaf_pem(&self) -> &str {
        &self.leaf_pem
    }

    /// Leaf then intermediate: what a server should send.
    pub fn chain_pem(&self) -> String {
        format!("{}{}", self.leaf_pem, self.intermediate_pem)
    }

    /// Leaf, intermediate, root.
    pub fn full_chain_pem(&self) -> String {
        format!(
            "{}{}{}",
            self.leaf_pem, self.intermediate_pem, self.root_pem
        )
    }

    /// Intermediate before leaf (wrong order).
    pub fn reversed_chain_pem(&self) -> String {
        format!("{}{}", self.intermediate_pem, self.leaf_pem)
    }

    /// Leaf, root, intermediate (wrong order further down).
    pub fn root_before_intermediate_pem(&self) -> String {
        format!(
            "{}{}{}",
            self.leaf_pem, self.root_pem, self.intermediate_pem
        )
    }

    /// Leaf followed by the intermediate of another `Pki` with the same name (the
    /// names match, the signature does not).
    pub fn with_impostor_intermediate(&self, other: &Pki) -> String {
        format!("{}{}", self.leaf_pem, other.intermediate_pem())
    }

    /// The leaf certificate as DER (binary, not PEM).
    pub fn leaf_der(&self) -> Vec<u8> {
        pem_der(&self.leaf_pem)
    }

    /// The key as PEM in its kind's encoding.
    pub fn key_pem(&self) -> String {
        self.key.pem()
    }

    /// `tls.crt` (chain) and `tls.key`.
    pub fn data(&self) -> BTreeMap<String, ByteString> {
        tls_data(self.chain_pem(), self.key_pem())
    }

    /// A `kubernetes.io/tls` secret holding [`Leaf::data`].
    pub fn secret(&self, namespace: &str, name: &str) -> Secret {
        tls_secret(namespace, name, Some(SECRET_TYPE_TLS), self.data())
    }
}

/// Secret data with `tls.crt` and `tls.key`.
pub fn tls_data(
    certificate: impl Into<Vec<u8>>,
    key: impl Into<Vec<u8>>,
) -> BTreeMap<String, ByteString> {
    BTreeMap::from([
        (TLS_CERT_ENTRY.to_owned(), ByteString(certificate.into())),
        (TLS_KEY_ENTRY.to_owned(), ByteString(key.into())),
    ])
}

/// A secret as the API server returns it.
pub fn tls_secret(
    namespace: &str,
    name: &str,
    secret_type: Option<&str>,
    data: BTreeMap<String, ByteString>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        type_: secret_type.map(str::to_owned),
        data: Some(data),
        ..Secret::default()
    }
}

/// An edge-terminated route in `namespace` whose certificate comes from secret `secret`.
pub fn route_with_external_certificate(
    namespace: &str,
    name: &str,
    host: &str,
    secret: &str,
) -> Route {
    let mut route = Route::new(
        name,
        RouteSpec {
            host: Some(host.to_owned()),
            to: RouteTargetReference {
                name: name.to_owned(),
                ..RouteTargetReference::default()
            },
            tls: Some(TlsConfig {
                termination: TlsTermination::Edge,
                external_certificate: Some(ExternalCertificateReference {
                    name: secret.to_owned(),
                    ..ExternalCertificateReference::default()
                }),
                ..TlsConfig::default()
            }),
            ..RouteSpec::default()
        },
    );
    route.metadata.namespace = Some(namespace.to_owned());
    route
}

/// Text with no PEM block at all.
pub const NOT_PEM_TEXT: &str = "this is not a certificate\n";

/// A CERTIFICATE block whose body is not base64.
pub const GARBAGE_PEM: &str =
    "-----BEGIN CERTIFICATE-----\nThis is *not* base64 @ all!\n-----END CERTIFICATE-----\n";

/// `pem` cut off before its last END line.
pub fn truncated_pem(pem: &str) -> String {
    let end = pem.rfind("-----END").expect("a PEM block");
    pem[..end].to_owned()
}

/// A well-formed CERTIFICATE block whose DER is not a certificate.
pub fn not_a_certificate_pem() -> String {
    pem_block(
        "CERTIFICATE",
        &der_sequence(&[tlv(DER_INTEGER, &[1]), tlv(DER_INTEGER, &[2])]),
    )
}

/// Valid PEM of `leaf`'s chain followed by bytes that are not UTF-8.
pub fn non_utf8_certificate(leaf: &Leaf) -> Vec<u8> {
    let mut bytes = leaf.chain_pem().into_bytes();
    bytes.extend_from_slice(&[0xff, 0xfe, 0x00, 0xc3, 0x28]);
    bytes
}

/// `pem` padded with explanatory text (RFC 7468 allows it between blocks) to exactly
/// `total_len` bytes. Panics if `pem` is already longer.
pub fn padded_to(pem: &str, total_len: usize) -> String {
    assert!(
        pem.len() <= total_len,
        "fixture already exceeds the requested size"
    );
    let mut out = String::with_capacity(total_len);
    out.push_str(pem);
    let line = "padding: explanatory text outside PEM blocks is ignored\n";
    while out.len() + line.len() <= total_len {
        out.push_str(line);
    }
    while out.len() < total_len {
        out.push('\n');
    }
    out
}

/// `leaf`'s full chain followed by copies of the self-signed root (each issued by the
/// next, so the chain stays in order) until adding one more would exceed `max_len`.
pub fn bulky_chain(leaf: &Leaf, max_len: usize) -> String {
    let mut out = leaf.full_chain_pem();
    assert!(
        out.len() <= max_len,
        "fixture already exceeds the requested size"
    );
    while out.len() + leaf.root_pem.len() <= max_len {
        out.push_str(&leaf.root_pem);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_have_their_labels() {
        for kind in KeyKind::ALL {
            let key = TestKey::generate(kind);
            let pem = key.pem();
            let label = kind.encoding().pem_label();
            assert!(
                pem.starts_with(&format!("-----BEGIN {label}-----\n")),
                "{kind:?}: {pem}"
            );
            assert!(!format!("{key:?}").contains(&key.base64_body()[..20]));
        }
    }

    #[test]
    fn another_key_differs() {
        for kind in KeyKind::ALL {
            let key = TestKey::generate(kind);
            assert_ne!(key.pkcs8_pem(), key.another().pkcs8_pem(), "{kind:?}");
        }
    }

    #[test]
    fn padding_hits_the_exact_size() {
        assert_eq!(padded_to("abc\n", 1000).len(), 1000);
        assert_eq!(tlv(0x04, &[0; 300])[..4], [0x04, 0x82, 0x01, 0x2c]);
    }
}
