//! Judged by the real router: the same routes, secrets, Services and EndpointSlices on
//! the real control plane (testenv), served by the real OpenShift router
//! (`../shared/tools/openshift-router`, its own HAProxy) and by certwatch
//! (`--haproxy-config-dir`, the HAProxy it runs, `--write-status`), each under its own
//! router name, for every route kind (no TLS; edge with an external, an inline or no
//! certificate of its own; passthrough; reencrypt without, with a right and with a wrong
//! destination CA) and for every per-route feature (allow lists, HSTS, rewrites, a
//! route by `spec.subdomain`, header case, header actions, the route's own
//! `caCertificate`, rate limits, the destination CA secret annotation), both with the
//! same error pages of the operator's (`ROUTER_ERRORFILE_503`/`404`,
//! `--error-page-503`/`404`); once both have
//! admitted every route, the same HTTP and HTTPS (SNI) requests go through both to real
//! backends on this machine, and per route the status (or a closed connection), who
//! answered (and how weights split the requests), the certificate served, the ALPN
//! negotiated, the redirect, the path and headers the backend received and the headers
//! the client received are compared; then an endpoint is added and one removed, and
//! both must send to the same backends. An idled service (its cluster IP, which no test
//! traffic goes to) is compared in both configurations: the same server, unchecked.
//!
//! Every difference is either none or one of [`DELIBERATE`], listed in docs/daemon.md
//! with its reason; a difference not in the list fails the test, and so does a listed
//! one that no longer happens (the list cannot grow or go stale silently).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::routing::{Routing, RoutingLaunch};
use common::traffic::{
    Backend, Response, create_service, http_get, https_get, set_endpoints, set_endpoints_each,
};
use common::{create_route_spec, create_tls_secret, eventually_async};
use kube::api::Api;
use route_secrets::route::Route;
use testenv::{ControlPlane, ControlPlaneOptions, Installer};

const NS: &str = "shop";

/// A route of a per-route feature: name, host, spec (without the host), annotations.
type Feature<'a> = (&'a str, &'a str, serde_json::Value, Vec<(&'a str, &'a str)>);

/// The header names whose case both routers adjust (`ROUTER_H1_CASE_ADJUST`,
/// `--http-header-name-case-adjustments`).
const CASE_ADJUST: &str = "Host,X-Backend";

/// The routers' domain (`ROUTER_DOMAIN`, `--router-domain`), for `spec.subdomain`.
const DOMAIN: &str = "apps.example";

/// The operator's 503 page both routers serve: it says so in `x-backend` (what the
/// test client reports as who answered).
const PAGE_503: &str = "HTTP/1.0 503 Service Unavailable\r\nx-backend: page-503\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\nunavailable\n";
/// The operator's 404 page (requests no route takes).
const PAGE_404: &str = "HTTP/1.0 404 Not Found\r\nx-backend: page-404\r\nConnection: close\r\nContent-Type: text/plain\r\n\r\nno route\n";

/// Differences between the router's answers and certwatch's that are deliberate or
/// known, by (route, request): what each says. Mirrored in docs/daemon.md ("Traffic
/// compared with the real router"): none today.
const DELIBERATE: &[(&str, &str, &str)] = &[];

/// The real router, from the shared tool, on a control plane; stopped when dropped.
struct RealRouter {
    tool: PathBuf,
    dir: PathBuf,
    env: BTreeMap<String, String>,
}

impl RealRouter {
    fn tool() -> PathBuf {
        std::env::var_os("CERTWATCH_TEST_OPENSHIFT_ROUTER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/openshift-router")
            })
    }

    /// Starts the router; `pages`: its 503 and 404 error page files.
    fn start(kubeconfig: &Path, dir: &Path, name: &str, pages: (&Path, &Path)) -> Self {
        let tool = Self::tool();
        assert!(
            tool.join("start").exists(),
            "the real router's tool is missing at {} (set CERTWATCH_TEST_OPENSHIFT_ROUTER)",
            tool.display()
        );
        let output = Command::new(tool.join("start"))
            .arg(dir)
            .env("KUBECONFIG", kubeconfig)
            .env("ROUTER_NAME", name)
            .env("ROUTER_MAX_CONNECTIONS", "2000")
            .env("ROUTER_DOMAIN", DOMAIN)
            .env("ROUTER_H1_CASE_ADJUST", CASE_ADJUST)
            .env("ROUTER_ERRORFILE_503", pages.0)
            .env("ROUTER_ERRORFILE_404", pages.1)
            .output()
            .expect("run the router tool's start");
        assert!(
            output.status.success(),
            "the real router did not start: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let env = std::fs::read_to_string(dir.join("env"))
            .unwrap()
            .lines()
            .filter_map(|line| line.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        Self {
            tool,
            dir: dir.to_owned(),
            env,
        }
    }

    fn port(&self, name: &str) -> u16 {
        self.env[name].parse().unwrap()
    }

    fn ready(&self) -> bool {
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port("ROUTER_STATS_PORT"))
            .parse()
            .unwrap();
        common::http_request(addr, "GET", "/healthz/ready", "").0 == 200
    }
}

impl Drop for RealRouter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("router.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- router log ---\n{}",
                lines[lines.len().saturating_sub(60)..].join("\n")
            );
        }
        let _ = Command::new(self.tool.join("stop")).arg(&self.dir).output();
    }
}

