//! The manifests in `deploy/`: they parse, the Deployment's probes and variables match
//! the daemon, its pod fits OpenShift's restricted-v2 (no fixed UID or fsGroup,
//! read-only root filesystems) and its limits the measured memory; the RBAC they grant
//! is exactly enough (loaded into the simulator, certwatch running as their service
//! account serves the route whose secret the example Role names, and rejects another
//! route in the same namespace); and a real kube-apiserver accepts every object of the
//! kustomize base, server-side, with the Pod Security "restricted" level enforced.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use base64::Engine as _;
use certwatch::{Daemon, DaemonOptions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_sim::{SimConfig, SimUser, Simulator};
use route_secrets::testing::{LeafSpec, Pki};
use serde_yaml::Value;

mod common;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The YAML documents of `file` (relative to `deploy/`).
fn documents(file: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(deploy_dir().join(file)).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|value: &Value| !value.is_null())
        .collect()
}

#[test]
fn manifests_parse_and_match_the_daemon() {
    let kustomization = documents("base/kustomization.yaml");
    for resource in kustomization[0]["resources"].as_sequence().unwrap() {
        let file = format!("base/{}", resource.as_str().unwrap());
        for doc in documents(&file) {
            assert!(
                doc["apiVersion"].is_string() && doc["kind"].is_string(),
                "{file}"
            );
            assert!(doc["metadata"]["name"].is_string(), "{file}");
        }
    }
    let deployment = documents("base/deployment.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Deployment")
        .unwrap();
    let pod = &deployment["spec"]["template"]["spec"];
    // restricted-v2 assigns the UID (a fixed one outside the namespace's range is
    // refused) and no fsGroup.
    for field in ["runAsUser", "runAsGroup", "fsGroup"] {
        assert!(pod["securityContext"][field].is_null(), "{field} is set");
    }
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    for container in pod["containers"].as_sequence().unwrap() {
        let security = &container["securityContext"];
        assert_eq!(security["readOnlyRootFilesystem"], true, "{container:?}");
        assert_eq!(security["allowPrivilegeEscalation"], false, "{container:?}");
        assert!(security["runAsUser"].is_null(), "{container:?}");
    }
    let container = &pod["containers"][0];
    // docs/BENCHMARKS.md: 313-334 MiB peak at 10,000 routes; the limit leaves room
    // for them and the memory-backed bundles.
    let limit = container["resources"]["limits"]["memory"].as_str().unwrap();
    let mebibytes: u64 = limit.strip_suffix("Mi").unwrap().parse().unwrap();
    assert!(mebibytes >= 450, "memory limit {limit}");
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
        "base/namespace.yaml",
        "base/clusterrole.yaml",
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
            "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"rbac\"} 1"
        ),
        "{metrics}"
    );
    // The reason is the missing grant, recorded in the route's status.
    let admin = simulator.client("admin").await.unwrap();
    let routes = kube::Api::<route_secrets::route::Route>::namespaced(admin, "shop");
    let message = common::eventually_async("the rejection in the route's status", || async {
        let route = routes.get("other").await.ok()?;
        route_secrets::route::admission::router_ingress(&route, "certwatch")
            .and_then(route_secrets::route::admission::admitted_condition)
            .and_then(|condition| condition.message.clone())
    })
    .await;
    assert!(message.contains("not allowed to get"), "{message}");
    daemon.shutdown().await;
    simulator.shutdown().await;
}

/// A real control plane (etcd + kube-apiserver) from the shared tool, stopped on drop.
struct ControlPlane {
    dir: tempfile::TempDir,
    tool: PathBuf,
    kubeconfig: PathBuf,
}

impl ControlPlane {
    /// `$CERTWATCH_TEST_CONTROL_PLANE`, or `<workspace>/../shared/tools/kube-apiserver`.
    fn tool() -> PathBuf {
        let tool = std::env::var_os("CERTWATCH_TEST_CONTROL_PLANE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("../../../shared/tools/kube-apiserver")
            });
        assert!(
            tool.join("start").exists(),
            "no control plane at {} (set CERTWATCH_TEST_CONTROL_PLANE to the kube-apiserver tool's directory; scripts/test does)",
            tool.display()
        );
        tool
    }

    fn start() -> Self {
        let tool = Self::tool();
        let dir = tempfile::Builder::new()
            .prefix("certwatch-cp-")
            .tempdir()
            .unwrap();
        let output = std::process::Command::new(tool.join("start"))
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "control plane did not start:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
        let kubeconfig = env
            .lines()
            .find_map(|line| line.strip_prefix("KUBECONFIG="))
            .map(|value| PathBuf::from(value.trim_matches('"').trim_matches('\'')))
            .unwrap();
        Self {
            dir,
            tool,
            kubeconfig,
        }
    }

    /// `kubectl --context admin ARGS` with `stdin`; returns (success, stdout + stderr).
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        use std::io::Write as _;
        let mut child = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
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
        (output.status.success(), text)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.tool.join("stop"))
            .arg(self.dir.path())
            .status();
    }
}

