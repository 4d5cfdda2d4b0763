//! Every check of `tls::TlsValidator`, with material built by `route_secrets::testing`.
//! (What HAProxy makes of the results is in `tls_router_matrix.rs`.)

// Helpers outside #[test] functions fail the test on bad fixtures, which is intended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use jiff::{SignedDuration, Timestamp};
use route_secrets::reason::{Reason, ValidationProblem};
use route_secrets::route::RouteKey;
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki, TestKey, openssl};
use route_secrets::tls::{
    self, KeyAlgorithm, KeyEncoding, PemProblem, SECRET_TYPE_TLS, SecurityLevel, TlsCause,
    TlsMaterial, TlsRejection, TlsValidator, TlsWarning, ValidatedTls,
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
    testing::pem_der(pem)
}

/// The codes of a validation's warnings.
fn warning_codes(validated: &ValidatedTls) -> Vec<&'static str> {
    validated.warnings().iter().map(TlsWarning::code).collect()
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
        assert_eq!(
            Some(validated.key_algorithm()),
            kind.algorithm(),
            "{kind:?}"
        );
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

/// The OpenSSL-made leaves' "now": inside their validity (2020..2120).
fn fixture_now() -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap()
}

fn check_fixture(certificate: &str, key: &str) -> Result<ValidatedTls, TlsRejection> {
    TlsValidator::default().validate(
        TlsMaterial {
            secret_type: Some(SECRET_TYPE_TLS),
            certificate: Some(certificate.as_bytes()),
            key: Some(key.as_bytes()),
        },
        Some(openssl::HOST),
        fixture_now(),
    )
}

#[test]
fn every_rsa_size_and_every_curve_go_knows_is_served() {
    let cases = [
        (openssl::LEAF_RSA_2048, KeyAlgorithm::Rsa { bits: 2048 }),
        (openssl::LEAF_RSA_2048_E3, KeyAlgorithm::Rsa { bits: 2048 }),
        (openssl::LEAF_RSA_3072, KeyAlgorithm::Rsa { bits: 3072 }),
        (openssl::LEAF_RSA_4096, KeyAlgorithm::Rsa { bits: 4096 }),
        (openssl::LEAF_EC_P224, KeyAlgorithm::EcdsaP224),
        (openssl::LEAF_EC_P521, KeyAlgorithm::EcdsaP521),
        (openssl::SELF_SIGNED_EC_P521, KeyAlgorithm::EcdsaP521),
    ];
    for (fixture, algorithm) in cases {
        let is_ec = !matches!(algorithm, KeyAlgorithm::Rsa { .. });
        let other = if is_ec {
            KeyEncoding::Sec1
        } else {
            KeyEncoding::Pkcs1
        };
        for key in [fixture.key.to_owned(), fixture.key_as(other)] {
            let validated = check_fixture(&fixture.chain_pem(), &key)
                .unwrap_or_else(|err| panic!("{}: {err}", fixture.name));
            assert_eq!(validated.key_algorithm(), algorithm, "{}", fixture.name);
            assert_eq!(validated.warnings(), &[], "{}", fixture.name);
        }
        if is_ec {
            // Without the public key in the key file, the point is derived.
            for encoding in [KeyEncoding::Pkcs8, KeyEncoding::Sec1] {
                let bare = testing::ec_key_without_public_key(fixture.key, encoding);
                check_fixture(&fixture.chain_pem(), &bare)
                    .unwrap_or_else(|err| panic!("{} {encoding:?}: {err}", fixture.name));
            }
            // Another key of the same curve does not match.
            let wrong = match algorithm {
                KeyAlgorithm::EcdsaP224 => openssl::LEAF_EC_P521.key,
                _ => openssl::LEAF_EC_P224.key,
            };
            let err = check_fixture(&fixture.chain_pem(), wrong).unwrap_err();
            assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
        }
    }
    // P-521 keys of two different certificates.
    let err = check_fixture(
        &openssl::SELF_SIGNED_EC_P521.chain_pem(),
        &testing::ec_key_without_public_key(openssl::LEAF_EC_P224.key, KeyEncoding::Sec1),
    )
    .unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
}

