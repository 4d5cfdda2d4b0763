//! The access checker's policies and caching, and the secret manager's contract,
//! against the simulator. Costs are asserted from the simulator's request log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use futures::future::join_all;
use kube_common::Verb;
use kube_sim::{FailRule, Simulator};
use route_secrets::api::access::{AccessChecker, AccessOptions, AccessPolicy};
use route_secrets::api::manager::{ManagerError, SecretManager};
use route_secrets::testing::{LeafSpec, Pki};
use secret_monitor::{ObjectEvent, SecretMonitor};

const NS: &str = "app";

async fn client(sim: &Simulator, context: &str) -> kube::Client {
    let config = sim.client_config(context).await.unwrap();
    kube_h2::build_client(config, kube_h2::ClientOptions::default())
        .unwrap()
        .client()
}

fn reviews(sim: &Simulator, resource: &str) -> usize {
    sim.request_log()
        .iter()
        .filter(|r| r.verb == "create" && r.resource == resource)
        .count()
}

async fn world() -> Simulator {
    let sim = sim_with_latency(Duration::from_millis(50)).await;
    let pki = Pki::new(now());
    for name in ["s1", "s2", "other"] {
        put_secret(
            &sim,
            &pki.issue(&LeafSpec::new("x.example", now()))
                .secret(NS, name),
        );
    }
    sim.grant_router_secrets(NS, &["s1", "s2"]).unwrap();
    sim
}

#[tokio::test]
async fn rules_review_answers_a_namespace_once() {
    let sim = world().await;
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfRules,
        Duration::from_secs(600),
    );
    let decisions = join_all((0..50).map(|i| {
        let checker = checker.clone();
        async move {
            checker
                .check(NS, if i % 2 == 0 { "s1" } else { "s2" })
                .await
        }
    }))
    .await;
    assert!(decisions.iter().all(|d| d.as_ref().unwrap().allowed()));
    assert_eq!(
        reviews(&sim, "selfsubjectrulesreviews"),
        1,
        "50 concurrent questions, one request"
    );
    assert_eq!(checker.stats().requests, 1);

    // A secret the router may not read: every verb denied, with the verbs named.
    let denied = checker.check(NS, "other").await.unwrap();
    assert_eq!(denied.denied, Verb::READ);
    // The denial was re-checked once (a denial is trusted only while fresh).
    assert!(reviews(&sim, "selfsubjectrulesreviews") <= 2);
}

#[tokio::test]
async fn reviews_per_verb_are_cached_per_secret() {
    let sim = world().await;
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfReviews,
        Duration::from_secs(600),
    );
    for _ in 0..5 {
        assert!(checker.check(NS, "s1").await.unwrap().allowed());
    }
    assert_eq!(
        reviews(&sim, "selfsubjectaccessreviews"),
        3,
        "get, list, watch once each"
    );
}

#[tokio::test]
async fn subject_access_reviews_check_another_identity() {
    let sim = world().await;
    let checker = AccessChecker::with_options(
        client(&sim, "admin").await,
        AccessOptions {
            policy: AccessPolicy::Subject {
                user: kube_sim::ROUTER_USER.to_owned(),
                groups: vec![
                    "system:serviceaccounts".into(),
                    "system:serviceaccounts:openshift-ingress".into(),
                ],
            },
            ttl: Duration::from_secs(600),
            denied_ttl: Duration::ZERO,
        },
    );
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert_eq!(reviews(&sim, "subjectaccessreviews"), 3);
    let denied = checker.check(NS, "other").await.unwrap();
    assert_eq!(denied.denied, Verb::READ);
    assert!(denied.subject.contains(kube_sim::ROUTER_USER));

    // A grant is noticed once denials are no longer trusted (here: at once).
    sim.grant_router_secrets(NS, &["other"]).unwrap();
    assert!(checker.check(NS, "other").await.unwrap().allowed());
}

#[tokio::test]
async fn failed_reviews_are_errors_and_not_cached() {
    let sim = world().await;
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfRules,
        Duration::from_secs(600),
    );
    sim.faults()
        .fail_next(FailRule::new("create", "selfsubjectrulesreviews", 500, 1));
    let err = checker.check(NS, "s1").await.unwrap_err();
    assert_eq!(err.code(), Some(500));
    assert_eq!(
        sim.request_log()
            .iter()
            .filter(|r| r.resource == "selfsubjectrulesreviews" && r.code == 500)
            .count(),
        1,
        "the fault fired"
    );
    assert!(err.to_string().contains("app/s1"), "{err}");
    assert!(
        checker.check(NS, "s1").await.unwrap().allowed(),
        "the error was not cached"
    );
}

