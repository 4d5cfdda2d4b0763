//! certwatch's endpoints cannot be starved, through the binary against the real control
//! plane (tools/testenv: etcd + kube-apiserver with RBAC, for the authorized scrape):
//!
//! - 300 HTTP/2 connections to the TLS metrics endpoint (`--metrics-listen`), each
//!   past its TLS handshake and HTTP/2 preface, then silent, plus 300 TCP connections
//!   that never start their handshake;
//! - 150 idle and 150 dribbling (a byte of headers now and then) connections to the
//!   plain `--listen` port;
//!
//! and then `/healthz`, `/readyz` and an authorized scrape answer, and every
//! dribbling connection is closed by certwatch (its headers never complete).
//!
//! No timing is asserted: answers and counts. The waits for answers have a generous
//! bound only so that a starved endpoint fails the test instead of hanging it.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::delegation::*;
use common::*;
use tokio::io::AsyncWriteExt;

/// A hang guard, not a timing assertion.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// HTTP/2's connection preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

async fn h2_idle(
    addr: std::net::SocketAddr,
    ca_pem: &str,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    // A connection that certwatch already closed to make room is fine: it was idle.
    let mut tls = connector.connect(name, tcp).await.ok()?;
    tls.write_all(H2_PREFACE).await.ok()?;
    tls.flush().await.ok()?;
    Some(tls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_do_not_starve_probes_or_scrapes() {
    let delegated = Delegated::start(&[]).await;
    let (ca, prometheus) = (delegated.ca.clone(), delegated.prometheus.clone());
    let certwatch = Certwatch::launch(delegated.launch());
    certwatch.wait_ready().await;
    let metrics_addr = certwatch.metrics_addr.expect("the HTTPS metrics address");
    let plain = certwatch.addr;

    // The metrics endpoint: 300 HTTP/2 connections past their preface, then silent;
    // 300 that never start their TLS handshake.
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(h2_idle(metrics_addr, &ca).await);
    }
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(tokio::net::TcpStream::connect(metrics_addr).await.unwrap());
    }
    // The plain port: 150 idle connections, 150 dribbling their headers.
    let mut idle = Vec::new();
    for _ in 0..150 {
        idle.push(tokio::net::TcpStream::connect(plain).await.unwrap());
    }
    let closed = Arc::new(AtomicUsize::new(0));
    let mut dribblers = Vec::new();
    for _ in 0..150 {
        let mut stream = tokio::net::TcpStream::connect(plain).await.unwrap();
        let closed = Arc::clone(&closed);
        dribblers.push(tokio::spawn(async move {
            let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
            if stream.write_all(request).await.is_err() {
                closed.fetch_add(1, Ordering::Relaxed);
                return;
            }
            // One byte per half second, never the end of the headers.
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                if stream.write_all(b"a").await.is_err() {
                    closed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }));
    }

    // Probes and an authorized scrape answer.
    let probe = |path: &'static str| {
        tokio::task::spawn_blocking(move || http_request(plain, "GET", path, ""))
    };
    let (status, body) = tokio::time::timeout(HANG_GUARD, probe("/healthz"))
        .await
        .expect("/healthz answers")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = tokio::time::timeout(HANG_GUARD, probe("/readyz"))
        .await
        .expect("/readyz answers")
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _head, body) = tokio::time::timeout(
        HANG_GUARD,
        https_get(metrics_addr, &ca, "/metrics", Some(&prometheus)),
    )
    .await
    .expect("an authorized scrape answers");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("certwatch_ready 1"), "{body}");

    // Headers that never complete: every dribbling connection is closed by certwatch.
    eventually("every dribbling connection to be closed", || {
        (closed.load(Ordering::Relaxed) == 150).then_some(())
    })
    .await;
    // And the endpoints still answer.
    let (status, _) = tokio::time::timeout(HANG_GUARD, probe("/healthz"))
        .await
        .expect("/healthz answers")
        .unwrap();
    assert_eq!(status, 200);
    let (status, _head, _body) = tokio::time::timeout(
        HANG_GUARD,
        https_get(metrics_addr, &ca, "/metrics", Some(&prometheus)),
    )
    .await
    .expect("an authorized scrape answers");
    assert_eq!(status, 200);
    drop((held, silent, idle));
    for dribbler in dribblers {
        dribbler.abort();
    }
}
