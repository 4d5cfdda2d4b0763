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
    // A new pod is taken in by load balancers before the next old one stops.
    assert_eq!(deployment["spec"]["minReadySeconds"], 30);
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
    assert_eq!(container["name"], "certwatch");
    // Sized from the measurements in docs/deploy.md ("Sizing"): each container's
    // request covers its measured peak at 10,000 routes, its limit the request.
    let (certwatch_peak, haproxy_peak) = measured_peaks_at_10000();
    for (container, peak) in [
        (&pod["containers"][0], certwatch_peak),
        (&pod["containers"][1], haproxy_peak),
    ] {
        let mebibytes = |quantity: &Value| -> f64 {
            quantity
                .as_str()
                .and_then(|text| text.strip_suffix("Mi"))
                .unwrap()
                .parse()
                .unwrap()
        };
        let request = mebibytes(&container["resources"]["requests"]["memory"]);
        let limit = mebibytes(&container["resources"]["limits"]["memory"]);
        assert!(
            request >= peak && limit >= request,
            "{}: request {request} Mi, limit {limit} Mi, measured peak {peak} MiB",
            container["name"].as_str().unwrap()
        );
    }
    // HAProxy's limit also holds every connection its maxconn lets in, each at its
    // bound (docs/deploy.md, "HAProxy's connections"): HAProxy stops accepting at
    // maxconn before the kernel would kill it.
    let maxconn: f64 = pod["containers"][0]["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|variable| variable["name"] == "CERTWATCH_HAPROXY_MAX_CONNECTIONS")
        .expect("the Deployment sets HAProxy's maxconn")["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let haproxy_limit: f64 = pod["containers"][1]["resources"]["limits"]["memory"]
        .as_str()
        .and_then(|text| text.strip_suffix("Mi"))
        .unwrap()
        .parse()
        .unwrap();
    let needed = haproxy_peak + maxconn * measured_connection_bound_kib() / 1024.0;
    assert!(
        haproxy_limit >= needed,
        "haproxy: limit {haproxy_limit} Mi, needed {needed:.1} MiB for maxconn {maxconn}"
    );
    // Probes that match the design: readiness gates the endpoints on /readyz, and the
    // only probe that can restart the container (liveness; no startup probe) asks
    // /healthz, which stays 200 through an API outage at start.
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(container["startupProbe"].is_null(), "a startup probe");
    // The API token is mounted in certwatch's container only.
    assert_eq!(pod["automountServiceAccountToken"], false);
    let service_account = documents("base/serviceaccount.yaml").remove(0);
    assert_eq!(service_account["automountServiceAccountToken"], false);
    let token_mounts: Vec<&str> = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|container| {
            container["volumeMounts"]
                .as_sequence()
                .unwrap()
                .iter()
                .any(|mount| mount["mountPath"] == "/var/run/secrets/kubernetes.io/serviceaccount")
        })
        .map(|container| container["name"].as_str().unwrap())
        .collect();
    assert_eq!(token_mounts, ["certwatch"]);
    let projected = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "kube-api-access")
        .unwrap();
    assert!(
        projected["projected"]["sources"][0]["serviceAccountToken"]["path"] == "token",
        "{projected:?}"
    );
    // The routes' traffic is published as the router publishes itself: a LoadBalancer
    // Service on 80 and 443, to HAProxy's ports in the sidecar.
    let haproxy = pod["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|container| container["name"] == "haproxy")
        .expect("the HAProxy container");
    let port_of = |name: &str| {
        haproxy["ports"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap_or_else(|| panic!("HAProxy's {name} port"))["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!((port_of("http"), port_of("https")), (8080, 8443));
    let router = documents("base/deployment.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Service" && doc["metadata"]["name"] == "certwatch-router")
        .expect("the routes' Service");
    assert_eq!(router["spec"]["type"], "LoadBalancer");
    let published: Vec<(u64, &str)> = router["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|port| {
            (
                port["port"].as_u64().unwrap(),
                port["targetPort"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(published, [(80, "http"), (443, "https")]);
    sidecar_runs_what_certwatch_renders(pod);
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

/// The HAProxy sidecar runs on what certwatch writes, and certwatch drives it: the
/// configuration directory and the cert dir are the same volumes at the same paths in
/// both containers (the configuration names files by their paths); certwatch does not
/// run HAProxy and reloads it through the master CLI the sidecar opens; HAProxy starts
/// once the configuration and the crt-list exist, at certwatch's OpenSSL level, with
/// certwatch's binds; both containers run the same image (so the same user, which the
/// sockets' and bundles' modes need). No ConfigMap configures HAProxy any more.
fn sidecar_runs_what_certwatch_renders(pod: &Value) {
    let containers = pod["containers"].as_sequence().unwrap();
    let (certwatch, haproxy) = (&containers[0], &containers[1]);
    assert_eq!(haproxy["name"], "haproxy");
    assert_eq!(certwatch["image"], haproxy["image"]);
    let env = |container: &Value, name: &str| -> String {
        container["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|variable| variable["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not set"))["value"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let mount = |container: &Value, volume: &str| -> String {
        container["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|mount| mount["name"] == volume)
            .unwrap_or_else(|| panic!("{volume} not mounted in {:?}", container["name"]))
            ["mountPath"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let config_dir = env(certwatch, "CERTWATCH_HAPROXY_CONFIG_DIR");
    assert_eq!(env(certwatch, "CERTWATCH_RUN_HAPROXY"), "false");
    let master = env(certwatch, "CERTWATCH_HAPROXY_MASTER_SOCKET");
    assert_eq!(master, format!("{config_dir}/master.sock"));
    assert_eq!(env(certwatch, "CERTWATCH_HTTP_BIND"), ":8080");
    assert_eq!(env(certwatch, "CERTWATCH_HTTPS_BIND"), ":8443");
    for volume in ["haproxy-run", "certs", "default-cert", "service-ca"] {
        assert_eq!(mount(certwatch, volume), mount(haproxy, volume), "{volume}");
    }
    // Reencrypt backends are verified against the service CA bundle, at a path HAProxy
    // reads in its own container (its configuration names it), from the ConfigMap the
    // service CA operator fills.
    assert_eq!(
        env(certwatch, "CERTWATCH_DEFAULT_DESTINATION_CA"),
        format!("{}/service-ca.crt", mount(certwatch, "service-ca"))
    );
    let service_ca = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "service-ca")
        .unwrap();
    let service_ca_map = documents("base/service-ca.yaml").remove(0);
    assert_eq!(
        service_ca["configMap"]["name"],
        service_ca_map["metadata"]["name"]
    );
    assert_eq!(
        service_ca_map["metadata"]["annotations"]["service.beta.openshift.io/inject-cabundle"],
        "true"
    );
    assert_eq!(mount(certwatch, "haproxy-run"), config_dir);
    let cert_dir = env(certwatch, "CERTWATCH_CERT_DIR");
    assert_eq!(mount(certwatch, "certs"), cert_dir);
    assert!(
        env(certwatch, "CERTWATCH_DEFAULT_CERTIFICATE")
            .starts_with(&format!("{}/", mount(certwatch, "default-cert")))
    );
    assert_eq!(
        env(haproxy, "OPENSSL_CONF"),
        format!("{config_dir}/openssl.cnf")
    );
    let script = haproxy["args"][0].as_str().unwrap();
    let wait = format!(
        "until [ -f {config_dir}/haproxy.cfg ] && [ -f {cert_dir}/crt-list ]; do sleep 1; done\n"
    );
    assert!(script.starts_with(&wait), "{script}");
    assert!(
        script.contains(&format!(
            "\nhaproxy -W -db -S {master},mode,600 -f {config_dir}/haproxy.cfg &\n"
        )),
        "{script}"
    );
    // Stopping: the kubelet's SIGTERM starts the same delay in both containers, and
    // the pod's grace period covers it and HAProxy's drain (tests/production.rs runs
    // the script).
    assert!(script.contains("trap drain TERM"), "{script}");
    let seconds = |text: &str| kube_common::duration::parse(text).unwrap().as_secs();
    let delay = seconds(&env(certwatch, "CERTWATCH_SHUTDOWN_DELAY"));
    assert_eq!(env(haproxy, "SHUTDOWN_DELAY"), delay.to_string());
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert_eq!(
        seconds(&env(certwatch, "CERTWATCH_TERMINATION_GRACE_PERIOD")),
        grace
    );
    let hard_stop = seconds(&env(certwatch, "CERTWATCH_HAPROXY_HARD_STOP_AFTER"));
    assert!(
        delay + hard_stop < grace,
        "{delay} + {hard_stop} >= {grace}"
    );
    // HAProxy's liveness: its own /healthz, where certwatch's configuration puts it.
    assert_eq!(env(certwatch, "CERTWATCH_HAPROXY_HEALTH_BIND"), ":1936");
    assert_eq!(haproxy["livenessProbe"]["httpGet"]["path"], "/healthz");
    let health_port = haproxy["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|port| port["name"] == haproxy["livenessProbe"]["httpGet"]["port"])
        .unwrap();
    assert_eq!(health_port["containerPort"], 1936);
    let kustomization = documents("base/kustomization.yaml");
    for resource in kustomization[0]["resources"].as_sequence().unwrap() {
        let file = format!("base/{}", resource.as_str().unwrap());
        for doc in documents(&file) {
            assert!(
                !(doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == "certwatch-haproxy"),
                "{file}: a static HAProxy configuration"
            );
        }
    }
}

/// The monitoring pieces fit together: the ServiceMonitor scrapes the Service's
/// metrics port over HTTPS, verifying the name the service CA signs, with the scraper
/// identity's token, whose ClusterRole grants get /metrics and nothing else; labels are
/// not honoured (the target's namespace wins); the network policy admits client
/// traffic to HAProxy and scrapes from the monitoring namespaces only.
#[test]
fn monitoring_and_network_policy_fit_together() {
    let deployment = documents("base/deployment.yaml");
    let service = deployment
        .iter()
        .find(|doc| doc["kind"] == "Service")
        .unwrap();
    let pod = &deployment
        .iter()
        .find(|doc| doc["kind"] == "Deployment")
        .unwrap()["spec"]["template"]["spec"];
    let monitor = documents("base/servicemonitor.yaml").remove(0);
    let endpoint = &monitor["spec"]["endpoints"][0];
    // HAProxy's series: the same endpoint, scraped the same way, on its own path.
    let haproxy = &monitor["spec"]["endpoints"][1];
    assert_eq!(haproxy["path"], "/metrics/haproxy");
    for field in ["port", "scheme", "authorization", "tlsConfig"] {
        assert_eq!(haproxy[field], endpoint[field], "{field}");
    }
    // Its own job, as the HAProxy alerts name it.
    assert_eq!(haproxy["relabelings"][0]["targetLabel"], "job");
    assert_eq!(
        haproxy["relabelings"][0]["replacement"],
        "certwatch-haproxy"
    );
    let rules = std::fs::read_to_string(deploy_dir().join("base/prometheusrule.yaml")).unwrap();
    assert!(
        rules.contains("up{job=\"certwatch-haproxy\"} == 0"),
        "{rules}"
    );
    assert_eq!(endpoint["scheme"], "https");
    assert!(endpoint["honorLabels"].is_null() || endpoint["honorLabels"] == false);
    let port = service["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|port| port["name"] == endpoint["port"])
        .unwrap();
    assert_eq!(port["targetPort"], "metrics");
    assert_eq!(
        endpoint["tlsConfig"]["serverName"].as_str().unwrap(),
        format!(
            "{}.{}.svc",
            service["metadata"]["name"].as_str().unwrap(),
            service["metadata"]["namespace"].as_str().unwrap()
        )
    );
    let serving_secret =
        service["metadata"]["annotations"]["service.beta.openshift.io/serving-cert-secret-name"]
            .as_str()
            .unwrap();
    assert!(
        pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .any(|volume| volume["secret"]["secretName"] == serving_secret),
        "the service CA's secret is not mounted"
    );
    let scraper = documents("base/metrics-scraper.yaml");
    let token = scraper.iter().find(|doc| doc["kind"] == "Secret").unwrap();
    assert_eq!(
        endpoint["authorization"]["credentials"]["name"],
        token["metadata"]["name"]
    );
    let reader = scraper
        .iter()
        .find(|doc| doc["kind"] == "ClusterRole")
        .unwrap();
    assert_eq!(
        serde_yaml::to_string(&reader["rules"]).unwrap(),
        "- nonResourceURLs:\n  - /metrics\n  verbs:\n  - get\n"
    );
    let ca = scraper
        .iter()
        .find(|doc| doc["kind"] == "ConfigMap")
        .unwrap();
    assert_eq!(
        endpoint["tlsConfig"]["ca"]["configMap"]["name"],
        ca["metadata"]["name"]
    );

    let policy = documents("base/networkpolicy.yaml").remove(0);
    assert_eq!(
        serde_yaml::to_string(&policy["spec"]["policyTypes"]).unwrap(),
        "- Ingress\n"
    );
    let rules = policy["spec"]["ingress"].as_sequence().unwrap();
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert_eq!(rules[0]["ports"][0]["port"], "https");
    assert_eq!(rules[0]["ports"][1]["port"], "http");
    assert!(rules[0]["from"].is_null(), "client traffic from anywhere");
    assert_eq!(rules[1]["ports"][0]["port"], "metrics");
    assert!(
        rules[1]["from"][0]["namespaceSelector"].is_mapping(),
        "scrapes from the monitoring namespaces only"
    );
}

/// From docs/deploy.md ("HAProxy's connections"): the most a connection HAProxy counts
/// against maxconn costs, KiB.
fn measured_connection_bound_kib() -> f64 {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy.md"),
    )
    .unwrap();
    let row = doc
        .lines()
        .find(|line| line.starts_with("| at most:"))
        .expect("docs/deploy.md has the bound per HAProxy connection");
    let cell = row.split('|').map(str::trim).nth(2).unwrap();
    cell.strip_suffix(" KiB").unwrap().parse().unwrap()
}

/// The upper ends of the measured peaks at 10,000 routes in docs/deploy.md's sizing
/// table: (certwatch, HAProxy), in MiB.
fn measured_peaks_at_10000() -> (f64, f64) {
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy.md"),
    )
    .unwrap();
    let row = doc
        .lines()
        .find(|line| line.starts_with("| 10,000 |"))
        .expect("docs/deploy.md has a sizing row for 10,000 routes");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // "205.2–213.5 MiB (...)": the range's upper end.
    let upper = |cell: &str| -> f64 {
        let range = cell.split(" MiB").next().unwrap();
        range.rsplit('–').next().unwrap().parse().unwrap()
    };
    (upper(cells[2]), upper(cells[3]))
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
        "base/lease-role.yaml",
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
    // As the Deployment runs it: status written by the holder of the Lease
    // certwatch-<router name>, which lease-role.yaml lets it take.
    options.leader_election = Some(route_secrets::api::leader::LeaseOptions::new(
        "certwatch",
        "certwatch-certwatch",
        "certwatch-pod",
    ));
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
    assert!(
        daemon.metrics_text().contains("certwatch_status_leader 1"),
        "the Lease RBAC does not let it lead"
    );
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
        common::delegation::kubectl_with(&self.kubeconfig, args, stdin)
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
    install_prometheus_operator_crds(&plane);

    for overlay in OVERLAYS {
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
        let mut expected = vec![
            "namespace/certwatch",
            "serviceaccount/certwatch",
            "serviceaccount/certwatch-metrics-scraper",
            "secret/certwatch-metrics-scraper-token",
            "deployment.apps/certwatch",
            "service/certwatch",
            "networkpolicy.networking.k8s.io/certwatch",
            "servicemonitor.monitoring.coreos.com/certwatch",
            "prometheusrule.monitoring.coreos.com/certwatch",
            "clusterrole.rbac.authorization.k8s.io/certwatch",
            "clusterrole.rbac.authorization.k8s.io/certwatch-metrics-reader",
            "clusterrolebinding.rbac.authorization.k8s.io/certwatch-auth-delegator",
        ];
        if overlay == "overlays/namespace-selector" {
            expected.push("clusterrole.rbac.authorization.k8s.io/certwatch-namespaces");
        }
        for object in expected {
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

    // Pod Security "restricted", enforced by the base's own namespace: each overlay's
    // pod is admitted there, a privileged one is not.
    let (ok, labels) = plane.kubectl(
        &[
            "get",
            "namespace",
            "certwatch",
            "-o",
            "jsonpath={.metadata.labels.pod-security\\.kubernetes\\.io/enforce}",
        ],
        None,
    );
    assert!(ok && labels == "restricted", "{labels}");
    // No controller-manager runs: the service account a pod without one names is made
    // here.
    let (ok, out) = plane.kubectl(
        &["-n", "certwatch", "create", "serviceaccount", "default"],
        None,
    );
    assert!(ok, "{out}");
    let (ok, out) = plane.kubectl(
        &["apply", "--server-side", "-f", "-"],
        Some("apiVersion: v1\nkind: Pod\nmetadata: {name: privileged, namespace: certwatch}\nspec: {containers: [{name: c, image: x}]}\n"),
    );
    assert!(
        !ok && out.contains("violates PodSecurity"),
        "the level is not enforced: {out}"
    );
    for overlay in OVERLAYS {
        let pod = pod_of(&plane, overlay, "certwatch");
        let (ok, out) = plane.kubectl(&["apply", "--server-side", "-f", "-"], Some(&pod));
        assert!(ok, "{overlay}'s pod is refused:\n{out}\n{pod}");
    }
}

/// The prometheus-operator's ServiceMonitor and PrometheusRule CRDs, established, so that
/// the API server checks those objects against their schemas.
fn install_prometheus_operator_crds(plane: &ControlPlane) {
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
}

/// Every component in `deploy/components/`.
const COMPONENTS: [&str; 6] = [
    "kubernetes",
    "namespace-selector",
    "subject-access-check",
    "loadbalancer",
    "nodeport",
    "host-network",
];

/// Shards rendered with another namespace and a name prefix: none, each component
/// alone, and mixes of the platform, the checks and each way of publishing.
fn combinations() -> Vec<Vec<&'static str>> {
    let mut combinations = vec![vec![]];
    combinations.extend(COMPONENTS.iter().map(|component| vec![*component]));
    combinations.push(vec![
        "kubernetes",
        "namespace-selector",
        "subject-access-check",
        "nodeport",
    ]);
    combinations.push(vec!["kubernetes", "host-network", "namespace-selector"]);
    combinations.push(vec![
        "namespace-selector",
        "subject-access-check",
        "loadbalancer",
    ]);
    combinations
}

/// A shard as docs/deploy.md makes one: a kustomization (in a temporary directory)
/// with a namePrefix, a namespace, the base, `components` and deploy/names as
/// transformers.
fn shard(prefix: &str, namespace: &str, components: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("certwatch-shard-")
        .tempdir()
        .unwrap();
    // kustomize takes relative paths only: from the shard's directory up to / and down.
    let depth = dir.path().canonicalize().unwrap().components().count() - 1;
    let deploy = deploy_dir().canonicalize().unwrap();
    let deploy = format!(
        "{}{}",
        "../".repeat(depth),
        deploy.to_str().unwrap().trim_start_matches('/')
    );
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: {prefix}\nnamespace: {namespace}\nresources:\n  - {deploy}/base\ncomponents:\n"
    );
    if components.is_empty() {
        text.push_str("  []\n");
    }
    for component in components {
        text.push_str(&format!("  - {deploy}/components/{component}\n"));
    }
    text.push_str(&format!("transformers:\n  - {deploy}/names\n"));
    std::fs::write(dir.path().join("kustomization.yaml"), text).unwrap();
    dir
}

/// `kubectl kustomize DIR`: the rendered text.
fn kustomize(dir: &std::path::Path) -> String {
    let output = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl must be on PATH (scripts/test installs it)");
    assert!(
        output.status.success(),
        "{}: {}",
        dir.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

fn parse_all(text: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .filter(|value: &Value| !value.is_null())
        .collect()
}

/// The objects of `kind` among `objects`.
fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|doc| doc["kind"] == kind).collect()
}

/// The one object of `kind` named `name`.
fn named<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = of_kind(objects, kind)
        .into_iter()
        .filter(|doc| doc["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind}/{name}");
    found[0]
}

/// A shard's objects (rendered, or read back from the API server) reference only the
/// shard's own: its router name (the Deployment's name) in the container's variables,
/// the Lease the Role grants, every selector's instance label and the alerts' job; its
/// Service's DNS name in the ServiceMonitor; its scraper account and token. Returns how
/// many references were checked.
fn assert_shard_references_its_own(objects: &[Value], prefix: &str, namespace: &str) -> usize {
    let router = format!("{prefix}certwatch");
    let mut checked = 0;
    let mut check = |what: &str, actual: &Value, expected: &str| {
        assert_eq!(actual.as_str(), Some(expected), "{router}: {what}");
        checked += 1;
    };
    let cluster_scoped = ["Namespace", "ClusterRole", "ClusterRoleBinding"];
    for object in objects {
        let kind = object["kind"].as_str().unwrap();
        let name = object["metadata"]["name"].as_str().unwrap();
        if !cluster_scoped.contains(&kind) {
            check(
                &format!("{kind}/{name}'s namespace"),
                &object["metadata"]["namespace"],
                namespace,
            );
        }
        if kind != "Namespace" {
            assert!(name.starts_with(prefix), "{kind}/{name} lacks {prefix}");
        }
        check(
            &format!("{kind}/{name}'s instance label"),
            &object["metadata"]["labels"]["app.kubernetes.io/instance"],
            &router,
        );
        for subject in object["subjects"].as_sequence().into_iter().flatten() {
            check(
                &format!("{kind}/{name}'s subject namespace"),
                &subject["namespace"],
                namespace,
            );
            assert!(subject["name"].as_str().unwrap().starts_with(prefix));
        }
    }
    let instance = "app.kubernetes.io/instance";

    let deployment = named(objects, "Deployment", &router);
    let spec = &deployment["spec"];
    let env = spec["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let router_name = &env
        .iter()
        .find(|variable| variable["name"] == "CERTWATCH_ROUTER_NAME")
        .unwrap()["value"];
    check("CERTWATCH_ROUTER_NAME", router_name, &router);
    check(
        "Deployment selector",
        &spec["selector"]["matchLabels"][instance],
        &router,
    );
    check(
        "pod label",
        &spec["template"]["metadata"]["labels"][instance],
        &router,
    );
    let pod_spec = &spec["template"]["spec"];
    check(
        "anti-affinity",
        &pod_spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["labelSelector"]["matchLabels"][instance],
        &router,
    );
    for constraint in pod_spec["topologySpreadConstraints"].as_sequence().unwrap() {
        check(
            "spread",
            &constraint["labelSelector"]["matchLabels"][instance],
            &router,
        );
    }

    let role = named(objects, "Role", &format!("{prefix}certwatch-leases"));
    let lease_rules: Vec<&Value> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|rule| !rule["resourceNames"].is_null())
        .collect();
    assert_eq!(lease_rules.len(), 1);
    assert_eq!(
        lease_rules[0]["resourceNames"].as_sequence().unwrap().len(),
        1
    );
    check(
        "Lease in the Role",
        &lease_rules[0]["resourceNames"][0],
        &format!("certwatch-{router}"),
    );

    let services = of_kind(objects, "Service");
    assert!(!services.is_empty());
    for service in &services {
        check(
            "Service selector",
            &service["spec"]["selector"][instance],
            &router,
        );
    }
    let metrics_service = named(objects, "Service", &router);
    for kind in ["PodDisruptionBudget", "ServiceMonitor"] {
        check(
            &format!("{kind} selector"),
            &named(objects, kind, &router)["spec"]["selector"]["matchLabels"][instance],
            &router,
        );
    }
    if let Some(policy) = of_kind(objects, "NetworkPolicy").first() {
        check(
            "NetworkPolicy selector",
            &policy["spec"]["podSelector"]["matchLabels"][instance],
            &router,
        );
    }

    let scraper = format!("{router}-metrics-scraper");
    named(objects, "ServiceAccount", &scraper);
    let token = named(objects, "Secret", &format!("{scraper}-token"));
    check(
        "token Secret's account",
        &token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        &scraper,
    );
    let monitor = named(objects, "ServiceMonitor", &router);
    let server_name = format!(
        "{}.{namespace}.svc",
        metrics_service["metadata"]["name"].as_str().unwrap()
    );
    let endpoints = monitor["spec"]["endpoints"].as_sequence().unwrap();
    assert_eq!(endpoints.len(), 2);
    for endpoint in endpoints {
        check(
            "serverName",
            &endpoint["tlsConfig"]["serverName"],
            &server_name,
        );
        check(
            "scraper token",
            &endpoint["authorization"]["credentials"]["name"],
            &format!("{scraper}-token"),
        );
        let ca = &endpoint["tlsConfig"]["ca"]["configMap"]["name"];
        if !ca.is_null() {
            named(objects, "ConfigMap", ca.as_str().unwrap());
            check("metrics CA", ca, &format!("{router}-metrics-ca"));
        }
    }
    let haproxy_job = format!("{router}-haproxy");
    check(
        "HAProxy's job",
        &endpoints[1]["relabelings"][0]["replacement"],
        &haproxy_job,
    );

    // The alerts select the scrapes' job (the Service's name), this shard's only.
    let rule = named(objects, "PrometheusRule", &router);
    let mut jobs = Vec::new();
    for group in rule["spec"]["groups"].as_sequence().unwrap() {
        for alert in group["rules"].as_sequence().unwrap() {
            let expr = alert["expr"].as_str().unwrap();
            for (start, _) in expr.match_indices("job=\"") {
                let rest = &expr[start + 5..];
                jobs.push(rest[..rest.find('"').unwrap()].to_owned());
            }
        }
    }
    assert!(jobs.contains(&router), "{jobs:?}");
    assert!(jobs.contains(&haproxy_job), "{jobs:?}");
    for job in jobs {
        assert!(
            job == router || job == haproxy_job,
            "{router}: alert job {job}"
        );
        checked += 1;
    }
    checked
}

/// The base and every combination of components render as a shard with another
/// namespace and a name prefix, and every name that depends on another follows.
#[test]
fn components_combine_and_a_shard_names_only_its_own() {
    let mut checked = 0;
    for components in combinations() {
        let dir = shard("edge-", "ingress-edge", &components);
        let text = kustomize(dir.path());
        // Nothing of the base's own names that others depend on is left over.
        for stale in [
            "certwatch.certwatch.svc",
            "job=\"certwatch",
            "certwatch-certwatch",
        ] {
            assert!(!text.contains(stale), "{components:?}: {stale}\n{text}");
        }
        let objects = parse_all(&text);
        checked += assert_shard_references_its_own(&objects, "edge-", "ingress-edge");
        let deployment = named(&objects, "Deployment", "edge-certwatch");
        let pod_spec = &deployment["spec"]["template"]["spec"];
        let env: Vec<&str> = pod_spec["containers"][0]["env"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(|variable| variable["name"].as_str().unwrap())
            .collect();
        // Each component's own change is there.
        assert_eq!(
            env.contains(&"CERTWATCH_NAMESPACE_SELECTOR"),
            components.contains(&"namespace-selector")
        );
        assert_eq!(
            env.contains(&"CERTWATCH_ACCESS_CHECK"),
            components.contains(&"subject-access-check")
        );
        assert_eq!(
            env.contains(&"CERTWATCH_METRICS_TLS_CERT"),
            !components.contains(&"kubernetes")
        );
        assert_eq!(
            pod_spec["securityContext"]["runAsUser"].as_u64(),
            components.contains(&"kubernetes").then_some(65532)
        );
        assert_eq!(
            of_kind(&objects, "ClusterRole")
                .iter()
                .any(|role| role["metadata"]["name"] == "edge-certwatch-namespaces"),
            components.contains(&"namespace-selector")
        );
        let publishing = of_kind(&objects, "Service")
            .into_iter()
            .find(|service| service["metadata"]["name"] == "edge-certwatch-router");
        if components.contains(&"host-network") {
            assert!(publishing.is_none());
            assert_eq!(pod_spec["hostNetwork"], true);
            let ports: Vec<(u64, u64)> = pod_spec["containers"][1]["ports"]
                .as_sequence()
                .unwrap()
                .iter()
                .map(|port| {
                    (
                        port["containerPort"].as_u64().unwrap(),
                        port["hostPort"].as_u64().unwrap(),
                    )
                })
                .collect();
            assert_eq!(ports, [(80, 80), (443, 443), (1936, 1936)]);
        } else {
            assert!(pod_spec["hostNetwork"].is_null());
            let expected = if components.contains(&"nodeport") {
                "NodePort"
            } else {
                "LoadBalancer"
            };
            assert_eq!(publishing.unwrap()["spec"]["type"], expected);
        }
    }
    assert!(checked > 0);
}

/// Two shards side by side on a real control plane, applied server-side (the CRDs
/// installed, so the ServiceMonitor and PrometheusRule are checked against their
/// schemas): each shard's objects, read back from the API server, reference only its
/// own.
#[test]
fn two_shards_apply_side_by_side_and_reference_only_their_own() {
    let plane = ControlPlane::start();
    install_prometheus_operator_crds(&plane);
    let shards = [
        ("north-", "shard-north", vec![]),
        (
            "south-",
            "shard-south",
            vec!["kubernetes", "namespace-selector"],
        ),
    ];
    for (prefix, namespace, components) in &shards {
        let dir = shard(prefix, namespace, components);
        let text = kustomize(dir.path());
        let (ok, out) = plane.kubectl(&["apply", "--server-side", "-f", "-"], Some(&text));
        assert!(ok, "{prefix}: {out}");
        assert!(
            out.contains(&format!(
                "deployment.apps/{prefix}certwatch serverside-applied"
            )),
            "{out}"
        );
    }
    for (prefix, namespace, _) in &shards {
        let mut objects = Vec::new();
        for args in [
            vec![
                "get",
                "-n",
                namespace,
                "deployment,service,role,rolebinding,serviceaccount,secret,configmap,poddisruptionbudget,networkpolicy,servicemonitor,prometheusrule",
                "-o",
                "yaml",
            ],
            vec![
                "get",
                "namespace,clusterrole,clusterrolebinding",
                "-l",
                &format!("app.kubernetes.io/instance={prefix}certwatch"),
                "-o",
                "yaml",
            ],
        ] {
            let (ok, out) = plane.kubectl(&args, None);
            assert!(ok, "{out}");
            let list: Value = serde_yaml::from_str(&out).unwrap();
            objects.extend(
                list["items"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    // What the API server makes itself in every namespace.
                    .filter(|object| {
                        !(object["kind"] == "ConfigMap"
                            && object["metadata"]["name"] == "kube-root-ca.crt")
                    })
                    .cloned(),
            );
        }
        assert!(
            of_kind(&objects, "Namespace").len() == 1
                && of_kind(&objects, "ClusterRoleBinding").len() >= 2,
            "{prefix}: {objects:?}"
        );
        let checked = assert_shard_references_its_own(&objects, prefix, namespace);
        assert!(checked > 20, "{prefix}: {checked}");
    }
}

/// Two replicas that never leave zero ready pods: a PodDisruptionBudget that keeps one,
/// a rolling update that surges before it retires, spreading over nodes and zones, and
/// the Lease that elects the status writer in the pods' namespace.
#[test]
fn the_deployment_is_highly_available() {
    let deployment = documents("base/deployment.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Deployment")
        .unwrap();
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 2);
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(spec["strategy"]["rollingUpdate"]["maxSurge"], 1);
    let labels = &spec["template"]["metadata"]["labels"];
    let spread = spec["template"]["spec"]["topologySpreadConstraints"]
        .as_sequence()
        .unwrap();
    let keys: Vec<&str> = spread
        .iter()
        .map(|constraint| constraint["topologyKey"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    );
    for constraint in spread {
        assert_eq!(&constraint["labelSelector"]["matchLabels"], labels);
    }
    // Never two replicas of one generation on a node; critical, Linux nodes only.
    let pod_spec = &spec["template"]["spec"];
    let anti = &pod_spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        [0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(&anti["labelSelector"]["matchLabels"], labels);
    assert_eq!(anti["matchLabelKeys"][0], "pod-template-hash");
    assert_eq!(pod_spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(pod_spec["nodeSelector"]["kubernetes.io/os"], "linux");
    // The budget never blocks a drain, even of a lone replica.
    let budget = documents("base/poddisruptionbudget.yaml").remove(0);
    assert!(budget["spec"]["minAvailable"].is_null());
    assert_eq!(budget["spec"]["maxUnavailable"], "50%");
    assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);
    // The Lease's name follows the router name the container is given.
    let env = spec["template"]["spec"]["containers"][0]["env"]
        .as_sequence()
        .unwrap();
    let router = env
        .iter()
        .find(|variable| variable["name"] == "CERTWATCH_ROUTER_NAME")
        .unwrap()["value"]
        .as_str()
        .unwrap();
    let role = documents("base/lease-role.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Role")
        .unwrap();
    let named: Vec<&Value> = role["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter(|rule| !rule["resourceNames"].is_null())
        .collect();
    assert_eq!(named.len(), 1);
    assert_eq!(
        named[0]["resourceNames"][0].as_str().unwrap(),
        format!("certwatch-{router}")
    );
}

/// Every kustomization in `deploy/`.
const OVERLAYS: [&str; 4] = [
    "base",
    "kubernetes",
    "overlays/namespace-selector",
    "overlays/subject-access-check",
];

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

/// Probes that match the design: certwatch configured as the Deployment configures it
/// (its variables, with local paths and free ports) and started while the API server
/// is not there keeps answering the probe that restarts the container (liveness; the
/// pod has no startup probe) through retry after retry, while its readiness probe says
/// not ready. So an API outage at start never kills the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_at_start_never_fails_a_probe_that_restarts() {
    let deployment = documents("base/deployment.yaml")
        .into_iter()
        .find(|doc| doc["kind"] == "Deployment")
        .unwrap();
    let container = deployment["spec"]["template"]["spec"]["containers"][0].clone();
    let temp = tempfile::tempdir().unwrap();
    let local = |name: &str, value: &str| -> String {
        match name {
            "CERTWATCH_CERT_DIR" => temp.path().join("certs").display().to_string(),
            "CERTWATCH_HAPROXY_CONFIG_DIR" => temp.path().join("haproxy").display().to_string(),
            "CERTWATCH_HAPROXY_MASTER_SOCKET" => temp
                .path()
                .join("haproxy/master.sock")
                .display()
                .to_string(),
            "CERTWATCH_HTTP_BIND" | "CERTWATCH_HTTPS_BIND" => {
                format!("127.0.0.1:{}", common::free_port())
            }
            // A self-signed one in the configuration directory.
            "CERTWATCH_DEFAULT_CERTIFICATE" => String::new(),
            "CERTWATCH_LISTEN" | "CERTWATCH_METRICS_LISTEN" => "127.0.0.1:0".to_owned(),
            "CERTWATCH_METRICS_TLS_CERT" | "CERTWATCH_METRICS_TLS_KEY" => String::new(),
            // A service CA bundle of the test's own where the operator's would be.
            "CERTWATCH_DEFAULT_DESTINATION_CA" => {
                let path = temp.path().join("service-ca.crt");
                std::fs::write(&path, common::traffic::TestCa::new("service-ca").pem).unwrap();
                path.display().to_string()
            }
            _ => value.to_owned(),
        }
    };
    // Nothing listens on port 1.
    let kubeconfig = temp.path().join("down.kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"https://127.0.0.1:1\"}}]\n\
         users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n",
    )
    .unwrap();
    let mut launch = common::Launch::new(
        &kubeconfig,
        &temp.path().join("certs"),
        &temp.path().join("certwatch.log"),
    );
    for variable in container["env"].as_sequence().unwrap() {
        let name = variable["name"].as_str().unwrap();
        let value = local(name, variable["value"].as_str().unwrap_or_default());
        // The serving certificate's files are the service CA's: self-signed here.
        if !value.is_empty() {
            launch = launch.env(name, &value);
        }
    }
    let json = container["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|variable| variable["name"] == "CERTWATCH_LOG_FORMAT" && variable["value"] == "json");
    assert!(json, "the deployment logs JSON");
    let mut certwatch = common::Certwatch::launch(launch.json());
    let probe_port = |probe: &Value| {
        assert_eq!(probe["httpGet"]["port"], "probes", "{probe:?}");
        certwatch.addr
    };
    // The route list failed: the outage has begun (its retries then wait for the
    // prober to see the API server answer again).
    common::eventually("a failed route list", || {
        certwatch
            .log_text()
            .contains("route watch failed; retrying")
            .then_some(())
    })
    .await;
    let liveness = &container["livenessProbe"];
    let threshold = liveness["failureThreshold"].as_u64().unwrap_or(3);
    let path = liveness["httpGet"]["path"].as_str().unwrap();
    for _ in 0..=threshold {
        let (status, body) = common::http_request(probe_port(liveness), "GET", path, "");
        assert_eq!(status, 200, "liveness {path}: {body}");
    }
    let readiness = &container["readinessProbe"];
    let path = readiness["httpGet"]["path"].as_str().unwrap();
    let (status, body) = common::http_request(probe_port(readiness), "GET", path, "");
    assert_eq!(status, 503, "readiness {path}: {body}");
    assert!(body.contains("waiting for the list of routes"), "{body}");
    assert!(certwatch.exited().is_none());
    assert_eq!(certwatch.terminate().code(), Some(0));
}
