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

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use testenv::ControlPlane;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `kubectl --context admin ARGS` with `stdin`; panics unless it succeeds.
fn kubectl(plane: &ControlPlane, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write as _;
    let mut child = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(plane.kubeconfig_path())
        .args(["--context", "admin"])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl must be on PATH (scripts/test installs it)");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "kubectl {args:?}:\n{text}");
    text
}

/// A token for the service account `namespace/name`, from the API server's
/// TokenRequest (what the kubelet mounts into a pod).
async fn token_for(admin: &kube::Client, namespace: &str, name: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
        .unwrap()
}

/// A kubeconfig for `token` on the control plane.
fn kubeconfig_for(plane: &ControlPlane, token: &str, path: &Path) {
    use base64::Engine as _;
    let ca = base64::engine::general_purpose::STANDARD.encode(plane.ca_pem());
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: test, cluster: {{server: \"{}\", certificate-authority-data: {ca}}}}}]\n\
             users: [{{name: certwatch, user: {{token: {token}}}}}]\n\
             contexts: [{{name: certwatch, context: {{cluster: test, user: certwatch}}}}]\ncurrent-context: certwatch\n",
            plane.url()
        ),
    )
    .unwrap();
}

/// A CA, and a serving certificate it issued for `localhost` and 127.0.0.1, written
/// as `ca.crt`, `tls.crt`, `tls.key` in `dir`.
pub fn serving_certificate(dir: &Path) -> String {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "certwatch test service CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    ca.pem()
}

/// `GET path` over TLS (trusting `ca_pem`, as `localhost`) with an optional bearer
/// token: status, headers (lower-case names), body.
pub async fn https_get(
    addr: SocketAddr,
    ca_pem: &str,
    path: &str,
    token: Option<&str>,
) -> (u16, String, String) {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut response = Vec::new();
    // The server closes after the response (Connection: close); a TLS close without
    // close_notify is still the end of the body read so far.
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), body.to_owned())
}

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
    let ca = serving_certificate(temp.path());
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