#[test]
fn keys_the_router_cannot_serve_are_unsupported() {
    let cases = [
        (openssl::LEAF_ED25519, "Ed25519 keys cannot be served"),
        (openssl::LEAF_ED448, "Ed448 keys cannot be served"),
        (openssl::LEAF_DSA, "DSA keys cannot be served"),
        (
            openssl::LEAF_RSA_PSS,
            "RSASSA-PSS-only RSA keys cannot be served",
        ),
    ];
    for (fixture, detail) in cases {
        let err = check_fixture(&fixture.chain_pem(), fixture.key).unwrap_err();
        let (label, found) = unsupported(&err);
        assert_eq!(label, "PRIVATE KEY", "{}", fixture.name);
        assert!(found.starts_with(detail), "{}: {found}", fixture.name);
        assert_eq!(err.cause(), TlsCause::UnsupportedKey);
    }
    // The certificate is refused before its key where the router cannot read it.
    for (fixture, curve) in [
        (openssl::LEAF_EC_SECP256K1, "ECDSA on secp256k1"),
        (openssl::LEAF_EC_BRAINPOOL, "ECDSA on a brainpool curve"),
    ] {
        let err = check_fixture(&fixture.chain_pem(), fixture.key).unwrap_err();
        match &err {
            TlsRejection::UnsupportedCertificateKey {
                position,
                algorithm,
                ..
            } => {
                assert_eq!((*position, algorithm.as_str()), (1, curve));
            }
            other => panic!("{}: unexpected {other}", fixture.name),
        }
        assert_eq!(err.cause(), TlsCause::UnsupportedKey);
    }
    // An Ed25519 key made by ring, with its rcgen certificate.
    let ed = Pki::self_signed(&LeafSpec::new(HOST, now()).key(KeyKind::Ed25519Pkcs8));
    let err = check(ed.leaf_pem().as_bytes(), ed.key_pem().as_bytes()).unwrap_err();
    assert!(unsupported(&err).1.starts_with("Ed25519"), "{err}");
}

#[test]
fn weak_signatures_are_refused_unless_self_signed() {
    let cases: [(String, &str, usize, &str); 6] = [
        (
            openssl::LEAF_SHA1.chain_pem(),
            openssl::LEAF_SHA1.key,
            1,
            "SHA-1",
        ),
        (
            openssl::LEAF_MD5.chain_pem(),
            openssl::LEAF_MD5.key,
            1,
            "MD5",
        ),
        (
            openssl::LEAF_ECDSA_SHA1.chain_pem(),
            openssl::LEAF_ECDSA_SHA1.key,
            1,
            "SHA-1",
        ),
        (
            openssl::LEAF_DSA_SHA1.chain_pem(),
            openssl::LEAF_DSA_SHA1.key,
            1,
            "SHA-1",
        ),
        (
            format!(
                "{}{}{}",
                openssl::LEAF_RSA_2048.certificate,
                openssl::INTERMEDIATE_SHA1,
                openssl::ROOT
            ),
            openssl::LEAF_RSA_2048.key,
            2,
            "SHA-1",
        ),
        (
            format!(
                "{}{}",
                openssl::LEAF_RSA_2048.certificate,
                openssl::INTERMEDIATE_MD5
            ),
            openssl::LEAF_RSA_2048.key,
            2,
            "MD5",
        ),
    ];
    for (crt, key, expected_position, expected_digest) in cases {
        let err = check_fixture(&crt, key).unwrap_err();
        match &err {
            TlsRejection::WeakSignature {
                position, digest, ..
            } => assert_eq!((*position, *digest), (expected_position, expected_digest)),
            other => panic!("unexpected {other}"),
        }
        assert_eq!(err.cause(), TlsCause::WeakSignature);
        assert_eq!(err.router_reason(), "ExtendedValidationFailed");
        assert!(err.to_string().contains("CA-signed using"), "{err}");
    }
    // Self-signed certificates may use anything: nobody verifies their signature.
    for fixture in [openssl::SELF_SIGNED_SHA1, openssl::SELF_SIGNED_MD5] {
        check_fixture(fixture.certificate, fixture.key)
            .unwrap_or_else(|err| panic!("{}: {err}", fixture.name));
    }
    let with_sha1_root = format!(
        "{}{}{}",
        openssl::LEAF_RSA_2048.certificate,
        openssl::INTERMEDIATE,
        openssl::ROOT_SHA1
    );
    let validated = check_fixture(&with_sha1_root, openssl::LEAF_RSA_2048.key).unwrap();
    assert_eq!(validated.chain_len(), 3);
    assert_eq!(validated.warnings(), &[]);
}

