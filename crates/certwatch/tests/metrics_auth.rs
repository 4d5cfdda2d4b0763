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
use common::*;
use testenv::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unauthenticated_and_unauthorized_scrapers_are_refused_an_authorized_one_served() {
    let plane = ControlPlane::start().await.unwrap();
    let admin = plane.admin_client().await.unwrap();
    // certwatch's identity and RBAC, as deploy/base declares them.
    for file in ["namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml"] {
        let path = deploy_dir().join("base").join(file);
        kubectl(
            &plane,
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        );
    }
    // Two scrapers: one granted get on /metrics (as prometheus-k8s is), one not.
    kubectl(
        &plane,
        &["apply", "--server-side", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: prometheus, namespace: monitoring}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: intruder, namespace: monitoring}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: metrics-reader}\n\
             rules: [{nonResourceURLs: [/metrics], verbs: [get]}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: prometheus-metrics-reader}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}\n\
             subjects: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]\n",
        ),
    );
    let certwatch_token = token_for(&admin, "certwatch", "certwatch").await;
    let prometheus = token_for(&admin, "monitoring", "prometheus").await;
    let intruder = token_for(&admin, "monitoring", "intruder").await;

    let temp = tempfile::tempdir().unwrap();
    let kubeconfig = temp.path().join("certwatch.kubeconfig");
    kubeconfig_for(&plane, &certwatch_token, &kubeconfig);
    let ca = serving_certificate(temp.path(), &["localhost", "127.0.0.1"]);
    let cert = temp.path().join("tls.crt");
    let key = temp.path().join("tls.key");
    let mut certwatch = Certwatch::launch(
        Launch::new(
            &kubeconfig,
            &temp.path().join("certs"),
            &temp.path().join("certwatch.log"),
        )
        .args(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-tls-cert",
            cert.to_str().unwrap(),
            "--metrics-tls-key",
            key.to_str().unwrap(),
        ]),
    );
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
        .args(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-tls-cert",
            cert.to_str().unwrap(),
            "--metrics-tls-key",
            key.to_str().unwrap(),
        ]),
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
    let plane = ControlPlane::start().await.unwrap();
    let admin = plane.admin_client().await.unwrap();
    for file in ["namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml"] {
        let path = deploy_dir().join("base").join(file);
        kubectl(
            &plane,
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        );
    }
    kubectl(
        &plane,
        &["apply", "--server-side", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: monitoring}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: prometheus, namespace: monitoring}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: intruder, namespace: monitoring}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: metrics-reader}\n\
             rules: [{nonResourceURLs: [/metrics], verbs: [get]}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: prometheus-metrics-reader}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: metrics-reader}\n\
             subjects: [{kind: ServiceAccount, name: prometheus, namespace: monitoring}]\n",
        ),
    );
    let certwatch_token = token_for(&admin, "certwatch", "certwatch").await;
    let prometheus = token_for(&admin, "monitoring", "prometheus").await;
    let intruder = token_for(&admin, "monitoring", "intruder").await;
    let temp = tempfile::tempdir().unwrap();
    let kubeconfig = temp.path().join("certwatch.kubeconfig");
    kubeconfig_for(&plane, &certwatch_token, &kubeconfig);
    let ca = serving_certificate(temp.path(), &["localhost", "127.0.0.1"]);
    let (cert, key) = (temp.path().join("tls.crt"), temp.path().join("tls.key"));
    let config_dir = temp.path().join("haproxy");
    let (http_bind, https_bind) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut certwatch = Certwatch::launch(
        Launch::new(
            &kubeconfig,
            &temp.path().join("certs"),
            &temp.path().join("certwatch.log"),
        )
        .args(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-tls-cert",
            cert.to_str().unwrap(),
            "--metrics-tls-key",
            key.to_str().unwrap(),
            "--haproxy-config-dir",
            config_dir.to_str().unwrap(),
            "--http-bind",
            &http_bind,
            "--https-bind",
            &https_bind,
            "--haproxy-max-connections",
            "2000",
        ]),
    );
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
    for series in [
        "haproxy_process_nbthread 4",
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
