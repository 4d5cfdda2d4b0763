//! Start-up against an API server with a tiny concurrency budget: the
//! binary against kube-sim at 4 seats without a queue (every request beyond 4 in flight
//! is answered 429 at once). Counts come from the simulator's `/sim/stats` and
//! certwatch's `/metrics`, never from a clock.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{
    Certwatch, PATIENCE, SimProcess, counted_429s, crt_list, eventually_async, metric_value,
};
use kube::api::{Api, ListParams};
use route_secrets::route::Route;
use route_secrets::route::admission::{admitted_condition, router_ingress};

const ROUTES: usize = 300;
const NAMESPACES: usize = 8;
/// certwatch's upper bound on requests at once: the size of its first window.
const FIRST_WINDOW: usize = 32;

/// This router's name in route status.
const ROUTER_NAME: &str = "budget";

/// Requests start-up needs when nothing is refused: one streaming list per secret, one
/// rules review per namespace, the route list and watch, and one status write per
/// route.
const fn requests_needed() -> usize {
    ROUTES + NAMESPACES + 2 + ROUTES
}

/// How many of the routes' statuses say this router admitted them (Admitted=True).
async fn admitted_in_status(routes: &Api<Route>) -> Option<usize> {
    let listed = routes.list(&ListParams::default()).await.ok()?;
    Some(
        listed
            .items
            .iter()
            .filter(|route| {
                router_ingress(route, ROUTER_NAME)
                    .and_then(admitted_condition)
                    .is_some_and(|condition| condition.status.as_str() == "True")
            })
            .count(),
    )
}

/// The simulator's counters.
fn sim_stats(sim: &SimProcess) -> serde_json::Value {
    let (status, body) = sim.admin("GET", "/sim/stats", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/sim/stats is JSON")
}

fn count(stats: &serde_json::Value, key: &str) -> u64 {
    stats[key].as_u64().unwrap_or(0)
}

/// 300 routes through a server that takes 4 requests at once and refuses the rest:
/// certwatch becomes ready with every route admitted, the refusals stay within the
/// budget's bound (a quarter of the requests needed, plus the first window), and
/// `/metrics` shows them and the window that adapted to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaches_ready_through_four_seats_without_a_queue() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::four_seats_without_a_queue(temp.path(), ROUTES, NAMESPACES);
    let (status, _) = sim.admin("POST", "/sim/stats/reset", "");
    assert_eq!(status, 200);
    let cert_dir = temp.path().join("certs");
    let first_window = FIRST_WINDOW.to_string();
    let certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[
            "--max-concurrent-syncs",
            &first_window,
            "--write-status",
            "--router-name",
            ROUTER_NAME,
        ],
    );

    // Not `eventually`: a start-up that does not converge is reported with the
    // simulator's counts, not just as a time-out.
    let deadline = std::time::Instant::now() + PATIENCE;
    while !certwatch.is_ready() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let ready = certwatch.is_ready();
    assert!(
        ready,
        "not ready: {}\n{}",
        refusals_by_request(&router_requests(&sim)),
        certwatch.log_text()
    );
    // Every route's admission lands in its status: the writes may still be under way
    // at ready, and a write the server refuses must be retried, not lost.
    eventually_async("every route's status written", || async {
        let written = router_requests(&sim)
            .iter()
            .filter(|request| {
                request["resource"] == "routes/status" && request["code"].as_u64() == Some(200)
            })
            .filter_map(|request| request["name"].as_str().map(str::to_owned))
            .collect::<std::collections::BTreeSet<_>>()
            .len();
        (written == ROUTES).then_some(())
    })
    .await;

    // The counts, before the test's own requests (as admin) add to them.
    let stats = sim_stats(&sim);
    let requests = router_requests(&sim);
    let rejected = count(&stats, "rejected_429");
    let total = count(&stats, "requests_total");
    let metrics = certwatch.metrics();
    eprintln!(
        "4 seats, no queue, {ROUTES} routes: {total} requests, {rejected} answered 429 ({}), \
         needed {}, window now {:?}, limiter refusals {:?}",
        refusals_by_request(&requests),
        requests_needed(),
        metric_value(&metrics, "certwatch_startup_window"),
        metric_value(&metrics, "certwatch_startup_refusals_total"),
    );
    assert_eq!(
        requests.len() as u64,
        total,
        "only the router asked the server anything"
    );
    assert_eq!(
        metric_value(&metrics, "certwatch_routes_admitted"),
        Some(ROUTES as f64),
        "every route admitted"
    );
    assert_eq!(crt_list(&cert_dir).len(), ROUTES);
    let bound = requests_needed() / 4 + FIRST_WINDOW;
    assert!(
        rejected as usize <= bound,
        "{rejected} requests refused; the bound is {bound} (a quarter of the {} needed plus the first window of {FIRST_WINDOW})",
        requests_needed()
    );
    // Every 429 the server sent is counted by certwatch, by resource, verb and code.
    assert_eq!(
        counted_429s(&metrics),
        rejected,
        "429s in /metrics vs the simulator's"
    );
    // Every refused request was retried and the retry counted, per resource and verb
    // (the route list and watch too: kube-runtime's watcher retries them, through a
    // client that marks the retries).
    let refused_by_request =
        by_resource_and_verb(&metrics, "certwatch_api_requests_total", |line| {
            line.contains("code=\"429\"")
        });
    assert_eq!(
        refused_by_request.values().sum::<u64>(),
        rejected,
        "429s in /metrics by resource and verb"
    );
    for ((resource, verb), refused) in refused_by_request {
        // The Lease loop answers a refusal on its own schedule (its retry period), not
        // as a retry of the request.
        if resource == "leases" {
            continue;
        }
        let retried = by_resource_and_verb(&metrics, "certwatch_api_retries_total", |_| true)
            .get(&(resource.clone(), verb.clone()))
            .copied()
            .unwrap_or(0);
        assert!(
            retried >= refused,
            "{verb} {resource}: {refused} refused, {retried} retries counted\n{metrics}"
        );
    }
    // The window shrank below its bound (the budget is 4) and says so.
    if rejected > 0 {
        let window = metric_value(&metrics, "certwatch_startup_window").unwrap();
        assert!(window < FIRST_WINDOW as f64, "window {window}");
    }

    // The status, as the API server holds it: every route admitted by this router.
    let routes: Api<Route> = Api::all(sim.client("admin").await);
    eventually_async("every route Admitted=True in its status", || async {
        (admitted_in_status(&routes).await? == ROUTES).then_some(())
    })
    .await;
}

