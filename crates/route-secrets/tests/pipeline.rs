//! Every route and secret transition of the external-certificate pipeline, against the
//! simulator, as the router identity with real RBAC. Each test checks the outcome, the
//! reason, the status written and the number of secret watches open at the simulator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use route_secrets::testing::{LeafSpec, Pki};
use route_secrets::tls::TlsWarning;

const NS: &str = "shop";

struct World {
    h: Harness,
    pki: Pki,
}

/// A namespace with secrets `a` and `b` (certificates for `a.shop.example` and
/// `b.shop.example`), both granted to the router, and a running pipeline.
async fn world() -> World {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    for name in ["a", "b"] {
        let leaf = pki.issue(&LeafSpec::new(&format!("{name}.shop.example"), now()));
        put_secret(&sim, &leaf.secret(NS, name));
    }
    sim.grant_router_secrets(NS, &["a", "b"]).unwrap();
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    World { h, pki }
}

fn route(name: &str, host: &str, secret: &str) -> route_secrets::route::Route {
    route_secrets::testing::route_with_external_certificate(NS, name, host, secret)
}

fn rotate(w: &World, secret: &str, host: &str) -> [u8; 32] {
    let leaf = w.pki.issue(&LeafSpec::new(host, now()));
    put_secret(&w.h.sim, &leaf.secret(NS, secret));
    fingerprint_of_leaf(&leaf)
}

#[tokio::test]
async fn added_route_is_admitted_with_its_secret() {
    let mut w = world().await;
    let fingerprint = rotate(&w, "a", "a.shop.example");
    put_route(&w.h.sim, &route("r", "a.shop.example", "a"));
    let admitted = w.h.until_admitted(&key(NS, "r"), Some(fingerprint)).await;
    // The bundle is the secret's chain, then its key.
    let secret = w.h.sim.store().get("secrets", NS, "a").unwrap();
    let decode = |field: &str| {
        use base64::Engine;
        let encoded = secret["data"][field].as_str().unwrap();
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .unwrap(),
        )
        .unwrap()
    };
    let bundle = bundle(&admitted);
    assert!(bundle.starts_with(admitted.tls.chain_pem()));
    assert_eq!(
        admitted
            .tls
            .chain_pem()
            .matches("BEGIN CERTIFICATE")
            .count(),
        decode("tls.crt").matches("BEGIN CERTIFICATE").count()
    );
    assert!(admitted.warnings.is_empty(), "{:?}", admitted.warnings);
    assert_eq!(admitted.secret, "a");
    w.h.until_status(&key(NS, "r"), true, None).await;
    w.h.until_secret_watches(1).await;
}

#[tokio::test]
async fn modified_route_cases() {
    let mut w = world().await;
    let r = key(NS, "r");
    let fa = rotate(&w, "a", "r.shop.example");
    let fb = rotate(&w, "b", "r.shop.example");
    put_route(&w.h.sim, &route("r", "r.shop.example", "a"));
    w.h.until_admitted(&r, Some(fa)).await;
    w.h.until_secret_watches(1).await;

    // (a) another secret: the old one is released, the new one registered.
    put_route(&w.h.sim, &route("r", "r.shop.example", "b"));
    w.h.until_admitted(&r, Some(fb)).await;
    w.h.until_secret_watches(1).await;
    assert_eq!(w.h.manager.secret_of(&r).as_deref(), Some("b"));

    // (b) same secret, other host: re-validated; the certificate does not cover it.
    put_route(&w.h.sim, &route("r", "elsewhere.example", "b"));
    w.h.until("r warns about the host", |h| {
        h.admitted(&r).is_some_and(|a| {
            a.warnings
                .iter()
                .any(|w| matches!(w, TlsWarning::HostNotCovered { .. }))
        })
    })
    .await;
    w.h.until_secret_watches(1).await;

    // (d) no external certificate any more: removed, watch closed.
    let mut plain = route("r", "r.shop.example", "b");
    plain.spec.tls.as_mut().unwrap().external_certificate = None;
    put_route(&w.h.sim, &plain);
    w.h.until("r is removed", |h| h.removed(&r)).await;
    w.h.until_secret_watches(0).await;
    assert_eq!(w.h.manager.secret_of(&r), None);

    // (c) an external certificate again.
    put_route(&w.h.sim, &route("r", "r.shop.example", "a"));
    w.h.until_admitted(&r, Some(fa)).await;
    w.h.until_secret_watches(1).await;
}

#[tokio::test]
async fn deleted_route_releases_its_secret() {
    let mut w = world().await;
    put_route(&w.h.sim, &route("r", "a.shop.example", "a"));
    w.h.until_admitted(&key(NS, "r"), None).await;
    w.h.until_secret_watches(1).await;
    delete(&w.h.sim, "routes", NS, "r");
    w.h.until("r is removed", |h| h.removed(&key(NS, "r")))
        .await;
    w.h.until_secret_watches(0).await;
    assert_eq!(w.h.manager.route_count(), 0);
}

