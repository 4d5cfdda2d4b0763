//! Every check of `tls::TlsValidator`, with material built by `route_secrets::testing`.

// Helpers outside #[test] functions fail the test on bad fixtures, which is intended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use jiff::{SignedDuration, Timestamp};
use route_secrets::reason::{Reason, ValidationProblem};
use route_secrets::route::RouteKey;
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki, TestKey};
use route_secrets::tls::{
    self, KeyAlgorithm, KeyEncoding, PemProblem, SECRET_TYPE_TLS, TlsMaterial, TlsRejection,
    TlsValidator, TlsWarning, ValidatedTls,
};

const HOST: &str = "shop.example.com";

/// A fixed "now" (2026-01-01T00:00:00Z): validity is always relative to it.
fn now() -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap()
}

fn days(n: i64) -> SignedDuration {
    SignedDuration::from_hours(24 * n)
}

fn check(certificate: &[u8], key: &[u8]) -> Result<ValidatedTls, TlsRejection> {
    check_host(certificate, key, Some(HOST))
}

fn check_host(
    certificate: &[u8],
    key: &[u8],
    host: Option<&str>,
) -> Result<ValidatedTls, TlsRejection> {
    TlsValidator::default().validate(
        TlsMaterial {
            secret_type: Some(SECRET_TYPE_TLS),
            certificate: Some(certificate),
            key: Some(key),
        },
        host,
        now(),
    )
}

fn leaf(pki: &Pki, kind: KeyKind) -> testing::Leaf {
    pki.issue(&LeafSpec::new(HOST, now()).key(kind))
}

fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    STANDARD.decode(body).unwrap()
}

/// Asserts that no 24-character window of `secret` appears in `output`.
fn assert_no_leak(output: &str, secret: &str) {
    let chars: Vec<char> = secret.chars().collect();
    for start in (0..chars.len().saturating_sub(24)).step_by(8) {
        let window: String = chars[start..start + 24].iter().collect();
        assert!(
            !output.contains(&window),
            "secret bytes leaked into: {output}"
        );
    }
}

#[test]
fn valid_material_passes_in_every_key_format() {
    let pki = Pki::new(now());
    for kind in KeyKind::ALL {
        let leaf = leaf(&pki, kind);
        let validated = check(leaf.chain_pem().as_bytes(), leaf.key_pem().as_bytes())
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(validated.key_algorithm(), kind.algorithm(), "{kind:?}");
        assert_eq!(validated.key_encoding(), kind.encoding(), "{kind:?}");
        assert_eq!(validated.chain_len(), 2);
        assert_eq!(validated.warnings(), &[], "{kind:?}");
        assert_eq!(validated.dns_names(), [HOST]);
        assert!(validated.covers_host(HOST));
        assert_eq!(validated.subject(), format!("O=certwatch tests, CN={HOST}"));

        // The chain is normalized leaf first, the key keeps its encoding.
        assert_eq!(validated.chain_pem(), leaf.chain_pem().replace('\r', ""));
        assert_eq!(
            validated.key_pem().expose_secret(),
            leaf.key_pem().replace('\r', "")
        );
        let bundle = validated.pem_bundle();
        assert_eq!(
            bundle.expose_secret(),
            format!(
                "{}{}",
                validated.chain_pem(),
                validated.key_pem().expose_secret()
            )
        );
        let leaf_der = pem_der(leaf.leaf_pem());
        let digest = ring::digest::digest(&ring::digest::SHA256, &leaf_der);
        assert_eq!(validated.fingerprint().0.as_slice(), digest.as_ref());
        assert_eq!(validated.not_before(), now() - days(1));
        assert_eq!(validated.not_after(), now() + days(90));
    }
}

#[test]
fn ec_keys_without_embedded_public_key_pass() {
    let pki = Pki::new(now());
    for kind in [
        KeyKind::EcdsaP256Pkcs8,
        KeyKind::EcdsaP256Sec1,
        KeyKind::EcdsaP384Pkcs8,
        KeyKind::EcdsaP384Sec1,
    ] {
        let leaf = leaf(&pki, kind);
        let key = leaf.key.pem_without_public_key();
        let validated = check(leaf.chain_pem().as_bytes(), key.as_bytes())
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(validated.key_encoding(), kind.encoding());

        let other = leaf.key.another().pem_without_public_key();
        let err = check(leaf.chain_pem().as_bytes(), other.as_bytes()).unwrap_err();
        assert!(
            matches!(err, TlsRejection::KeyMismatch { .. }),
            "{kind:?}: {err}"
        );
    }
}