#[test]
fn small_rsa_keys_are_refused_anywhere_in_the_chain_at_level_two() {
    let cases: [(String, &str, usize); 4] = [
        (
            openssl::LEAF_RSA_1024.chain_pem(),
            openssl::LEAF_RSA_1024.key,
            1,
        ),
        (
            openssl::SELF_SIGNED_RSA_1024.chain_pem(),
            openssl::SELF_SIGNED_RSA_1024.key,
            1,
        ),
        (
            openssl::LEAF_UNDER_RSA_1024.chain_pem(),
            openssl::LEAF_UNDER_RSA_1024.key,
            2,
        ),
        // A self-signed root with a small key: still refused by HAProxy.
        (
            format!(
                "{}{}{}",
                openssl::LEAF_RSA_2048.certificate,
                openssl::INTERMEDIATE_UNDER_RSA_1024_ROOT,
                openssl::ROOT_RSA_1024
            ),
            openssl::LEAF_RSA_2048.key,
            3,
        ),
    ];
    let at_level_two = TlsValidator::default().security_level(SecurityLevel::DEBIAN_DEFAULT);
    for (crt, key, expected_position) in cases {
        // The router image's level (the default) loads them; Debian's does not.
        check_fixture(&crt, key).expect("RSA 1024 at level 1");
        let err = at_level_two
            .validate(
                TlsMaterial {
                    secret_type: Some(SECRET_TYPE_TLS),
                    certificate: Some(crt.as_bytes()),
                    key: Some(key.as_bytes()),
                },
                Some(openssl::HOST),
                fixture_now(),
            )
            .unwrap_err();
        match &err {
            TlsRejection::WeakKey {
                position,
                algorithm,
                ..
            } => assert_eq!(
                (*position, algorithm.as_str()),
                (expected_position, "RSA 1024-bit")
            ),
            other => panic!("unexpected {other}"),
        }
        assert_eq!(err.cause(), TlsCause::WeakKey);
        assert!(
            err.to_string()
                .contains("HAProxy refuses to load at OpenSSL security level 2"),
            "{err}"
        );
    }
    // DSA 2048 in the chain is strong enough.
    let validated = check_fixture(
        &openssl::LEAF_UNDER_DSA_ROOT.chain_pem(),
        openssl::LEAF_UNDER_DSA_ROOT.key,
    )
    .unwrap();
    assert_eq!(validated.chain_len(), 2);
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
    // EC PARAMETERS in tls.crt are dropped as well.
    let crt = format!(
        "{}{}",
        key.split("-----BEGIN EC PRIVATE KEY").next().unwrap(),
        leaf.chain_pem()
    );
    let validated = check(crt.as_bytes(), leaf.key_pem().as_bytes()).unwrap();
    assert_eq!(validated.warnings(), &[]);
    assert_eq!(validated.chain_pem(), leaf.chain_pem());
}

#[test]
fn keys_are_read_whatever_their_label_and_written_with_the_right_one() {
    let pki = Pki::new(now());
    let rsa = leaf(&pki, KeyKind::RsaPkcs8);
    // PKCS#8 bytes under the PKCS#1 label, as the router tolerates.
    let mislabelled = rsa
        .key_pem()
        .replace("BEGIN PRIVATE KEY", "BEGIN RSA PRIVATE KEY")
        .replace("END PRIVATE KEY", "END RSA PRIVATE KEY");
    let validated = check(rsa.chain_pem().as_bytes(), mislabelled.as_bytes()).unwrap();
    assert_eq!(validated.key_encoding(), KeyEncoding::Pkcs8);
    assert_eq!(validated.key_pem().expose_secret(), rsa.key_pem());

    // "ECDSA PRIVATE KEY", another label the router knows.
    let ec = leaf(&pki, KeyKind::EcdsaP256Sec1);
    let ecdsa_label = ec.key_pem().replace("EC PRIVATE KEY", "ECDSA PRIVATE KEY");
    let validated = check(ec.chain_pem().as_bytes(), ecdsa_label.as_bytes()).unwrap();
    assert_eq!(validated.key_encoding(), KeyEncoding::Sec1);
    assert_eq!(validated.key_pem().expose_secret(), ec.key_pem());
}

