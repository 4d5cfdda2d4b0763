//! How long traffic takes to follow a change through the HAProxy certwatch runs, at
//! scale: N generated routes (each with its own secret) in the simulator, the
//! `certwatch` binary given with `--haproxy-config-dir`, and real backends.
//!
//! - **endpoint change → traffic on the new server**: one route's service gets a second
//!   endpoint (its EndpointSlice replaced through the API); from the write until an
//!   HTTPS request through HAProxy is answered by the new backend. Then the endpoint is
//!   taken away again (until the old backend alone answers), repeated `--samples` times.
//! - **route added → served**: a route created through the API (its namespace, secret,
//!   grant, service and endpoint made beforehand); from the write until an HTTPS request
//!   for its host is answered by its backend under its certificate.
//!
//! ```sh
//! cargo build --profile dist -p certwatch -p certwatch-lab --examples
//! target/dist/examples/routing_latency --certwatch target/dist/certwatch --routes 2000
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use certwatch_lab::traffic::{DemoBackend, https_get};
use clap::Parser;
use kube_sim::{GenerateSpec, SimConfig, Simulator};

#[derive(Parser)]
struct Args {
    /// The certwatch binary to measure.
    #[arg(long)]
    certwatch: PathBuf,
    /// Generated routes (each with its own secret).
    #[arg(long, default_value_t = 2_000)]
    routes: usize,
    /// Namespaces they are spread over.
    #[arg(long, default_value_t = 20)]
    namespaces: usize,
    /// Endpoint changes measured (each an addition and a removal).
    #[arg(long, default_value_t = 5)]
    samples: usize,
    /// Where certwatch's log goes (default: the run's temporary directory).
    #[arg(long)]
    log: Option<PathBuf>,
    /// certwatch's log filter (`RUST_LOG`).
    #[arg(long, default_value = "warn")]
    log_filter: String,
}

fn free() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// One EndpointSlice per backend (`<service>-<n>`, each on its backend's port), as
/// YAML documents for `load_manifests`.
fn slice(namespace: &str, service: &str, backends: &[&DemoBackend]) -> String {
    backends
        .iter()
        .enumerate()
        .map(|(n, backend)| {
            serde_json::to_string(&serde_json::json!({
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": format!("{service}-{n}"), "namespace": namespace,
                             "labels": {"kubernetes.io/service-name": service}},
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": backend.addr.port(), "protocol": "TCP"}],
                "endpoints": [{"addresses": [backend.addr.ip().to_string()],
                               "conditions": {"ready": true}}],
            }))
            .unwrap()
        })
        .collect::<Vec<_>>()
        .join("\n---\n")
}