#[test]
fn sec1_key_after_ec_parameters_passes_without_warning() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Sec1);
    let key = leaf.key.pem_with_ec_parameters();
    let validated = check(leaf.chain_pem().as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(validated.warnings(), &[]);
    assert!(
        !validated
            .key_pem()
            .expose_secret()
            .contains("EC PARAMETERS")
    );
}

#[test]
fn full_chain_and_self_signed_pass() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let validated = check(leaf.full_chain_pem().as_bytes(), leaf.key_pem().as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 3);

    let single = Pki::self_signed(&LeafSpec::new(HOST, now()).key(KeyKind::Ed25519Pkcs8));
    let validated = check(single.leaf_pem().as_bytes(), single.key_pem().as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 1);
}

#[test]
fn secret_type_must_be_tls() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let data = leaf.data();
    assert_eq!(
        tls::validate(Some("Opaque"), &data, Some(HOST), now()).unwrap_err(),
        TlsRejection::WrongSecretType {
            found: Some("Opaque".into())
        }
    );
    assert_eq!(
        tls::validate(None, &data, Some(HOST), now()).unwrap_err(),
        TlsRejection::WrongSecretType { found: None }
    );
    assert!(tls::validate(Some(SECRET_TYPE_TLS), &data, Some(HOST), now()).is_ok());
    assert!(
        TlsValidator::default()
            .validate_secret(&leaf.secret("team-a", "shop-tls"), Some(HOST), now())
            .is_ok()
    );
}

#[test]
fn missing_and_empty_entries_are_told_apart() {
    let validator = TlsValidator::default();
    let material = |certificate: Option<&'static [u8]>, key: Option<&'static [u8]>| TlsMaterial {
        secret_type: Some(SECRET_TYPE_TLS),
        certificate,
        key,
    };
    let cases = [
        (material(None, None), TlsRejection::CertificateMissing),
        (
            material(Some(b""), Some(b"k")),
            TlsRejection::CertificateEmpty,
        ),
        (material(Some(b"c"), None), TlsRejection::KeyMissing),
        (material(Some(b"c"), Some(b"")), TlsRejection::KeyEmpty),
    ];
    for (input, expected) in cases {
        assert_eq!(
            validator.validate(input, None, now()).unwrap_err(),
            expected
        );
    }
    let secret = testing::tls_secret("ns", "s", Some(SECRET_TYPE_TLS), Default::default());
    assert_eq!(
        validator.validate_secret(&secret, None, now()).unwrap_err(),
        TlsRejection::CertificateMissing
    );
}

#[test]
fn certificate_must_be_text() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();

    let bytes = testing::non_utf8_certificate(&leaf);
    let err = check(&bytes, key.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::CertificateNotText {
            offset: leaf.chain_pem().len(),
            looks_like_der: false
        }
    );

    let err = check(&leaf.leaf_der(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::CertificateNotText {
                looks_like_der: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("openssl x509 -inform der"));
}

#[test]
fn malformed_certificate_pem_is_specific() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();

    let err = check(testing::GARBAGE_PEM.as_bytes(), key.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::CertificatePemMalformed {
            problem: PemProblem::InvalidBase64 {
                label: "CERTIFICATE".into(),
                line: 1
            }
        }
    );

    let truncated = testing::truncated_pem(&leaf.chain_pem());
    let err = check(truncated.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::CertificatePemMalformed {
                problem: PemProblem::Unterminated { .. }
            }
        ),
        "{err}"
    );

    let err = check(testing::NOT_PEM_TEXT.as_bytes(), key.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::NoCertificate {
            found_labels: vec![]
        }
    );
}

#[test]
fn swapped_entries_are_recognised() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();
    let err = check(key.as_bytes(), leaf.chain_pem().as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::NoCertificate {
            found_labels: vec!["PRIVATE KEY".into()]
        }
    );
    assert!(err.to_string().contains("swapped"), "{err}");
    assert_no_leak(&format!("{err} {err:?}"), &leaf.key.base64_body());
}

#[test]
fn unparseable_certificate_names_its_position() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();
    let first = testing::not_a_certificate_pem();
    let err = check(first.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::CertificateUnparseable { position: 1, .. }
        ),
        "{err}"
    );
    let second = format!("{}{}", leaf.leaf_pem(), testing::not_a_certificate_pem());
    let err = check(second.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::CertificateUnparseable { position: 2, .. }
        ),
        "{err}"
    );
}

