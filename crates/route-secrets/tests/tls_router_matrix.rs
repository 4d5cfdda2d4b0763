//! The certificate side of the OpenShift router's admission matrix, case by case, against
//! a real HAProxy.
//!
//! Each row states what the router does with a secret's `tls.crt` / `tls.key` (read from
//! openshift/router `routeapihelpers.ExtendedValidateRoute` and
//! `ValidateTLSExternalCertificate`: the reason it records and the words of its message)
//! and what certwatch does. certwatch admits what the router admits, except where HAProxy
//! would refuse the bundle (and with it the whole crt-list), which each such row shows
//! with `haproxy -c`. Every bundle certwatch admits is loaded by `haproxy -c`, alone and
//! all together in one crt-list. The table in docs/daemon.md is rendered from these rows
//! and must stay identical to it.
//!
//! A property test then draws random combinations of certificates, chains, keys and
//! decorations and checks the same: whatever certwatch admits, HAProxy loads.

// Helpers outside #[test] functions fail the test on bad fixtures, which is intended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fmt::Write as _;
use std::sync::OnceLock;

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use route_secrets::testing::haproxy::{Bundle, HaproxyCheck, Verdict};
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki, openssl};
use route_secrets::tls::{
    KeyEncoding, ROUTER_REASON_CERTIFICATE, ROUTER_REASON_SECRET, SECRET_TYPE_TLS, SecurityLevel,
    TlsCause, TlsValidator, TlsWarning, ValidatedTls,
};

const HOST: &str = openssl::HOST;

/// 2026-01-01T00:00:00Z: inside the OpenSSL fixtures' validity; rcgen certificates are
/// made relative to it.
fn now() -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap()
}

/// HAProxy at Debian's OpenSSL security level (2), for the table: certwatch validates at
/// the same level there ([`validate`]).
fn haproxy() -> &'static HaproxyCheck {
    static HAPROXY: OnceLock<HaproxyCheck> = OnceLock::new();
    HAPROXY.get_or_init(|| HaproxyCheck::new().expect("HAProxy is needed for this test"))
}

/// HAProxy at the OpenShift router image's OpenSSL security level (1), certwatch's
/// default.
fn haproxy_at_router_level() -> &'static HaproxyCheck {
    static HAPROXY: OnceLock<HaproxyCheck> = OnceLock::new();
    HAPROXY.get_or_init(|| {
        HaproxyCheck::new()
            .expect("HAProxy is needed for this test")
            .at_level(SecurityLevel::ROUTER_IMAGE)
    })
}

/// Validates at Debian's OpenSSL security level (2), the level of the table's HAProxy.
fn validate(
    secret_type: &str,
    crt: &[u8],
    key: &[u8],
) -> Result<ValidatedTls, route_secrets::tls::TlsRejection> {
    validate_at(SecurityLevel::DEBIAN_DEFAULT, secret_type, crt, key)
}

fn validate_at(
    level: SecurityLevel,
    secret_type: &str,
    crt: &[u8],
    key: &[u8],
) -> Result<ValidatedTls, route_secrets::tls::TlsRejection> {
    let secret = testing::tls_secret(
        "matrix",
        "case",
        Some(secret_type),
        testing::tls_data(crt.to_vec(), key.to_vec()),
    );
    TlsValidator::default()
        .security_level(level)
        .validate_secret(&secret, Some(HOST), now())
}

/// HAProxy's verdict on one bundle for `HOST` (at Debian's level).
fn haproxy_verdict(pem: &str) -> Verdict {
    verdict_of(haproxy(), pem)
}

fn verdict_of(check: &HaproxyCheck, pem: &str) -> Verdict {
    check
        .bundles(&[Bundle {
            pem,
            sni: Some(HOST),
        }])
        .expect("haproxy -c runs")
}

/// What the router does with a case.
#[derive(Clone, Copy, Debug)]
enum Router {
    Admits,
    Rejects {
        reason: &'static str,
        /// Words of the router's message.
        message: &'static str,
    },
}

/// Why certwatch deliberately rejects what the router admits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Difference {
    /// HAProxy refuses the bundle, and with it the whole crt-list, at the next reload.
    HaproxyRefuses,
    /// There is no certificate to serve: the router would serve its default certificate
    /// under the route's host.
    NothingToServe,
}

impl Difference {
    fn why(self) -> &'static str {
        match self {
            Self::HaproxyRefuses => {
                "HAProxy at OpenSSL security level 2 (Debian's default; the table's) refuses \
                 it, and with it the whole crt-list: one tenant would break TLS for all; at \
                 the router image's level 1 (`--openssl-security-level 1`, the default) both \
                 admit it"
            }
            Self::NothingToServe => {
                "the validation finds no certificate to serve; the route itself is admitted \
                 by both, served with the default certificate (certwatch gives it no \
                 crt-list line)"
            }
        }
    }
}