/// The pod template of `deploy/<overlay>`'s Deployment as a Pod in `namespace`.
fn pod_of(plane: &ControlPlane, overlay: &str, namespace: &str) -> String {
    let (ok, rendered) = plane.kubectl(
        &["kustomize", deploy_dir().join(overlay).to_str().unwrap()],
        None,
    );
    assert!(ok, "{rendered}");
    let deployment: Value = serde_yaml::Deserializer::from_str(&rendered)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .find(|doc: &Value| doc["kind"] == "Deployment")
        .unwrap();
    let mut pod: serde_yaml::Mapping = serde_yaml::Mapping::new();
    pod.insert("apiVersion".into(), "v1".into());
    pod.insert("kind".into(), "Pod".into());
    let mut metadata = serde_yaml::Mapping::new();
    metadata.insert(
        "name".into(),
        format!("certwatch-{}", overlay.replace('/', "-")).into(),
    );
    metadata.insert("namespace".into(), namespace.into());
    pod.insert("metadata".into(), metadata.into());
    pod.insert(
        "spec".into(),
        deployment["spec"]["template"]["spec"].clone(),
    );
    serde_yaml::to_string(&pod).unwrap()
}

/// Server-side apply of the kustomize base (with the prometheus-operator CRDs
/// installed, so that the ServiceMonitor and the PrometheusRule are checked against
/// their schemas) and of the plain-Kubernetes overlay; their pods pass the Pod Security
/// "restricted" level, enforced by the API server.
#[test]
fn the_base_applies_server_side_and_its_pod_is_restricted() {
    let plane = ControlPlane::start();
    let crds =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/prometheus-operator-crds");
    for crd in [
        "monitoring.coreos.com_servicemonitors.yaml",
        "monitoring.coreos.com_prometheusrules.yaml",
    ] {
        let (ok, out) = plane.kubectl(
            &[
                "apply",
                "--server-side",
                "-f",
                crds.join(crd).to_str().unwrap(),
            ],
            None,
        );
        assert!(ok, "{out}");
    }
    let (ok, out) = plane.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "--timeout=60s",
        ],
        None,
    );
    assert!(ok, "{out}");

    for overlay in ["base", "kubernetes"] {
        let (ok, out) = plane.kubectl(
            &[
                "apply",
                "--server-side",
                "-k",
                deploy_dir().join(overlay).to_str().unwrap(),
            ],
            None,
        );
        assert!(ok, "{overlay}: {out}");
        for object in [
            "namespace/certwatch",
            "deployment.apps/certwatch",
            "servicemonitor.monitoring.coreos.com/certwatch",
            "prometheusrule.monitoring.coreos.com/certwatch",
            "clusterrole.rbac.authorization.k8s.io/certwatch",
        ] {
            assert!(
                out.contains(&format!("{object} serverside-applied")),
                "{overlay}: {object}\n{out}"
            );
        }
    }
    // A schema violation is refused: the schemas are really checked.
    let (ok, out) = plane.kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some("apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {name: broken, namespace: certwatch}\nspec: {groups: [{name: g, rules: [{alert: A, expr: 1, for: soon}]}]}\n"),
    );
    assert!(!ok, "{out}");

    // The example per-namespace grant.
    let (ok, out) = plane.kubectl(&["create", "namespace", "shop"], None);
    assert!(ok, "{out}");
    let (ok, out) = plane.kubectl(
        &[
            "apply",
            "--server-side",
            "-f",
            deploy_dir()
                .join("example-route-secret-access.yaml")
                .to_str()
                .unwrap(),
        ],
        None,
    );
    assert!(ok, "{out}");

    // Pod Security "restricted", enforced: each overlay's pod is admitted.
    let (ok, out) = plane.kubectl(&["create", "namespace", "restricted"], None);
    assert!(ok, "{out}");
    // No controller-manager runs: the service accounts the pods name are made here.
    for account in ["default", "certwatch"] {
        let (ok, out) = plane.kubectl(
            &["-n", "restricted", "create", "serviceaccount", account],
            None,
        );
        assert!(ok, "{out}");
    }
    let (ok, out) = plane.kubectl(
        &[
            "label",
            "namespace",
            "restricted",
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = plane.kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: privileged, namespace: restricted}\nspec: {containers: [{name: c, image: x}]}\n"),
    );
    assert!(
        !ok && out.contains("violates PodSecurity"),
        "the level is not enforced: {out}"
    );
    for overlay in ["base", "kubernetes"] {
        let pod = pod_of(&plane, overlay, "restricted");
        let (ok, out) = plane.kubectl(&["apply", "--server-side", "-f", "-"], Some(&pod));
        assert!(ok, "{overlay}'s pod is refused:\n{out}\n{pod}");
    }
}

/// The binary names the commit it was built from (what `certwatch_build_info`'s
/// `commit` label carries): the checkout's HEAD, since the tests build from it.
#[test]
fn the_version_names_the_commit() {
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("git must be on PATH: the tests build from a git checkout");
    assert!(head.status.success(), "not a git checkout");
    let head = String::from_utf8(head.stdout).unwrap();
    let version = std::process::Command::new(env!("CARGO_BIN_EXE_certwatch"))
        .arg("--version")
        .output()
        .unwrap();
    let version = String::from_utf8(version.stdout).unwrap();
    assert_eq!(
        version.trim(),
        format!(
            "certwatch {} (commit {})",
            env!("CARGO_PKG_VERSION"),
            head.trim()
        )
    );
}