#[test]
fn chain_order_is_checked() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();

    let err = check(leaf.reversed_chain_pem().as_bytes(), key.as_bytes()).unwrap_err();
    match &err {
        TlsRejection::ChainOutOfOrder {
            position,
            subject,
            next_subject,
            ..
        } => {
            assert_eq!(*position, 1);
            assert!(subject.contains("intermediate"), "{subject}");
            assert!(next_subject.contains(HOST), "{next_subject}");
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("server certificate first"));

    let err = check(
        leaf.root_before_intermediate_pem().as_bytes(),
        key.as_bytes(),
    )
    .unwrap_err();
    assert!(
        matches!(err, TlsRejection::ChainOutOfOrder { position: 1, .. }),
        "{err}"
    );
    let leaf_again = format!("{}{}", leaf.chain_pem(), leaf.leaf_pem());
    let err = check(leaf_again.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(err, TlsRejection::ChainOutOfOrder { position: 2, .. }),
        "{err}"
    );

    let impostor = Pki::new(now());
    let chain = leaf.with_impostor_intermediate(&impostor);
    let err = check(chain.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(err, TlsRejection::ChainSignatureInvalid { position: 1, .. }),
        "{err}"
    );
}

#[test]
fn key_must_be_pem_text() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let chain = leaf.chain_pem();

    let err = check(chain.as_bytes(), b"-----BEGIN PRIVATE KEY-----\n\xff\xfe").unwrap_err();
    assert_eq!(err, TlsRejection::KeyNotText { offset: 28 });

    let err = check(
        chain.as_bytes(),
        b"-----BEGIN PRIVATE KEY-----\n%%%\n-----END PRIVATE KEY-----\n",
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::KeyPemMalformed {
                problem: PemProblem::InvalidBase64 { .. }
            }
        ),
        "{err}"
    );

    let err = check(chain.as_bytes(), leaf.leaf_pem().as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::NoPrivateKey {
            found_labels: vec!["CERTIFICATE".into()]
        }
    );
    let err = check(chain.as_bytes(), b"just words").unwrap_err();
    assert_eq!(
        err,
        TlsRejection::NoPrivateKey {
            found_labels: vec![]
        }
    );
}

fn unsupported(err: &TlsRejection) -> (&str, &str) {
    match err {
        TlsRejection::UnsupportedKey { label, detail } => (label, detail),
        other => panic!("expected UnsupportedKey, got {other}"),
    }
}

#[test]
fn unsupported_keys_name_their_label() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let chain = leaf.chain_pem();
    let run = |key: &str| check(chain.as_bytes(), key.as_bytes()).unwrap_err();

    let err = run(testing::ENCRYPTED_PKCS8_KEY_PEM);
    assert_eq!(unsupported(&err).0, "ENCRYPTED PRIVATE KEY");
    assert!(unsupported(&err).1.contains("encrypted"));

    let err = run(testing::ENCRYPTED_SEC1_KEY_PEM);
    assert_eq!(unsupported(&err).0, "EC PRIVATE KEY");
    assert!(unsupported(&err).1.contains("encrypted"));

    let err = run(testing::RSA_1024_KEY_PEM);
    assert!(
        unsupported(&err).1.contains("1024 bits is too small"),
        "{err}"
    );

    let err = run(testing::EC_P521_KEY_PEM);
    assert!(unsupported(&err).1.contains("P-521"), "{err}");

    let err = run(testing::ED448_KEY_PEM);
    assert!(unsupported(&err).1.contains("Ed448"), "{err}");

    let openssh = testing::pem_block("OPENSSH PRIVATE KEY", b"openssh-key-v1\0");
    let err = run(&openssh);
    assert_eq!(unsupported(&err).0, "OPENSSH PRIVATE KEY");
    assert!(err.to_string().contains("supported are unencrypted"));
}

/// Flips the last byte of the DER inside a PEM block.
fn flip_last_der_byte(pem: &str, label: &str) -> String {
    let mut der = pem_der(pem);
    *der.last_mut().unwrap() ^= 0x01;
    testing::pem_block(label, &der)
}