/// Applies the router's cluster rights (the tool's rbac.yaml) as admin.
fn apply_router_rbac(kubeconfig: &Path) {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", "admin", "apply", "--server-side", "-f"])
        .arg(RealRouter::tool().join("rbac.yaml"))
        .output()
        .expect("kubectl must be installed (scripts/test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// What one request through one router got, as compared.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    status: Option<u16>,
    location: Option<String>,
    certificate: Option<String>,
    alpn: Option<String>,
    backends: BTreeSet<String>,
    /// The path the backend received (after any rewrite).
    path: Option<String>,
    /// The `Strict-Transport-Security` header of the response.
    hsts: Option<String>,
    /// The Host header's name as the backend received it (its case).
    host_header: Option<String>,
    /// The `x-backend` header's name as the client received it (its case).
    backend_header: Option<String>,
    /// The `x-added` request header the backend received.
    echo_added: Option<String>,
    /// The `x-resp` response header.
    x_resp: Option<String>,
}

/// Names a certificate: the route's secret it is, or `default`.
fn certificate_name(der: &Option<Vec<u8>>, leaves: &BTreeMap<Vec<u8>, String>) -> Option<String> {
    der.as_ref().map(|der| {
        leaves
            .get(der)
            .cloned()
            .unwrap_or_else(|| "default".to_owned())
    })
}

fn seen(responses: &[Option<Response>], leaves: &BTreeMap<Vec<u8>, String>) -> Seen {
    let first = responses.first().cloned().flatten();
    Seen {
        status: first.as_ref().map(|r| r.status),
        location: first.as_ref().and_then(|r| r.location.clone()),
        certificate: first
            .as_ref()
            .and_then(|r| certificate_name(&r.certificate, leaves)),
        alpn: first.as_ref().and_then(|r| r.alpn.clone()),
        path: first.as_ref().and_then(|r| r.path.clone()),
        hsts: first.as_ref().and_then(|r| r.hsts.clone()),
        host_header: first.as_ref().and_then(|r| r.host_header.clone()),
        backend_header: first.as_ref().and_then(|r| r.backend_header.clone()),
        echo_added: first.as_ref().and_then(|r| r.echo_added.clone()),
        x_resp: first.as_ref().and_then(|r| r.x_resp.clone()),
        backends: responses
            .iter()
            .flatten()
            .filter_map(|r| r.backend.clone())
            .collect(),
    }
}

/// Sends the comparison's requests for `host` through one router's HAProxy.
async fn requests(
    http: SocketAddr,
    https: SocketAddr,
    host: &str,
    leaves: &BTreeMap<Vec<u8>, String>,
) -> Vec<(&'static str, Seen)> {
    let mut out = Vec::new();
    let mut plain = Vec::new();
    let mut tls = Vec::new();
    for _ in 0..8 {
        plain.push(http_get(http, host, "/a/b?c=1").await);
        tls.push(https_get(https, host, "/a/b?c=1", false).await);
    }
    out.push(("http", seen(&plain, leaves)));
    let tls_seen = seen(&tls, leaves);
    out.push((
        "https status",
        Seen {
            alpn: None,
            ..tls_seen.clone()
        },
    ));
    let h2 = https_get(https, host, "/", true).await;
    out.push((
        "https alpn",
        Seen {
            status: None,
            location: None,
            certificate: None,
            alpn: h2.as_ref().and_then(|r| r.alpn.clone()),
            backends: BTreeSet::new(),
            path: None,
            hsts: None,
            host_header: None,
            backend_header: None,
            echo_added: None,
            x_resp: None,
        },
    ));
    out
}

/// A route's inline certificate: self-signed for its host.
struct Inline {
    certificate: String,
    key: String,
    der: Vec<u8>,
}

impl Inline {
    fn new(host: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec![host.to_owned()]).unwrap();
        let certificate = params.self_signed(&key).unwrap();
        Self {
            certificate: certificate.pem(),
            key: key.serialize_pem(),
            der: certificate.der().to_vec(),
        }
    }
}

fn certificate_pem(der: &[u8]) -> String {
    pem::encode(&pem::Pem::new("CERTIFICATE", der.to_vec()))
}

/// Creates route `name` in [`NS`] with `spec` and `annotations`.
async fn create_annotated_route(
    admin: &kube::Client,
    name: &str,
    spec: serde_json::Value,
    annotations: &[(&str, &str)],
) {
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let route: Route = serde_json::from_value(serde_json::json!({
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": spec,
    }))
    .unwrap();
    Api::<Route>::namespaced(admin.clone(), NS)
        .create(&kube::api::PostParams::default(), &route)
        .await
        .unwrap();
}

/// The host router `name` wrote in route `route`'s `status.ingress[]` entry.
async fn status_host(admin: &kube::Client, route: &str, name: &str) -> Option<String> {
    let route = Api::<Route>::namespaced(admin.clone(), NS)
        .get(route)
        .await
        .unwrap();
    let value = serde_json::to_value(&route).unwrap();
    value["status"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|ingress| ingress["routerName"] == name)
        .and_then(|ingress| ingress["host"].as_str().map(str::to_owned))
}

/// How many of `count` TLS connections to `sni` the proxy at `addr` lets through to a
/// backend's handshake, all held open together.
async fn held_connections(addr: SocketAddr, sni: &str, count: usize) -> usize {
    let mut held = Vec::new();
    for _ in 0..count {
        if let Some(session) = testenv::tls_probe::connect(addr, sni, &[b"http/1.1"]).await {
            held.push(session);
        }
    }
    held.len()
}