#[test]
fn a_private_key_in_tls_crt_is_used_as_the_router_uses_it() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let crt = format!("{}{}", leaf.chain_pem(), leaf.key_pem());
    for key in [b"".as_slice(), b"no key here\n", leaf.key_pem().as_bytes()] {
        let validated = check(crt.as_bytes(), key).unwrap();
        assert_eq!(validated.chain_pem(), leaf.chain_pem());
        assert_eq!(validated.key_pem().expose_secret(), leaf.key_pem());
        assert_eq!(validated.warnings()[0], TlsWarning::KeyFromCertificateEntry);
    }
    // The key in tls.crt comes first, as in the router: a different one in tls.key is
    // left out.
    let other = leaf.key.another().pem();
    let validated = check(crt.as_bytes(), other.as_bytes()).unwrap();
    assert_eq!(
        warning_codes(&validated),
        ["key_from_certificate_entry", "ignored_pem_blocks"]
    );
    // Two keys in tls.crt and none in tls.key: the second is left out.
    let two_keys = format!("{crt}{other}");
    let validated = check(two_keys.as_bytes(), b"").unwrap();
    assert_eq!(
        validated.warnings()[1],
        TlsWarning::IgnoredPemBlocks {
            entry: "tls.crt",
            labels: vec!["PRIVATE KEY".into()]
        }
    );
    // But every key must be servable.
    let err = check(crt.as_bytes(), testing::ED448_KEY_PEM.as_bytes()).unwrap_err();
    assert!(unsupported(&err).1.contains("Ed448"), "{err}");
}

#[test]
fn full_chain_and_self_signed_pass() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let validated = check(leaf.full_chain_pem().as_bytes(), leaf.key_pem().as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 3);
    assert_eq!(validated.warnings(), &[]);

    let single = Pki::self_signed(&LeafSpec::new(HOST, now()).key(KeyKind::EcdsaP384Pkcs8));
    let validated = check(single.leaf_pem().as_bytes(), single.key_pem().as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 1);
}

#[test]
fn secret_type_must_be_tls() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let data = leaf.data();
    let err = tls::validate(Some("Opaque"), &data, Some(HOST), now()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::WrongSecretType {
            found: Some("Opaque".into())
        }
    );
    assert_eq!(err.cause(), TlsCause::WrongType);
    assert_eq!(err.router_reason(), "ExternalCertificateValidationFailed");
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
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let chain = leaf.chain_pem();
    let validator = TlsValidator::default();
    fn material<'a>(certificate: Option<&'a [u8]>, key: Option<&'a [u8]>) -> TlsMaterial<'a> {
        TlsMaterial {
            secret_type: Some(SECRET_TYPE_TLS),
            certificate,
            key,
        }
    }
    let cases = [
        (material(None, None), TlsRejection::CertificateMissing),
        (
            material(Some(b""), Some(b"k")),
            TlsRejection::CertificateEmpty,
        ),
        (
            material(Some(chain.as_bytes()), None),
            TlsRejection::KeyMissing,
        ),
        (
            material(Some(chain.as_bytes()), Some(b"")),
            TlsRejection::KeyEmpty,
        ),
    ];
    for (input, expected) in cases {
        let err = validator.validate(input, None, now()).unwrap_err();
        assert_eq!(err.cause(), TlsCause::MissingData);
        assert_eq!(err, expected);
    }
    let secret = testing::tls_secret("ns", "s", Some(SECRET_TYPE_TLS), Default::default());
    assert_eq!(
        validator.validate_secret(&secret, None, now()).unwrap_err(),
        TlsRejection::CertificateMissing
    );
}

#[test]
fn text_around_the_blocks_is_ignored_even_when_binary() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();

    // Trailing bytes that are not UTF-8, as the router's Go PEM decoder ignores them.
    let bytes = testing::non_utf8_certificate(&leaf);
    let validated = check(&bytes, key.as_bytes()).unwrap();
    assert_eq!(validated.chain_pem(), leaf.chain_pem());
    assert_eq!(validated.warnings(), &[]);

    // Comments, CRLF line ends and garbage after the key.
    let crt = format!(
        "subject=CN = {HOST}\r\n{}",
        leaf.chain_pem().replace('\n', "\r\n")
    );
    let key_with_garbage = format!("{key}\ngarbage after the key \u{1F600}\n");
    let validated = check(crt.as_bytes(), key_with_garbage.as_bytes()).unwrap();
    assert_eq!(validated.chain_pem(), leaf.chain_pem());
    assert_eq!(validated.key_pem().expose_secret(), key);
    assert_eq!(validated.warnings(), &[]);

    // Binary DER is not PEM at all.
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
    assert_eq!(err.cause(), TlsCause::BadPem);
}

