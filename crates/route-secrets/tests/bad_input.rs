//! The bad-input corpus: every case is rejected with a specific reason, while a healthy
//! route in the same namespace stays admitted throughout, with one outcome only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use k8s_openapi::ByteString;
use kube_sim::LatencyConfig;
use route_secrets::pipeline::RouteOutcome;
use route_secrets::reason::{Reason, SecretVerb, ValidationProblem};
use route_secrets::testing::{self, KeyKind, LeafSpec, Pki, TestKey};

const NS: &str = "corpus";

/// What a case must end as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Rejected for its TLS material, with this `TlsRejection::code()`.
    Tls(&'static str),
    NotFound,
    Denied(SecretVerb),
    InvalidName,
    InlineConflict,
    /// Accepted: valid although unusual.
    Admitted,
}

fn check(outcome: Option<&RouteOutcome>, expect: Expect) -> bool {
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
        (Expect::InlineConflict, ValidationProblem::InlineCertificateConflict) => true,
        _ => false,
    }
}

fn data(crt: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> BTreeMap<String, ByteString> {
    testing::tls_data(crt, key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_is_rejected_specifically_and_disturbs_nothing() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    let host = |name: &str| format!("{name}.corpus.example");
    let leaf = |name: &str| pki.issue(&LeafSpec::new(&host(name), now()));
    let tls = Some("kubernetes.io/tls");
    let mut cases: Vec<(&str, Expect)> = Vec::new();
    let mut granted: Vec<&str> = Vec::new();

    // The healthy neighbour.
    put_secret(&sim, &leaf("healthy").secret(NS, "healthy"));
    granted.push("healthy");

    // Secrets the API server would accept.
    let valid = leaf("wrong-type");
    put_secret(
        &sim,
        &testing::tls_secret(NS, "wrong-type", Some("Opaque"), valid.data()),
    );
    cases.push(("wrong-type", Expect::Tls("wrong_secret_type")));

    let l = leaf("key-mismatch");
    let other = TestKey::generate(KeyKind::EcdsaP256Pkcs8);
    put_secret(
        &sim,
        &testing::tls_secret(NS, "key-mismatch", tls, data(l.chain_pem(), other.pem())),
    );
    cases.push(("key-mismatch", Expect::Tls("key_mismatch")));

    let expired = pki.issue(&LeafSpec::new(&host("expired"), now()).expired(now()));
    put_secret(&sim, &expired.secret(NS, "expired"));
    // Served anyway, as by the router (a warning says so).
    cases.push(("expired", Expect::Admitted));

    let early = pki.issue(&LeafSpec::new(&host("not-yet-valid"), now()).not_yet_valid(now()));
    put_secret(&sim, &early.secret(NS, "not-yet-valid"));
    cases.push(("not-yet-valid", Expect::Admitted));

    let l = leaf("wrong-order");
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "wrong-order",
            tls,
            data(l.reversed_chain_pem(), l.key_pem()),
        ),
    );
    // The key must belong to the first certificate.
    cases.push(("wrong-order", Expect::Tls("key_mismatch")));

    let l = leaf("impostor");
    let stranger = Pki::new(now());
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "impostor",
            tls,
            data(l.with_impostor_intermediate(&stranger), l.key_pem()),
        ),
    );
    // Chains are not verified, as by the router (a warning says so).
    cases.push(("impostor", Expect::Admitted));

    let l = leaf("encrypted-key");
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "encrypted-key",
            tls,
            data(l.chain_pem(), testing::ENCRYPTED_PKCS8_KEY_PEM),
        ),
    );
    cases.push(("encrypted-key", Expect::Tls("unsupported_key")));

    let l = leaf("ed448-key");
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "ed448-key",
            tls,
            data(l.chain_pem(), testing::ED448_KEY_PEM),
        ),
    );
    cases.push(("ed448-key", Expect::Tls("unsupported_key")));

    let l = leaf("garbage");
    put_secret(
        &sim,
        &testing::tls_secret(NS, "garbage", tls, data(testing::GARBAGE_PEM, l.key_pem())),
    );
    cases.push(("garbage", Expect::Tls("certificate_pem_malformed")));

    let l = leaf("not-pem");
    put_secret(
        &sim,
        &testing::tls_secret(NS, "not-pem", tls, data(testing::NOT_PEM_TEXT, l.key_pem())),
    );
    cases.push(("not-pem", Expect::Tls("no_certificate")));

    let l = leaf("not-a-cert");
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "not-a-cert",
            tls,
            data(testing::not_a_certificate_pem(), l.key_pem()),
        ),
    );
    cases.push(("not-a-cert", Expect::Tls("certificate_unparseable")));

    let l = leaf("non-utf8");
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "non-utf8",
            tls,
            data(testing::non_utf8_certificate(&l), l.key_pem()),
        ),
    );
    // Bytes after the last block are ignored, as by the router.
    cases.push(("non-utf8", Expect::Admitted));

    let l = leaf("crt-empty");
    put_secret(
        &sim,
        &testing::tls_secret(NS, "crt-empty", tls, data("", l.key_pem())),
    );
    cases.push(("crt-empty", Expect::Tls("certificate_empty")));

    let l = leaf("key-empty");
    put_secret(
        &sim,
        &testing::tls_secret(NS, "key-empty", tls, data(l.chain_pem(), "")),
    );
    cases.push(("key-empty", Expect::Tls("key_empty")));

    // Nearly 1 MiB (the API's limit on secret data): valid, and served.
    let l = leaf("huge-valid");
    let budget = testing::SECRET_SIZE_LIMIT - l.key_pem().len() - 1024;
    put_secret(
        &sim,
        &testing::tls_secret(
            NS,
            "huge-valid",
            tls,
            data(testing::bulky_chain(&l, budget), l.key_pem()),
        ),
    );
    cases.push(("huge-valid", Expect::Admitted));
    // Nearly 1 MiB of text without a certificate.
    let l = leaf("huge-junk");
    let junk = testing::padded_to(
        testing::NOT_PEM_TEXT,
        testing::SECRET_SIZE_LIMIT - l.key_pem().len() - 1024,
    );
    put_secret(
        &sim,
        &testing::tls_secret(NS, "huge-junk", tls, data(junk, l.key_pem())),
    );
    cases.push(("huge-junk", Expect::Tls("no_certificate")));

    // Secrets the API server refuses (a kubernetes.io/tls secret without its keys),
    // as an older server or a direct etcd write could leave them.
    let l = leaf("crt-missing");
    let mut only_key = BTreeMap::new();
    only_key.insert("tls.key".to_owned(), ByteString(l.key_pem().into_bytes()));
    put_secret_unchecked(&sim, &testing::tls_secret(NS, "crt-missing", tls, only_key));
    cases.push(("crt-missing", Expect::Tls("certificate_missing")));
    let l = leaf("key-missing");
    let mut only_crt = BTreeMap::new();
    only_crt.insert("tls.crt".to_owned(), ByteString(l.chain_pem().into_bytes()));
    put_secret_unchecked(&sim, &testing::tls_secret(NS, "key-missing", tls, only_crt));
    cases.push(("key-missing", Expect::Tls("key_missing")));

    // Missing secret.
    cases.push(("missing", Expect::NotFound));

    // RBAC denying one verb at a time (each secret has a Role of its own).
    for (name, verbs, denied) in [
        ("deny-get", ["list", "watch"], SecretVerb::Get),
        ("deny-list", ["get", "watch"], SecretVerb::List),
        ("deny-watch", ["get", "list"], SecretVerb::Watch),
    ] {
        put_secret(&sim, &leaf(name).secret(NS, name));
        grant(&sim, NS, &format!("partial-{name}"), &verbs, &[name]);
        cases.push((name, Expect::Denied(denied)));
    }

    for (name, _) in &cases {
        if !name.starts_with("deny-") {
            granted.push(name);
        }
    }
    sim.grant_router_secrets(NS, &granted).unwrap();

    // Routes: one per case, named after its secret, plus the odd ones.
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "healthy", &host("healthy"), "healthy"),
    );
    for (name, _) in &cases {
        put_route(
            &sim,
            &testing::route_with_external_certificate(NS, name, &host(name), name),
        );
    }
    // The API server validates these names; the router must still cope with them.
    put_route_unchecked(
        &sim,
        &testing::route_with_external_certificate(NS, "empty-name", &host("x"), ""),
    );
    cases.push(("empty-name", Expect::InvalidName));
    put_route_unchecked(
        &sim,
        &testing::route_with_external_certificate(NS, "invalid-name", &host("x"), "Not_A_Name"),
    );
    cases.push(("invalid-name", Expect::InvalidName));
    let mut inline =
        testing::route_with_external_certificate(NS, "inline", &host("healthy"), "healthy");
    let healthy_leaf = leaf("inline");
    inline.spec.tls.as_mut().unwrap().certificate = Some(healthy_leaf.leaf_pem().to_owned());
    put_route_unchecked(&sim, &inline);
    cases.push(("inline", Expect::InlineConflict));
    assert!(cases.len() >= 24, "{} cases", cases.len());

    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    let healthy = key(NS, "healthy");
    h.until_admitted(&healthy, None).await;
    for (name, expect) in &cases {
        let route = key(NS, name);
        let what = format!("{route} ends as {expect:?}");
        h.until(&what, |h| check(h.latest.get(&route), *expect))
            .await;
        // The message names the route and its secret.
        if let Some(rejected) = h.rejected(&route) {
            let message = rejected.reason.to_string();
            assert!(message.contains(&route.to_string()), "{message}");
            assert!(!message.contains("BEGIN"), "no PEM in messages: {message}");
        }
        let status_reason = match expect {
            Expect::Admitted => None,
            _ => Some("ExternalCertificateValidationFailed"),
        };
        h.until_status(&route, *expect == Expect::Admitted, status_reason)
            .await;
    }

    // Changes while routes register: the API server is slow now.
    h.sim
        .set_latency(LatencyConfig::fixed(Duration::from_millis(300)));

    // The secret is deleted while its route registers.
    put_secret(&sim, &leaf("vanishing").secret(NS, "vanishing"));
    sim.grant_router_secrets(NS, &["vanishing", "fleeting", "swap-x", "swap-y"])
        .unwrap();
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "vanishing", &host("vanishing"), "vanishing"),
    );
    delete(&sim, "secrets", NS, "vanishing");
    let vanishing = key(NS, "vanishing");
    h.until("vanishing is rejected", |h| {
        h.rejected(&vanishing).is_some_and(|r| {
            matches!(
                &r.reason,
                Reason::ExternalCertificateSecretDeleted { .. }
                    | Reason::ExternalCertificateValidationFailed {
                        problem: ValidationProblem::SecretNotFound,
                        ..
                    }
            )
        })
    })
    .await;

    // The route is deleted while it registers: nothing is left behind.
    put_secret(&sim, &leaf("fleeting").secret(NS, "fleeting"));
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "fleeting", &host("fleeting"), "fleeting"),
    );
    delete(&sim, "routes", NS, "fleeting");

    // Two routes switch secrets with each other at once.
    let x = leaf("swap-x");
    let y = leaf("swap-y");
    put_secret(&sim, &x.secret(NS, "swap-x"));
    put_secret(&sim, &y.secret(NS, "swap-y"));
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "swap-1", &host("swap"), "swap-x"),
    );
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "swap-2", &host("swap"), "swap-y"),
    );
    h.until_admitted(&key(NS, "swap-1"), Some(fingerprint_of_leaf(&x)))
        .await;
    h.until_admitted(&key(NS, "swap-2"), Some(fingerprint_of_leaf(&y)))
        .await;
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "swap-1", &host("swap"), "swap-y"),
    );
    put_route(
        &sim,
        &testing::route_with_external_certificate(NS, "swap-2", &host("swap"), "swap-x"),
    );
    h.until_admitted(&key(NS, "swap-1"), Some(fingerprint_of_leaf(&y)))
        .await;
    h.until_admitted(&key(NS, "swap-2"), Some(fingerprint_of_leaf(&x)))
        .await;

    // Every watch the simulator holds belongs to a registered route, and the deleted
    // route's secret is not among them.
    let fleeting = key(NS, "fleeting");
    h.until("fleeting left no registration", |h| {
        h.manager.secret_of(&fleeting).is_none()
    })
    .await;
    h.until("no watch is held for fleeting's secret", |h| {
        h.manager
            .watched_secrets()
            .keys()
            .all(|k| k.name != "fleeting")
    })
    .await;
    let expected = h.manager.watched_secrets().len() as u64;
    h.until_secret_watches(expected).await;

    // The healthy route was admitted once and never disturbed.
    let healthy_outcomes: Vec<_> = h
        .history
        .iter()
        .filter(|o| o.route() == &healthy)
        .map(summary)
        .collect();
    assert_eq!(healthy_outcomes.len(), 1, "{healthy_outcomes:?}");
    assert!(h.admitted(&healthy).is_some());
}
