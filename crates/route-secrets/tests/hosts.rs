//! Host claims and wildcard routes through the pipeline's shell against the simulator.
//! Every rule is unit-tested on the state machine (`src/machine/tests.rs`,
//! `src/machine/claims.rs`); this checks that the decisions reach the route status, that
//! a refused route holds no watch, and that a refused claimant takes over.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use route_secrets::api::pipeline::{HostPolicy, PipelineOptions, Sni};
use route_secrets::route::{Route, WildcardPolicy};
use route_secrets::testing::{self, LeafSpec, Pki};
use support::*;

fn route(namespace: &str, name: &str, host: &str, secret: &str) -> Route {
    testing::route_with_external_certificate(namespace, name, host, secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_younger_claim_waits_for_the_host_and_takes_over_when_the_owner_goes() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    for (namespace, secret) in [("shop", "owner-tls"), ("thief", "claimant-tls")] {
        let leaf = pki.issue(&LeafSpec::new("shop.example", now()));
        put_secret(&sim, &leaf.secret(namespace, secret));
        sim.grant_router_secrets(namespace, &[secret]).unwrap();
    }
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    put_route(&sim, &route("shop", "owner", "shop.example", "owner-tls"));
    let owner = key("shop", "owner");
    h.until_admitted(&owner, None).await;

    // The claimant is created in a later second than the owner: creation times have
    // second resolution, and within one second claims are ordered by uid (random).
    let owner_second = jiff::Timestamp::now().as_second();
    while jiff::Timestamp::now().as_second() == owner_second {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    put_route(
        &sim,
        &route("thief", "claimant", "shop.example", "claimant-tls"),
    );
    let claimant = key("thief", "claimant");
    let reason = h.until_rejected(&claimant, "HostAlreadyClaimed").await;
    assert!(reason.to_string().contains("shop/owner"), "{reason}");
    h.until_status(&claimant, false, Some("HostAlreadyClaimed"))
        .await;
    // Refused on its claim alone: its secret was never watched.
    assert_eq!(h.watched(), BTreeMap::from([("owner-tls".to_owned(), 1)]));
    let claimant_watches = requests(&sim, "watch", "secrets")
        .iter()
        .chain(&requests(&sim, "list", "secrets"))
        .filter(|request| request.namespace.as_deref() == Some("thief"))
        .count();
    assert_eq!(claimant_watches, 0);

    delete(&sim, "routes", "shop", "owner");
    h.until_admitted(&claimant, None).await;
    h.until_status(&claimant, true, None).await;
    assert!(h.removed(&owner));
    eventually("only the claimant's secret is watched", || {
        h.watched() == BTreeMap::from([("claimant-tls".to_owned(), 1)])
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcard_routes_are_refused_unless_allowed() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    let leaf = pki.issue(&LeafSpec::new("*.shop.example", now()));
    put_secret(&sim, &leaf.secret("shop", "wild-tls"));
    sim.grant_router_secrets("shop", &["wild-tls"]).unwrap();
    let mut wild = route("shop", "wild", "www.shop.example", "wild-tls");
    wild.spec.wildcard_policy = Some(WildcardPolicy::Subdomain);
    put_route(&sim, &wild);
    let wild_key = key("shop", "wild");

    let mut refusing = Harness::start(&sim, HarnessOptions::default()).await;
    refusing.ready().await;
    refusing.until_rejected(&wild_key, "RouteNotAdmitted").await;
    refusing
        .until_status(&wild_key, false, Some("RouteNotAdmitted"))
        .await;
    assert!(refusing.watched().is_empty());
    drop(refusing);

    let allowing = HarnessOptions {
        pipeline: PipelineOptions {
            hosts: HostPolicy {
                allow_wildcard_routes: true,
                ..HostPolicy::default()
            },
            ..HarnessOptions::default().pipeline
        },
        ..HarnessOptions::default()
    };
    let mut h = Harness::start(&sim, allowing).await;
    h.ready().await;
    let admitted = h.until_admitted(&wild_key, None).await;
    assert_eq!(
        admitted.sni,
        Sni::Subdomain {
            domain: "shop.example".to_owned()
        }
    );
    h.until_status(&wild_key, true, None).await;
}