#[test]
fn broken_blocks_are_skipped_and_reported_when_nothing_else_is_there() {
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

    // The intermediate cut short: the router skips it and serves the leaf alone.
    let truncated = testing::truncated_pem(&leaf.chain_pem());
    let validated = check(truncated.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(validated.chain_len(), 1);
    assert_eq!(validated.chain_pem(), leaf.leaf_pem());
    match validated.warnings() {
        [TlsWarning::SkippedPemBlocks { entry, problems }] => {
            assert_eq!(*entry, "tls.crt");
            assert!(matches!(problems[..], [PemProblem::Unterminated { .. }]));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(
        validated.warnings()[0]
            .to_string()
            .contains("has no END line")
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
    // An empty CERTIFICATE block is an unparseable certificate, as for the router.
    let empty = format!(
        "{}-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        leaf.leaf_pem()
    );
    let err = check(empty.as_bytes(), key.as_bytes()).unwrap_err();
    assert!(
        matches!(
            err,
            TlsRejection::CertificateUnparseable { position: 2, .. }
        ),
        "{err}"
    );
}

#[test]
fn chain_order_is_not_enforced_but_served_in_issuing_order() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let key = leaf.key_pem();
    let in_order = leaf.full_chain_pem();

    // Leaf, root, intermediate: served leaf, intermediate, root.
    let validated = check(
        leaf.root_before_intermediate_pem().as_bytes(),
        key.as_bytes(),
    )
    .unwrap();
    assert_eq!(validated.chain_pem(), in_order);
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::ChainReordered {
            order: vec![1, 3, 2]
        }]
    );
    assert!(validated.warnings()[0].to_string().contains("#1, #3, #2"));

    // The leaf again at the end, and an intermediate that did not issue the leaf (same
    // name, other key): unrelated, served after the path, as given.
    let leaf_again = format!("{}{}", leaf.chain_pem(), leaf.leaf_pem());
    let validated = check(leaf_again.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::UnrelatedCertificates { positions: vec![3] }]
    );
    assert_eq!(validated.chain_pem(), leaf_again);
    let impostor = Pki::new(now());
    let chain = leaf.with_impostor_intermediate(&impostor);
    let validated = check(chain.as_bytes(), key.as_bytes()).unwrap();
    assert_eq!(warning_codes(&validated), ["unrelated_certificates"]);

    // The key must belong to the first certificate: the router's one rule on order.
    let err = check(leaf.reversed_chain_pem().as_bytes(), key.as_bytes()).unwrap_err();
    match &err {
        TlsRejection::KeyMismatch {
            subject,
            matching_position,
            ..
        } => {
            assert!(subject.contains("intermediate"), "{subject}");
            assert_eq!(*matching_position, Some(2));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(
        err.to_string().contains("list that certificate first"),
        "{err}"
    );
    assert_eq!(err.cause(), TlsCause::KeyMismatch);

    // OpenSSL-made chains reorder the same way.
    let shuffled = format!(
        "{}{}{}",
        openssl::LEAF_RSA_3072.certificate,
        openssl::ROOT,
        openssl::INTERMEDIATE
    );
    let validated = check_fixture(&shuffled, openssl::LEAF_RSA_3072.key).unwrap();
    assert_eq!(validated.chain_pem(), openssl::LEAF_RSA_3072.chain_pem());
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

    let err = check(chain.as_bytes(), b"just words").unwrap_err();
    assert_eq!(
        err,
        TlsRejection::NoPrivateKey {
            found_labels: vec![]
        }
    );
}

#[test]
fn blocks_the_router_does_not_know_or_place_are_rejected() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let (chain, key) = (leaf.chain_pem(), leaf.key_pem());
    let crl = testing::pem_block("X509 CRL", b"crl");
    let public_key = testing::pem_block("PUBLIC KEY", b"spki");

    let crt = format!("{chain}{crl}");
    assert_eq!(
        check(crt.as_bytes(), key.as_bytes()).unwrap_err(),
        TlsRejection::UnrecognizedPemBlock {
            entry: "tls.crt",
            label: "X509 CRL".into()
        }
    );
    let crt = format!("{chain}{public_key}");
    assert_eq!(
        check(crt.as_bytes(), key.as_bytes()).unwrap_err(),
        TlsRejection::UnexpectedPemBlock {
            entry: "tls.crt",
            label: "PUBLIC KEY".into(),
            expected: "CERTIFICATE"
        }
    );
    let with_cert = format!("{key}{}", leaf.leaf_pem());
    let err = check(chain.as_bytes(), with_cert.as_bytes()).unwrap_err();
    assert_eq!(
        err,
        TlsRejection::UnexpectedPemBlock {
            entry: "tls.key",
            label: "CERTIFICATE".into(),
            expected: "PRIVATE KEY"
        }
    );
    assert_eq!(err.cause(), TlsCause::BadPem);
    let with_crl = format!("{key}{crl}");
    assert_eq!(
        check(chain.as_bytes(), with_crl.as_bytes()).unwrap_err(),
        TlsRejection::UnrecognizedPemBlock {
            entry: "tls.key",
            label: "X509 CRL".into()
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

    let err = run(testing::ED448_KEY_PEM);
    assert!(unsupported(&err).1.contains("Ed448"), "{err}");

    let openssh = testing::pem_block("OPENSSH PRIVATE KEY", b"openssh-key-v1\0");
    let err = run(&openssh);
    assert_eq!(unsupported(&err).0, "OPENSSH PRIVATE KEY");
    assert!(err.to_string().contains("supported are unencrypted"));

    // Served kinds that are not this certificate's: a mismatch, not unsupported.
    for key in [testing::RSA_1024_KEY_PEM, testing::EC_P521_KEY_PEM] {
        assert!(matches!(run(key), TlsRejection::KeyMismatch { .. }));
    }
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
    // The same for P-521, whose point is derived by RustCrypto, not ring.
    let p521 = openssl::LEAF_EC_P521.key_as(KeyEncoding::Sec1);
    let corrupt = flip_last_der_byte(&p521, "EC PRIVATE KEY");
    let err = check_fixture(&openssl::LEAF_EC_P521.chain_pem(), &corrupt).unwrap_err();
    assert!(
        matches!(&err, TlsRejection::KeyInvalid { detail, .. } if detail.contains("do not belong together")),
        "{err}"
    );

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
        let algorithm = kind.algorithm().unwrap().to_string();
        match &err {
            TlsRejection::KeyMismatch {
                key,
                certificate,
                subject,
                matching_position,
            } => {
                assert_eq!(key, &algorithm);
                assert_eq!(certificate, &algorithm);
                assert!(subject.contains(HOST));
                assert_eq!(*matching_position, None);
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
            matching_position: None,
        }
    );
    let p256 = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let p384 = TestKey::generate(KeyKind::EcdsaP384Pkcs8);
    let err = check(p256.chain_pem().as_bytes(), p384.pem().as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
}

#[test]
fn validity_dates_are_warnings_not_rejections() {
    let pki = Pki::new(now());
    let expired = pki.issue(&LeafSpec::new(HOST, now()).expired(now()));
    let validated = check(expired.chain_pem().as_bytes(), expired.key_pem().as_bytes()).unwrap();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::Expired {
            not_after: now() - days(1)
        }]
    );
    let message = validated.warnings()[0].to_string();
    assert!(
        message.contains("expired at 2025-12-31T00:00:00Z"),
        "{message}"
    );
    assert!(message.contains("served anyway"), "{message}");
    assert_eq!(validated.not_after(), now() - days(1));

    let future = pki.issue(&LeafSpec::new(HOST, now()).not_yet_valid(now()));
    let validated = check(future.chain_pem().as_bytes(), future.key_pem().as_bytes()).unwrap();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::NotYetValid {
            not_before: now() + days(1)
        }]
    );
    assert!(
        validated.warnings()[0]
            .to_string()
            .contains("not valid before 2026-01-02T00:00:00Z")
    );

    // What holds later: the validation is kept while the secret does not change.
    let window = days(30);
    assert_eq!(
        validated.validity_warning(now() + days(2), window),
        None,
        "valid, 88 days left"
    );
    assert_eq!(
        validated.validity_warning(now() + days(80), window),
        Some(TlsWarning::ExpiresSoon {
            not_after: now() + days(90),
            days_left: 10
        })
    );
    assert_eq!(
        validated.validity_warning(now() + days(91), window),
        Some(TlsWarning::Expired {
            not_after: now() + days(90)
        })
    );
}

