//! The pipeline's shell through API faults: each test injects a fault at the
//! simulator, asserts from the request log that it fired (and how often), and that the
//! pipeline recovered at its next retry after the fault ended. The retry policy is the
//! production one (`kube_common::backoff`) with short bounds: recovering at the first
//! retry after a fault means, in production, within one capped delay (30 s) plus a
//! round trip of the fault's end.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use kube_sim::FailRule;
use route_secrets::api::access::AccessOptions;
use route_secrets::api::pipeline::PipelineError;
use route_secrets::testing::{LeafSpec, Pki, route_with_external_certificate};
use support::*;

const NS: &str = "shop";

/// A simulator with a secret `s` granted to the router.
async fn sim_with_secret() -> kube_sim::Simulator {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    put_secret(
        &sim,
        &pki.issue(&LeafSpec::new("r.shop.example", now()))
            .secret(NS, "s"),
    );
    sim.grant_router_secrets(NS, &["s"]).unwrap();
    sim
}

fn route(name: &str) -> route_secrets::route::Route {
    route_with_external_certificate(NS, name, "r.shop.example", "s")
}

#[tokio::test]
async fn a_route_created_after_a_route_watch_fault_is_served_at_the_next_retry() {
    let sim = sim_with_secret().await;
    sim.faults()
        .fail_next(FailRule::new("list", "routes", 500, 6));
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    eventually("the route list failed six times", || {
        answered(&sim, "list", "routes", 500) == 6
    })
    .await;
    // The fault is over; a route created now is served.
    put_route(&sim, &route("r"));
    h.until_admitted(&key(NS, "r"), None).await;
    h.ready().await;
    assert_eq!(
        answered(&sim, "list", "routes", 500),
        6,
        "the fault fired six times"
    );
    assert_eq!(
        answered(&sim, "list", "routes", 200),
        1,
        "the first retry after the fault listed the routes"
    );
}

#[tokio::test]
async fn an_invalid_route_selector_stops_the_pipeline_with_a_typed_error() {
    let sim = sim_with_secret().await;
    let mut h = Harness::start(
        &sim,
        HarnessOptions {
            route_selector: Some("tier in (web".to_owned()),
            ..HarnessOptions::default()
        },
    )
    .await;
    let stopped = h.stopped().await;
    let Err(PipelineError::RouteWatch(error)) = stopped else {
        panic!("expected a refused route watch, got {stopped:?}");
    };
    assert_eq!(error.code, 400, "{error}");
    assert_eq!(
        requests(&sim, "list", "routes").len(),
        1,
        "a malformed request is not retried"
    );
    assert!(!h.readiness.borrow().is_ready());
}

#[tokio::test]
async fn a_route_rejected_during_an_access_review_fault_is_admitted_at_its_next_retry() {
    let sim = sim_with_secret().await;
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    sim.faults()
        .fail_next(FailRule::new("create", "selfsubjectrulesreviews", 500, 3));
    put_route(&sim, &route("r"));
    let r = key(NS, "r");
    h.until_admitted(&r, None).await;
    assert_eq!(
        answered(&sim, "create", "selfsubjectrulesreviews", 500),
        3,
        "the fault fired three times"
    );
    let reviews = requests(&sim, "create", "selfsubjectrulesreviews").len();
    assert_eq!(reviews, 4, "the first review after the fault succeeded");
    // Rejected once while the fault lasted (not once per failed retry), then admitted.
    let said = h.outcomes_of(&r);
    assert_eq!(said.len(), 2, "{said:#?}");
    assert!(
        said[0].contains("ExternalCertificateGetFailed"),
        "{said:#?}"
    );
    assert!(said[1].starts_with("admitted"), "{said:#?}");
}

#[tokio::test]
async fn a_route_whose_secret_watch_is_refused_is_admitted_at_its_next_retry() {
    let sim = sim_with_secret().await;
    let mut h = Harness::start(&sim, HarnessOptions::default()).await;
    h.ready().await;
    sim.faults()
        .fail_next(FailRule::new("watch", "secrets", 403, 1));
    put_route(&sim, &route("r"));
    let r = key(NS, "r");
    h.until_admitted(&r, None).await;
    assert_eq!(
        answered(&sim, "watch", "secrets", 403),
        1,
        "the fault fired"
    );
    let said = h.outcomes_of(&r);
    assert_eq!(said.len(), 2, "{said:#?}");
    assert!(
        said[0].contains("not allowed to watch the secret"),
        "{said:#?}"
    );
    h.until_secret_watches(1).await;
}

#[tokio::test]
async fn a_grant_after_a_denial_is_noticed_when_the_denial_expires() {
    let sim = sim_with_latency(Duration::from_millis(5)).await;
    let pki = Pki::new(now());
    put_secret(
        &sim,
        &pki.issue(&LeafSpec::new("r.shop.example", now()))
            .secret(NS, "s"),
    );
    let denied_ttl = Duration::from_secs(1);
    let mut h = Harness::start(
        &sim,
        HarnessOptions {
            access: AccessOptions {
                denied_ttl,
                ..AccessOptions::default()
            },
            ..HarnessOptions::default()
        },
    )
    .await;
    h.ready().await;
    put_route(&sim, &route("r"));
    let r = key(NS, "r");
    h.until_rejected(&r, "ExternalCertificateValidationFailed")
        .await;
    let before_grant = requests(&sim, "create", "selfsubjectrulesreviews").len();
    sim.grant_router_secrets(NS, &["s"]).unwrap();
    h.until_admitted(&r, None).await;
    // Noticed at the first check after the denial expired: one more review (two if
    // the grant landed while a review was in flight), not one per backoff step.
    let after_grant = requests(&sim, "create", "selfsubjectrulesreviews").len() - before_grant;
    assert!((1..=2).contains(&after_grant), "{after_grant} reviews");
    assert_eq!(h.outcomes_of(&r).len(), 2, "{:#?}", h.outcomes_of(&r));
}
