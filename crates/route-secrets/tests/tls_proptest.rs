//! Whatever bytes a secret holds, validation returns a verdict and never panics; valid
//! verdicts always carry consistent material.

// Helpers outside #[test] functions fail the test on bad fixtures, which is intended.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::OnceLock;

use jiff::Timestamp;
use proptest::prelude::*;
use route_secrets::testing::{KeyKind, LeafSpec, Pki};
use route_secrets::tls::{SECRET_TYPE_TLS, TlsMaterial, TlsValidator, ValidatedTls};

const HOST: &str = "shop.example.com";

fn now() -> Timestamp {
    Timestamp::from_second(1_767_225_600).unwrap()
}

/// One valid (chain, key) pair per key kind, built once.
fn fixtures() -> &'static [(String, String)] {
    static FIXTURES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let pki = Pki::new(now());
        KeyKind::ALL
            .into_iter()
            .map(|kind| {
                let leaf = pki.issue(&LeafSpec::new(HOST, now()).key(kind));
                (leaf.chain_pem(), leaf.key_pem())
            })
            .collect()
    })
}

fn validate(certificate: &[u8], key: &[u8]) -> Option<ValidatedTls> {
    TlsValidator::default()
        .validate(
            TlsMaterial {
                secret_type: Some(SECRET_TYPE_TLS),
                certificate: Some(certificate),
                key: Some(key),
            },
            Some(HOST),
            now(),
        )
        .ok()
}

/// A valid verdict must describe material that validates again, unchanged.
fn assert_consistent(validated: &ValidatedTls) {
    assert!(validated.chain_len() >= 1);
    let again = validate(
        validated.chain_pem().as_bytes(),
        validated.key_pem().expose_secret().as_bytes(),
    )
    .expect("normalized material validates");
    assert_eq!(again.fingerprint(), validated.fingerprint());
    assert_eq!(again.chain_pem(), validated.chain_pem());
}

/// Text made of PEM-ish pieces, to get past the UTF-8 and boundary checks often.
fn pem_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("-----BEGIN CERTIFICATE-----\n".to_owned()),
        Just("-----END CERTIFICATE-----\n".to_owned()),
        Just("-----BEGIN PRIVATE KEY-----\n".to_owned()),
        Just("-----END PRIVATE KEY-----\n".to_owned()),
        Just("-----BEGIN EC PRIVATE KEY-----\n".to_owned()),
        Just("-----END EC PRIVATE KEY-----\n".to_owned()),
        Just("Proc-Type: 4,ENCRYPTED\n".to_owned()),
        Just("\n".to_owned()),
        "[A-Za-z0-9+/]{0,64}={0,2}\n",
        "[ -~]{0,40}\n",
    ];
    prop::collection::vec(piece, 0..24).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic(
        certificate in prop::collection::vec(any::<u8>(), 0..2048),
        key in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        if let Some(validated) = validate(&certificate, &key) {
            assert_consistent(&validated);
        }
    }

    #[test]
    fn pem_like_text_never_panics(certificate in pem_like(), key in pem_like()) {
        if let Some(validated) = validate(certificate.as_bytes(), key.as_bytes()) {
            assert_consistent(&validated);
        }
    }

    #[test]
    fn mutated_valid_material_never_panics(
        which in 0..KeyKind::ALL.len(),
        in_key in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        truncate in prop::option::of(any::<prop::sample::Index>()),
    ) {
        let (chain, key) = &fixtures()[which];
        let mut certificate = chain.clone().into_bytes();
        let mut key = key.clone().into_bytes();
        let target = if in_key { &mut key } else { &mut certificate };
        for (index, byte) in flips {
            let at = index.index(target.len());
            target[at] = byte;
        }
        if let Some(cut) = truncate {
            let at = cut.index(target.len());
            target.truncate(at);
        }
        if let Some(validated) = validate(&certificate, &key) {
            assert_consistent(&validated);
        }
    }
}

#[test]
fn unmutated_fixtures_are_valid() {
    for (chain, key) in fixtures() {
        let validated = validate(chain.as_bytes(), key.as_bytes()).expect("fixture is valid");
        assert_consistent(&validated);
    }
}