#[test]
fn corrupt_keys_are_invalid_not_mismatched() {
    let pki = Pki::new(now());

    let junk = testing::pem_block("PRIVATE KEY", &[0x30, 0x03, 0x02, 0x01, 0x00]);
    let leaf_ec = leaf(&pki, KeyKind::EcdsaP256Sec1);
    let err = check(leaf_ec.chain_pem().as_bytes(), junk.as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyInvalid { .. }), "{err}");

    // SEC1 ends with the public point: a changed point no longer matches the scalar.
    let corrupt = flip_last_der_byte(&leaf_ec.key_pem(), "EC PRIVATE KEY");
    let err = check(leaf_ec.chain_pem().as_bytes(), corrupt.as_bytes()).unwrap_err();
    match &err {
        TlsRejection::KeyInvalid { label, detail } => {
            assert_eq!(label, "EC PRIVATE KEY");
            assert!(detail.contains("do not belong together"), "{detail}");
        }
        other => panic!("unexpected {other}"),
    }

    // PKCS#1 ends with the CRT coefficient: ring notices the inconsistency.
    let leaf_rsa = leaf(&pki, KeyKind::RsaPkcs1);
    let corrupt = flip_last_der_byte(&leaf_rsa.key_pem(), "RSA PRIVATE KEY");
    let err = check(leaf_rsa.chain_pem().as_bytes(), corrupt.as_bytes()).unwrap_err();
    assert!(
        matches!(&err, TlsRejection::KeyInvalid { label, .. } if label == "RSA PRIVATE KEY"),
        "{err}"
    );
}

#[test]
fn mismatched_keys_are_rejected_for_every_kind() {
    let pki = Pki::new(now());
    for kind in KeyKind::ALL {
        let leaf = leaf(&pki, kind);
        let other = leaf.key.another();
        let err = check(leaf.chain_pem().as_bytes(), other.pem().as_bytes()).unwrap_err();
        match &err {
            TlsRejection::KeyMismatch {
                key,
                certificate,
                subject,
            } => {
                assert_eq!(key, &kind.algorithm().to_string());
                assert_eq!(certificate, &kind.algorithm().to_string());
                assert!(subject.contains(HOST));
            }
            other => panic!("{kind:?}: unexpected {other}"),
        }
        assert_no_leak(&format!("{err} {err:?}"), &other.base64_body());
    }
}