/// What certwatch does with a case.
#[derive(Clone, Copy, Debug)]
enum Certwatch {
    /// Admitted, with warnings of these codes.
    Admits(&'static [&'static str]),
    /// Rejected with this cause class and rejection code.
    Rejects {
        cause: TlsCause,
        code: &'static str,
        differs: Option<Difference>,
    },
}

struct Row {
    case: &'static str,
    secret_type: &'static str,
    crt: Vec<u8>,
    key: Vec<u8>,
    router: Router,
    certwatch: Certwatch,
}

fn row(
    case: &'static str,
    crt: impl Into<Vec<u8>>,
    key: impl Into<Vec<u8>>,
    router: Router,
    certwatch: Certwatch,
) -> Row {
    Row {
        case,
        secret_type: SECRET_TYPE_TLS,
        crt: crt.into(),
        key: key.into(),
        router,
        certwatch,
    }
}

const ADMITS: Router = Router::Admits;

fn extended(message: &'static str) -> Router {
    Router::Rejects {
        reason: ROUTER_REASON_CERTIFICATE,
        message,
    }
}

fn rejects(cause: TlsCause, code: &'static str) -> Certwatch {
    Certwatch::Rejects {
        cause,
        code,
        differs: None,
    }
}

fn rejects_unlike_router(cause: TlsCause, code: &'static str, why: Difference) -> Certwatch {
    Certwatch::Rejects {
        cause,
        code,
        differs: Some(why),
    }
}

fn cat(parts: &[&str]) -> String {
    parts.concat()
}