#[test]
fn checks_run_in_the_documented_order() {
    let pki = Pki::new(now());
    let expired = pki.issue(&LeafSpec::new(HOST, now()).expired(now()));
    let other = expired.key.another().pem();
    // Key mismatch is reported whatever the dates.
    let err = check(expired.chain_pem().as_bytes(), other.as_bytes()).unwrap_err();
    assert!(matches!(err, TlsRejection::KeyMismatch { .. }), "{err}");
    // Certificates before any key problem: a weak signature, then a weak key.
    let err = check_fixture(&openssl::LEAF_SHA1.chain_pem(), "garbage").unwrap_err();
    assert!(matches!(err, TlsRejection::WeakSignature { .. }), "{err}");
    let sha1_and_small = format!(
        "{}{}",
        openssl::LEAF_RSA_1024.certificate,
        openssl::INTERMEDIATE_SHA1
    );
    let err = check_fixture(&sha1_and_small, "garbage").unwrap_err();
    assert!(
        matches!(err, TlsRejection::WeakSignature { position: 2, .. }),
        "{err}"
    );
    // Unknown blocks before the certificates are parsed.
    let crt = format!(
        "{}{}",
        testing::not_a_certificate_pem(),
        testing::pem_block("X509 CRL", b"crl")
    );
    let err = check(crt.as_bytes(), b"garbage").unwrap_err();
    assert!(
        matches!(err, TlsRejection::UnrecognizedPemBlock { .. }),
        "{err}"
    );
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
            let output = match check(crt.as_bytes(), &key_bytes) {
                Err(err) => {
                    let reason = Reason::ExternalCertificateValidationFailed {
                        route: RouteKey::new("ns", "r"),
                        secret: "s".into(),
                        problem: ValidationProblem::Tls(err.clone()),
                    };
                    format!("{err} {err:?} {reason} {reason:?} {:?}", reason.admission())
                }
                // The key in tls.crt is admitted, as by the router.
                Ok(validated) => format!(
                    "{validated:?} {}",
                    validated
                        .warnings()
                        .iter()
                        .map(ToString::to_string)
                        .collect::<String>()
                ),
            };
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
fn rejection_codes_are_distinct_and_causes_stable() {
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
    let labels: Vec<&str> = TlsCause::ALL.iter().map(|cause| cause.as_str()).collect();
    assert_eq!(
        labels,
        [
            "wrong_type",
            "missing_data",
            "bad_pem",
            "key_mismatch",
            "unsupported_key",
            "weak_key",
            "weak_signature"
        ]
    );
    assert_eq!(KeyAlgorithm::Rsa { bits: 3072 }.to_string(), "RSA 3072-bit");
    assert_eq!(KeyEncoding::Sec1.pem_label(), "EC PRIVATE KEY");
}

#[test]
fn a_long_chain_given_backwards_is_served_in_issuing_order() {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    // root -> CA 1 -> ... -> CA 39 -> leaf, each CA named differently.
    let mut pems = Vec::new();
    let ca = |name: &str| {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
    };
    let mut issuer_params = ca("chain CA 0");
    let mut issuer_key = KeyPair::generate().unwrap();
    pems.push(issuer_params.self_signed(&issuer_key).unwrap().pem());
    for depth in 1..40 {
        let params = ca(&format!("chain CA {depth}"));
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&issuer_params, &issuer_key);
        pems.push(params.signed_by(&key, &issuer).unwrap().pem());
        (issuer_params, issuer_key) = (params, key);
    }
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![HOST.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &Issuer::from_params(&issuer_params, &issuer_key))
        .unwrap()
        .pem();
    // Given: the leaf, then the root first; served: the leaf, then CA 39 down to the root.
    let given = format!("{leaf}{}", pems.concat());
    let validated = check(given.as_bytes(), leaf_key.serialize_pem().as_bytes()).unwrap();
    let expected = format!("{leaf}{}", pems.iter().rev().cloned().collect::<String>());
    assert_eq!(validated.chain_pem(), expected);
    assert_eq!(validated.chain_len(), 41);
    let order: Vec<usize> = std::iter::once(1).chain((2..=41).rev()).collect();
    assert_eq!(
        validated.warnings(),
        &[TlsWarning::ChainReordered { order }]
    );
}

