//! Labels that survive scraping, and alerts that name the route's namespace, with a
//! real Prometheus (Debian's `prometheus`) scraping certwatch as the ServiceMonitor of
//! `deploy/base` makes the prometheus-operator scrape it: HTTPS with the service CA and
//! the Service's DNS name, the scraper identity's bearer token (checked by certwatch
//! with the real control plane's TokenReview and SubjectAccessReview), and
//! `honor_labels: false`, with the target labels a ServiceMonitor gives (`namespace`
//! is certwatch's). The alerts are the shipped rule file's, with every `for:` set to 0
//! so that they fire within seconds (their durations are tested by promtool:
//! tests/alerts.rs). Routes whose certificates expire in 7 days make
//! `CertwatchCertificateExpiringSoon` fire once per route, labelled and described
//! with the route's own namespace; stopping certwatch makes `CertwatchDown` fire.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::delegation::*;
use common::*;
use serde_yaml::Value;
use testenv::{ControlPlane, Installer};

/// Prometheus as a child process, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

impl Prometheus {
    fn start(dir: &Path, config: &str) -> Self {
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect(
                "prometheus must be on PATH (Debian package prometheus; scripts/test installs it)",
            );
        Self { child, addr, log }
    }

    /// `GET /api/v1/<path>`'s `data`, once Prometheus answers.
    fn api(&mut self, path: &str) -> Option<serde_json::Value> {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!(
                "prometheus exited ({status}):\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
        let (status, body) = http_request(self.addr, "GET", &format!("/api/v1/{path}"), "");
        if status != 200 {
            return None;
        }
        let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some(answer["data"].clone())
    }

    /// The firing alerts named `name`.
    fn firing(&mut self, name: &str) -> Vec<serde_json::Value> {
        self.api("alerts")
            .and_then(|data| data["alerts"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .filter(|alert| alert["labels"]["alertname"] == name && alert["state"] == "firing")
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The shipped rules with every `for:` at 0.
fn rules_firing_at_once() -> String {
    let path = deploy_dir().join("alerts/certwatch.rules.yaml");
    let mut rules: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for group in rules["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            if let Some(rule) = rule.as_mapping_mut()
                && rule.contains_key("for")
            {
                rule.insert("for".into(), "0s".into());
            }
        }
    }
    serde_yaml::to_string(&rules).unwrap()
}

/// The scrape configuration the prometheus-operator makes of the ServiceMonitor's
/// endpoint, for a target at `target` (the pod's address) in the ServiceMonitor's
/// namespace.
fn scrape_config(dir: &Path, target: SocketAddr) -> String {
    let monitor: Value = serde_yaml::from_str(
        &std::fs::read_to_string(deploy_dir().join("base/servicemonitor.yaml")).unwrap(),
    )
    .unwrap();
    let namespace = monitor["metadata"]["namespace"].as_str().unwrap();
    let endpoint = &monitor["spec"]["endpoints"][0];
    // The operator writes honor_labels: false unless the ServiceMonitor says true.
    let honor_labels = endpoint["honorLabels"].as_bool().unwrap_or(false);
    assert!(!honor_labels);
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [{rules}]\n\
         scrape_configs:\n\
         - job_name: serviceMonitor/{namespace}/certwatch/0\n\
         \x20 honor_labels: {honor_labels}\n\
         \x20 scheme: {scheme}\n\
         \x20 metrics_path: {path}\n\
         \x20 authorization: {{type: Bearer, credentials_file: {token}}}\n\
         \x20 tls_config: {{ca_file: {ca}, server_name: {server_name}}}\n\
         \x20 static_configs:\n\
         \x20 - targets: ['{target}']\n\
         \x20   labels: {{job: certwatch, namespace: {namespace}, service: certwatch, pod: certwatch-6d5f7c9b8-k2x4z, container: certwatch, endpoint: {port}}}\n",
        rules = dir.join("rules.yaml").display(),
        scheme = endpoint["scheme"].as_str().unwrap(),
        path = endpoint["path"].as_str().unwrap(),
        token = dir.join("token").display(),
        ca = dir.join("ca.crt").display(),
        server_name = endpoint["tlsConfig"]["serverName"].as_str().unwrap(),
        port = endpoint["port"].as_str().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_with_honor_labels_false_and_alerts_name_the_route_namespace() {
    let plane = ControlPlane::start().await.unwrap();
    let admin = plane.admin_client().await.unwrap();
    // Routes whose certificates expire in 7 days, readable by the router identity.
    let spec: kube_sim::GenerateSpec = "routes=3,namespaces=2,validity=7d".parse().unwrap();
    let cluster = Installer::new(admin.clone()).generate(&spec).await.unwrap();
    let routes: BTreeSet<(String, String, String)> = cluster
        .routes
        .iter()
        .map(|route| {
            (
                route.namespace.clone(),
                route.route.clone(),
                route.secret.clone(),
            )
        })
        .collect();
    assert_eq!(routes.len(), 3);
    // certwatch runs as the router identity, which may also review tokens (as the
    // base binds system:auth-delegator); the scraper identity and its grant are the
    // base's.
    kubectl(
        &plane,
        &["apply", "--server-side", "-f", "-"],
        Some(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: router-auth-delegator}\n\
             roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}\n\
             subjects: [{kind: ServiceAccount, name: router, namespace: openshift-ingress}]\n",
        ),
    );
    for file in ["namespace.yaml", "metrics-scraper.yaml"] {
        let path = deploy_dir().join("base").join(file);
        kubectl(
            &plane,
            &["apply", "--server-side", "-f", path.to_str().unwrap()],
            None,
        );
    }
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();
    std::fs::write(
        dir.join("token"),
        token_for(&admin, "certwatch", "certwatch-metrics-scraper").await,
    )
    .unwrap();
    // The service CA's certificate for the name the ServiceMonitor verifies.
    serving_certificate(dir, &["certwatch.certwatch.svc"]);
    std::fs::write(dir.join("rules.yaml"), rules_firing_at_once()).unwrap();

    let mut certwatch = Certwatch::launch(
        Launch::new(
            plane.kubeconfig_path(),
            &dir.join("certs"),
            &dir.join("certwatch.log"),
        )
        .args(&[
            "--metrics-listen",
            "127.0.0.1:0",
            "--metrics-tls-cert",
            dir.join("tls.crt").to_str().unwrap(),
            "--metrics-tls-key",
            dir.join("tls.key").to_str().unwrap(),
        ]),
    );
    certwatch.wait_ready().await;
    let target = certwatch.metrics_addr.unwrap();
    let mut prometheus = Prometheus::start(dir, &scrape_config(dir, target));

    // The target is up: the scrape passed TLS verification and the token review.
    eventually("the certwatch target up", || {
        let up = prometheus.api("query?query=up")?;
        let series = up["result"].as_array()?.first()?.clone();
        (series["value"][1] == "1").then_some(())
    })
    .await;
    // Every route's expiry series, with the route's namespace in route_namespace and
    // certwatch's in namespace; nothing renamed to exported_namespace.
    let series = eventually("three expiry series", || {
        let data =
            prometheus.api("query?query=certwatch_certificate_expiration_timestamp_seconds")?;
        let result = data["result"].as_array()?.clone();
        (result.len() == 3).then_some(result)
    })
    .await;
    let mut seen = BTreeSet::new();
    for series in &series {
        let labels = &series["metric"];
        assert_eq!(labels["namespace"], "certwatch", "{labels}");
        assert!(labels["exported_namespace"].is_null(), "{labels}");
        seen.insert((
            labels["route_namespace"].as_str().unwrap().to_owned(),
            labels["route"].as_str().unwrap().to_owned(),
            labels["secret"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(seen, routes);

    // The expiring-soon alert fires once per secret (not per route, not per replica),
    // named by the route's namespace.
    let secrets: BTreeSet<(String, String)> = routes
        .iter()
        .map(|(namespace, _, secret)| (namespace.clone(), secret.clone()))
        .collect();
    let alerts = eventually("CertwatchCertificateExpiringSoon for every secret", || {
        let alerts = prometheus.firing("CertwatchCertificateExpiringSoon");
        (alerts.len() == secrets.len()).then_some(alerts)
    })
    .await;
    let mut alerted = BTreeSet::new();
    for alert in &alerts {
        let labels = &alert["labels"];
        let (namespace, secret) = (
            labels["route_namespace"].as_str().unwrap(),
            labels["secret"].as_str().unwrap(),
        );
        assert!(labels["route"].is_null(), "{alert}");
        assert_eq!(labels["severity"], "info", "{alert}");
        assert!(labels["exported_namespace"].is_null(), "{alert}");
        let description = alert["annotations"]["description"].as_str().unwrap();
        assert!(
            description.starts_with(&format!(
                "Secret {namespace}/{secret}, served by routes in {namespace}, has a certificate that expires in 6d 23h"
            )),
            "{description}"
        );
        assert!(
            alert["annotations"]["runbook_url"]
                .as_str()
                .unwrap()
                .ends_with("docs/deploy.md#certwatchcertificateexpiringsoon"),
            "{alert}"
        );
        alerted.insert((namespace.to_owned(), secret.to_owned()));
    }
    assert_eq!(alerted, secrets);
    for silent in [
        "CertwatchCertificateExpiresIn3Days",
        "CertwatchDown",
        "CertwatchAbsent",
        "CertwatchNotReady",
    ] {
        assert_eq!(
            prometheus.firing(silent),
            Vec::<serde_json::Value>::new(),
            "{silent}"
        );
    }

    // certwatch stops: its target is down, and the alert says so.
    assert_eq!(certwatch.terminate().code(), Some(0));
    let down = eventually("CertwatchDown", || {
        let alerts = prometheus.firing("CertwatchDown");
        (!alerts.is_empty()).then_some(alerts)
    })
    .await;
    assert_eq!(down.len(), 1);
    assert_eq!(down[0]["labels"]["namespace"], "certwatch");
    assert_eq!(down[0]["labels"]["job"], "certwatch");
    // One alert for the Deployment, saying how many replicas are down.
    assert!(down[0]["labels"]["instance"].is_null(), "{down:?}");
    assert!(
        down[0]["annotations"]["description"]
            .as_str()
            .unwrap()
            .starts_with("1 certwatch replica(s) in certwatch have failed their scrapes"),
        "{down:?}"
    );
}