/// The requests the simulator logged (every one since the reset came from certwatch).
fn router_requests(sim: &SimProcess) -> Vec<serde_json::Value> {
    let (status, body) = sim.admin("GET", "/sim/requests", "");
    assert_eq!(status, 200, "{body}");
    let requests: Vec<serde_json::Value> =
        serde_json::from_str(&body).expect("/sim/requests is JSON");
    requests
        .into_iter()
        .filter(|request| request["user"] != kube_sim::ADMIN_USER)
        .collect()
}

/// The 429s by verb and resource, e.g. `{"list secrets": 12}`.
fn refusals_by_request(requests: &[serde_json::Value]) -> String {
    let mut refused = std::collections::BTreeMap::<String, usize>::new();
    for request in requests
        .iter()
        .filter(|request| request["code"].as_u64() == Some(429))
    {
        let key = format!(
            "{} {}",
            request["verb"].as_str().unwrap_or("?"),
            request["resource"].as_str().unwrap_or("?")
        );
        *refused.entry(key).or_default() += 1;
    }
    format!("429s by request: {refused:?}")
}

/// The samples of `metric` whose line passes `filter`, summed by resource and verb.
fn by_resource_and_verb(
    metrics: &str,
    metric: &str,
    filter: impl Fn(&str) -> bool,
) -> std::collections::BTreeMap<(String, String), u64> {
    let label = |line: &str, name: &str| {
        let start = line.find(&format!("{name}=\""))? + name.len() + 2;
        let end = start + line[start..].find('"')?;
        Some(line[start..end].to_owned())
    };
    let mut counts = std::collections::BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")) && filter(line))
    {
        let (Some(resource), Some(verb), Some(value)) = (
            label(line, "resource"),
            label(line, "verb"),
            line.rsplit(' ')
                .next()
                .and_then(|value| value.parse::<f64>().ok()),
        ) else {
            continue;
        };
        *counts.entry((resource, verb)).or_default() += value as u64;
    }
    counts
}
