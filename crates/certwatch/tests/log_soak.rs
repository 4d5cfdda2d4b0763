//! The log soak: 500 routes whose certificates both expire soon and do not cover the
//! route's host, their secrets rotated to new such certificates without pause for two
//! minutes, against `certwatch run --log-format json` at the default log level (what
//! a deployment runs). Each route's warnings are logged once, when the route first
//! serves a certificate that has them; the later versions that keep them are counted
//! in `certwatch_certificate_warnings_total` and summarised at a bounded rate. The log
//! stays under 1,000 lines, every one of them JSON.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt as _;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, Patch, PatchParams};
use route_secrets::testing::{LeafSpec, Pki};

const ROUTES: usize = 500;
const SOAK: Duration = Duration::from_secs(120);
const LINE_BUDGET: usize = 1_000;

/// Certificates for a host no route has, valid for 7 days (inside the 30-day warning
/// window): every one warns `expires_soon` and `host_not_covered` for any route.
fn certificate_pool(size: usize) -> Vec<BTreeMap<String, ByteString>> {
    let now = jiff::Timestamp::now();
    let pki = Pki::new(now);
    (0..size)
        .map(|i| {
            let spec = LeafSpec::new(&format!("elsewhere-{i}.example.org"), now).valid(
                now - jiff::SignedDuration::from_hours(1),
                now + jiff::SignedDuration::from_hours(7 * 24),
            );
            pki.issue(&spec).data()
        })
        .collect()
}

/// (namespace, name) of every generated secret.
async fn secrets(admin: &kube::Client) -> Vec<(String, String)> {
    Api::<Secret>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|secret| {
            let name = secret.metadata.name?;
            name.starts_with("tls-")
                .then(|| (secret.metadata.namespace.unwrap_or_default(), name))
        })
        .collect()
}

async fn set_data(
    admin: &kube::Client,
    (namespace, name): &(String, String),
    data: &BTreeMap<String, ByteString>,
) -> Secret {
    Api::<Secret>::namespaced(admin.clone(), namespace)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({ "data": data })),
        )
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_500_secrets_for_two_minutes_logs_fewer_than_1000_lines() {
    let temp = tempfile::tempdir().unwrap();
    let generate = format!("routes={ROUTES},namespaces=5");
    let sim = SimProcess::start(temp.path(), &["--generate", &generate]);
    let admin = sim.client("admin").await;
    let pool = certificate_pool(16);
    let secrets = secrets(&admin).await;
    assert_eq!(secrets.len(), ROUTES);

    // Every route has both warnings from its first decision on.
    futures::stream::iter(secrets.iter().enumerate())
        .for_each_concurrent(16, |(i, secret)| {
            let (admin, data) = (admin.clone(), &pool[i % pool.len()]);
            async move {
                set_data(&admin, secret, data).await;
            }
        })
        .await;

    let cert_dir = temp.path().join("certs");
    let log = temp.path().join("certwatch.log");
    let mut certwatch = Certwatch::launch(
        Launch::new(&sim.kubeconfig, &cert_dir, &log)
            .json()
            .default_log_level(),
    );
    certwatch.wait_ready().await;

    // Rotation without pause: round after round over every secret, each time to a
    // certificate it did not have, 16 writes in flight.
    let started = Instant::now();
    let mut rotations = 0_usize;
    let mut last: HashMap<(String, String), Secret> = HashMap::new();
    let mut round = 1;
    while started.elapsed() < SOAK {
        let written: Vec<((String, String), Secret)> =
            futures::stream::iter(secrets.iter().enumerate())
                .map(|(i, secret)| {
                    let (admin, data) = (admin.clone(), &pool[(i + round) % pool.len()]);
                    async move { (secret.clone(), set_data(&admin, secret, data).await) }
                })
                .buffer_unordered(16)
                .collect()
                .await;
        rotations += written.len();
        last.extend(written);
        round += 1;
    }

    // Every route ends up serving its secret's last certificate.
    for ((namespace, name), secret) in &last {
        let route = name.replacen("tls-", "route-", 1);
        let bundle = cert_dir.join(format!("{namespace}:{route}.pem"));
        let expected = expected_bundle(secret);
        eventually(&format!("{namespace}/{route}'s last certificate"), || {
            (read_or_empty(&bundle) == expected).then_some(())
        })
        .await;
    }
    let metrics = certwatch.metrics();
    assert_eq!(certwatch.terminate().code(), Some(0));

    let text = certwatch.log_text();
    let lines: Vec<&str> = text.lines().collect();
    let mut by_message: BTreeMap<String, usize> = BTreeMap::new();
    for line in &lines {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        let message = event["message"].as_str().unwrap_or_default();
        // Messages that name a route: counted by their first words.
        let key: String = message
            .split_whitespace()
            .take(6)
            .collect::<Vec<_>>()
            .join(" ");
        *by_message
            .entry(format!("{} {key}", event["level"].as_str().unwrap_or("?")))
            .or_default() += 1;
    }
    let counted = |warning: &str| {
        metric_value(
            &metrics,
            &format!("certwatch_certificate_warnings_total{{warning=\"{warning}\"}}"),
        )
        .unwrap_or(0.0)
    };
    eprintln!(
        "log soak: {ROUTES} routes, {rotations} rotations in {:.0} s ({round} rounds): {} log lines; \
         counted warnings: host_not_covered {}, expires_soon {}\n{by_message:#?}",
        started.elapsed().as_secs_f64(),
        lines.len(),
        counted("host_not_covered"),
        counted("expires_soon"),
    );
    assert!(
        lines.len() < LINE_BUDGET,
        "{} lines:\n{by_message:#?}",
        lines.len()
    );
    // The warnings not logged are counted: at least the first and the last
    // certificate of every route.
    for warning in ["host_not_covered", "expires_soon"] {
        assert!(
            counted(warning) >= (2 * ROUTES) as f64,
            "{warning}: {}\n{metrics}",
            counted(warning)
        );
    }
    let routes_with = |warning: &str| {
        metric_value(
            &metrics,
            &format!("certwatch_routes_with_certificate_warning{{warning=\"{warning}\"}}"),
        )
    };
    assert_eq!(routes_with("host_not_covered"), Some(ROUTES as f64));
    assert_eq!(routes_with("expires_soon"), Some(ROUTES as f64));
}
