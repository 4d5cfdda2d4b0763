//! The access checker's policies and caching, and the secret manager's contract,
//! against the simulator. Costs are asserted from the simulator's request log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use futures::future::join_all;
use kube_common::Verb;
use kube_common::adaptive::AdaptiveLimiter;
use kube_sim::{FailRule, LimitsConfig, Simulator};
use route_secrets::api::access::{AccessChecker, AccessOptions, AccessPolicy};
use route_secrets::api::manager::{SecretManager, TlsSecretMonitor};
use route_secrets::testing::{LeafSpec, Pki};
use secret_monitor::{MonitorErrorKind, ObjectEvent};
use support::*;

const NS: &str = "app";

fn reviews(sim: &Simulator, resource: &str) -> usize {
    requests(sim, "create", resource).len()
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
async fn prefetches_of_a_namespace_share_its_rules_review() {
    let sim = world().await;
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfRules,
        Duration::from_secs(600),
    );
    for _ in 0..3 {
        for name in ["s1", "s2", "other"] {
            checker.prefetch(NS, name);
        }
    }
    eventually("the namespace's rules asked", || {
        reviews(&sim, "selfsubjectrulesreviews") == 1
    })
    .await;
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert!(checker.check(NS, "s2").await.unwrap().allowed());
    assert_eq!(checker.check(NS, "other").await.unwrap().denied, Verb::READ);
    // Prefetched again once answered: nothing more to ask.
    for name in ["s1", "s2", "other"] {
        checker.prefetch(NS, name);
    }
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert_eq!(reviews(&sim, "selfsubjectrulesreviews"), 1);
    assert_eq!(reviews(&sim, "selfsubjectaccessreviews"), 0);
    assert_eq!(checker.stats().requests, 1);
}

