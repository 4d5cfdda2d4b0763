//! The manifests in `deploy/`: they parse, the Deployment's probes and variables match
//! the daemon, and the RBAC they grant is exactly enough: loaded into the simulator,
//! certwatch running as their service account serves the route whose secret the
//! example Role names, and rejects another route in the same namespace.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use base64::Engine as _;
use certwatch::run::{Daemon, DaemonOptions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_sim::{SimConfig, SimUser, Simulator};
use route_secrets::testing::{LeafSpec, Pki};
use serde_yaml::Value;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|value: &Value| !value.is_null())
        .collect()
}

#[test]
fn manifests_parse_and_match_the_daemon() {
    let kustomization = documents("kustomization.yaml");
    for resource in kustomization[0]["resources"].as_sequence().unwrap() {
        let file = resource.as_str().unwrap();
        for doc in documents(file) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{file}"
            );
            assert!(doc["metadata"]["name"].is_string(), "{file}");
        }
    }
    let deployment = documents("deployment.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Deployment")
        .unwrap();
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "certwatch");
    assert_eq!(container["startupProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_certwatch"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    for variable in container["env"].as_sequence().unwrap() {
        let name = variable["name"].as_str().unwrap();
        assert!(
            help.contains(&format!("[env: {name}=")),
            "{name} is not an option"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_manifests_grant_exactly_the_named_secret() {
    let token = "certwatch-sa-token";
    let simulator = Simulator::start(SimConfig {
        users: vec![SimUser {
            token: token.to_owned(),
            name: "system:serviceaccount:certwatch:certwatch".to_owned(),
            groups: vec![
                "system:serviceaccounts".to_owned(),
                "system:serviceaccounts:certwatch".to_owned(),
            ],
        }],
        ..SimConfig::default()
    })
    .await
    .unwrap();
    for file in [
        "namespace.yaml",
        "clusterrole.yaml",
        "example-route-secret-access.yaml",
    ] {
        let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
        simulator.load_manifests(&text).unwrap();
    }
    // Two routes in the example's namespace; the example Role names one secret.
    let now = jiff::Timestamp::now();
    let pki = Pki::new(now);
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut objects = String::new();
    for (route, secret) in [("storefront", "storefront-tls"), ("other", "other-tls")] {
        let host = format!("{route}.shop.example.com");
        let leaf = pki.issue(&LeafSpec::new(&host, now));
        objects.push_str(&format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {secret}, namespace: shop}}\ntype: kubernetes.io/tls\n\
             data: {{tls.crt: {}, tls.key: {}}}\n\
             ---\napiVersion: route.openshift.io/v1\nkind: Route\nmetadata: {{name: {route}, namespace: shop}}\n\
             spec: {{host: {host}, to: {{kind: Service, name: {route}}}, tls: {{termination: edge, externalCertificate: {{name: {secret}}}}}}}\n",
            b64.encode(leaf.chain_pem()),
            b64.encode(leaf.key_pem()),
        ));
    }
    simulator.load_manifests(&objects).unwrap();

    let kubeconfig = Kubeconfig::from_yaml(&format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: sim, cluster: {{server: \"{}\"}}}}]\n\
         users: [{{name: certwatch, user: {{token: {token}}}}}]\n\
         contexts: [{{name: certwatch, context: {{cluster: sim, user: certwatch}}}}]\ncurrent-context: certwatch\n",
        simulator.url()
    ))
    .unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    let cert_dir = tempfile::tempdir().unwrap();
    let mut options = DaemonOptions::new(cert_dir.path());
    options.write_status = true;
    let daemon = Daemon::start(config, options).await.unwrap();
    let status = daemon.wait_ready().await.unwrap();
    assert_eq!((status.admitted, status.rejected), (1, 1));
    assert!(cert_dir.path().join("shop:storefront.pem").exists());
    assert!(!cert_dir.path().join("shop:other.pem").exists());
    let metrics = daemon.metrics_text();
    assert!(
        metrics.contains(
            "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\"} 1"
        ),
        "{metrics}"
    );
    // The reason is the missing grant, recorded in the route's status.
    let admin = simulator.client("admin").await.unwrap();
    let routes = kube::Api::<route_secrets::route::Route>::namespaced(admin, "shop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let message = loop {
        assert!(std::time::Instant::now() < deadline, "no status written");
        let route = routes.get("other").await.unwrap();
        let message = route_secrets::route::admission::router_ingress(&route, "certwatch")
            .and_then(route_secrets::route::admission::admitted_condition)
            .and_then(|condition| condition.message.clone());
        if let Some(message) = message {
            break message;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(message.contains("not allowed to get"), "{message}");
    daemon.shutdown().await;
    simulator.shutdown().await;
}