#[tokio::test]
async fn a_failed_rules_review_names_each_callers_own_secret() {
    let sim = world().await;
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfRules,
        Duration::from_secs(600),
    );
    sim.faults()
        .fail_next(FailRule::new("create", "selfsubjectrulesreviews", 500, 1));
    // Both questions join the one rules review of the namespace, which fails.
    let (first, second) = tokio::join!(checker.check(NS, "s1"), checker.check(NS, "s2"));
    let failed_reviews = sim
        .request_log()
        .iter()
        .filter(|r| r.resource == "selfsubjectrulesreviews" && r.code == 500)
        .count();
    assert_eq!(failed_reviews, 1, "the fault fired, once, for both callers");
    let (first, second) = (first.unwrap_err(), second.unwrap_err());
    assert_eq!((first.secret(), second.secret()), ("s1", "s2"));
    assert!(first.to_string().contains("app/s1"), "{first}");
    assert!(!first.to_string().contains("s2"), "{first}");
    assert!(second.to_string().contains("app/s2"), "{second}");
    assert!(!second.to_string().contains("s1"), "{second}");
}

#[tokio::test]
async fn a_denial_says_when_it_is_asked_again() {
    let sim = world().await;
    let denied_ttl = Duration::from_secs(20);
    let checker = AccessChecker::with_options(
        client(&sim, "router").await,
        AccessOptions {
            denied_ttl,
            ..AccessOptions::default()
        },
    );
    let denied = checker.check(NS, "other").await.unwrap();
    assert!(!denied.allowed());
    assert!(
        denied.recheck_after > Duration::ZERO && denied.recheck_after <= denied_ttl,
        "{:?}",
        denied.recheck_after
    );
    let allowed = checker.check(NS, "s1").await.unwrap();
    assert_eq!(allowed.recheck_after, Duration::ZERO);
}

#[tokio::test]
async fn manager_contract() {
    let sim = world().await;
    let manager = SecretManager::new(SecretMonitor::new(client(&sim, "router").await));
    let r1 = key(NS, "r1");
    let r2 = key(NS, "r2");
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<ObjectEvent<_>>();
    manager.register_route(&r1, "s1", tx.clone()).await.unwrap();
    assert!(matches!(events.recv().await, Some(ObjectEvent::Added(_))));
    let again = manager
        .register_route(&r1, "s2", tx.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&again, ManagerError::AlreadyRegistered { secret, .. } if secret == "s1"),
        "{again}"
    );
    assert_eq!(manager.secret_of(&r1).as_deref(), Some("s1"));
    assert_eq!(
        manager.get_secret(&r1).unwrap().metadata.name.as_deref(),
        Some("s1")
    );

    // Two routes, one secret: one watch.
    manager.register_route(&r2, "s1", tx.clone()).await.unwrap();
    assert_eq!(manager.watched_secrets().len(), 1);
    manager.unregister_route(&r1).unwrap();
    assert!(matches!(
        manager.unregister_route(&r1),
        Err(ManagerError::NotRegistered { .. })
    ));
    assert!(matches!(
        manager.get_secret(&r1),
        Err(ManagerError::NotRegistered { .. })
    ));
    assert_eq!(manager.watched_secrets().len(), 1);
    manager.unregister_route(&r2).unwrap();
    assert!(manager.watched_secrets().is_empty());

    // A missing secret: registered (watched), absent from the cache.
    sim.grant_router_secrets(NS, &["not-there"]).unwrap();
    manager
        .register_route(&r1, "not-there", tx.clone())
        .await
        .unwrap();
    let err = manager.get_secret(&r1).unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    manager.unregister_route(&r1).unwrap();

    // A secret the router may not watch: the registration fails with the cause.
    let err = manager
        .register_route(&r1, "other", tx.clone())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("forbidden"), "{err}");
    assert_eq!(manager.route_count(), 0);
}

#[tokio::test]
async fn unregistering_while_registering_leaves_nothing() {
    let sim = sim_with_latency(Duration::from_millis(300)).await;
    let pki = Pki::new(now());
    put_secret(
        &sim,
        &pki.issue(&LeafSpec::new("x.example", now()))
            .secret(NS, "s1"),
    );
    sim.grant_router_secrets(NS, &["s1"]).unwrap();
    let manager = SecretManager::new(SecretMonitor::new(client(&sim, "router").await));
    let route = key(NS, "r");
    let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
    let registering = {
        let manager = manager.clone();
        let route = route.clone();
        tokio::spawn(async move { manager.register_route(&route, "s1", tx).await })
    };
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while manager.secret_of(&route).is_none() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    manager.unregister_route(&route).unwrap();
    let outcome = registering.await.unwrap();
    assert!(
        matches!(outcome, Err(ManagerError::Unregistered { .. })),
        "{outcome:?}"
    );
    assert_eq!(manager.route_count(), 0);
    assert!(manager.watched_secrets().is_empty());
}

#[tokio::test]
async fn prefetch_holds_watches_until_released() {
    let sim = world().await;
    let manager = SecretManager::new(SecretMonitor::new(client(&sim, "router").await));
    manager.prefetch(NS, "s1");
    manager.prefetch(NS, "s2");
    manager.prefetch(NS, "s1");
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while sim.stats().open_watches != 2 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A route joins a prefetched watch without another request.
    let before = sim.request_log().len();
    let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
    manager
        .register_route(&key(NS, "r"), "s1", tx)
        .await
        .unwrap();
    assert_eq!(sim.request_log().len(), before);
    manager.release_prefetched();
    // s2 had no route: its watch closes; s1 stays for its route.
    while sim.stats().open_watches != 1 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(
        manager
            .watched_secrets()
            .keys()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
        ["s1"]
    );
}