#[test]
fn material_that_is_already_canonical_is_read_from_the_shared_secret() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let full = leaf.secret("ns", "s");
    let secret = std::sync::Arc::new(tls::TlsSecret::from(&full));
    let copied = TlsValidator::default()
        .validate_secret(&full, Some(HOST), now())
        .unwrap();
    assert_eq!(std::sync::Arc::strong_count(&secret), 1);

    let shared = TlsValidator::default()
        .validate_shared_secret(&secret, Some(HOST), now())
        .unwrap();
    // The chain and the key each hold the secret instead of a copy of its text.
    assert_eq!(std::sync::Arc::strong_count(&secret), 3);
    assert_eq!(shared, copied);
    assert_eq!(shared.chain_pem(), leaf.chain_pem());
    assert_eq!(shared.key_pem().expose_secret(), leaf.key_pem());
    assert_eq!(
        shared.pem_bundle().expose_secret(),
        copied.pem_bundle().expose_secret()
    );
    drop(shared);
    assert_eq!(std::sync::Arc::strong_count(&secret), 1);
}

#[test]
fn material_that_was_re_encoded_is_not_shared_and_is_served_re_encoded() {
    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    // CRLF line ends: the served text is re-encoded with LF, so it is not the entry.
    let crlf = |text: String| text.replace('\n', "\r\n");
    let secret = std::sync::Arc::new(tls::TlsSecret::from(&testing::tls_secret(
        "ns",
        "s",
        Some(SECRET_TYPE_TLS),
        testing::tls_data(crlf(leaf.chain_pem()), leaf.key_pem()),
    )));
    let shared = TlsValidator::default()
        .validate_shared_secret(&secret, Some(HOST), now())
        .unwrap();
    // Only the key, which is canonical, is shared.
    assert_eq!(std::sync::Arc::strong_count(&secret), 2);
    assert_eq!(shared.chain_pem(), leaf.chain_pem());
    assert_eq!(shared.key_pem().expose_secret(), leaf.key_pem());
}