#[tokio::test]
async fn an_incomplete_rules_answer_has_the_prefetch_ask_what_it_does_not_grant() {
    // An incomplete rules list cannot deny: each verb it does not grant is asked with
    // a review. The prefetch asks them ahead of the checks, for the secret the rules
    // do not grant only.
    let sim = world().await;
    sim.set_rules_incomplete(true);
    let checker = AccessChecker::new(
        client(&sim, "router").await,
        AccessPolicy::SelfRules,
        Duration::from_secs(600),
    );
    for name in ["s1", "other", "s2", "other"] {
        checker.prefetch(NS, name);
    }
    eventually("the ungranted secret's three verbs asked", || {
        reviews(&sim, "selfsubjectaccessreviews") == 3
    })
    .await;
    eventually("every prefetched answer received", || {
        checker.stats().requests == 4
    })
    .await;
    assert_eq!(checker.check(NS, "other").await.unwrap().denied, Verb::READ);
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert!(checker.check(NS, "s2").await.unwrap().allowed());
    // The checks were answered from what the prefetch asked.
    assert_eq!(reviews(&sim, "selfsubjectrulesreviews"), 1);
    assert_eq!(reviews(&sim, "selfsubjectaccessreviews"), 3);
    assert_eq!(checker.stats().requests, 4);
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
        answered(&sim, "create", "selfsubjectrulesreviews", 500),
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
    assert_eq!(
        answered(&sim, "create", "selfsubjectrulesreviews", 500),
        1,
        "the fault fired, once, for both callers"
    );
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

/// Under the process's adaptive limiter, a review the server refuses for load is
/// re-queued in its place instead of failing the check, and the limiter learns from
/// each refusal.
#[tokio::test]
async fn reviews_refused_for_load_are_re_queued_under_a_limiter() {
    let sim = world().await;
    let limiter = AdaptiveLimiter::new(Some(8));
    let checker = AccessChecker::with_limiter(
        client(&sim, "router").await,
        AccessOptions::default(),
        limiter.clone(),
    );
    sim.faults()
        .fail_next(FailRule::new("create", "selfsubjectrulesreviews", 503, 2));
    assert!(checker.check(NS, "s1").await.unwrap().allowed());
    assert_eq!(reviews(&sim, "selfsubjectrulesreviews"), 3);
    assert_eq!(
        answered(&sim, "create", "selfsubjectrulesreviews", 503),
        2,
        "the faults fired"
    );
    assert_eq!(checker.stats().requests, 3, "every attempt is counted");
    let snapshot = limiter.snapshot();
    assert_eq!(
        (snapshot.refused, snapshot.succeeded, snapshot.in_flight),
        (2, 1, 0)
    );
}

/// A burst of per-verb reviews (three per secret) against a server that takes two
/// requests at once and answers 429 to the rest: without a limiter some checks fail
/// with the 429; under one, every check is answered, every answer allows (a 429 never
/// becomes a denial), and each 429 the server sent was re-queued by the limiter.
#[tokio::test]
async fn a_review_burst_through_two_seats_is_answered_under_a_limiter() {
    const SECRETS: usize = 30;
    let sim = world().await;
    let names: Vec<String> = (0..SECRETS).map(|i| format!("burst-{i}")).collect();
    let pki = Pki::new(now());
    for name in &names {
        put_secret(
            &sim,
            &pki.issue(&LeafSpec::new("x.example", now()))
                .secret(NS, name),
        );
    }
    let granted: Vec<&str> = names.iter().map(String::as_str).collect();
    sim.grant_router_secrets(NS, &granted).unwrap();
    sim.set_limits(LimitsConfig {
        max_inflight: Some(2),
        queue_len: 0,
        ..LimitsConfig::default()
    });
    let options = AccessOptions {
        policy: AccessPolicy::SelfReviews,
        ..AccessOptions::default()
    };
    let burst = |checker: AccessChecker| {
        join_all(names.iter().map(move |name| {
            let checker = checker.clone();
            async move { checker.check(NS, name).await }
        }))
    };

    // The control: the same burst without a limiter loses checks to 429s.
    let unpaced = burst(AccessChecker::with_options(
        client(&sim, "router").await,
        options.clone(),
    ))
    .await;
    let failed = unpaced
        .iter()
        .filter(|decision| decision.as_ref().is_err_and(|err| err.code() == Some(429)))
        .count();
    assert!(failed > 0, "the budget refuses an unpaced burst");

    let before = sim.request_log().len();
    let limiter = AdaptiveLimiter::new(None);
    let checker =
        AccessChecker::with_limiter(client(&sim, "router").await, options, limiter.clone());
    let decisions = burst(checker.clone()).await;
    for (name, decision) in names.iter().zip(&decisions) {
        let decision = decision
            .as_ref()
            .unwrap_or_else(|err| panic!("{name}: {err}"));
        assert!(decision.allowed(), "{name}: {decision:?}");
    }
    let sent: Vec<_> = sim.request_log()[before..]
        .iter()
        .filter(|r| r.verb == "create" && r.resource == "selfsubjectaccessreviews")
        .cloned()
        .collect();
    let refused = sent.iter().filter(|r| r.code == 429).count();
    let allowed = sent
        .iter()
        .filter(|r| r.code == 201 || r.code == 200)
        .count();
    assert_eq!(
        allowed,
        SECRETS * 3,
        "one answered review per secret and verb"
    );
    assert!(
        refused > 0,
        "the server refused some of the paced burst too"
    );
    assert_eq!(checker.stats().requests as usize, sent.len());
    let snapshot = limiter.snapshot();
    assert_eq!(
        (
            snapshot.refused as usize,
            snapshot.succeeded as usize,
            snapshot.in_flight
        ),
        (refused, SECRETS * 3, 0),
        "the limiter saw every refusal and every answer"
    );
}

#[tokio::test]
async fn manager_contract() {
    let sim = world().await;
    let manager = SecretManager::new(TlsSecretMonitor::new(client(&sim, "router").await));
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel::<ObjectEvent<_>>();
    let first = manager.register(NS, "s1", tx.clone()).await.unwrap();
    assert!(matches!(events.recv().await, Some(ObjectEvent::Added(_))));
    assert_eq!(first.key().name, "s1");
    assert_eq!(first.secret().unwrap().name(), Some("s1"));

    // Two registrations, one secret: one watch, closed when the last one goes.
    let second = manager.register(NS, "s1", tx.clone()).await.unwrap();
    assert_eq!(manager.route_count(), 2);
    assert_eq!(manager.watched_secrets().len(), 1);
    assert_eq!(answered(&sim, "watch", "secrets", 200), 1);
    drop(first);
    assert_eq!(manager.watched_secrets().len(), 1);
    drop(second);
    assert!(manager.watched_secrets().is_empty());
    assert_eq!(manager.route_count(), 0);

    // A missing secret: registered (watched), absent from the cache.
    sim.grant_router_secrets(NS, &["not-there"]).unwrap();
    let missing = manager.register(NS, "not-there", tx.clone()).await.unwrap();
    let err = missing.secret().unwrap_err();
    assert!(matches!(err.kind(), MonitorErrorKind::NotFound), "{err}");
    drop(missing);

    // A secret the router may not watch: the registration fails with the cause.
    let err = manager.register(NS, "other", tx.clone()).await.unwrap_err();
    assert!(
        matches!(err.kind(), MonitorErrorKind::Forbidden { .. }),
        "{err}"
    );
    assert_eq!(manager.route_count(), 0);
    assert!(manager.watched_secrets().is_empty());
}

#[tokio::test]
async fn a_registration_cancelled_during_its_first_sync_leaves_nothing() {
    let sim = sim_with_latency(Duration::from_millis(300)).await;
    let pki = Pki::new(now());
    put_secret(
        &sim,
        &pki.issue(&LeafSpec::new("x.example", now()))
            .secret(NS, "s1"),
    );
    sim.grant_router_secrets(NS, &["s1"]).unwrap();
    let manager = SecretManager::new(TlsSecretMonitor::new(client(&sim, "router").await));
    let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
    let registering = {
        let manager = manager.clone();
        tokio::spawn(async move { manager.register(NS, "s1", tx).await })
    };
    // The registration is waiting for the sync once the monitor counts its waiter.
    eventually("the registration waits for its first sync", || {
        manager
            .watched_secrets()
            .values()
            .any(|status| status.waiting == 1)
    })
    .await;
    registering.abort();
    assert!(registering.await.unwrap_err().is_cancelled());
    eventually("the cancelled registration left no watch", || {
        manager.watched_secrets().is_empty() && sim.stats().open_watches == 0
    })
    .await;
    assert_eq!(manager.route_count(), 0);
}

#[tokio::test]
async fn prefetch_holds_watches_until_released() {
    let sim = world().await;
    let manager = SecretManager::new(TlsSecretMonitor::new(client(&sim, "router").await));
    manager.prefetch(NS, "s1");
    manager.prefetch(NS, "s2");
    manager.prefetch(NS, "s1");
    eventually("both prefetched watches are open", || {
        sim.stats().open_watches == 2
    })
    .await;
    // A registration joins a prefetched watch without another request.
    let before = sim.request_log().len();
    let (tx, _events) = tokio::sync::mpsc::unbounded_channel();
    let registration = manager.register(NS, "s1", tx).await.unwrap();
    assert_eq!(sim.request_log().len(), before);
    manager.release_prefetched();
    // s2 had no registration: its watch closes; s1 stays for its registration.
    eventually("the unused prefetch closed", || {
        sim.stats().open_watches == 1
    })
    .await;
    assert_eq!(
        manager
            .watched_secrets()
            .keys()
            .map(|k| k.name.as_str())
            .collect::<Vec<_>>(),
        ["s1"]
    );
    drop(registration);
}
