//! Ready means served, through the binary and a real HAProxy (Debian's 2.6):
//!
//! - certwatch runs HAProxy (`--haproxy-config`): HAProxy is started only once the files
//!   are complete and loads them itself (no certificate is pushed at start-up);
//!   `/readyz` is 503 until its worker serves, then 200, and follows HAProxy: when the
//!   worker dies, 503 until certwatch has started it again;
//! - a route whose bundle is 1 MiB (far beyond what HAProxy's runtime API takes in one
//!   request) beside ordinary routes: with a HAProxy certwatch cannot reload, every
//!   other route is pushed and served and certwatch is ready, the big one is refused,
//!   counted and logged once; with a HAProxy certwatch runs, the big one is loaded from
//!   its file by a reload while the others go through the runtime API;
//! - coalescing: ten rotations of one secret while HAProxy cannot answer reach it as at
//!   most two uploads, the last one the tenth certificate.
//!
//! No timing is asserted: counts (commands, reloads, refusals), the order of log lines,
//! and what handshakes return.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::haproxy::*;
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};

/// A chain that fills a secret up to the API server's limit (1 MiB of data, the key
/// included).
const ONE_MIB_OF_DATA: usize = (1 << 20) - 4096;

fn commands(certwatch: &Certwatch, command: &str) -> f64 {
    certwatch
        .metric(&format!(
            "certwatch_haproxy_commands_total{{command=\"{command}\",result=\"ok\"}}"
        ))
        .unwrap_or(0.0)
}

fn host(i: usize) -> String {
    format!("route-{i}.app-0.apps.sim.example")
}

/// TLS data whose chain is padded to about `size` bytes with extra self-signed CA
/// certificates (distinct, ECDSA P-256): a valid secret far beyond HAProxy's CLI
/// buffer.
fn padded_tls_data(
    host: &str,
    size: usize,
) -> (std::collections::BTreeMap<String, ByteString>, Vec<u8>) {
    let mut data = new_tls_data(host);
    let leaf = leaf_der(&data["tls.crt"].0);
    let mut chain = data["tls.crt"].0.clone();
    let mut n = 0;
    while chain.len() < size {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("padding CA {n}"));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        chain.extend_from_slice(params.self_signed(&key).unwrap().pem().as_bytes());
        n += 1;
    }
    data.insert("tls.crt".to_owned(), ByteString(chain));
    (data, leaf)
}

async fn create_secret_with(
    admin: &kube::Client,
    name: &str,
    data: std::collections::BTreeMap<String, ByteString>,
) {
    let mut secret = Secret {
        data: Some(data),
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_owned());
    Api::<Secret>::namespaced(admin.clone(), "app-0")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

async fn replace_secret_data(
    admin: &kube::Client,
    name: &str,
    data: std::collections::BTreeMap<String, ByteString>,
) {
    Api::<Secret>::namespaced(admin.clone(), "app-0")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": data })),
        )
        .await
        .unwrap();
}

/// The SHA-1 of the server certificate HAProxy holds under `name`, as `show ssl cert`
/// prints it.
fn held_sha1(socket: &std::path::Path, name: &str) -> String {
    runtime_api(socket, &format!("show ssl cert {name}"))
        .lines()
        .find_map(|line| line.strip_prefix("SHA1 FingerPrint: ").map(str::to_owned))
        .unwrap_or_default()
}

fn sha1(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, der)
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect()
}

