//! One tenant's RSA-1024 key beside ordinary routes, with certwatch's default flags
//! (`--openssl-security-level 1`, the router image's) on this machine's Debian HAProxy
//! 2.6 and OpenSSL 3.0, whose own default level is 2 (RSA under 2048 bits refused),
//! through the binary:
//!
//! - HAProxy certwatch runs on the admin's configuration (`--haproxy-config`): it runs
//!   at certwatch's level (an `OPENSSL_CONF` certwatch writes), so every route is
//!   served, the RSA-1024 one included; HAProxy was started once and never reloaded;
//!   a restarted certwatch (and its HAProxy, loading every file) is ready again and
//!   serves them all;
//! - HAProxy run by others at Debian's level (`--haproxy-socket` alone): the RSA-1024
//!   certificate is refused (HAProxy's `add ssl crt-list` fails), counted, logged once,
//!   its line left out of the crt-list file; every ordinary route is served, certwatch
//!   is ready, and a restarted certwatch is ready again.
//!
//! No timing is asserted: counts (reloads, refusals, log lines) and handshakes.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::haproxy::*;
use common::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

const WEAK_HOST: &str = "weak.app-0.apps.sim.example";

fn host(i: usize) -> String {
    format!("route-{i}.app-0.apps.sim.example")
}

