//! The bad-input corpus, through the pipeline against the simulator: every case is
//! rejected with a specific reason, while a healthy route in the same namespace stays
//! admitted throughout, with one outcome only. Each row names its secret, how the
//! secret is made, and what the route must end as.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube_common::Verb;
use kube_sim::{LatencyConfig, Simulator};
use route_secrets::api::pipeline::RouteOutcome;
use route_secrets::reason::{Reason, ValidationProblem};
use route_secrets::testing::{self, KeyKind, Leaf, LeafSpec, Pki, TestKey};
use support::*;

const NS: &str = "corpus";

/// What a case must end as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Rejected for its TLS material, with this `TlsRejection::code()`.
    Tls(&'static str),
    NotFound,
    Denied(Verb),
    InvalidName,
    /// Accepted: valid although unusual.
    Admitted,
}

/// How a case's secret is made.
#[derive(Debug, Clone, Copy)]
enum Material {
    /// A valid secret of another type.
    WrongType,
    /// The chain of one certificate with the key of another.
    KeyMismatch,
    Expired,
    NotYetValid,
    /// Root first, leaf last.
    ReversedChain,
    /// An intermediate of another PKI that names the real one.
    ImpostorIntermediate,
    /// A valid chain with this key PEM.
    Key(&'static str),
    /// This certificate text with a valid key.
    Certificate(&'static str),
    NonUtf8Certificate,
    NotACertificate,
    /// Nearly 1 MiB (the API's limit on secret data), valid.
    HugeValid,
    /// Nearly 1 MiB of text without a certificate.
    HugeJunk,
    /// A kubernetes.io/tls secret without tls.crt, which the API server refuses (as an
    /// older server or a direct etcd write could leave it).
    CertificateMissing,
    /// The same, without tls.key.
    KeyMissing,
    /// No secret at all.
    Absent,
    /// A valid secret on which the router is granted only these verbs.
    Granted(&'static [&'static str]),
}

use Material::*;

const CASES: &[(&str, Material, Expect)] = &[
    ("wrong-type", WrongType, Expect::Tls("wrong_secret_type")),
    ("key-mismatch", KeyMismatch, Expect::Tls("key_mismatch")),
    // Served anyway, as by the router (a warning says so).
    ("expired", Expired, Expect::Admitted),
    ("not-yet-valid", NotYetValid, Expect::Admitted),
    // The key must belong to the first certificate.
    ("wrong-order", ReversedChain, Expect::Tls("key_mismatch")),
    // Chains are not verified, as by the router (a warning says so).
    ("impostor", ImpostorIntermediate, Expect::Admitted),
    (
        "encrypted-key",
        Key(testing::ENCRYPTED_PKCS8_KEY_PEM),
        Expect::Tls("unsupported_key"),
    ),
    (
        "ed448-key",
        Key(testing::ED448_KEY_PEM),
        Expect::Tls("unsupported_key"),
    ),
    ("key-empty", Key(""), Expect::Tls("key_empty")),
    (
        "garbage",
        Certificate(testing::GARBAGE_PEM),
        Expect::Tls("certificate_pem_malformed"),
    ),
    (
        "not-pem",
        Certificate(testing::NOT_PEM_TEXT),
        Expect::Tls("no_certificate"),
    ),
    // No certificate to serve: admitted as the router admits it, with the default
    // certificate.
    ("crt-empty", Certificate(""), Expect::Admitted),
    (
        "not-a-cert",
        NotACertificate,
        Expect::Tls("certificate_unparseable"),
    ),
    // Bytes after the last block are ignored, as by the router.
    ("non-utf8", NonUtf8Certificate, Expect::Admitted),
    ("huge-valid", HugeValid, Expect::Admitted),
    ("huge-junk", HugeJunk, Expect::Tls("no_certificate")),
    ("crt-missing", CertificateMissing, Expect::Admitted),
    ("key-missing", KeyMissing, Expect::Tls("key_missing")),
    ("missing", Absent, Expect::NotFound),
    (
        "deny-get",
        Granted(&["list", "watch"]),
        Expect::Denied(Verb::Get),
    ),
    (
        "deny-list",
        Granted(&["get", "watch"]),
        Expect::Denied(Verb::List),
    ),
    (
        "deny-watch",
        Granted(&["get", "list"]),
        Expect::Denied(Verb::Watch),
    ),
];

fn host(name: &str) -> String {
    format!("{name}.corpus.example")
}

fn data(crt: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> BTreeMap<String, ByteString> {
    testing::tls_data(crt, key)
}

fn tls_secret(name: &str, data: BTreeMap<String, ByteString>) -> Secret {
    testing::tls_secret(NS, name, Some("kubernetes.io/tls"), data)
}

/// Writes the case's secret (and its partial grant); says whether the router gets the
/// full grant on it.
fn make(sim: &Simulator, pki: &Pki, name: &str, material: Material) -> bool {
    let leaf = |spec: LeafSpec| -> Leaf { pki.issue(&spec) };
    let valid = || leaf(LeafSpec::new(&host(name), now()));
    let secret = match material {
        WrongType => Some(testing::tls_secret(
            NS,
            name,
            Some("Opaque"),
            valid().data(),
        )),
        KeyMismatch => {
            let other = TestKey::generate(KeyKind::EcdsaP256Pkcs8);
            Some(tls_secret(name, data(valid().chain_pem(), other.pem())))
        }
        Expired => Some(leaf(LeafSpec::new(&host(name), now()).expired(now())).secret(NS, name)),
        NotYetValid => {
            Some(leaf(LeafSpec::new(&host(name), now()).not_yet_valid(now())).secret(NS, name))
        }
        ReversedChain => {
            let l = valid();
            Some(tls_secret(name, data(l.reversed_chain_pem(), l.key_pem())))
        }
        ImpostorIntermediate => {
            let l = valid();
            let stranger = Pki::new(now());
            let chain = l.with_impostor_intermediate(&stranger);
            Some(tls_secret(name, data(chain, l.key_pem())))
        }
        Key(key) => Some(tls_secret(name, data(valid().chain_pem(), key))),
        Certificate(text) => Some(tls_secret(name, data(text, valid().key_pem()))),
        NonUtf8Certificate => {
            let l = valid();
            Some(tls_secret(
                name,
                data(testing::non_utf8_certificate(&l), l.key_pem()),
            ))
        }
        NotACertificate => Some(tls_secret(
            name,
            data(testing::not_a_certificate_pem(), valid().key_pem()),
        )),
        HugeValid => {
            let l = valid();
            let budget = testing::SECRET_SIZE_LIMIT - l.key_pem().len() - 1024;
            Some(tls_secret(
                name,
                data(testing::bulky_chain(&l, budget), l.key_pem()),
            ))
        }
        HugeJunk => {
            let l = valid();
            let budget = testing::SECRET_SIZE_LIMIT - l.key_pem().len() - 1024;
            let junk = testing::padded_to(testing::NOT_PEM_TEXT, budget);
            Some(tls_secret(name, data(junk, l.key_pem())))
        }
        CertificateMissing | KeyMissing => {
            let l = valid();
            let (entry, pem) = match material {
                CertificateMissing => ("tls.key", l.key_pem()),
                _ => ("tls.crt", l.chain_pem()),
            };
            let only = BTreeMap::from([(entry.to_owned(), ByteString(pem.into_bytes()))]);
            put_secret_unchecked(sim, &tls_secret(name, only));
            None
        }
        Absent => None,
        Granted(verbs) => {
            grant(sim, NS, &format!("partial-{name}"), verbs, &[name]);
            put_secret(sim, &valid().secret(NS, name));
            return false;
        }
    };
    if let Some(secret) = secret {
        put_secret(sim, &secret);
    }
    true
}

fn ends_as(outcome: Option<&RouteOutcome>, expect: Expect) -> bool {
    let problem = match outcome {
        Some(RouteOutcome::Rejected(rejected)) => match &rejected.reason {
            Reason::ExternalCertificateValidationFailed { problem, .. } => problem,
            _ => return false,
        },
        Some(RouteOutcome::Admitted(_)) => return expect == Expect::Admitted,
        _ => return false,
    };
    match (expect, problem) {
        (Expect::Tls(code), ValidationProblem::Tls(rejection)) => rejection.code() == code,
        (Expect::NotFound, ValidationProblem::SecretNotFound) => true,
        (Expect::Denied(verb), ValidationProblem::AccessDenied { verb: denied, .. }) => {
            *denied == verb
        }
        (Expect::InvalidName, ValidationProblem::InvalidSecretName(_)) => true,
        _ => false,
    }
}

/// The cause class (its label) and the router's reason name a case must be rejected
/// with; `None` for a case that is admitted.
fn rejected_as(expect: Expect) -> Option<(&'static str, &'static str)> {
    const SECRET: &str = "ExternalCertificateValidationFailed";
    const CERTIFICATE: &str = "ExtendedValidationFailed";
    Some(match expect {
        Expect::Admitted => return None,
        Expect::NotFound => ("secret_missing", SECRET),
        Expect::Denied(_) => ("rbac", SECRET),
        Expect::InvalidName => ("invalid_reference", SECRET),
        Expect::Tls("wrong_secret_type") => ("secret_type", SECRET),
        Expect::Tls("key_mismatch") => ("key_mismatch", CERTIFICATE),
        Expect::Tls("unsupported_key") => ("unsupported_key", CERTIFICATE),
        Expect::Tls("key_empty" | "key_missing") => ("missing_data", CERTIFICATE),
        Expect::Tls(_) => ("bad_pem", CERTIFICATE),
    })
}

fn route(name: &str, secret: &str) -> route_secrets::route::Route {
    testing::route_with_external_certificate(NS, name, &host(name), secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_rejected_specifically_and_disturbs_nothing() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    put_secret(
        &sim,
        &pki.issue(&LeafSpec::new(&host("healthy"), now()))
            .secret(NS, "healthy"),
    );
    let mut granted = vec!["healthy"];
    for (name, material, _) in CASES {
        if make(&sim, &pki, name, *material) {
            granted.push(name);
        }
    }
    sim.grant_router_secrets(NS, &granted).unwrap();

    // Routes: one per case, named after its secret, plus ones the API server refuses
    // (an older server or a direct etcd write could leave them; the router copes).
    put_route(&sim, &route("healthy", "healthy"));
    let mut expectations: Vec<(&str, Expect)> = Vec::new();
    for (name, _, expect) in CASES {
        put_route(&sim, &route(name, name));
        expectations.push((name, *expect));
    }
    put_route_unchecked(&sim, &route("empty-name", ""));
    put_route_unchecked(&sim, &route("invalid-name", "Not_A_Name"));
    let mut inline = route("inline", "healthy");
    let certificate = pki.issue(&LeafSpec::new(&host("inline"), now()));
    inline.spec.tls.as_mut().unwrap().certificate = Some(certificate.leaf_pem().to_owned());
    put_route_unchecked(&sim, &inline);
    expectations.extend([
        // No secret named: no external certificate, as for the router (served with the
        // default certificate).
        ("empty-name", Expect::Admitted),
        ("invalid-name", Expect::InvalidName),
        // The secret's certificate replaces the inline one, as in the router.
        ("inline", Expect::Admitted),
    ]);

    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    let healthy = key(NS, "healthy");
    h.until_admitted(&healthy, None).await;
    for (name, expect) in &expectations {
        let route = key(NS, name);
        let what = format!("{route} ends as {expect:?}");
        h.until(&what, |h| ends_as(h.latest.get(&route), *expect))
            .await;
        // The message names the route and never holds PEM; the cause class and the
        // reason name are the router's for this problem.
        let expected = rejected_as(*expect);
        if let Some(rejected) = h.rejected(&route) {
            let message = rejected.reason.to_string();
            assert!(message.contains(&route.to_string()), "{message}");
            assert!(!message.contains("BEGIN"), "no PEM in messages: {message}");
            let cause = Some(rejected.cause().as_str());
            assert_eq!(
                (cause, Some(rejected.reason.name())),
                (expected.map(|e| e.0), expected.map(|e| e.1)),
                "{message}"
            );
        }
        let status_reason = expected.map(|(_, reason)| reason);
        h.until_status(&route, *expect == Expect::Admitted, status_reason)
            .await;
    }
    assert_eq!(
        h.outcomes_of(&healthy).len(),
        1,
        "{:?}",
        h.outcomes_of(&healthy)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_while_routes_register_leave_nothing_behind() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    let valid = |name: &str| pki.issue(&LeafSpec::new(&host(name), now()));
    put_secret(&sim, &valid("healthy").secret(NS, "healthy"));
    sim.grant_router_secrets(
        NS,
        &["healthy", "vanishing", "fleeting", "swap-x", "swap-y"],
    )
    .unwrap();
    put_route(&sim, &route("healthy", "healthy"));
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    let healthy = key(NS, "healthy");
    h.until_admitted(&healthy, None).await;

    // The API server is slow now: every change below lands while routes register.
    h.sim
        .set_latency(LatencyConfig::fixed(Duration::from_millis(300)));

    // The secret is deleted while its route registers.
    put_secret(&sim, &valid("vanishing").secret(NS, "vanishing"));
    put_route(&sim, &route("vanishing", "vanishing"));
    delete(&sim, "secrets", NS, "vanishing");
    let vanishing = key(NS, "vanishing");
    h.until("vanishing is rejected", |h| {
        h.rejected(&vanishing).is_some_and(|r| {
            matches!(
                &r.reason,
                Reason::ExternalCertificateValidationFailed {
                    problem: ValidationProblem::SecretNotFound,
                    ..
                }
            )
        })
    })
    .await;

    // The route is deleted while it registers.
    put_secret(&sim, &valid("fleeting").secret(NS, "fleeting"));
    put_route(&sim, &route("fleeting", "fleeting"));
    delete(&sim, "routes", NS, "fleeting");

    // Two routes switch secrets with each other at once.
    let (x, y) = (valid("swap-x"), valid("swap-y"));
    put_secret(&sim, &x.secret(NS, "swap-x"));
    put_secret(&sim, &y.secret(NS, "swap-y"));
    put_route(&sim, &route("swap-1", "swap-x"));
    put_route(&sim, &route("swap-2", "swap-y"));
    h.until_admitted(&key(NS, "swap-1"), Some(fingerprint_of_leaf(&x)))
        .await;
    h.until_admitted(&key(NS, "swap-2"), Some(fingerprint_of_leaf(&y)))
        .await;
    put_route(&sim, &route("swap-1", "swap-y"));
    put_route(&sim, &route("swap-2", "swap-x"));
    h.until_admitted(&key(NS, "swap-1"), Some(fingerprint_of_leaf(&y)))
        .await;
    h.until_admitted(&key(NS, "swap-2"), Some(fingerprint_of_leaf(&x)))
        .await;

    // Every watch belongs to a registered route, one per route: the deleted route's
    // secret is not among them.
    let expected = BTreeMap::from([
        ("healthy".to_owned(), 1),
        ("swap-x".to_owned(), 1),
        ("swap-y".to_owned(), 1),
        ("vanishing".to_owned(), 1),
    ]);
    eventually("only registered routes hold watches", || {
        h.watched() == expected
    })
    .await;
    assert_eq!(h.manager.route_count(), 4);
    h.until_secret_watches(expected.len() as u64).await;

    // The healthy route was admitted once and never disturbed.
    assert_eq!(
        h.outcomes_of(&healthy).len(),
        1,
        "{:?}",
        h.outcomes_of(&healthy)
    );
}