fn line_index(log: &str, needle: &str) -> usize {
    log.lines()
        .position(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no log line with {needle:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_haproxy_certwatch_runs_and_follows_it() {
    let case = HaproxyCase::start(20).await;
    let (admin, socket) = (case.admin.clone(), case.socket.clone());
    let managed = case.managed();
    let (port, default_leaf) = (managed.port, managed.default_leaf.clone());
    let certwatch = case.certwatch("certwatch.log", &managed.args());
    certwatch.wait_ready().await;

    // The files were ready first, then HAProxy was started on them, then certwatch was
    // ready: HAProxy loaded every certificate itself, none was pushed.
    let log = certwatch.log_text();
    let files = line_index(&log, "files ready");
    let starting = line_index(&log, "starting HAProxy on the complete files");
    let ready = line_index(
        &log,
        "ready: HAProxy serves every route present at start-up",
    );
    assert!(files < starting && starting < ready, "{log}");
    assert_eq!(commands(&certwatch, "set ssl cert"), 0.0);
    assert_eq!(
        certwatch.metric("certwatch_haproxy_reloads_total{reason=\"start\",result=\"ok\"}"),
        Some(1.0)
    );
    for i in 0..20 {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
    assert_eq!(presented(port, "nobody.example").await, Some(default_leaf));
    assert_eq!(
        certwatch.metric("certwatch_routes_admitted_not_served"),
        Some(0.0)
    );

    // A rotation goes through the runtime API: set and commit, no reload.
    let rotated = rotate_secret(&admin, "app-0", "tls-3", &host(3)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("the rotation to be served", || async {
        (presented(port, &host(3)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;
    assert_eq!(commands(&certwatch, "set ssl cert"), 1.0);
    assert_eq!(commands(&certwatch, "commit ssl cert"), 1.0);

    // The worker dies (HAProxy's master exits with it): not ready until certwatch has
    // started HAProxy again, which then serves the rotated certificate from its file.
    let worker = info_field(&socket, "Pid");
    send_signal(worker, "9");
    eventually("/readyz to say 503", || {
        (!certwatch.is_ready()).then_some(())
    })
    .await;
    certwatch.wait_ready().await;
    assert_ne!(info_field(&socket, "Pid"), worker);
    assert_eq!(presented(port, &host(3)).await, Some(rotated_leaf));
    assert_eq!(
        certwatch.metric("certwatch_haproxy_reloads_total{reason=\"start\",result=\"ok\"}"),
        Some(2.0)
    );
    assert_eq!(
        commands(&certwatch, "set ssl cert"),
        1.0,
        "nothing pushed again"
    );
}

/// A HAProxy certwatch cannot reload, running before certwatch on an empty crt-list
/// (every route reaches it through the runtime API): the 1 MiB route is refused alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_bundle_is_refused_alone_by_a_haproxy_certwatch_cannot_reload() {
    let case = HaproxyCase::start(5).await;
    let (admin, cert_dir) = (case.admin.clone(), case.cert_dir.clone());
    let (big_data, big_leaf) = padded_tls_data("big.app-0.apps.sim.example", ONE_MIB_OF_DATA);
    grant_secret(&admin, "app-0", "tls-big").await;
    create_secret_with(&admin, "tls-big", big_data).await;
    create_route(
        &admin,
        "app-0",
        "big",
        Some("big.app-0.apps.sim.example"),
        "tls-big",
    )
    .await;

    // HAProxy first, on an empty crt-list in certwatch's cert dir.
    let (_haproxy, port, default_leaf) = case.haproxy_of_others().await;
    let certwatch = case.certwatch_beside_haproxy("certwatch.log");
    // Ready: every other route is served; the big one is refused, not waited for.
    certwatch.wait_ready().await;
    for i in 0..5 {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
    assert_eq!(
        presented(port, "big.app-0.apps.sim.example").await,
        Some(default_leaf.clone()),
        "HAProxy does not have the big certificate"
    );
    let refused_once = "HAProxy cannot take this certificate through its runtime API";
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(1.0)
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refusals_total{reason=\"too_large\"}"),
        Some(1.0)
    );
    assert_eq!(
        certwatch.metric("certwatch_routes_admitted_not_served"),
        Some(0.0)
    );
    // Its bundle is on disk for HAProxy's next load.
    assert_eq!(
        leaf_der(&std::fs::read(cert_dir.join("app-0:big.pem")).unwrap()),
        big_leaf
    );

    // Later changes of other routes are served; the big one is not retried meanwhile.
    let rotated = rotate_secret(&admin, "app-0", "tls-1", &host(1)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("the rotation to be served", || async {
        (presented(port, &host(1)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;
    assert_eq!(
        commands(&certwatch, "set ssl cert"),
        6.0,
        "5 routes, 1 rotation"
    );
    assert_eq!(
        certwatch.log_text().matches(refused_once).count(),
        1,
        "logged once"
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refusals_total{reason=\"too_large\"}"),
        Some(1.0)
    );
}

/// With the HAProxy certwatch runs, the 1 MiB route's rotation is loaded from its file
/// by a reload, while another route's rotation goes through the runtime API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_bundle_is_loaded_by_a_reload_beside_runtime_updates() {
    let case = HaproxyCase::start(5).await;
    let (admin, socket, cert_dir) = (
        case.admin.clone(),
        case.socket.clone(),
        case.cert_dir.clone(),
    );
    let big_host = "big.app-0.apps.sim.example";
    let (big_data, big_leaf) = padded_tls_data(big_host, ONE_MIB_OF_DATA);
    grant_secret(&admin, "app-0", "tls-big").await;
    create_secret_with(&admin, "tls-big", big_data).await;
    create_route(&admin, "app-0", "big", Some(big_host), "tls-big").await;
    let managed = case.managed();
    let port = managed.port;
    let mut args = managed.args();
    args.extend(["--haproxy-min-reload-interval", "0s"]);
    let certwatch = case.certwatch("certwatch.log", &args);
    certwatch.wait_ready().await;
    // Loaded from its file at the start. (A 1 MiB chain is beyond what TLS clients take
    // by default, rustls's and OpenSSL's alike: what HAProxy holds is read from it.)
    let big_name = cert_dir.join("links/app-0_big.pem").display().to_string();
    assert_eq!(held_sha1(&socket, &big_name), sha1(&big_leaf));

    // Both rotate: the ordinary one through the runtime API, the big one by a reload.
    let (new_big, new_big_leaf) = padded_tls_data(big_host, ONE_MIB_OF_DATA);
    replace_secret_data(&admin, "tls-big", new_big).await;
    let rotated = rotate_secret(&admin, "app-0", "tls-2", &host(2)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("both rotations to be served", || async {
        (presented(port, &host(2)).await == Some(rotated_leaf.clone())
            && held_sha1(&socket, &big_name) == sha1(&new_big_leaf))
        .then_some(())
    })
    .await;
    assert!(commands(&certwatch, "set ssl cert") >= 1.0);
    // The new worker serves a moment before certwatch has seen the reload end.
    eventually("the reload to be counted", || {
        certwatch
            .metric("certwatch_haproxy_reloads_total{reason=\"too_large\",result=\"ok\"}")
            .filter(|count| *count >= 1.0)
    })
    .await;
    assert_eq!(
        certwatch.metric("certwatch_haproxy_reloads_total{reason=\"too_large\",result=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refusals_total{reason=\"too_large\"}"),
        Some(1.0)
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(0.0)
    );
    eventually("nothing unserved", || {
        (certwatch.metric("certwatch_routes_admitted_not_served") == Some(0.0)).then_some(())
    })
    .await;
    // Every route still served with its own certificate after the reload.
    for i in [0, 1, 3, 4] {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
}

/// Ten rotations while HAProxy's worker is stopped (SIGSTOP): the first upload waits
/// for its answer, the other nine rotations coalesce, and once HAProxy answers again
/// at most two uploads were made, the last with the tenth certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotations_coalesce_while_haproxy_is_busy() {
    let case = HaproxyCase::start(3).await;
    let (admin, socket, cert_dir) = (
        case.admin.clone(),
        case.socket.clone(),
        case.cert_dir.clone(),
    );
    let managed = case.managed();
    let port = managed.port;
    let mut args = managed.args();
    // HAProxy is stopped on purpose for a while: no timeout during the test.
    args.extend(["--haproxy-command-timeout", "1h"]);
    let certwatch = case.certwatch("certwatch.log", &args);
    certwatch.wait_ready().await;
    let before = commands(&certwatch, "set ssl cert");
    let worker = info_field(&socket, "Pid").to_string();
    let signal = |name: &str| send_signal(&worker, name.trim_start_matches('-'));
    signal("-STOP");
    let bundle = cert_dir.join("app-0:route-0.pem");
    let mut last = Vec::new();
    for _ in 0..10 {
        let secret = rotate_secret(&admin, "app-0", "tls-0", &host(0)).await;
        last = leaf_der(&tls_of(&secret).0);
        // Each rotation reaches its file (HAProxy is not needed for that).
        let expected = last.clone();
        eventually("the rotation's file", || {
            (leaf_der(&read_or_empty(&bundle)) == expected).then_some(())
        })
        .await;
    }
    signal("-CONT");
    eventually_async("the tenth certificate to be served", || async {
        (presented(port, &host(0)).await == Some(last.clone())).then_some(())
    })
    .await;
    eventually("nothing unserved", || {
        (certwatch.metric("certwatch_routes_admitted_not_served") == Some(0.0)).then_some(())
    })
    .await;
    let uploads = commands(&certwatch, "set ssl cert") - before;
    assert!(
        (1.0..=2.0).contains(&uploads),
        "ten rotations, {uploads} uploads"
    );
    assert_eq!(info_field(&socket, "Pid").to_string(), worker, "no reload");
}
