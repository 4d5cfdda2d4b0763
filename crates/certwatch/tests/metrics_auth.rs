//! `/metrics` for authorized scrapers only, against the real control plane's
//! TokenReview and SubjectAccessReview (tools/testenv: etcd + kube-apiserver with RBAC).
//! certwatch runs as the service account of `deploy/base` with that base's RBAC
//! (applied server-side from the manifests), serves `--metrics-listen` over HTTPS with
//! a certificate of a test CA, and three scrapers ask: one without a token (and one
//! with a token the server never issued), one whose service account has no grant,
//! and one granted `get` on the non-resource URL `/metrics`, as OpenShift's
//! `prometheus-k8s` is. Refused, refused, served; answers are cached (the second
//! scrape costs no review); the plain port serves probes only.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::delegation::*;
use common::routing::RoutingLaunch;
use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_unauthorized_scrapers_are_refused_an_authorized_one_served() {
    // Two scrapers: one granted get on /metrics (as prometheus-k8s is), one not.
    let delegated = Delegated::start(&["intruder"]).await;
    let (plane, temp, metrics_args) = (&delegated.plane, &delegated.temp, &delegated.metrics_args);
    let (ca, prometheus, intruder) = (
        delegated.ca.clone(),
        delegated.prometheus.clone(),
        delegated.ungranted[0].clone(),
    );
    let mut certwatch = Certwatch::launch(delegated.launch());
    certwatch.wait_ready().await;
    let metrics_addr = certwatch.metrics_addr.expect("the HTTPS metrics address");

    // No token.
    let (status, head, body) = https_get(metrics_addr, &ca, "/metrics", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    assert!(!body.contains("certwatch_"), "{body}");
    // A token the API server never issued.
    let (status, _, body) = https_get(metrics_addr, &ca, "/metrics", Some("not-a-token")).await;
    assert_eq!(status, 401, "{body}");
    // A real identity without the grant.
    let (status, _, body) = https_get(metrics_addr, &ca, "/metrics", Some(&intruder)).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("system:serviceaccount:monitoring:intruder") && !body.contains("certwatch_"),
        "{body}"
    );
    // The granted one, twice: the second scrape is answered from the cache.
    let (status, head, body) = https_get(metrics_addr, &ca, "/metrics", Some(&prometheus)).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    assert!(body.contains("certwatch_ready 1\n"), "{body}");
    let (status, _, body) = https_get(metrics_addr, &ca, "/metrics", Some(&prometheus)).await;
    assert_eq!(status, 200, "{body}");
    // Three tokens reviewed (the unknown one, the intruder's, prometheus's), two users
    // checked; each was one request to the real API server, answered 201.
    for (sample, count) in [
        (
            "certwatch_api_requests_total{resource=\"tokenreviews\",verb=\"create\",code=\"201\"}",
            3.0,
        ),
        (
            "certwatch_api_requests_total{resource=\"subjectaccessreviews\",verb=\"create\",code=\"201\"}",
            2.0,
        ),
        ("certwatch_metrics_scrapes_total{result=\"served\"}", 2.0),
        (
            "certwatch_metrics_scrapes_total{result=\"unauthenticated\"}",
            2.0,
        ),
        ("certwatch_metrics_scrapes_total{result=\"forbidden\"}", 1.0),
        (
            "certwatch_metrics_scrapes_total{result=\"review_failed\"}",
            0.0,
        ),
    ] {
        assert_eq!(metric_value(&body, sample), Some(count), "{sample}\n{body}");
    }

    // The plain port: probes, no metrics.
    assert_eq!(certwatch.get("/readyz").0, 200);
    assert_eq!(certwatch.get("/healthz").0, 200);
    assert_eq!(certwatch.get("/metrics").0, 404);
    assert_eq!(certwatch.terminate().code(), Some(0));

    // certwatch as an identity that may not create reviews (the control plane's router
    // identity, without grants): nobody is served, and the answer says why.
    let mut denied = Certwatch::launch(
        Launch::new(
            plane.kubeconfig_path(),
            &temp.path().join("certs-denied"),
            &temp.path().join("denied.log"),
        )
        .args(metrics_args),
    );
    let addr = denied.metrics_addr.unwrap();
    let (status, _, body) = https_get(addr, &ca, "/metrics", Some(&prometheus)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("cannot review the token: the API server answered 403 Forbidden")
            && body.contains("tokenreviews"),
        "{body}"
    );
    assert_eq!(denied.terminate().code(), Some(0));
}

/// HAProxy's own series (`haproxy_frontend_*`, `haproxy_backend_*`, `haproxy_process_*`
/// from its Prometheus exporter) beside certwatch's, on `/metrics/haproxy` of the same
/// endpoint, to the same authorized scrapers only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxys_own_metrics_are_served_to_authorized_scrapers_only() {
    let delegated = Delegated::start(&["intruder"]).await;
    let (ca, prometheus, intruder) = (
        delegated.ca.clone(),
        delegated.prometheus.clone(),
        delegated.ungranted[0].clone(),
    );
    let mut certwatch = RoutingLaunch::new(&delegated.kubeconfig, delegated.temp.path())
        .args(&delegated.metrics_args)
        .start();
    certwatch.wait_ready().await;
    let addr = certwatch.metrics_addr.expect("the HTTPS metrics address");

    let (status, _, body) = https_get(addr, &ca, "/metrics/haproxy", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("haproxy_"), "{body}");
    let (status, _, body) = https_get(addr, &ca, "/metrics/haproxy", Some(&intruder)).await;
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("haproxy_"), "{body}");
    let (status, head, body) = https_get(addr, &ca, "/metrics/haproxy", Some(&prometheus)).await;
    assert_eq!(status, 200, "{body}");
    assert!(head.contains("content-type: text/plain"), "{head}");
    // The default threads: the router's 4, or one per CPU where there are fewer.
    let threads =
        certwatch::args::default_haproxy_threads(std::thread::available_parallelism().ok());
    assert!(
        body.contains(&format!("haproxy_process_nbthread {threads}\n")),
        "{body}"
    );
    for series in [
        "haproxy_frontend_http_requests_total{proxy=\"public\"}",
        "haproxy_frontend_current_sessions{proxy=\"public_ssl\"}",
        "haproxy_backend_current_sessions{proxy=\"openshift_default\"}",
    ] {
        assert!(body.contains(series), "{series}:\n{body}");
    }
    // certwatch's own series stay on /metrics.
    assert!(!body.contains("certwatch_"), "{body}");
    assert_eq!(certwatch.terminate().code(), Some(0));
}