/// The rows, in the order of the table in docs/daemon.md.
fn rows() -> Vec<Row> {
    use Certwatch::Admits;
    use TlsCause::*;
    let pki = Pki::new(now());
    let issue = |kind: KeyKind| pki.issue(&LeafSpec::new(HOST, now()).key(kind));
    let rsa = openssl::LEAF_RSA_2048;
    let (p256, p256_sec1, p384, rsa_pkcs1) = (
        issue(KeyKind::EcdsaP256Pkcs8),
        issue(KeyKind::EcdsaP256Sec1),
        issue(KeyKind::EcdsaP384Sec1),
        issue(KeyKind::RsaPkcs1),
    );
    let expired = pki.issue(&LeafSpec::new(HOST, now()).expired(now()));
    let early = pki.issue(&LeafSpec::new(HOST, now()).not_yet_valid(now()));
    let ed25519_rcgen = pki.issue(&LeafSpec::new(HOST, now()).key(KeyKind::Ed25519Pkcs8));
    let impostor = Pki::new(now());
    let crl = testing::pem_block("X509 CRL", b"not a CRL");
    let public_key = p384.key.key_pair().public_key_pem();
    let mut binary_tail = rsa.chain_pem().into_bytes();
    binary_tail.extend_from_slice(&[0xff, 0xfe, 0x00, 0x80]);
    let mismatch = "tls: private key does not match public key";

    vec![
        // Key types and sizes.
        row(
            "RSA 2048 (PKCS#8)",
            rsa.chain_pem(),
            rsa.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "RSA 2048 (PKCS#1)",
            rsa_pkcs1.chain_pem(),
            rsa_pkcs1.key_pem(),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "RSA 2048, exponent 3",
            openssl::LEAF_RSA_2048_E3.chain_pem(),
            openssl::LEAF_RSA_2048_E3.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "RSA 3072",
            openssl::LEAF_RSA_3072.chain_pem(),
            openssl::LEAF_RSA_3072.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "RSA 4096",
            openssl::LEAF_RSA_4096.chain_pem(),
            openssl::LEAF_RSA_4096.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "ECDSA P-224",
            openssl::LEAF_EC_P224.chain_pem(),
            openssl::LEAF_EC_P224.key_as(KeyEncoding::Sec1),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "ECDSA P-256",
            p256.chain_pem(),
            p256.key_pem(),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "ECDSA P-384 (SEC1)",
            p384.chain_pem(),
            p384.key_pem(),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "ECDSA P-521",
            openssl::LEAF_EC_P521.chain_pem(),
            openssl::LEAF_EC_P521.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "ECDSA P-521 (SEC1, no public key in the key file)",
            openssl::LEAF_EC_P521.chain_pem(),
            testing::ec_key_without_public_key(openssl::LEAF_EC_P521.key, KeyEncoding::Sec1),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "RSA 1024 server certificate",
            openssl::LEAF_RSA_1024.chain_pem(),
            openssl::LEAF_RSA_1024.key,
            ADMITS,
            rejects_unlike_router(WeakKey, "weak_key", Difference::HaproxyRefuses),
        ),
        row(
            "RSA 1024 self-signed",
            openssl::SELF_SIGNED_RSA_1024.chain_pem(),
            openssl::SELF_SIGNED_RSA_1024.key,
            ADMITS,
            rejects_unlike_router(WeakKey, "weak_key", Difference::HaproxyRefuses),
        ),
        row(
            "RSA 1024 intermediate",
            openssl::LEAF_UNDER_RSA_1024.chain_pem(),
            openssl::LEAF_UNDER_RSA_1024.key,
            ADMITS,
            rejects_unlike_router(WeakKey, "weak_key", Difference::HaproxyRefuses),
        ),
        row(
            "RSA 1024 self-signed root in the chain",
            cat(&[
                rsa.certificate,
                openssl::INTERMEDIATE_UNDER_RSA_1024_ROOT,
                openssl::ROOT_RSA_1024,
            ]),
            rsa.key,
            ADMITS,
            rejects_unlike_router(WeakKey, "weak_key", Difference::HaproxyRefuses),
        ),
        row(
            "Ed25519",
            openssl::LEAF_ED25519.chain_pem(),
            openssl::LEAF_ED25519.key,
            extended("block private key ed25519.PrivateKey is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "Ed25519 (PKCS#8 v2, made by ring)",
            ed25519_rcgen.chain_pem(),
            ed25519_rcgen.key_pem(),
            extended("block private key ed25519.PrivateKey is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "Ed448",
            openssl::LEAF_ED448.chain_pem(),
            openssl::LEAF_ED448.key,
            extended("block PRIVATE KEY is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "DSA 2048",
            openssl::LEAF_DSA.chain_pem(),
            openssl::LEAF_DSA.key,
            extended("block PRIVATE KEY is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "RSASSA-PSS key",
            openssl::LEAF_RSA_PSS.chain_pem(),
            openssl::LEAF_RSA_PSS.key,
            extended("block PRIVATE KEY is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "ECDSA secp256k1",
            openssl::LEAF_EC_SECP256K1.chain_pem(),
            openssl::LEAF_EC_SECP256K1.key,
            extended("x509: unsupported elliptic curve"),
            rejects(UnsupportedKey, "unsupported_certificate_key"),
        ),
        row(
            "ECDSA brainpoolP256r1",
            openssl::LEAF_EC_BRAINPOOL.chain_pem(),
            openssl::LEAF_EC_BRAINPOOL.key,
            extended("x509: unsupported elliptic curve"),
            rejects(UnsupportedKey, "unsupported_certificate_key"),
        ),
        row(
            "encrypted key (PKCS#8)",
            p256.chain_pem(),
            testing::ENCRYPTED_PKCS8_KEY_PEM,
            extended("unrecognized PEM block ENCRYPTED PRIVATE KEY"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        row(
            "encrypted key (legacy PEM)",
            p256.chain_pem(),
            testing::ENCRYPTED_SEC1_KEY_PEM,
            extended("block EC PRIVATE KEY is not valid"),
            rejects(UnsupportedKey, "unsupported_key"),
        ),
        // Signatures.
        row(
            "CA-signed with SHA-1",
            openssl::LEAF_SHA1.chain_pem(),
            openssl::LEAF_SHA1.key,
            extended("router does not support CA-signed certs using SHA1"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "CA-signed with MD5",
            openssl::LEAF_MD5.chain_pem(),
            openssl::LEAF_MD5.key,
            extended("router does not support CA-signed certs using MD5"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "CA-signed with ECDSA-SHA1",
            openssl::LEAF_ECDSA_SHA1.chain_pem(),
            openssl::LEAF_ECDSA_SHA1.key,
            extended("router does not support CA-signed certs using SHA1"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "CA-signed with DSA-SHA1",
            openssl::LEAF_DSA_SHA1.chain_pem(),
            openssl::LEAF_DSA_SHA1.key,
            extended("router does not support CA-signed certs using SHA1"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "intermediate signed with SHA-1",
            cat(&[rsa.certificate, openssl::INTERMEDIATE_SHA1, openssl::ROOT]),
            rsa.key,
            extended("router does not support CA-signed certs using SHA1"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "intermediate signed with MD5",
            cat(&[rsa.certificate, openssl::INTERMEDIATE_MD5]),
            rsa.key,
            extended("router does not support CA-signed certs using MD5"),
            rejects(WeakSignature, "weak_signature"),
        ),
        row(
            "CA-signed with RSASSA-PSS and SHA-256",
            openssl::LEAF_PSS_SHA256.chain_pem(),
            openssl::LEAF_PSS_SHA256.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "CA-signed with RSASSA-PSS and SHA-1",
            openssl::LEAF_PSS_SHA1.chain_pem(),
            openssl::LEAF_PSS_SHA1.key,
            ADMITS,
            rejects_unlike_router(WeakSignature, "weak_signature", Difference::HaproxyRefuses),
        ),
        row(
            "self-signed with SHA-1",
            openssl::SELF_SIGNED_SHA1.chain_pem(),
            openssl::SELF_SIGNED_SHA1.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "self-signed with MD5",
            openssl::SELF_SIGNED_MD5.chain_pem(),
            openssl::SELF_SIGNED_MD5.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "root self-signed with SHA-1 in the chain",
            cat(&[rsa.certificate, openssl::INTERMEDIATE, openssl::ROOT_SHA1]),
            rsa.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "DSA root in the chain",
            openssl::LEAF_UNDER_DSA_ROOT.chain_pem(),
            openssl::LEAF_UNDER_DSA_ROOT.key,
            ADMITS,
            Admits(&[]),
        ),
        // Dates.
        row(
            "expired",
            expired.chain_pem(),
            expired.key_pem(),
            ADMITS,
            Admits(&["expired"]),
        ),
        row(
            "not yet valid",
            early.chain_pem(),
            early.key_pem(),
            ADMITS,
            Admits(&["not_yet_valid"]),
        ),
        // Chains.
        row(
            "full chain, in order",
            p256.full_chain_pem(),
            p256.key_pem(),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "chain out of order (leaf, root, intermediate)",
            p256.root_before_intermediate_pem(),
            p256.key_pem(),
            ADMITS,
            Admits(&["chain_reordered"]),
        ),
        row(
            "chain reversed (intermediate first)",
            p256.reversed_chain_pem(),
            p256.key_pem(),
            extended(mismatch),
            rejects(KeyMismatch, "key_mismatch"),
        ),
        row(
            "extra unrelated certificate",
            cat(&[&rsa.chain_pem(), openssl::EC_ROOT]),
            rsa.key,
            ADMITS,
            Admits(&["unrelated_certificates"]),
        ),
        row(
            "server certificate twice",
            cat(&[&p256.chain_pem(), p256.leaf_pem()]),
            p256.key_pem(),
            ADMITS,
            Admits(&["unrelated_certificates"]),
        ),
        row(
            "intermediate that did not issue the leaf",
            p256.with_impostor_intermediate(&impostor),
            p256.key_pem(),
            ADMITS,
            Admits(&["unrelated_certificates"]),
        ),
        // Keys.
        row(
            "key of another certificate",
            p256.chain_pem(),
            p256.key.another().pem(),
            extended(mismatch),
            rejects(KeyMismatch, "key_mismatch"),
        ),
        row(
            "key of another algorithm",
            rsa.chain_pem(),
            p384.key_pem(),
            extended("tls: private key type does not match public key type"),
            rejects(KeyMismatch, "key_mismatch"),
        ),
        row(
            "PKCS#8 key labelled RSA PRIVATE KEY",
            rsa.chain_pem(),
            rsa.key.replace("PRIVATE KEY", "RSA PRIVATE KEY"),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "EC PARAMETERS before the key",
            p256_sec1.chain_pem(),
            p256_sec1.key.pem_with_ec_parameters(),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "key appended to tls.crt too",
            cat(&[&rsa.chain_pem(), rsa.key]),
            rsa.key,
            ADMITS,
            Admits(&["key_from_certificate_entry", "ignored_pem_blocks"]),
        ),
        row(
            "key in tls.crt only",
            cat(&[&rsa.chain_pem(), rsa.key]),
            "no key here\n",
            ADMITS,
            Admits(&["key_from_certificate_entry"]),
        ),
        // PEM.
        row(
            "text and comments around the blocks",
            cat(&["subject=CN = test\n", &rsa.chain_pem(), "trailing words\n"]),
            cat(&["Bag Attributes\n", rsa.key, "\n\n"]),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "binary garbage after the PEM",
            binary_tail,
            rsa.key,
            ADMITS,
            Admits(&[]),
        ),
        row(
            "CRLF line ends",
            rsa.chain_pem().replace('\n', "\r\n"),
            rsa.key.replace('\n', "\r\n"),
            ADMITS,
            Admits(&[]),
        ),
        row(
            "intermediate cut short",
            testing::truncated_pem(&rsa.chain_pem()),
            rsa.key,
            ADMITS,
            Admits(&["skipped_pem_blocks"]),
        ),
        row(
            "not PEM",
            testing::NOT_PEM_TEXT,
            rsa.key,
            extended("data does not contain any valid RSA or ECDSA certificates"),
            rejects(BadPem, "no_certificate"),
        ),
        row(
            "bad base64",
            testing::GARBAGE_PEM,
            rsa.key,
            extended("data does not contain any valid RSA or ECDSA certificates"),
            rejects(BadPem, "certificate_pem_malformed"),
        ),
        row(
            "binary DER instead of PEM",
            p256.leaf_der(),
            p256.key_pem(),
            extended("data does not contain any valid RSA or ECDSA certificates"),
            rejects(BadPem, "certificate_not_text"),
        ),
        row(
            "CERTIFICATE block that is not a certificate",
            testing::not_a_certificate_pem(),
            rsa.key,
            extended("x509: malformed certificate"),
            rejects(BadPem, "certificate_unparseable"),
        ),
        row(
            "tls.crt and tls.key swapped",
            rsa.key,
            rsa.chain_pem(),
            extended("data does not contain any valid RSA or ECDSA certificates"),
            rejects(BadPem, "no_certificate"),
        ),
        row(
            "unknown block in tls.crt",
            cat(&[&rsa.chain_pem(), &crl]),
            rsa.key,
            extended("unrecognized PEM block X509 CRL"),
            rejects(BadPem, "unrecognized_pem_block"),
        ),
        row(
            "public key in tls.crt",
            cat(&[&rsa.chain_pem(), &public_key]),
            rsa.key,
            extended("invalid types PUBLIC KEY, expecting only CERTIFICATE"),
            rejects(BadPem, "unexpected_pem_block"),
        ),
        row(
            "certificate in tls.key",
            rsa.chain_pem(),
            cat(&[rsa.key, rsa.certificate]),
            extended("invalid types CERTIFICATE, expecting only PRIVATE KEY"),
            rejects(BadPem, "unexpected_pem_block"),
        ),
        row(
            "no private key",
            rsa.chain_pem(),
            "just words\n",
            extended("no key specified"),
            rejects(BadPem, "no_private_key"),
        ),
        // Entries.
        row(
            "empty tls.key",
            rsa.chain_pem(),
            "",
            extended("no key specified"),
            rejects(MissingData, "key_empty"),
        ),
        row(
            "empty tls.crt",
            "",
            rsa.key,
            ADMITS,
            rejects_unlike_router(MissingData, "certificate_empty", Difference::NothingToServe),
        ),
        Row {
            secret_type: "Opaque",
            ..row(
                "secret of type Opaque",
                rsa.chain_pem(),
                rsa.key,
                Router::Rejects {
                    reason: ROUTER_REASON_SECRET,
                    message: "secret of type \"kubernetes.io/tls\" required",
                },
                rejects(WrongType, "wrong_secret_type"),
            )
        },
    ]
}

/// The row's material as one file, as a naive writer would hand it to HAProxy.
fn raw_bundle(row: &Row) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&row.crt),
        String::from_utf8_lossy(&row.key)
    )
}

/// One row's line in the docs table.
fn table_line(row: &Row) -> String {
    let router = match row.router {
        Router::Admits => "admitted".to_owned(),
        Router::Rejects { reason, message } => format!("`{reason}`: `{message}`"),
    };
    let (certwatch, note) = match row.certwatch {
        Certwatch::Admits([]) => ("admitted".to_owned(), ""),
        Certwatch::Admits(warnings) => (
            format!(
                "admitted, warning {}",
                warnings
                    .iter()
                    .map(|code| format!("`{code}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "",
        ),
        Certwatch::Rejects {
            cause,
            code,
            differs,
        } => (
            if cause.as_str() == code {
                format!("rejected, `{cause}`")
            } else {
                format!("rejected, `{cause}` (`{code}`)")
            },
            differs.map_or("", Difference::why),
        ),
    };
    let note = if note.is_empty() {
        String::new()
    } else {
        format!("**differs**: {note}")
    };
    format!("| {} | {router} | {certwatch} | {note} |\n", row.case)
}

fn render_table(rows: &[Row]) -> String {
    let mut table = String::from(
        "| Case (`tls.crt` / `tls.key`) | OpenShift router | certwatch | Note |\n\
         |---|---|---|---|\n",
    );
    for row in rows {
        table.push_str(&table_line(row));
    }
    table
}

#[test]
fn the_router_matrix_holds_and_haproxy_loads_everything_admitted() {
    let rows = rows();
    let mut admitted_bundles = Vec::new();
    let mut report = String::new();
    for row in &rows {
        let result = validate(row.secret_type, &row.crt, &row.key);
        match (row.certwatch, &result) {
            (Certwatch::Admits(warnings), Ok(validated)) => {
                let codes: Vec<&str> = validated.warnings().iter().map(TlsWarning::code).collect();
                assert_eq!(codes, warnings, "{}: warnings", row.case);
                assert!(
                    matches!(row.router, Router::Admits),
                    "{}: certwatch must not admit what the router rejects",
                    row.case
                );
                let bundle = validated.pem_bundle().expose_secret().to_owned();
                let verdict = haproxy_verdict(&bundle);
                assert!(
                    verdict.is_accepted(),
                    "{}: haproxy -c on what certwatch admitted: {verdict}",
                    row.case
                );
                admitted_bundles.push(bundle);
            }
            (
                Certwatch::Rejects {
                    cause,
                    code,
                    differs,
                },
                Err(rejection),
            ) => {
                assert_eq!(
                    (rejection.cause(), rejection.code()),
                    (cause, code),
                    "{}: {rejection}",
                    row.case
                );
                if matches!(cause, TlsCause::WeakKey | TlsCause::WeakSignature) {
                    // Handed to HAProxy as given, the material is refused: this is what
                    // the rejection protects the crt-list from.
                    let verdict = haproxy_verdict(&raw_bundle(row));
                    assert!(!verdict.is_accepted(), "{}: HAProxy loads it", row.case);
                    let _ = writeln!(report, "{}: {verdict}", row.case);
                }
                match (row.router, differs) {
                    (Router::Rejects { reason, .. }, None) => {
                        assert_eq!(rejection.router_reason(), reason, "{}", row.case);
                    }
                    (Router::Admits, Some(difference)) => {
                        // A difference from the router must have its reason.
                        assert!(
                            difference != Difference::HaproxyRefuses
                                || matches!(cause, TlsCause::WeakKey | TlsCause::WeakSignature),
                            "{}",
                            row.case
                        );
                    }
                    (router, differs) => panic!(
                        "{}: router {router:?} and difference {differs:?} do not fit",
                        row.case
                    ),
                }
            }
            (expected, got) => panic!("{}: expected {expected:?}, got {got:?}", row.case),
        }
    }
    assert!(admitted_bundles.len() > 20, "{}", admitted_bundles.len());

    // Everything admitted, in one crt-list: HAProxy loads it all.
    let all: Vec<Bundle<'_>> = admitted_bundles
        .iter()
        .map(|pem| Bundle {
            pem,
            sni: Some(HOST),
        })
        .collect();
    let verdict = haproxy().bundles(&all).unwrap();
    assert!(verdict.is_accepted(), "all admitted bundles: {verdict}");
    println!("{}\nHAProxy's refusals:\n{report}", haproxy().version());
    let weak_rows = rows
        .iter()
        .filter(|row| {
            matches!(
                row.certwatch,
                Certwatch::Rejects {
                    cause: TlsCause::WeakKey | TlsCause::WeakSignature,
                    ..
                }
            )
        })
        .count();
    assert_eq!(report.matches(": refused: ").count(), weak_rows, "{report}");
}

#[test]
fn one_refused_bundle_makes_haproxy_refuse_the_whole_list() {
    // Why weak keys and signatures must never reach the crt-list: a good bundle next to
    // a bad one is not served either.
    let good = openssl::LEAF_RSA_2048;
    let good_pem = format!("{}{}", good.chain_pem(), good.key);
    let bad_pem = format!(
        "{}{}",
        openssl::LEAF_SHA1.chain_pem(),
        openssl::LEAF_SHA1.key
    );
    let bundle = |pem| Bundle {
        pem,
        sni: Some(HOST),
    };
    assert!(
        haproxy()
            .bundles(&[bundle(&good_pem)])
            .unwrap()
            .is_accepted()
    );
    let verdict = haproxy()
        .bundles(&[bundle(&good_pem), bundle(&bad_pem)])
        .unwrap();
    match verdict {
        Verdict::Refused { message } => {
            assert!(message.contains("bundle-1.pem"), "{message}");
        }
        Verdict::Accepted => panic!("HAProxy loaded a SHA-1 CA-signed certificate"),
    }
}

#[test]
fn haproxy_check_reads_an_existing_crt_list() {
    let dir = std::env::temp_dir().join(format!("certwatch-matrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bundle = dir.join("ns:route.pem");
    let fixture = openssl::LEAF_EC_P521;
    std::fs::write(&bundle, format!("{}{}", fixture.chain_pem(), fixture.key)).unwrap();
    let list = dir.join("crt-list");
    std::fs::write(&list, format!("{} {HOST}\n", bundle.display())).unwrap();
    assert!(haproxy().crt_list(&list).unwrap().is_accepted());
    // A crt-list naming a file that is not there is refused.
    std::fs::write(&list, format!("{}/gone.pem {HOST}\n", dir.display())).unwrap();
    assert!(!haproxy().crt_list(&list).unwrap().is_accepted());
    // An empty crt-list is fine (the check's bind has a default certificate).
    std::fs::write(&list, "").unwrap();
    assert!(haproxy().crt_list(&list).unwrap().is_accepted());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_docs_table_is_this_matrix() {
    let table = render_table(&rows());
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/daemon.md"))
            .unwrap();
    assert!(
        docs.contains(&table),
        "docs/daemon.md must contain the certificate admission table exactly as the \
         matrix renders it:\n\n{table}"
    );
}

/// Material for the property test: leaves with their keys, and other certificates.
struct Pool {
    leaves: Vec<(String, String)>,
    others: Vec<String>,
    keys: Vec<String>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let pki = Pki::new(now());
        let mut leaves: Vec<(String, String)> = openssl::ALL
            .iter()
            .map(|fixture| (fixture.certificate.to_owned(), fixture.key.to_owned()))
            .collect();
        for kind in KeyKind::ALL.into_iter().chain([KeyKind::Ed25519Pkcs8]) {
            let leaf = pki.issue(&LeafSpec::new(HOST, now()).key(kind));
            leaves.push((leaf.leaf_pem().to_owned(), leaf.key_pem()));
        }
        let expired = pki.issue(&LeafSpec::new(HOST, now()).valid(
            now() - SignedDuration::from_hours(48),
            now() - SignedDuration::from_hours(1),
        ));
        leaves.push((expired.leaf_pem().to_owned(), expired.key_pem()));
        let others = [
            openssl::ROOT,
            openssl::ROOT_SHA1,
            openssl::ROOT_RSA_1024,
            openssl::INTERMEDIATE,
            openssl::INTERMEDIATE_SHA1,
            openssl::INTERMEDIATE_MD5,
            openssl::INTERMEDIATE_RSA_1024,
            openssl::INTERMEDIATE_UNDER_RSA_1024_ROOT,
            openssl::EC_ROOT,
            openssl::DSA_ROOT,
            pki.root_pem(),
            pki.intermediate_pem(),
            Pki::new(now()).intermediate_pem(),
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let keys = leaves.iter().map(|(_, key)| key.clone()).collect();
        Pool {
            leaves,
            others,
            keys,
        }
    })
}

/// How a drawn case is dressed up.
#[derive(Clone, Debug)]
struct Case {
    leaf: usize,
    chain: Vec<usize>,
    /// `None`: the leaf's own key; `Some(i)`: pool key `i`.
    key: Option<usize>,
    key_encoding: u8,
    leaf_not_first: bool,
    key_in_crt: bool,
    crlf: bool,
    garbage: Option<Vec<u8>>,
}

fn case_strategy() -> impl Strategy<Value = Case> {
    let pool = pool();
    (
        0..pool.leaves.len(),
        prop::collection::vec(0..pool.others.len(), 0..4),
        prop::option::weighted(0.2, 0..pool.keys.len()),
        0u8..3,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        any::<bool>(),
        prop::option::weighted(0.2, prop::collection::vec(any::<u8>(), 0..64)),
    )
        .prop_map(
            |(leaf, chain, key, key_encoding, leaf_not_first, key_in_crt, crlf, garbage)| Case {
                leaf,
                chain,
                key,
                key_encoding,
                leaf_not_first,
                key_in_crt,
                crlf,
                garbage,
            },
        )
}

impl Case {
    fn material(&self) -> (Vec<u8>, Vec<u8>) {
        let pool = pool();
        let (leaf, own_key) = &pool.leaves[self.leaf];
        let key = self.key.map_or(own_key, |index| &pool.keys[index]);
        let key = match self.key_encoding {
            1 if key.contains("BEGIN PRIVATE KEY") && is_rsa_or_ec(key) => {
                testing::pkcs8_key_as(key, encoding_for(key))
            }
            2 if key.contains("BEGIN PRIVATE KEY") && encoding_for(key) == KeyEncoding::Sec1 => {
                testing::ec_key_without_public_key(key, KeyEncoding::Sec1)
            }
            _ => key.clone(),
        };
        let mut certificates: Vec<&str> = self
            .chain
            .iter()
            .map(|&i| pool.others[i].as_str())
            .collect();
        if self.leaf_not_first && !certificates.is_empty() {
            certificates.insert(1, leaf);
        } else {
            certificates.insert(0, leaf);
        }
        let mut crt = certificates.concat();
        if self.key_in_crt {
            crt.push_str(&key);
        }
        let (mut crt, key) = if self.crlf {
            (
                crt.replace('\n', "\r\n").into_bytes(),
                key.replace('\n', "\r\n").into_bytes(),
            )
        } else {
            (crt.into_bytes(), key.into_bytes())
        };
        if let Some(garbage) = &self.garbage {
            crt.extend_from_slice(b"\n");
            crt.extend_from_slice(garbage);
        }
        (crt, key)
    }
}

/// Whether a PKCS#8 key is RSA or EC (so it has another encoding).
fn is_rsa_or_ec(pkcs8_pem: &str) -> bool {
    let der = testing::pem_der(pkcs8_pem);
    let rsa = [0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
    let ec = [0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
    contains(&der, &rsa) || contains(&der, &ec)
}

fn encoding_for(pkcs8_pem: &str) -> KeyEncoding {
    let der = testing::pem_der(pkcs8_pem);
    if contains(&der, &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]) {
        KeyEncoding::Sec1
    } else {
        KeyEncoding::Pkcs1
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

#[test]
fn whatever_certwatch_admits_haproxy_loads() {
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    // Guards the (admitted, rejected) counts the runner's closure adds to.
    let counts = std::sync::Mutex::new((0usize, 0usize));
    let result = runner.run(&case_strategy(), |case| {
        let (crt, key) = case.material();
        // At the router image's level (certwatch's default) and at Debian's, each with
        // a HAProxy at that level.
        for (level, check) in [
            (SecurityLevel::ROUTER_IMAGE, haproxy_at_router_level()),
            (SecurityLevel::DEBIAN_DEFAULT, haproxy()),
        ] {
            match validate_at(level, SECRET_TYPE_TLS, &crt, &key) {
                Ok(validated) => {
                    let verdict = verdict_of(check, validated.pem_bundle().expose_secret());
                    prop_assert!(verdict.is_accepted(), "level {level}, {case:?}: {verdict}");
                    counts.lock().unwrap().0 += 1;
                }
                Err(_) => counts.lock().unwrap().1 += 1,
            }
        }
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{failure}");
    }
    let (admitted, rejected) = *counts.lock().unwrap();
    // The draw is weighted so that both outcomes happen; a property that only ever saw
    // rejections would prove nothing.
    assert!(
        admitted >= 5 && rejected >= 5,
        "admitted {admitted}, rejected {rejected}"
    );
}

/// Key strength follows the HAProxy it feeds: at the router image's OpenSSL security
/// level (1) the RSA-1024 cases of the table are admitted and that HAProxy loads them;
/// at Debian's (2) they are rejected with a reason naming the level, and that HAProxy
/// refuses them; P-224, loaded at 2, is rejected at 3, where HAProxy refuses it too.
#[test]
fn key_strength_follows_the_openssl_security_level() {
    let level_three = SecurityLevel::new(3).unwrap();
    let haproxy_at_three = haproxy().clone().at_level(level_three);
    let cases = [
        (
            openssl::LEAF_RSA_1024,
            SecurityLevel::ROUTER_IMAGE,
            SecurityLevel::DEBIAN_DEFAULT,
        ),
        (
            openssl::SELF_SIGNED_RSA_1024,
            SecurityLevel::ROUTER_IMAGE,
            SecurityLevel::DEBIAN_DEFAULT,
        ),
        (
            openssl::LEAF_UNDER_RSA_1024,
            SecurityLevel::ROUTER_IMAGE,
            SecurityLevel::DEBIAN_DEFAULT,
        ),
        (
            openssl::LEAF_EC_P224,
            SecurityLevel::DEBIAN_DEFAULT,
            level_three,
        ),
    ];
    let check_at = |level: SecurityLevel| {
        if level == SecurityLevel::ROUTER_IMAGE {
            haproxy_at_router_level()
        } else if level == SecurityLevel::DEBIAN_DEFAULT {
            haproxy()
        } else {
            &haproxy_at_three
        }
    };
    for (fixture, loads_at, refused_at) in cases {
        let crt = fixture.chain_pem();
        let admitted = validate_at(
            loads_at,
            SECRET_TYPE_TLS,
            crt.as_bytes(),
            fixture.key.as_bytes(),
        )
        .unwrap_or_else(|error| panic!("{} at level {loads_at}: {error}", fixture.name));
        let verdict = verdict_of(check_at(loads_at), admitted.pem_bundle().expose_secret());
        assert!(
            verdict.is_accepted(),
            "{} at level {loads_at}: {verdict}",
            fixture.name
        );

        let rejection = validate_at(
            refused_at,
            SECRET_TYPE_TLS,
            crt.as_bytes(),
            fixture.key.as_bytes(),
        )
        .expect_err(fixture.name);
        assert_eq!(rejection.cause(), TlsCause::WeakKey, "{}", fixture.name);
        let message = rejection.to_string();
        assert!(
            message.contains(&format!("OpenSSL security level {refused_at}")),
            "{message}"
        );
        let verdict = verdict_of(check_at(refused_at), admitted.pem_bundle().expose_secret());
        assert!(
            !verdict.is_accepted(),
            "{} at level {refused_at}: {verdict}",
            fixture.name
        );
    }
}
