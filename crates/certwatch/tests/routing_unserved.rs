//! What HAProxy answers for a route whose service has no ready endpoint, through the
//! binary against the simulator with the HAProxy certwatch runs: an idled service
//! (`idling.alpha.openshift.io/idled-at`) is served at its cluster IP without health
//! checks, as the OpenShift router serves it (the cluster IP is a real server in the
//! test host here, playing the service proxy that wakes the service), until its
//! endpoints are ready again; and the operator's error pages (`--error-page-503`,
//! `CERTWATCH_ERROR_PAGE_404`) answer where no server serves and where no route does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;

use common::routing::{Routing, RoutingLaunch};
use common::traffic::{Backend, create_service, http_get, set_endpoints};
use common::{SimProcess, create_route_spec, eventually_async};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams, PostParams};

const NS: &str = "app-0";
const IDLED_AT: &str = "idling.alpha.openshift.io/idled-at";

/// The operator's 503 page: says it is theirs in `x-backend` (what the test client
/// reports as who answered).
const PAGE_503: &str = "HTTP/1.1 503 Service Unavailable\r\nx-backend: page-503\r\nContent-Type: text/plain\r\nContent-Length: 12\r\nConnection: close\r\n\r\nno one home\n";
/// The operator's 404 page, LF line ends.
const PAGE_404: &str =
    "HTTP/1.0 404 Not Found\nx-backend: page-404\nConnection: close\n\nno such route\n";

