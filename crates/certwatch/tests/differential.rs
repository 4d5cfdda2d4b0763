//! certwatch beside the real OpenShift router, judged by it.
//!
//! One real control plane (kube-apiserver + etcd with the Route CRD), the real router
//! (openshift/router with its HAProxy template, from the shared tool; its HAProxy at the
//! router image's OpenSSL security level 1) and `certwatch run --write-status` (the
//! production binary, configured alike), each writing `status.ingress[]` under its own
//! router name as the same service account. A corpus of routes and secrets (every TLS
//! case of the router matrix, every termination, inline certificates, routes without
//! TLS or host, host claims, a wildcard route) is created before either starts; then
//! steps change it (a route moves to another secret, a secret is deleted, re-created,
//! rotated to a good, a bad and a good pair again, a missing secret and a missing grant
//! appear, a claimed host is freed).
//!
//! After every step the test waits until the router has written what the corpus
//! records for it (the judge's answer, so that a step is known to have settled) and
//! takes the router's answers then; then it waits until certwatch has written the same
//! `Admitted` status and reason, or what docs/daemon.md lists as a deliberate
//! difference for that route and step, and takes certwatch's answers. It fails
//! when a difference is not listed, is listed with other steps, or is listed and no
//! longer occurs: the list cannot grow, or go stale, silently.
//!
//! Nothing is skipped: a missing control plane, router tool or HAProxy fails the test
//! with what to install.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "differential/mod.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use harness::corpus::{self, Admitted};
use harness::differences::{self, Documented, Finding};
use harness::{Harness, Observation, wait_until};

/// How long the router may take to process the whole corpus at start (about 0.6 s per
/// external certificate at client-go's 5 QPS on its access reviews, twice per route).
/// A bound on a hang, never a statement about speed.
const START_PATIENCE: Duration = Duration::from_secs(600);
/// How long either router may take to settle after a later step (a bound on a hang).
const STEP_PATIENCE: Duration = Duration::from_secs(180);

/// Overrides [`STEP_PATIENCE`] (seconds), for a quick look at the differences while
/// changing the corpus or the list: with undocumented differences every step waits
/// out its whole patience.
const STEP_PATIENCE_ENV: &str = "CERTWATCH_DIFFERENTIAL_STEP_PATIENCE";

fn step_patience() -> Duration {
    std::env::var(STEP_PATIENCE_ENV)
        .ok()
        .and_then(|seconds| seconds.parse().ok())
        .map_or(STEP_PATIENCE, Duration::from_secs)
}

/// What the corpus expects of the real router after a step, cumulatively.
#[derive(Clone, Debug, Default)]
struct Expected {
    /// Route → its condition (`None`: any, but present).
    routes: BTreeMap<String, Option<Admitted>>,
}

impl Expected {
    fn apply(&mut self, step: &corpus::Step) {
        for gone in &step.gone {
            self.routes.remove(gone);
        }
        for (route, expect) in &step.expect {
            self.routes.insert(route.clone(), expect.router.clone());
        }
    }

    /// Routes whose router status is not (yet) what the corpus records.
    fn unmet(
        &self,
        observation: &Observation,
        rewritten: &BTreeSet<String>,
        since: jiff::Timestamp,
    ) -> Vec<String> {
        self.routes
            .iter()
            .filter(|(route, expected)| {
                let Some(observed) = observation.get(*route) else {
                    return true;
                };
                let status_met = match expected {
                    Some(expected) => observed.router == *expected,
                    None => observed.router != Admitted::Absent,
                };
                let written = !rewritten.contains(*route)
                    || observed.router_transition.is_some_and(|at| at >= since);
                !(status_met && written)
            })
            .map(|(route, _)| route.clone())
            .collect()
    }
}