#[test]
fn keys_of_another_algorithm_are_mismatched() {
    let pki = Pki::new(now());
    let rsa = leaf(&pki, KeyKind::RsaPkcs8);
    let ec = TestKey::generate(KeyKind::EcdsaP384Sec1);
    let err = check(rsa.chain_pem().as_bytes(), ec.pem().as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::KeyMismatch {
            key: "ECDSA P-384".into(),
            certificate: "RSA 2048-bit".into(),
            subject: format!("O=certwatch tests, CN={HOST}"),
        }
    );
    let p256 = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let p384 = TestKey::generate(KeyKind::EcdsaP384Pkcs8);
    let err = check(p256.chain_pem().as_bytes(), p384.pem().as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
    let ed = TestKey::generate(KeyKind::Ed25519Pkcs8);
    let err = check(p256.chain_pem().as_bytes(), ed.pem().as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
}

#[test]
fn validity_period_is_enforced_with_dates() {
    let pki = Pki::new(now());
    let expired = pki.issue(&LeafSpec::new(HOST, now()).expired(now()));
    let err = check(expired.chain_pem().as_bytes(), expired.key_pem().as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::CertificateExpired {
            subject: format!("O=certwatch tests, CN={HOST}"),
            not_after: now() - days(1),
            now: now(),
        }
    );
    assert!(
        err.to_string().contains("expired at 2025-12-31T00:00:00Z"),
        "{err}"
    );

    let future = pki.issue(&LeafSpec::new(HOST, now()).not_yet_valid(now()));
    let err = check(future.chain_pem().as_bytes(), future.key_pem().as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::CertificateNotYetValid {
            subject: format!("O=certwatch tests, CN={HOST}"),
            not_before: now() + days(1),
            now: now(),
        }
    );
    assert!(
        err.to_string()
            .contains("not valid before 2026-01-02T00:00:00Z")
    );
}

#[test]
fn checks_run_in_the_documented_order() {
    let pki = Pki::new(now());
    let expired = pki.issue(&LeafSpec::new(HOST, now()).expired(now()));
    let other = expired.key.another().pem();
    // Key mismatch is reported before expiry.
    let err = check(expired.chain_pem().as_bytes(), other.as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
    // Chain order before any key problem.
    let err = check(expired.reversed_chain_pem().as_bytes(), b"garbage").unwrap_err();
    assert!(matches!(err, TlsRejection::ChainOutOfOrder { .. }), "{err}");
    // Secret type before everything.
    let err = TlsValidator::default()
        .validate(TlsMaterial::default(), None, now())
        .unwrap_err();
    assert_eq!(err, TlsRejection::WrongSecretType { found: None });
}

#[test]
fn expiry_warning_window_is_configurable() {
    let pki = Pki::new(now());
    let soon = pki.issue(&LeafSpec::new(HOST, now()).valid(now() - days(80), now() + days(10)));
    let validated = check(soon.chain_pem().as_bytes(), soon.key_pem().as_bytes()).unwrap();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::ExpiresSoon {
            not_after: now() + days(10),
            days_left: 10
        }]
    );
    assert_eq!(validated.not_after(), now() + days(10));
    assert!(validated.warnings()[0].to_string().contains("10 days left"));

    let narrow = TlsValidator::with_expiry_warning(days(5));
    let validated = narrow
        .validate(
            TlsMaterial::from_data(Some(SECRET_TYPE_TLS), &soon.data()),
            Some(HOST),
            now(),
        )
        .unwrap();
    assert_eq!(validated.warnings(), &[]);
}

#[test]
fn host_coverage_is_a_warning() {
    let pki = Pki::new(now());
    let wildcard = pki.issue(&LeafSpec::new(HOST, now()).names(&["*.example.com", "example.com"]));
    let (crt, key) = (wildcard.chain_pem(), wildcard.key_pem());
    for covered in ["a.example.com", "example.com", "SHOP.example.com."] {
        let validated = check_host(crt.as_bytes(), key.as_bytes(), Some(covered)).unwrap();
        assert_eq!(validated.warnings(), &[], "{covered}");
    }
    let validated = check_host(crt.as_bytes(), key.as_bytes(), Some("a.b.example.com")).unwrap();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::HostNotCovered {
            host: "a.b.example.com".into(),
            names: vec!["*.example.com".into(), "example.com".into()],
        }]
    );
    assert_eq!(validated.warnings()[0].code(), "host_not_covered");
    // No host, no check; the same check is available per host afterwards.
    let hostless = check_host(crt.as_bytes(), key.as_bytes(), None).unwrap();
    assert_eq!(hostless.warnings(), &[]);
    assert_eq!(hostless.host_warning("a.example.com"), None);
    assert_eq!(
        hostless.host_warning("a.b.example.com").as_ref(),
        validated.warnings().first()
    );
    assert_eq!(
        check_host(crt.as_bytes(), key.as_bytes(), Some(""))
            .unwrap()
            .warnings(),
        &[]
    );
}

#[test]
fn common_name_counts_only_without_sans() {
    let pki = Pki::new(now());
    let cn_only = pki.issue(&LeafSpec::new(HOST, now()).common_name_only("legacy.example.com"));
    let validated = check_host(
        cn_only.chain_pem().as_bytes(),
        cn_only.key_pem().as_bytes(),
        Some("legacy.example.com"),
    )
    .unwrap();
    assert_eq!(validated.dns_names(), ["legacy.example.com"]);
    assert_eq!(validated.warnings(), &[]);

    let mut spec = LeafSpec::new(HOST, now()).names(&["10.1.2.3"]);
    spec.common_name = Some("legacy.example.com".into());
    let with_san = pki.issue(&spec);
    let validated = check_host(
        with_san.chain_pem().as_bytes(),
        with_san.key_pem().as_bytes(),
        Some("legacy.example.com"),
    )
    .unwrap();
    assert_eq!(
        validated.ip_addresses(),
        ["10.1.2.3".parse::<std::net::IpAddr>().unwrap()]
    );
    assert!(validated.dns_names().is_empty());
    assert_eq!(validated.warnings().len(), 1);
    assert!(validated.covers_host("10.1.2.3"));
}

#[test]
fn extra_blocks_are_left_out_with_a_warning() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let crt = format!(
        "subject=CN = {HOST}\n{}{}",
        leaf.chain_pem(),
        testing::pem_block("X509 CRL", b"crl")
    );
    let key = format!("{}{}", leaf.key_pem(), leaf.leaf_pem());
    let validated = check(crt.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(
        validated.warnings(),
        &[
            TlsWarning::IgnoredPemBlocks {
                entry: "tls.crt",
                labels: vec!["X509 CRL".into()]
            },
            TlsWarning::IgnoredPemBlocks {
                entry: "tls.key",
                labels: vec!["CERTIFICATE".into()]
            },
        ]
    );
    assert_eq!(validated.chain_pem(), leaf.chain_pem().replace('\r', ""));
    assert!(!validated.key_pem().expose_secret().contains("CERTIFICATE"));
}