/// The certificates (DER) the proxy at `addr` presents for `sni`, in the order served.
async fn served_chain(addr: SocketAddr, sni: &str) -> Vec<Vec<u8>> {
    let Some(session) = testenv::tls_probe::connect(addr, sni, &[b"http/1.1"]).await else {
        return Vec::new();
    };
    session
        .stream
        .get_ref()
        .1
        .peer_certificates()
        .into_iter()
        .flatten()
        .map(|der| der.to_vec())
        .collect()
}

/// The statuses of `count` HTTPS requests to `host` in a row (0: no answer).
async fn statuses(addr: SocketAddr, host: &str, count: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..count {
        out.push(
            https_get(addr, host, "/", false)
                .await
                .map_or(0, |r| r.status),
        );
    }
    out
}

/// The routes in [`NS`] that router `name` has written `Admitted: True` for.
async fn admitted_by(admin: &kube::Client, name: &str) -> BTreeSet<String> {
    let routes = Api::<Route>::namespaced(admin.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    routes
        .items
        .iter()
        .filter(|route| {
            let value = serde_json::to_value(route).unwrap();
            value["status"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|ingress| ingress["routerName"] == name)
                .flat_map(|ingress| {
                    ingress["conditions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                })
                .any(|c| c["type"] == "Admitted" && c["status"] == "True")
        })
        .filter_map(|route| route.metadata.name.clone())
        .collect()
}

/// The share of requests `backend` answered, out of `count` HTTPS requests.
async fn share(https: SocketAddr, host: &str, backend: &str, count: usize) -> f64 {
    let mut hits = 0;
    for _ in 0..count {
        if https_get(https, host, "/", false)
            .await
            .and_then(|r| r.backend)
            .as_deref()
            == Some(backend)
        {
            hits += 1;
        }
    }
    f64::from(hits) / count as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_through_certwatch_matches_the_real_router() {
    let dir = tempfile::tempdir().unwrap();
    let control_plane = ControlPlane::start_with(ControlPlaneOptions::from_env())
        .await
        .unwrap();
    let admin = control_plane.admin_client().await.unwrap();
    let kubeconfig = control_plane.kubeconfig_path().to_owned();
    apply_router_rbac(&kubeconfig);
    let installer = Installer::new(admin.clone());
    // The router identity's cluster role for certwatch (routes, status, reviews,
    // services and EndpointSlices) and the namespace.
    installer
        .generate(&kube_sim::GenerateSpec::new(1, 1))
        .await
        .unwrap();
    installer.namespace(NS).await.unwrap();

    let blue = [Backend::http("blue-1").await, Backend::http("blue-2").await];
    let green = Backend::http("green-1").await;
    let secure = Backend::https("secure-1", "secure.shop.svc").await;
    // A passthrough route's backend presents its own certificate to the client; a
    // reencrypt route's backend with a destination CA of its own.
    let pass = Backend::https("pass-1", "pass.example").await;
    let pinned = Backend::https("pinned-1", "pinned.shop.svc").await;
    for service in ["blue", "green", "secure", "pass", "pinned"] {
        create_service(&admin, NS, service).await;
    }
    set_endpoints_each(&admin, NS, "blue", &[&blue[0], &blue[1]]).await;
    set_endpoints(&admin, NS, "green", &[&green]).await;
    set_endpoints(&admin, NS, "secure", &[&secure]).await;
    set_endpoints(&admin, NS, "pass", &[&pass]).await;
    set_endpoints(&admin, NS, "pinned", &[&pinned]).await;
    // An idled service: its slice empty, its cluster IP the API server's (no request
    // goes to it: only the configurations are compared).
    let idled: k8s_openapi::api::core::v1::Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "idle", "namespace": NS,
                     "annotations": {"idling.alpha.openshift.io/idled-at": "2026-12-06T05:00:00Z"}},
        "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": "http"}]},
    }))
    .unwrap();
    let idled = Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), NS)
        .create(&kube::api::PostParams::default(), &idled)
        .await
        .unwrap();
    let cluster_ip = idled
        .spec
        .and_then(|spec| spec.cluster_ip)
        .expect("the API server gives the idled service a cluster IP");
    set_endpoints(&admin, NS, "idle", &[]).await;
    create_route_spec(
        &admin,
        NS,
        "idle",
        serde_json::json!({"host": "idle.example", "to": {"kind": "Service", "name": "idle"}}),
    )
    .await;

    let cases: &[(&str, &str, &str, &str, serde_json::Value)] = &[
        (
            "edge-none",
            "edge.example",
            "edge",
            "None",
            serde_json::json!({"kind": "Service", "name": "blue"}),
        ),
        (
            "edge-redirect",
            "redirect.example",
            "edge",
            "Redirect",
            serde_json::json!({"kind": "Service", "name": "blue"}),
        ),
        (
            "edge-allow",
            "allow.example",
            "edge",
            "Allow",
            serde_json::json!({"kind": "Service", "name": "green"}),
        ),
        (
            "weighted",
            "weighted.example",
            "edge",
            "None",
            serde_json::json!({"kind": "Service", "name": "blue", "weight": 1}),
        ),
        (
            "reencrypt",
            "secure.example",
            "reencrypt",
            "None",
            serde_json::json!({"kind": "Service", "name": "secure"}),
        ),
    ];
    let mut leaves = BTreeMap::new();
    let mut secrets = Vec::new();
    for (name, host, _, _, _) in cases {
        let secret = format!("{name}-tls");
        let created = create_tls_secret(&admin, NS, &secret, host).await;
        leaves.insert(
            common::haproxy::leaf_der(&common::tls_of(&created).0),
            (*name).to_owned(),
        );
        secrets.push(secret);
    }
    // A certificate issued by an intermediate, for the routes' own caCertificate (the
    // intermediate and the root): from a secret and inline.
    let now = jiff::Timestamp::now();
    let pki = route_secrets::testing::Pki::new(now);
    let ca_ext = pki.issue(&route_secrets::testing::LeafSpec::new(
        "ca-ext.example",
        now,
    ));
    let ca_inline = pki.issue(&route_secrets::testing::LeafSpec::new(
        "ca-inline.example",
        now,
    ));
    let route_ca = format!("{}{}", pki.intermediate_pem(), pki.root_pem());
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), NS)
        .create(&Default::default(), &ca_ext.secret(NS, "ca-ext-tls"))
        .await
        .unwrap();
    secrets.push("ca-ext-tls".to_owned());
    let names: Vec<&str> = secrets.iter().map(String::as_str).collect();
    installer.grant_router_secrets(NS, &names).await.unwrap();
    for (name, host, termination, policy, to) in cases {
        let mut spec = serde_json::json!({
            "host": host, "to": to,
            "tls": {"termination": termination, "insecureEdgeTerminationPolicy": policy,
                    "externalCertificate": {"name": format!("{name}-tls")}},
        });
        if *name == "weighted" {
            spec["alternateBackends"] =
                serde_json::json!([{"kind": "Service", "name": "green", "weight": 3}]);
        }
        create_route_spec(&admin, NS, name, spec).await;
    }
    // Every other route kind: without TLS, edge and reencrypt with an inline
    // certificate, edge without a certificate of its own (the default certificate),
    // passthrough, and reencrypt verifying its backend with the route's destination CA
    // (one right, one wrong).
    let inline = Inline::new("inline.example");
    let pinned_inline = Inline::new("pinned.example");
    leaves.insert(inline.der.clone(), "inline".to_owned());
    leaves.insert(pinned_inline.der.clone(), "pinned".to_owned());
    leaves.insert(pass.certificate.clone().unwrap(), "pass-backend".to_owned());
    let pinned_ca = certificate_pem(pinned.certificate.as_ref().unwrap());
    let other_ca = certificate_pem(&Inline::new("pinned.shop.svc").der);
    let kinds: Vec<(&str, &str, serde_json::Value)> = vec![
        (
            "plain",
            "plain.example",
            serde_json::json!({"to": {"kind": "Service", "name": "blue"}}),
        ),
        (
            "inline",
            "inline.example",
            serde_json::json!({"to": {"kind": "Service", "name": "green"},
                "tls": {"termination": "edge", "certificate": inline.certificate,
                        "key": inline.key}}),
        ),
        (
            "default-cert",
            "default.example",
            serde_json::json!({"to": {"kind": "Service", "name": "blue"},
                "tls": {"termination": "edge"}}),
        ),
        (
            "passthrough",
            "pass.example",
            serde_json::json!({"to": {"kind": "Service", "name": "pass"},
                "tls": {"termination": "passthrough"}}),
        ),
        (
            "pinned",
            "pinned.example",
            serde_json::json!({"to": {"kind": "Service", "name": "pinned"},
                "tls": {"termination": "reencrypt", "certificate": pinned_inline.certificate,
                        "key": pinned_inline.key, "destinationCACertificate": pinned_ca}}),
        ),
        (
            "wrong-ca",
            "wrong-ca.example",
            serde_json::json!({"to": {"kind": "Service", "name": "pinned"},
                "tls": {"termination": "reencrypt", "destinationCACertificate": other_ca}}),
        ),
    ];
    for (name, host, spec) in &kinds {
        let mut spec = spec.clone();
        spec["host"] = (*host).into();
        create_route_spec(&admin, NS, name, spec).await;
    }
    // Per-route features: allow lists (valid, invalid, the older name, passthrough),
    // HSTS (valid, refused), rewrites (with paths), a route by subdomain, rate limits
    // (with weights, and on passthrough).
    let client_net = "127.0.0.0/8";
    let elsewhere = "10.9.0.0/16";
    let plain = |service: &str| serde_json::json!({"to": {"kind": "Service", "name": service}});
    let edge = |service: &str| {
        serde_json::json!({"to": {"kind": "Service", "name": service},
                           "tls": {"termination": "edge"}})
    };
    let passthrough = serde_json::json!({"to": {"kind": "Service", "name": "pass"},
                                         "tls": {"termination": "passthrough"}});
    let with_path = |mut spec: serde_json::Value, path: &str| {
        spec["path"] = path.into();
        spec
    };
    const ALLOW: &str = "haproxy.router.openshift.io/ip_allowlist";
    const WHITE: &str = "haproxy.router.openshift.io/ip_whitelist";
    const HSTS: &str = "haproxy.router.openshift.io/hsts_header";
    const REWRITE: &str = "haproxy.router.openshift.io/rewrite-target";
    const LIMIT: &str = "haproxy.router.openshift.io/rate-limit-connections";
    let allow_open = format!("{client_net} 10.0.0.1");
    // More entries than a HAProxy line takes: a file, the client's network last.
    let long_allowlist = (1..=70)
        .map(|n| format!("10.8.0.{n}"))
        .chain([client_net.to_owned()])
        .collect::<Vec<_>>()
        .join(" ");
    let features: Vec<Feature> = vec![
        (
            "allow-open",
            "allow-open.example",
            plain("blue"),
            vec![(ALLOW, allow_open.as_str())],
        ),
        (
            "allow-closed",
            "allow-closed.example",
            edge("blue"),
            vec![(ALLOW, elsewhere)],
        ),
        (
            "allow-old",
            "allow-old.example",
            plain("green"),
            vec![(WHITE, "192.0.2.1")],
        ),
        (
            "allow-long",
            "allow-long.example",
            plain("blue"),
            vec![(ALLOW, long_allowlist.as_str())],
        ),
        (
            "allow-bogus",
            "allow-bogus.example",
            plain("green"),
            vec![(ALLOW, "nonsense 300.0.0.1")],
        ),
        (
            "allow-pass-open",
            "allow-pass-open.example",
            passthrough.clone(),
            vec![(ALLOW, client_net)],
        ),
        (
            "allow-pass",
            "allow-pass.example",
            passthrough.clone(),
            vec![(ALLOW, elsewhere)],
        ),
        (
            "hsts-good",
            "hsts-good.example",
            edge("blue"),
            vec![(HSTS, "max-age=100;includeSubDomains")],
        ),
        (
            "hsts-twice",
            "hsts-twice.example",
            edge("blue"),
            vec![(HSTS, "max-age=1;max-age=2")],
        ),
        (
            "rewrite",
            "rewrite.example",
            with_path(plain("green"), "/a"),
            vec![(REWRITE, "/x")],
        ),
        (
            "rewrite-root",
            "rewrite-root.example",
            with_path(plain("green"), "/a"),
            vec![(REWRITE, "/")],
        ),
        (
            "rewrite-odd",
            "rewrite-odd.example",
            with_path(edge("green"), "/a"),
            vec![(REWRITE, "/q%25\\z")],
        ),
        (
            "dest-ca-secret",
            "dest-ca-secret.example",
            serde_json::json!({"to": {"kind": "Service", "name": "secure"},
                               "tls": {"termination": "reencrypt"}}),
            vec![(
                "route.openshift.io/destination-ca-certificate-secret",
                "missing-ca",
            )],
        ),
        (
            "h1-case",
            "h1-case.example",
            plain("green"),
            vec![("haproxy.router.openshift.io/h1-adjust-case", "true")],
        ),
        (
            "rewrite-bad",
            "rewrite-bad.example",
            with_path(plain("green"), "/a"),
            vec![(REWRITE, "x")],
        ),
    ];
    for (name, host, spec, annotations) in &features {
        let mut spec = spec.clone();
        spec["host"] = (*host).into();
        create_annotated_route(&admin, name, spec, annotations).await;
    }
    create_route_spec(
        &admin,
        NS,
        "sub",
        serde_json::json!({"subdomain": "sub", "to": {"kind": "Service", "name": "blue"},
                           "tls": {"termination": "edge"}}),
    )
    .await;
    let sub_host = format!("sub.{DOMAIN}");
    create_route_spec(
        &admin,
        NS,
        "ca-ext",
        serde_json::json!({"host": "ca-ext.example", "to": {"kind": "Service", "name": "blue"},
                           "tls": {"termination": "edge", "externalCertificate": {"name": "ca-ext-tls"},
                                   "caCertificate": route_ca}}),
    )
    .await;
    create_route_spec(
        &admin,
        NS,
        "ca-inline",
        serde_json::json!({"host": "ca-inline.example", "to": {"kind": "Service", "name": "blue"},
                           "tls": {"termination": "edge", "certificate": ca_inline.chain_pem(),
                                   "key": ca_inline.key_pem(), "caCertificate": route_ca}}),
    )
    .await;
    leaves.insert(ca_ext.leaf_der(), "ca-ext".to_owned());
    // Header actions: a request header set from the request's host, a response header
    // set from the backend's, one deleted each way; one refused value (ignored).
    for (name, termination) in [("headers", None), ("headers-edge", Some("edge"))] {
        let mut spec = serde_json::json!({
            "host": format!("{name}.example"), "to": {"kind": "Service", "name": "green"},
            "httpHeaders": {"actions": {
                "request": [
                    {"name": "X-Added", "action": {"type": "Set",
                        "set": {"value": "got %[req.hdr(host),lower] 100%%"}}},
                    {"name": "X-Drop", "action": {"type": "Delete"}}
                ],
                "response": [
                    {"name": "X-Resp", "action": {"type": "Set",
                        "set": {"value": "from %[res.hdr(x-backend)]"}}},
                    {"name": "X-Path", "action": {"type": "Delete"}}
                ]
            }}
        });
        if let Some(termination) = termination {
            spec["tls"] = serde_json::json!({"termination": termination});
        }
        create_route_spec(&admin, NS, name, spec).await;
    }
    leaves.insert(ca_inline.leaf_der(), "ca-inline".to_owned());
    let mut limited = edge("blue");
    limited["host"] = "limited.example".into();
    limited["alternateBackends"] =
        serde_json::json!([{"kind": "Service", "name": "green", "weight": 3}]);
    create_annotated_route(
        &admin,
        "limited",
        limited,
        &[(LIMIT, "true"), (&format!("{LIMIT}.rate-http"), "4")],
    )
    .await;
    let mut limited_pass = passthrough.clone();
    limited_pass["host"] = "limited-pass.example".into();
    create_annotated_route(
        &admin,
        "limited-pass",
        limited_pass,
        &[(LIMIT, "true"), (&format!("{LIMIT}.concurrent-tcp"), "3")],
    )
    .await;

    let page_503 = dir.path().join("error-503.http");
    std::fs::write(&page_503, PAGE_503).unwrap();
    let page_404 = dir.path().join("error-404.http");
    std::fs::write(&page_404, PAGE_404).unwrap();
    let router = RealRouter::start(
        &kubeconfig,
        &dir.path().join("router"),
        "real",
        (&page_503, &page_404),
    );
    let Routing {
        certwatch,
        http,
        https,
        config_dir,
        ..
    } = RoutingLaunch::new(&kubeconfig, dir.path())
        .args(&[
            "--router-name",
            "certwatch",
            "--write-status",
            "--router-domain",
            DOMAIN,
            "--http-header-name-case-adjustments",
            CASE_ADJUST,
            "--error-page-503",
            page_503.to_str().unwrap(),
            "--error-page-404",
            page_404.to_str().unwrap(),
        ])
        .ready()
        .await;
    eventually_async("the real router ready", || async {
        router.ready().then_some(())
    })
    .await;
    let ours = (http, https);
    let theirs = (
        SocketAddr::from(([127, 0, 0, 1], router.port("ROUTER_HTTP_PORT"))),
        SocketAddr::from(([127, 0, 0, 1], router.port("ROUTER_HTTPS_PORT"))),
    );
    // Both admit every route, and serve each before anything is compared.
    let mut all_routes: Vec<&str> = cases.iter().map(|(name, ..)| *name).collect();
    all_routes.extend(kinds.iter().map(|(name, ..)| *name));
    all_routes.extend(features.iter().map(|(name, ..)| *name));
    all_routes.extend([
        "sub",
        "limited",
        "limited-pass",
        "ca-ext",
        "ca-inline",
        "headers",
        "headers-edge",
        "idle",
    ]);
    for who in ["real", "certwatch"] {
        let all_routes = &all_routes;
        let admin = &admin;
        eventually_async(&format!("{who} admits every route"), || async move {
            admitted_by(admin, who)
                .await
                .is_superset(&all_routes.iter().map(|n| (*n).to_owned()).collect())
                .then_some(())
        })
        .await;
    }
    for (addr, who) in [(ours, "certwatch"), (theirs, "the router")] {
        let leaves = &leaves;
        eventually_async(&format!("{who} serves plain.example"), || async move {
            http_get(addr.0, "plain.example", "/")
                .await
                .filter(|r| r.status == 200 && r.backend.is_some())
        })
        .await;
        eventually_async(&format!("{who} serves rewrite.example"), || async move {
            http_get(addr.0, "rewrite.example", "/a/b")
                .await
                .filter(|r| r.status == 200 && r.backend.is_some())
        })
        .await;
        for (host, certificate, backend) in [
            (sub_host.as_str(), "default", "blue"),
            ("inline.example", "inline", "green-1"),
            ("default.example", "default", ""),
            ("pass.example", "pass-backend", "pass-1"),
            ("pinned.example", "pinned", "pinned-1"),
        ] {
            eventually_async(&format!("{who} serves {host}"), || async move {
                https_get(addr.1, host, "/", false).await.filter(|r| {
                    r.status == 200
                        && certificate_name(&r.certificate, leaves).as_deref() == Some(certificate)
                        && (backend.is_empty()
                            || r.backend.as_deref().is_some_and(|b| b.starts_with(backend)))
                })
            })
            .await;
        }
    }
    for (addr, who) in [(ours.1, "certwatch"), (theirs.1, "the router")] {
        for (name, host, ..) in cases {
            let name = (*name).to_owned();
            let leaves = &leaves;
            eventually_async(&format!("{who} serves {host} with its certificate"), || {
                let name = name.clone();
                async move {
                    https_get(addr, host, "/", false).await.filter(|r| {
                        r.status == 200 && certificate_name(&r.certificate, leaves) == Some(name)
                    })
                }
            })
            .await;
        }
    }

    let mut differences: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut hosts: Vec<(&str, &str)> = cases.iter().map(|(n, h, ..)| (*n, *h)).collect();
    hosts.extend(kinds.iter().map(|(n, h, _)| (*n, *h)));
    hosts.extend(features.iter().map(|(n, h, ..)| (*n, *h)));
    hosts.push(("sub", sub_host.as_str()));
    hosts.push(("ca-ext", "ca-ext.example"));
    hosts.push(("ca-inline", "ca-inline.example"));
    hosts.push(("headers", "headers.example"));
    hosts.push(("headers-edge", "headers-edge.example"));
    hosts.push(("unknown", "unknown.example"));
    for (name, host) in hosts {
        let on_router = requests(theirs.0, theirs.1, host, &leaves).await;
        let on_certwatch = requests(ours.0, ours.1, host, &leaves).await;
        for ((what, r), (_, c)) in on_router.iter().zip(&on_certwatch) {
            eprintln!("{name} {what}: router {r:?} / certwatch {c:?}");
            if r != c {
                let said = match *what {
                    "https alpn" => format!(
                        "router {}, certwatch {}",
                        r.alpn.as_deref().unwrap_or("none"),
                        c.alpn.as_deref().unwrap_or("none")
                    ),
                    _ => format!("router {r:?}, certwatch {c:?}"),
                };
                differences.insert((name.to_owned(), (*what).to_owned(), said));
            }
        }
    }
    // What the features must do, through both (so that equal answers are not equally
    // wrong): a client outside an allow list is closed, inside served; HSTS only for a
    // value of the router's pattern; the backend sees the rewritten path.
    for (who, addr) in [("certwatch", ours), ("the router", theirs)] {
        assert_eq!(
            http_get(addr.0, "allow-old.example", "/").await,
            None,
            "{who}"
        );
        assert!(
            https_get(addr.1, "allow-closed.example", "/", false)
                .await
                .is_none(),
            "{who}"
        );
        assert!(
            https_get(addr.1, "allow-pass.example", "/", false)
                .await
                .is_none(),
            "{who}"
        );
        for host in [
            "allow-open.example",
            "allow-bogus.example",
            "allow-long.example",
        ] {
            let served = http_get(addr.0, host, "/").await;
            assert_eq!(served.map(|r| r.status), Some(200), "{who}: {host}");
        }
        let pass = https_get(addr.1, "allow-pass-open.example", "/", false).await;
        assert_eq!(
            pass.and_then(|r| r.backend).as_deref(),
            Some("pass-1"),
            "{who}"
        );
        let good = https_get(addr.1, "hsts-good.example", "/", false)
            .await
            .unwrap();
        assert_eq!(
            good.hsts.as_deref(),
            Some("max-age=100;includeSubDomains"),
            "{who}"
        );
        let twice = https_get(addr.1, "hsts-twice.example", "/", false)
            .await
            .unwrap();
        assert_eq!(twice.hsts, None, "{who}");
        for (host, path) in [
            ("rewrite.example", "/x/b?c=1"),
            ("rewrite-root.example", "/b?c=1"),
            ("rewrite-bad.example", "/a/b?c=1"),
        ] {
            let seen = http_get(addr.0, host, "/a/b?c=1").await.unwrap();
            assert_eq!(seen.path.as_deref(), Some(path), "{who}: {host}");
        }
        let odd = https_get(addr.1, "rewrite-odd.example", "/a/b", false)
            .await
            .unwrap();
        assert_eq!(odd.path.as_deref(), Some("/q%25z/b"), "{who}");
    }
    // A route's caCertificate is served after its chain: leaf, intermediate (tls.crt),
    // then the route's intermediate and root, through both.
    for host in ["ca-ext.example", "ca-inline.example"] {
        let router_chain = served_chain(theirs.1, host).await;
        let certwatch_chain = served_chain(ours.1, host).await;
        assert_eq!(router_chain.len(), 4, "the router's chain for {host}");
        assert_eq!(router_chain, certwatch_chain, "{host}");
    }
    // Header case: responses to clients adjusted for every route, requests to the
    // backend only for the route that asks.
    for (who, addr) in [("certwatch", ours), ("the router", theirs)] {
        let asked = http_get(addr.0, "h1-case.example", "/").await.unwrap();
        assert_eq!(asked.host_header.as_deref(), Some("Host"), "{who}");
        assert_eq!(asked.backend_header.as_deref(), Some("X-Backend"), "{who}");
        let other = http_get(addr.0, "plain.example", "/").await.unwrap();
        assert_eq!(other.host_header.as_deref(), Some("host"), "{who}");
        assert_eq!(other.backend_header.as_deref(), Some("X-Backend"), "{who}");
    }
    // The destination CA secret annotation is not the router's (the ingress-to-route
    // controller reads it for Ingresses): a route with one is admitted and served as
    // without it, by both.
    for (who, addr) in [("certwatch", ours), ("the router", theirs)] {
        let seen = https_get(addr.1, "dest-ca-secret.example", "/", false).await;
        assert_eq!(
            seen.and_then(|r| r.backend).as_deref(),
            Some("secure-1"),
            "{who}"
        );
    }
    // Header actions: the backend saw the header set, the client the response header
    // set and not the one deleted.
    for (who, addr) in [("certwatch", ours), ("the router", theirs)] {
        let seen = http_get(addr.0, "headers.example", "/").await.unwrap();
        assert_eq!(
            seen.echo_added.as_deref(),
            Some("got headers.example 100%"),
            "{who}"
        );
        assert_eq!(seen.x_resp.as_deref(), Some("from green-1"), "{who}");
        assert_eq!(seen.path, None, "{who}: x-path deleted");
        assert_eq!(seen.backend.as_deref(), Some("green-1"), "{who}");
    }
    // The subdomain route's status names the host both serve it at.
    for who in ["real", "certwatch"] {
        assert_eq!(
            status_host(&admin, "sub", who).await.as_deref(),
            Some(sub_host.as_str()),
            "{who}"
        );
    }
    // Rate limits: requests over the HTTP rate (with weights), connections over the
    // concurrent limit (passthrough), refused alike.
    let router_rate = statuses(theirs.1, "limited.example", 8).await;
    let certwatch_rate = statuses(ours.1, "limited.example", 8).await;
    eprintln!("limited: router {router_rate:?}, certwatch {certwatch_rate:?}");
    assert_eq!(router_rate, certwatch_rate);
    assert!(
        certwatch_rate.contains(&200) && certwatch_rate.contains(&0),
        "{certwatch_rate:?}"
    );
    let router_held = held_connections(theirs.1, "limited-pass.example", 5).await;
    let certwatch_held = held_connections(ours.1, "limited-pass.example", 5).await;
    eprintln!("limited-pass: router held {router_held}, certwatch {certwatch_held}");
    assert_eq!(router_held, certwatch_held);
    assert!((1..5).contains(&certwatch_held), "{certwatch_held}");

    // wrong-ca's 503 is HAProxy refusing the backend's certificate, not a route it does
    // not know: both configurations hold its backend, verified against the route's CA.
    let router_config =
        std::fs::read_to_string(dir.path().join("router/haproxy/conf/haproxy.config")).unwrap();
    let certwatch_config = std::fs::read_to_string(config_dir.join("haproxy.cfg")).unwrap();
    for (who, config) in [("router", &router_config), ("certwatch", &certwatch_config)] {
        let section = config
            .split("\nbackend ")
            .find(|section| section.starts_with("be_secure:shop:wrong-ca\n"))
            .unwrap_or_else(|| panic!("{who}'s configuration has no backend for wrong-ca"));
        assert!(
            section.contains(&pinned.addr.to_string())
                && section.contains("verify required ca-file"),
            "{who}: {section}"
        );
    }

    // The idled service: both serve it at its cluster IP, without a health check. The
    // router looks the Service up when the service's endpoints change, so the slice is
    // touched once both run (its Service cache may have been filled after its first
    // look).
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(admin.clone(), NS)
        .patch(
            "idle-1",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"touched": "1"}}}),
            ),
        )
        .await
        .unwrap();
    let idled_server = format!("server ept:idle:http:{cluster_ip}:8080 {cluster_ip}:8080 ");
    for (who, path) in [
        (
            "router",
            dir.path().join("router/haproxy/conf/haproxy.config"),
        ),
        ("certwatch", config_dir.join("haproxy.cfg")),
    ] {
        let idled_server = &idled_server;
        let line = eventually_async(&format!("{who} serves the idled service"), || {
            let path = path.clone();
            async move {
                let config = std::fs::read_to_string(&path).ok()?;
                let section = config
                    .split("\nbackend ")
                    .find(|section| section.starts_with("be_http:shop:idle\n"))?
                    .to_owned();
                section
                    .lines()
                    .map(str::trim)
                    .find(|line| line.starts_with(idled_server.as_str()))
                    .map(str::to_owned)
            }
        })
        .await;
        assert!(!line.contains(" check"), "{who}: {line}");
    }

    // The long allow list is a file in both configurations.
    for (who, config) in [("router", &router_config), ("certwatch", &certwatch_config)] {
        let section = config
            .split("\nbackend ")
            .find(|section| section.starts_with("be_http:shop:allow-long\n"))
            .unwrap_or_else(|| panic!("{who}'s configuration has no backend for allow-long"));
        assert!(
            section.contains("acl allowlist src -f "),
            "{who}: {section}"
        );
    }

    // Weights: the same split through both (round robin over 42, 42 and 256).
    let router_green = share(theirs.1, "weighted.example", "green-1", 170).await;
    let certwatch_green = share(ours.1, "weighted.example", "green-1", 170).await;
    eprintln!("weighted: green's share router {router_green:.3}, certwatch {certwatch_green:.3}");
    assert!(
        (router_green - certwatch_green).abs() < 0.08,
        "{router_green} vs {certwatch_green}"
    );
    assert!((0.65..0.85).contains(&certwatch_green), "{certwatch_green}");

    // Endpoint changes: both follow an endpoint added, then one removed.
    let blue_3 = Backend::http("blue-3").await;
    set_endpoints_each(&admin, NS, "blue", &[&blue[0], &blue[1], &blue_3]).await;
    let answering = |addr: SocketAddr| async move {
        let mut seen = BTreeSet::new();
        for _ in 0..12 {
            if let Some(backend) = https_get(addr, "edge.example", "/", false)
                .await
                .and_then(|r| r.backend)
            {
                seen.insert(backend);
            }
        }
        seen
    };
    let three: BTreeSet<String> = ["blue-1", "blue-2", "blue-3"].map(str::to_owned).into();
    for (addr, who) in [(ours.1, "certwatch"), (theirs.1, "the router")] {
        let three = three.clone();
        eventually_async(&format!("{who} sends to the added endpoint"), || {
            let three = three.clone();
            async move { (answering(addr).await == three).then_some(()) }
        })
        .await;
    }
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(admin.clone(), NS)
        .delete("blue-0", &Default::default())
        .await
        .unwrap();
    let two: BTreeSet<String> = ["blue-2", "blue-3"].map(str::to_owned).into();
    for (addr, who) in [(ours.1, "certwatch"), (theirs.1, "the router")] {
        let two = two.clone();
        eventually_async(
            &format!("{who} stops sending to the removed endpoint"),
            || {
                let two = two.clone();
                async move { (answering(addr).await == two).then_some(()) }
            },
        )
        .await;
    }

    let expected: BTreeSet<(String, String, String)> = DELIBERATE
        .iter()
        .map(|(a, b, c)| ((*a).to_owned(), (*b).to_owned(), (*c).to_owned()))
        .collect();
    let unexpected: Vec<_> = differences.difference(&expected).collect();
    let stale: Vec<_> = expected.difference(&differences).collect();
    assert!(
        unexpected.is_empty() && stale.is_empty(),
        "differences not listed as deliberate: {unexpected:#?}\nlisted but not seen: {stale:#?}"
    );
    drop(certwatch);
}