/// What certwatch should have written for each route: the router's answer, or the
/// documented difference.
fn certwatch_unmet(
    corpus: &corpus::Corpus,
    documented: &Documented,
    step: &str,
    expected: &Expected,
    router_view: &Observation,
    certwatch_view: &Observation,
) -> Vec<String> {
    expected
        .routes
        .keys()
        .filter(|route| {
            let (Some(router), Some(certwatch)) =
                (router_view.get(*route), certwatch_view.get(*route))
            else {
                return true;
            };
            let want = documented
                .certwatch_for(corpus, route, step, &router.router)
                .unwrap_or_else(|| router.router.clone());
            certwatch.certwatch != want
        })
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certwatch_writes_what_the_openshift_router_writes() {
    let now = jiff::Timestamp::now();
    let corpus = corpus::corpus(now);
    let documented = Documented::read();
    let mut harness = Harness::start().await;

    let mut expected = Expected::default();
    let mut findings: Vec<Finding> = Vec::new();
    // (step, route, corpus's record of the router, what it wrote)
    let mut stale_record: Vec<(String, String, String, String)> = Vec::new();
    let mut report = String::new();
    for (index, step) in corpus.steps.iter().enumerate() {
        // Transition times have a resolution of a second: a rewrite after this counts.
        let since = jiff::Timestamp::from_second(jiff::Timestamp::now().as_second()).unwrap();
        if step.pause_certwatch {
            harness.certwatch.as_ref().unwrap().signal("STOP");
        }
        for action in &step.actions {
            harness.apply(action).await;
        }
        let patience = if index == 0 {
            harness.start_routers(&["--access-denied-ttl", "1s"]).await;
            let ready = wait_until(START_PATIENCE, async || harness.router().is_ready()).await;
            assert!(
                ready,
                "the router never became ready:\n{}",
                harness.router().log_tail()
            );
            START_PATIENCE
        } else {
            step_patience()
        };
        expected.apply(step);
        let rewritten: BTreeSet<String> = step
            .expect
            .iter()
            .filter(|(_, expect)| expect.rewritten)
            .map(|(route, _)| route.clone())
            .collect();

        // The router settles on the corpus's record of it: its answers are taken then.
        let mut router_view = Observation::new();
        wait_until(patience, async || {
            router_view = harness.observe().await;
            expected.unmet(&router_view, &rewritten, since).is_empty()
        })
        .await;
        for route in expected.unmet(&router_view, &rewritten, since) {
            let observed = router_view.get(&route).map_or_else(
                || "no route".to_owned(),
                |observed| observed.router.to_string(),
            );
            let recorded = expected.routes[&route]
                .as_ref()
                .map_or_else(|| "any".to_owned(), ToString::to_string);
            stale_record.push((step.id.to_owned(), route, recorded, observed));
        }
        if step.pause_certwatch {
            harness.certwatch.as_ref().unwrap().signal("CONT");
        }
        // certwatch writes the router's answer, or the documented difference: its
        // answers are taken once it has.
        let mut certwatch_view = Observation::new();
        wait_until(step_patience(), async || {
            certwatch_view = harness.observe().await;
            certwatch_unmet(
                &corpus,
                &documented,
                step.id,
                &expected,
                &router_view,
                &certwatch_view,
            )
            .is_empty()
        })
        .await;

        let mut lines = format!("step `{}`: {}\n", step.id, step.about);
        for route in expected.routes.keys() {
            let router = router_view
                .get(route)
                .map_or(Admitted::Absent, |observed| observed.router.clone());
            let certwatch = certwatch_view
                .get(route)
                .map_or(Admitted::Absent, |observed| observed.certwatch.clone());
            let mark = if router == certwatch { " " } else { "≠" };
            let _ = writeln!(
                lines,
                "  {mark} {route:<30} router {:<45} certwatch {certwatch}",
                router.to_string(),
            );
            if router != certwatch {
                findings.push(Finding {
                    case: route.clone(),
                    step: step.id,
                    router,
                    certwatch,
                });
            }
        }
        eprint!("{lines}");
        report.push_str(&lines);
    }

    let mut problems = Vec::new();
    for (step, route, recorded, observed) in &stale_record {
        problems.push(format!(
            "step {step}: the router wrote {observed} for {route}, the corpus records {recorded}"
        ));
    }
    problems.extend(differences::compare(&corpus, &documented, &findings));
    assert!(
        problems.is_empty(),
        "certwatch and the OpenShift router differ beyond docs/daemon.md's list:\n{}\n\n{report}",
        problems.join("\n")
    );
}