#[test]
fn near_limit_certificates_validate() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();
    let size = testing::SECRET_SIZE_LIMIT - key.len() - 1024;

    let padded = testing::padded_to(&leaf.chain_pem(), size);
    assert_eq!(padded.len(), size);
    let validated = check(padded.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 2);

    let bulky = testing::bulky_chain(&leaf, size);
    assert!(bulky.len() > size - 1024, "{}", bulky.len());
    let validated = check(bulky.as_bytes(), key.as_bytes()).unwrap();
    assert!(validated.chain_len() > 1000, "{}", validated.chain_len());
}

#[test]
fn key_material_never_appears_in_errors_or_debug() {
    let pki = Pki::new(now());
    for kind in KeyKind::ALL {
        let leaf = leaf(&pki, kind);
        let key = leaf.key_pem();
        let body = leaf.key.base64_body();
        let expired = pki.issue_for_key(
            &LeafSpec::new(HOST, now()).expired(now()),
            TestKey::generate(kind),
        );
        let cases: Vec<(String, Vec<u8>)> = vec![
            // Key where the certificate belongs, and both in one entry.
            (key.clone(), key.clone().into_bytes()),
            (format!("{key}{}", leaf.chain_pem()), b"x".to_vec()),
            // Key bytes inside a broken block, and the key as a certificate.
            (
                format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END PRIVATE KEY-----\n"),
                key.clone().into_bytes(),
            ),
            (
                testing::pem_block("CERTIFICATE", &pem_der(&key)),
                key.clone().into_bytes(),
            ),
            // Right certificate, key in odd places.
            (leaf.reversed_chain_pem(), key.clone().into_bytes()),
            (
                leaf.chain_pem(),
                format!("-----BEGIN {body}-----\n").into_bytes(),
            ),
            (
                leaf.chain_pem(),
                key.replace("PRIVATE KEY-----\n", "PRIVATE KEY-----\n!")
                    .into_bytes(),
            ),
            (leaf.chain_pem(), testing::truncated_pem(&key).into_bytes()),
            (
                leaf.chain_pem(),
                testing::pem_block("PRIVATE KEY", &pem_der(&key)[..40]).into_bytes(),
            ),
            (expired.chain_pem(), key.clone().into_bytes()),
            (leaf.chain_pem(), leaf.key.another().pem().into_bytes()),
        ];
        for (crt, key_bytes) in cases {
            let err = check(crt.as_bytes(), &key_bytes).unwrap_err();
            let reason = Reason::ExternalCertificateValidationFailed {
                route: RouteKey::new("ns", "r"),
                secret: "s".into(),
                problem: ValidationProblem::Tls(err.clone()),
            };
            let output = format!("{err} {err:?} {reason} {reason:?} {:?}", reason.admission());
            assert_no_leak(&output, &body);
        }

        let validated = check(leaf.chain_pem().as_bytes(), key.as_bytes()).unwrap();
        let output = format!(
            "{validated:?} {:?} {:?}",
            validated.key_pem(),
            validated.pem_bundle()
        );
        assert_no_leak(&output, &body);
        assert!(output.contains("redacted"));
        assert!(
            !format!(
                "{:?}",
                TlsMaterial::from_data(Some(SECRET_TYPE_TLS), &leaf.data())
            )
            .contains(&body[..24])
        );
    }
}

#[test]
fn rejection_codes_are_distinct() {
    let samples = [
        TlsRejection::CertificateMissing,
        TlsRejection::CertificateEmpty,
        TlsRejection::KeyMissing,
        TlsRejection::KeyEmpty,
        TlsRejection::WrongSecretType { found: None },
        TlsRejection::KeyNotText { offset: 0 },
    ];
    let codes: std::collections::BTreeSet<_> = samples.iter().map(TlsRejection::code).collect();
    assert_eq!(codes.len(), samples.len());
    assert_eq!(KeyAlgorithm::Rsa { bits: 3072 }.to_string(), "RSA 3072-bit");
    assert_eq!(KeyEncoding::Sec1.pem_label(), "EC PRIVATE KEY");
}