/// Creates Service `name` with cluster IP and port those of `proxy` (the stand-in for
/// the service proxy), idled.
async fn idled_service(admin: &kube::Client, name: &str, proxy: &Backend) {
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS,
                     "annotations": {IDLED_AT: "2026-12-06T05:00:00Z"}},
        "spec": {"clusterIP": proxy.addr.ip().to_string(),
                 "ports": [{"name": "http", "port": proxy.addr.port(), "targetPort": "http"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
}

async fn plain_route(admin: &kube::Client, name: &str, to: serde_json::Value) {
    create_route_spec(
        admin,
        NS,
        name,
        serde_json::json!({"host": format!("{name}.example"), "to": to}),
    )
    .await;
}

/// The `server` lines of `backend` in the configuration certwatch wrote.
fn server_lines(config_dir: &Path, backend: &str) -> Vec<String> {
    let config = std::fs::read_to_string(config_dir.join("haproxy.cfg")).unwrap();
    let start = config
        .find(&format!("\nbackend {backend}\n"))
        .expect("the backend");
    let section = &config[start + 1..];
    let section = &section[..section.find("\n\n").unwrap_or(section.len())];
    section
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("server ") && !line.contains("_dynamic-pod-"))
        .map(str::to_owned)
        .collect()
}

/// Who answers `n` requests for `host`: (backend or status, count), sorted.
async fn answers(http: SocketAddr, host: &str, n: usize) -> Vec<(String, usize)> {
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..n {
        let answer = http_get(http, host, "/")
            .await
            .map(|r| format!("{} {}", r.status, r.backend.unwrap_or_else(|| "-".into())))
            .unwrap_or_else(|| "closed".into());
        *counts.entry(answer).or_insert(0) += 1;
    }
    counts.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idled_services_are_served_at_their_cluster_ip_and_error_pages_are_the_operators() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(dir.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;

    // `sleepy`: idled, its slice empty (as the endpoints controller leaves it when the
    // service is scaled to zero); its cluster IP is `proxy`.
    let proxy = Backend::http("cluster-ip").await;
    idled_service(&admin, "sleepy", &proxy).await;
    set_endpoints(&admin, NS, "sleepy", &[]).await;
    // `awake`: one ready endpoint; `down`: not idled, no endpoint.
    let awake = Backend::http("awake-1").await;
    create_service(&admin, NS, "awake").await;
    set_endpoints(&admin, NS, "awake", &[&awake]).await;
    create_service(&admin, NS, "down").await;
    set_endpoints(&admin, NS, "down", &[]).await;

    plain_route(
        &admin,
        "sleepy",
        serde_json::json!({"kind": "Service", "name": "sleepy"}),
    )
    .await;
    // Both services behind one route: two active endpoints, so health-checked, except
    // the idled service's.
    create_route_spec(
        &admin,
        NS,
        "pair",
        serde_json::json!({
            "host": "pair.example",
            "to": {"kind": "Service", "name": "awake", "weight": 1},
            "alternateBackends": [{"kind": "Service", "name": "sleepy", "weight": 1}],
        }),
    )
    .await;
    plain_route(
        &admin,
        "down",
        serde_json::json!({"kind": "Service", "name": "down"}),
    )
    .await;

    let page_503 = dir.path().join("503.http");
    std::fs::write(&page_503, PAGE_503).unwrap();
    let page_404 = dir.path().join("404.http");
    std::fs::write(&page_404, PAGE_404).unwrap();
    let Routing {
        mut certwatch,
        http,
        config_dir,
        ..
    } = RoutingLaunch::on(&sim, dir.path())
        .min_reload_interval("1s")
        .args(&["--error-page-503", page_503.to_str().unwrap()])
        .adjust(|launch| launch.env("CERTWATCH_ERROR_PAGE_404", page_404.to_str().unwrap()))
        .ready()
        .await;

    // The idled service: its cluster IP answers, no health check on it.
    let ip = proxy.addr.ip();
    let port = proxy.addr.port();
    assert_eq!(
        answers(http, "sleepy.example", 3).await,
        [("200 cluster-ip".to_owned(), 3)]
    );
    assert_eq!(
        server_lines(&config_dir, "be_http:app-0:sleepy"),
        [format!(
            "server ept:sleepy:http:{ip}:{port} {ip}:{port} weight 1"
        )]
    );
    let pair = server_lines(&config_dir, "be_http:app-0:pair");
    assert_eq!(pair.len(), 2, "{pair:?}");
    let (checked, unchecked): (Vec<&String>, Vec<&String>) =
        pair.iter().partition(|line| line.contains(" check inter "));
    assert!(
        checked.len() == 1 && checked[0].contains(&awake.addr.to_string()),
        "{pair:?}"
    );
    assert!(
        unchecked.len() == 1
            && unchecked[0].starts_with(&format!("server ept:sleepy:http:{ip}:{port} ")),
        "{pair:?}"
    );
    let split = answers(http, "pair.example", 40).await;
    assert_eq!(
        split
            .iter()
            .map(|(who, _)| who.as_str())
            .collect::<Vec<_>>(),
        ["200 awake-1", "200 cluster-ip"],
        "{split:?}"
    );

    // Woken: its pod is ready, the cluster IP is served no more.
    let pod = Backend::http("sleepy-1").await;
    set_endpoints(&admin, NS, "sleepy", &[&pod]).await;
    eventually_async("the woken service's pod answers", || async {
        (answers(http, "sleepy.example", 1).await == [("200 sleepy-1".to_owned(), 1)]).then_some(())
    })
    .await;
    assert_eq!(
        answers(http, "sleepy.example", 5).await,
        [("200 sleepy-1".to_owned(), 5)]
    );
    let served_by_proxy = proxy.served();

    // Scaled to zero again while still idled: the cluster IP again.
    set_endpoints(&admin, NS, "sleepy", &[]).await;
    eventually_async("the idled service's cluster IP answers again", || async {
        (answers(http, "sleepy.example", 1).await == [("200 cluster-ip".to_owned(), 1)])
            .then_some(())
    })
    .await;
    // Requests sent between an endpoint change and its arrival in HAProxy may reach either
    // side, so only the answers after the switch back are counted on.
    assert!(proxy.served() > served_by_proxy);

    // No longer idled, still no endpoint: nothing serves it, the operator's 503 page.
    Api::<Service>::namespaced(admin.clone(), NS)
        .patch(
            "sleepy",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {IDLED_AT: null}}})),
        )
        .await
        .unwrap();
    eventually_async("the service no longer idled is unserved", || async {
        (answers(http, "sleepy.example", 1).await == [("503 page-503".to_owned(), 1)]).then_some(())
    })
    .await;
    let answer = http_get(http, "sleepy.example", "/").await.unwrap();
    assert_eq!(
        (answer.status, answer.backend.as_deref()),
        (503, Some("page-503"))
    );

    // The operator's pages where no server and where no route serves.
    assert_eq!(
        answers(http, "down.example", 2).await,
        [("503 page-503".to_owned(), 2)]
    );
    assert_eq!(
        answers(http, "nobody.example", 2).await,
        [("404 page-404".to_owned(), 2)]
    );
    assert_eq!(
        std::fs::read(config_dir.join("error-page-503.http")).unwrap(),
        PAGE_503.as_bytes()
    );
    certwatch.terminate();
}

#[test]
fn an_error_page_haproxy_would_refuse_stops_certwatch_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("503.html");
    std::fs::write(&page, "<html><body>Sorry</body></html>\n").unwrap();
    let missing = dir.path().join("missing.http");
    for (flag, file, says) in [
        (
            "--error-page-503",
            &page,
            "is no HTTP response HAProxy's errorfile takes",
        ),
        ("--error-page-404", &missing, "cannot read"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_certwatch"))
            .args(["run", "--cert-dir"])
            .arg(dir.path().join("certs"))
            .arg("--haproxy-config-dir")
            .arg(dir.path().join("haproxy"))
            .arg(flag)
            .arg(file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(flag) && stderr.contains(says),
            "{flag}: {stderr}"
        );
        assert!(!dir.path().join("haproxy").exists());
    }
}