#[tokio::test]
async fn secret_update_delete_and_recreate() {
    let mut w = world().await;
    let r = key(NS, "r");
    put_route(&w.h.sim, &route("r", "a.shop.example", "a"));
    w.h.until_admitted(&r, None).await;

    // Updated: the new certificate is served.
    let rotated = rotate(&w, "a", "a.shop.example");
    w.h.until_admitted(&r, Some(rotated)).await;
    w.h.until_status(&r, true, None).await;

    // Deleted: rejected, status says so, the watch stays.
    delete(&w.h.sim, "secrets", NS, "a");
    w.h.until_rejected(&r, "ExternalCertificateSecretDeleted")
        .await;
    w.h.until_status(&r, false, Some("ExternalCertificateSecretDeleted"))
        .await;
    w.h.until_secret_watches(1).await;

    // Re-created: re-validated and re-admitted, with the reason recorded.
    let recreated = rotate(&w, "a", "a.shop.example");
    let admitted = w.h.until_admitted(&r, Some(recreated)).await;
    assert_eq!(
        admitted.reason.as_ref().map(|r| r.name()),
        Some("ExternalCertificateSecretRecreated")
    );
    w.h.until_status(&r, true, Some("ExternalCertificateSecretRecreated"))
        .await;
    w.h.until_secret_watches(1).await;
}

#[tokio::test]
async fn routes_sharing_a_secret_share_one_watch() {
    let mut w = world().await;
    for name in ["r1", "r2", "r3"] {
        put_route(&w.h.sim, &route(name, "a.shop.example", "a"));
    }
    for name in ["r1", "r2", "r3"] {
        w.h.until_admitted(&key(NS, name), None).await;
    }
    w.h.until_secret_watches(1).await;
    let watches =
        w.h.sim
            .request_log()
            .iter()
            .filter(|r| r.verb == "watch" && r.name.as_deref() == Some("a"))
            .count();
    assert_eq!(watches, 1, "three routes, one watch");

    let rotated = rotate(&w, "a", "a.shop.example");
    for name in ["r1", "r2", "r3"] {
        w.h.until_admitted(&key(NS, name), Some(rotated)).await;
    }
    delete(&w.h.sim, "routes", NS, "r1");
    delete(&w.h.sim, "routes", NS, "r2");
    w.h.until("r1 and r2 are removed", |h| {
        h.removed(&key(NS, "r1")) && h.removed(&key(NS, "r2"))
    })
    .await;
    w.h.until_secret_watches(1).await;
    delete(&w.h.sim, "routes", NS, "r3");
    w.h.until_secret_watches(0).await;
}

#[tokio::test]
async fn own_status_writes_do_not_loop() {
    let mut w = world().await;
    let r = key(NS, "r");
    put_route(&w.h.sim, &route("r", "a.shop.example", "a"));
    w.h.until_admitted(&r, None).await;
    w.h.until_status(&r, true, None).await;
    let status_writes = |h: &Harness| {
        h.sim
            .request_log()
            .iter()
            .filter(|req| req.resource == "routes/status" && req.verb == "update")
            .count()
    };
    // Another outcome (secret deleted) is one more write; the write's own route event
    // (a status-only change) produces none.
    delete(&w.h.sim, "secrets", NS, "a");
    w.h.until_status(&r, false, Some("ExternalCertificateSecretDeleted"))
        .await;
    // Settle: a further, unrelated change round-trips through the pipeline.
    put_route(&w.h.sim, &route("other", "b.shop.example", "b"));
    w.h.until_admitted(&key(NS, "other"), None).await;
    w.h.until_status(&key(NS, "other"), true, None).await;
    assert_eq!(
        status_writes(&w.h),
        3,
        "one write per outcome, none in reaction to its own writes"
    );
    let outcomes_for_r = w.h.history.iter().filter(|o| o.route() == &r).count();
    assert_eq!(
        outcomes_for_r,
        2,
        "admitted, then rejected: {:?}",
        w.h.history.iter().map(summary).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn missing_secret_is_admitted_once_created() {
    let mut w = world().await;
    let r = key(NS, "r");
    w.h.sim.grant_router_secrets(NS, &["later"]).unwrap();
    put_route(&w.h.sim, &route("r", "later.shop.example", "later"));
    let reason =
        w.h.until_rejected(&r, "ExternalCertificateValidationFailed")
            .await;
    assert!(reason.to_string().contains("does not exist"), "{reason}");
    w.h.until_status(&r, false, Some("ExternalCertificateValidationFailed"))
        .await;
    w.h.until_secret_watches(1).await;
    let created = rotate(&w, "later", "later.shop.example");
    w.h.until_admitted(&r, Some(created)).await;
    w.h.until_status(&r, true, None).await;
}