#[test]
fn a_secret_kept_to_its_tls_material_validates_alike_and_is_still_shared() {
    use k8s_openapi::ByteString;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    let pki = Pki::new(now());
    let leaf = leaf(&pki, KeyKind::EcdsaP256Pkcs8);
    let mut full = leaf.secret("ns", "s");
    full.metadata.uid = Some("uid-1".into());
    full.metadata.resource_version = Some("7".into());
    full.metadata.labels = Some([("team".to_owned(), "shop".to_owned())].into());
    full.metadata.annotations = Some(
        [(
            "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
            "{\"data\":{}}".to_owned(),
        )]
        .into(),
    );
    full.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
    full.data
        .as_mut()
        .unwrap()
        .insert("ca.crt".into(), ByteString(b"unused".to_vec()));

    let mut slim = full.clone();
    tls::keep_tls_material(&mut slim);
    assert_eq!(slim.metadata.name.as_deref(), Some("s"));
    assert_eq!(slim.metadata.namespace.as_deref(), Some("ns"));
    assert_eq!(slim.metadata.uid.as_deref(), Some("uid-1"));
    assert_eq!(slim.metadata.resource_version.as_deref(), Some("7"));
    assert!(slim.metadata.labels.is_none());
    assert!(slim.metadata.annotations.is_none());
    assert!(slim.metadata.managed_fields.is_none());
    assert_eq!(slim.type_, full.type_);
    assert!(
        slim.data
            .as_ref()
            .unwrap()
            .keys()
            .eq([tls::TLS_CERT_ENTRY, tls::TLS_KEY_ENTRY])
    );

    // What the monitor caches: decoded from the API server's JSON of the full
    // secret, without the rest; the same as the slimmed secret.
    let compact: tls::TlsSecret =
        serde_json::from_value(serde_json::to_value(&full).unwrap()).unwrap();
    assert_eq!(compact, tls::TlsSecret::from(&slim));
    assert_eq!(
        (compact.name(), compact.namespace()),
        (Some("s"), Some("ns"))
    );
    assert_eq!(
        (compact.uid(), compact.resource_version()),
        (Some("uid-1"), Some("7"))
    );
    let meta = compact.metadata();
    assert!(meta.labels.is_none() && meta.annotations.is_none());
    assert!(meta.managed_fields.is_none());
    assert_eq!(compact.secret_type(), full.type_.as_deref());
    assert_eq!(compact.entry("ca.crt"), None);

    let compact = std::sync::Arc::new(compact);
    let from_compact = TlsValidator::default()
        .validate_shared_secret(&compact, Some(HOST), now())
        .unwrap();
    let from_full = TlsValidator::default()
        .validate_secret(&full, Some(HOST), now())
        .unwrap();
    assert_eq!(from_compact, from_full);
    // The chain and the key still read the kept entries instead of copies.
    assert_eq!(std::sync::Arc::strong_count(&compact), 3);
}