/// A self-signed certificate for `host` on an RSA-1024 key, made by `openssl`.
fn rsa_1024(dir: &Path, host: &str) -> (Vec<u8>, Vec<u8>) {
    let (cert, key) = (dir.join("weak.crt"), dir.join("weak.key"));
    let status = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:1024", "-nodes", "-days", "30",
        ])
        .args(["-subj", &format!("/CN={host}")])
        .args(["-addext", &format!("subjectAltName=DNS:{host}")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    (std::fs::read(cert).unwrap(), std::fs::read(key).unwrap())
}

/// The RSA-1024 secret and its route, beside the generated ones; returns the leaf.
async fn weak_route(admin: &kube::Client, dir: &Path) -> Vec<u8> {
    let (cert, key) = rsa_1024(dir, WEAK_HOST);
    let mut secret = Secret {
        data: Some(BTreeMap::from([
            ("tls.crt".to_owned(), ByteString(cert.clone())),
            ("tls.key".to_owned(), ByteString(key)),
        ])),
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    };
    secret.metadata.name = Some("tls-weak".to_owned());
    grant_secret(admin, "app-0", "tls-weak").await;
    Api::<Secret>::namespaced(admin.clone(), "app-0")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    create_route(admin, "app-0", "weak", Some(WEAK_HOST), "tls-weak").await;
    leaf_der(&cert)
}

fn reloads(certwatch: &Certwatch) -> f64 {
    certwatch
        .metrics()
        .lines()
        .filter(|line| line.starts_with("certwatch_haproxy_reloads_total{"))
        .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

async fn ordinary_routes_served(admin: &kube::Client, port: u16) {
    for i in 0..5 {
        let expected = leaf_of(admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
}

/// The simulator with five ordinary routes and the RSA-1024 one; returns its leaf.
async fn weak_beside_ordinary() -> (HaproxyCase, Vec<u8>) {
    let case = HaproxyCase::start(5).await;
    let weak_leaf = weak_route(&case.admin, &case.root).await;
    (case, weak_leaf)
}

/// `add ssl crt-list` commands HAProxy refused.
fn refused_pushes(certwatch: &Certwatch) -> f64 {
    certwatch
        .metric("certwatch_haproxy_commands_total{command=\"add ssl crt-list\",result=\"error\"}")
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_haproxy_certwatch_runs_takes_what_certwatch_admits() {
    let (cluster, weak_leaf) = weak_beside_ordinary().await;
    let admin = &cluster.admin;
    let managed = cluster.managed();
    let (config, port) = (managed.config.clone(), managed.port);
    // This machine's OpenSSL alone refuses the key: HAProxy on its own would not load
    // these files.
    let args = managed.args();

    let mut certwatch = cluster.certwatch("1.log", &args);
    certwatch.wait_ready().await;
    assert!(
        haproxy_check(&config).is_err(),
        "Debian's OpenSSL level refuses RSA-1024"
    );
    ordinary_routes_served(admin, port).await;
    // (rustls, like webpki, takes no RSA key under 2048 bits: OpenSSL's client tells.)
    assert_eq!(
        presented_to_openssl(port, WEAK_HOST),
        Some(weak_leaf.clone())
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_reloads_total{reason=\"start\",result=\"ok\"}"),
        Some(1.0)
    );
    assert_eq!(reloads(&certwatch), 1.0, "started once, never reloaded");
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(0.0)
    );
    assert!(
        certwatch
            .log_text()
            .contains("HAProxy runs at certwatch's OpenSSL security level"),
    );
    // A rotation of an ordinary route goes through without a reload either.
    let rotated = rotate_secret(admin, "app-0", "tls-2", &host(2)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("the rotation to be served", || async {
        (presented(port, &host(2)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;
    assert_eq!(reloads(&certwatch), 1.0);
    assert!(certwatch.terminate().success());

    // Restarted: HAProxy loads every file again, the RSA-1024 one included.
    let certwatch = cluster.certwatch("2.log", &args);
    certwatch.wait_ready().await;
    ordinary_routes_served(admin, port).await;
    assert_eq!(presented_to_openssl(port, WEAK_HOST), Some(weak_leaf));
    assert_eq!(reloads(&certwatch), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_haproxy_run_by_others_refusing_a_key_is_a_refusal_of_that_route_alone() {
    let (cluster, _weak_leaf) = weak_beside_ordinary().await;
    let (admin, cert_dir) = (&cluster.admin, &cluster.cert_dir);
    let (_haproxy, port, default_leaf) = cluster.haproxy_of_others().await;

    let mut certwatch = cluster.certwatch_beside_haproxy("1.log");
    certwatch.wait_ready().await;
    ordinary_routes_served(admin, port).await;
    assert_eq!(
        presented_to_openssl(port, WEAK_HOST),
        Some(default_leaf.clone()),
        "HAProxy does not serve the RSA-1024 certificate"
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(1.0)
    );
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refusals_total{reason=\"rejected\"}"),
        Some(1.0)
    );
    let log = certwatch.log_text();
    assert!(
        log.contains(
            "certwatch does not start HAProxy: it assumes HAProxy's OpenSSL security level"
        ),
        "{log}"
    );
    // Its line leaves the crt-list file: HAProxy can load the files on its own.
    eventually("the refused line out of the crt-list", || {
        crt_list(cert_dir)
            .iter()
            .all(|(_, sni)| sni != WEAK_HOST)
            .then_some(())
    })
    .await;
    let config = cluster.root.join("haproxy.cfg");
    assert_eq!(haproxy_check(&config), Ok(()));
    // Nothing retries it: a later change of another route goes through alone.
    assert_eq!(refused_pushes(&certwatch), 1.0);
    let rotated = rotate_secret(admin, "app-0", "tls-2", &host(2)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("the rotation to be served", || async {
        (presented(port, &host(2)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;
    assert_eq!(
        refused_pushes(&certwatch),
        1.0,
        "the refused certificate is not retried"
    );
    assert_eq!(
        certwatch
            .log_text()
            .matches("HAProxy refused this certificate")
            .count(),
        1,
        "logged once"
    );
    assert!(certwatch.terminate().success());

    // Restarted: ready again, the refused route refused again, the others served.
    let certwatch = cluster.certwatch_beside_haproxy("2.log");
    certwatch.wait_ready().await;
    ordinary_routes_served(admin, port).await;
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(1.0)
    );
}

/// A refusal outlives a certwatch restart: the restarted certwatch leaves the refused
/// line out of the first crt-list it writes, so a HAProxy (run by others) restarted
/// while certwatch restarts loads its files; nothing is pushed to HAProxy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_outlives_a_certwatch_restart_so_a_restarted_haproxy_loads_its_files() {
    let (cluster, weak_leaf) = weak_beside_ordinary().await;
    let (admin, cert_dir) = (&cluster.admin, &cluster.cert_dir);
    let (haproxy, _, _) = cluster.haproxy_of_others().await;

    let mut certwatch = cluster.certwatch_beside_haproxy("1.log");
    certwatch.wait_ready().await;
    eventually("the refused line out of the crt-list", || {
        crt_list(cert_dir)
            .iter()
            .all(|(_, sni)| sni != WEAK_HOST)
            .then_some(())
    })
    .await;
    assert_eq!(refused_pushes(&certwatch), 1.0);
    assert!(certwatch.terminate().success());

    // certwatch and HAProxy restart together: HAProxy is down while certwatch writes
    // its first crt-list, so nothing can refuse the line in the meantime.
    drop(haproxy);
    let mut certwatch = cluster.certwatch_beside_haproxy("2.log");
    certwatch.wait_files_ready().await;
    assert!(
        crt_list(cert_dir).iter().all(|(_, sni)| sni != WEAK_HOST),
        "the refused line stays out of the first crt-list"
    );
    assert_eq!(crt_list(cert_dir).len(), 5);
    let config = cluster.root.join("haproxy.cfg");
    assert_eq!(haproxy_check(&config), Ok(()));
    let (_haproxy, port, default_leaf) = start_haproxy(&cluster.root, &cluster.socket, cert_dir);
    certwatch.wait_ready().await;
    ordinary_routes_served(admin, port).await;
    assert_eq!(
        presented_to_openssl(port, WEAK_HOST),
        Some(default_leaf),
        "HAProxy does not serve the RSA-1024 certificate"
    );
    assert_ne!(Some(weak_leaf), presented_to_openssl(port, WEAK_HOST));
    assert_eq!(
        certwatch.metric("certwatch_haproxy_refused_routes"),
        Some(1.0)
    );
    // Known refused: not pushed again, not refused again.
    assert_eq!(refused_pushes(&certwatch), 0.0);
    assert_eq!(
        certwatch
            .metric("certwatch_haproxy_refusals_total{reason=\"rejected\"}")
            .unwrap_or(0.0),
        0.0
    );
    assert!(certwatch.terminate().success());
}