async fn answered_by(https: SocketAddr, host: &str) -> Option<String> {
    https_get(https, host)
        .await
        .filter(|a| a.status == 200)
        .and_then(|a| a.backend)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    let test_host = testenv::netns::TestHost::shared()
        .expect("a test host for the backends (root and iproute2)");
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let cluster = sim
        .generate(&GenerateSpec::new(args.routes, args.namespaces))
        .unwrap();
    let admin = sim.client("admin").await.unwrap();
    let route = &cluster.routes[0];
    let (namespace, host) = (route.namespace.clone(), route.host.clone());
    let first = DemoBackend::start("first", test_host).await.unwrap();
    sim.load_manifests(
        &serde_json::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "svc-0", "namespace": namespace},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}))
        .unwrap(),
    )
    .unwrap();
    sim.load_manifests(&slice(&namespace, "svc-0", &[&first]))
        .unwrap();
    // The route added later: its namespace, secret and grant exist before certwatch
    // starts, its service and endpoint too.
    let late_ns = "late";
    let late_backend = DemoBackend::start("late", test_host).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let (http, https) = (free(), free());
    let mut child = Command::new(&args.certwatch)
        .arg("run")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cert-dir")
        .arg(dir.path().join("certs"))
        .arg("--haproxy-config-dir")
        .arg(dir.path().join("haproxy"))
        .args([
            "--http-bind",
            &http.to_string(),
            "--https-bind",
            &https.to_string(),
        ])
        .args([
            "--listen",
            "127.0.0.1:0",
            "--progress",
            "off",
            "--haproxy-max-connections",
            "4000",
        ])
        .env("RUST_LOG", &args.log_filter)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::File::create(
                args.log
                    .clone()
                    .unwrap_or_else(|| dir.path().join("certwatch.log")),
            )
            .unwrap(),
        )
        .spawn()
        .unwrap();
    let started = Instant::now();
    while answered_by(https, &host).await.as_deref() != Some("first") {
        assert!(started.elapsed() < Duration::from_secs(900), "never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{} routes: first request served through HAProxy {:.1} s after certwatch started",
        args.routes,
        started.elapsed().as_secs_f64()
    );

    let second = DemoBackend::start("second", test_host).await.unwrap();
    let slices = kube::Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(
        admin.clone(),
        &namespace,
    );
    let mut added = Vec::new();
    let mut removed = Vec::new();
    for _ in 0..args.samples {
        let body: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_str(
            slice(&namespace, "svc-0", &[&first, &second])
                .split("\n---\n")
                .nth(1)
                .unwrap(),
        )
        .unwrap();
        let at = Instant::now();
        slices
            .create(&kube::api::PostParams::default(), &body)
            .await
            .unwrap();
        'seen: loop {
            for _ in 0..4 {
                if answered_by(https, &host).await.as_deref() == Some("second") {
                    break 'seen;
                }
            }
            assert!(
                at.elapsed() < Duration::from_secs(300),
                "the new endpoint never answered"
            );
        }
        added.push(at.elapsed());
        let at = Instant::now();
        slices
            .delete("svc-0-1", &kube::api::DeleteParams::default())
            .await
            .unwrap();
        'gone: loop {
            let mut all_first = true;
            for _ in 0..8 {
                if answered_by(https, &host).await.as_deref() != Some("first") {
                    all_first = false;
                }
            }
            if all_first {
                break 'gone;
            }
            assert!(
                at.elapsed() < Duration::from_secs(300),
                "the removed endpoint kept answering"
            );
        }
        removed.push(at.elapsed());
    }
    added.sort();
    removed.sort();
    println!(
        "{} routes: endpoint added → traffic on the new server: p50 {:.0} ms, max {:.0} ms ({} samples); endpoint removed → no more traffic on it: p50 {:.0} ms, max {:.0} ms",
        args.routes,
        percentile(&added, 0.5).as_secs_f64() * 1000.0,
        added.last().unwrap().as_secs_f64() * 1000.0,
        added.len(),
        percentile(&removed, 0.5).as_secs_f64() * 1000.0,
        removed.last().unwrap().as_secs_f64() * 1000.0,
    );

    // Route added → served: a namespace of its own (its access answers are fresh).
    let late_host = "late.example";
    sim.load_manifests(&format!(
        "{{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{{\"name\":\"{late_ns}\"}}}}"
    ))
    .unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let certificate = rcgen::CertificateParams::new(vec![late_host.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let b64 = |text: String| base64_encode(text.as_bytes());
    sim.load_manifests(
        &serde_json::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "late-tls", "namespace": late_ns}, "type": "kubernetes.io/tls",
            "data": {"tls.crt": b64(certificate.pem()), "tls.key": b64(key.serialize_pem())}}))
        .unwrap(),
    )
    .unwrap();
    sim.grant_router_secrets(late_ns, &["late-tls"]).unwrap();
    sim.load_manifests(
        &serde_json::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "late", "namespace": late_ns},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 8443}]}}))
        .unwrap(),
    )
    .unwrap();
    sim.load_manifests(&slice(late_ns, "late", &[&late_backend]))
        .unwrap();
    let route: route_secrets::route::Route = serde_json::from_value(serde_json::json!({
        "apiVersion": "route.openshift.io/v1", "kind": "Route",
        "metadata": {"name": "late", "namespace": late_ns},
        "spec": {"host": late_host, "to": {"kind": "Service", "name": "late"},
                 "port": {"targetPort": "https"},
                 "tls": {"termination": "edge", "externalCertificate": {"name": "late-tls"}}}}))
    .unwrap();
    let expected = route_secrets::tls::Sha256Fingerprint::of(certificate.der());
    // Reloads come at most every 5 s (--haproxy-min-reload-interval): the last load is
    // left that far behind, so that what is measured is the way to being served, not
    // the wait for the interval (at most 5 s more).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let at = Instant::now();
    eprintln!("route added at {}", jiff::Timestamp::now());
    kube::Api::<route_secrets::route::Route>::namespaced(admin.clone(), late_ns)
        .create(&kube::api::PostParams::default(), &route)
        .await
        .unwrap();
    loop {
        let answer = https_get(https, late_host).await;
        if answer.as_ref().is_some_and(|a| {
            a.status == 200
                && a.backend.as_deref() == Some("late")
                && a.certificate == Some(expected)
        }) {
            break;
        }
        assert!(
            at.elapsed() < Duration::from_secs(900),
            "the new route was never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "{} routes: route added → served (its backend, its certificate): {:.2} s",
        args.routes,
        at.elapsed().as_secs_f64()
    );
    let _ = child.kill();
    let _ = child.wait();
    drop(sim);
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
