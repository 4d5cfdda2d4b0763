//! Transport: 1,000 watches multiplexed over HTTP/2 on at most 10 connections,
//! h1 and h2 on one port, the advertised stream limit, and TLS with ALPN.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use http::Method;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_sim::loadgen::{H2Connection, H2Pool};
use kube_sim::{SimConfig, SimStats, Simulator};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use serde_json::json;

/// Stats fetched over HTTP/1.1 through the kube client, so the query does not add
/// an HTTP/2 connection.
async fn stats_over_h1(sim: &Simulator) -> SimStats {
    let client = sim.client("admin").await.unwrap();
    let (code, v) = get(&client, "/sim/stats").await;
    assert_eq!(code, 200);
    serde_json::from_value(v).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_watches_over_http2_on_ten_connections() {
    let sim = start().await;
    for i in 0..1000 {
        sim.store()
            .create(
                "secrets",
                opaque_secret(&format!("ns-{}", i % 20), &format!("s-{i}"), &[]),
            )
            .unwrap();
    }
    let rv = sim.store().resource_version();
    let token = sim.token("admin").unwrap();
    let pool = H2Pool::new(sim.addr(), &token, 100);
    let paths: Vec<String> = (0..1000)
        .map(|i| {
            format!(
                "/api/v1/namespaces/ns-{}/secrets?watch=true&fieldSelector=metadata.name%3Ds-{i}&resourceVersion={rv}&allowWatchBookmarks=true",
                i % 20
            )
        })
        .collect();
    let watches = pool.open_watches(&paths).await.unwrap();
    assert_eq!(watches.len(), 1000);
    assert_eq!(pool.connections(), 10);

    let stats = stats_over_h1(&sim).await;
    assert_eq!(stats.open_watches, 1000);
    assert_eq!(stats.open_watches_by_resource["secrets"], 1000);
    assert!(stats.peak_open_watches >= 1000);
    assert_eq!(stats.watches_started, 1000);
    assert!(
        stats.open_connections.h2 <= 10,
        "{:?}",
        stats.open_connections
    );
    assert_eq!(stats.connections.h2, 10);
    assert_eq!(stats.inflight, 0, "open watches are not in flight");
    assert_eq!(stats.requests["watch"]["secrets"], 1000);

    // One update per secret reaches exactly its watcher.
    for i in 0..1000 {
        sim.store()
            .merge_patch(
                "secrets",
                format!("ns-{}", i % 20).as_str(),
                &format!("s-{i}"),
                json!({"metadata": {"labels": {"v": "2"}}}),
            )
            .unwrap();
    }
    let received = futures::future::join_all(watches.into_iter().enumerate().map(
        |(i, mut w)| async move {
            let e = w.next_event().await.unwrap();
            assert_eq!(e["type"], "MODIFIED");
            assert_eq!(e["object"]["metadata"]["name"], format!("s-{i}"));
            w
        },
    ))
    .await;
    assert_eq!(received.len(), 1000);
    let stats = stats_over_h1(&sim).await;
    assert_eq!(stats.watch_events_sent, 1000);
    // Every distinct secret had exactly one watch and no GET.
    let log = sim.request_log();
    let mut watched: Vec<_> = log
        .iter()
        .filter(|r| r.verb == "watch")
        .map(|r| r.name.clone().unwrap())
        .collect();
    watched.sort();
    watched.dedup();
    assert_eq!(watched.len(), 1000);
    assert!(
        log.iter()
            .all(|r| !(r.verb == "get" && r.resource == "secrets"))
    );
    assert!(
        log.iter()
            .filter(|r| r.verb == "watch")
            .all(|r| r.protocol == "h2")
    );
    drop(received);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_and_http2_share_the_port_and_streams_are_limited() {
    let sim = start_with(SimConfig {
        max_concurrent_streams: 5,
        ..SimConfig::default()
    })
    .await;
    let token = sim.token("admin").unwrap();
    // h2c with prior knowledge.
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let (status, _) = conn
        .request(Method::GET, "/api/v1/namespaces", None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    // HTTP/1.1 through kube's client.
    let client = sim.client("admin").await.unwrap();
    let (code, _) = get(&client, "/api/v1/namespaces").await;
    assert_eq!(code, 200);
    let stats = sim.stats();
    assert_eq!((stats.connections.h1, stats.connections.h2), (1, 1));
    let protocols: Vec<String> = sim.request_log().into_iter().map(|r| r.protocol).collect();
    assert_eq!(protocols, ["h2", "h1"]);

    // The advertised SETTINGS_MAX_CONCURRENT_STREAMS.
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let (client, h2conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(h2conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::get(format!("http://{}/version", sim.addr()))
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    assert_eq!(resp.await.unwrap().status(), 200);
    assert_eq!(client.current_max_send_streams(), 5);
    sim.shutdown().await;
}

fn tls_client(ca_pem: &str, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_negotiates_h2_or_http1_with_alpn() {
    let sim = start_with(SimConfig {
        tls: true,
        ..SimConfig::default()
    })
    .await;
    assert!(sim.url().starts_with("https://127.0.0.1:"));
    let ca = sim.ca_pem().unwrap();
    let kc = sim.kubeconfig();
    let ca_in_kubeconfig = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .certificate_authority_data
        .clone()
        .unwrap();
    assert_eq!(ca_in_kubeconfig, b64(&ca));
    let token = sim.token("admin").unwrap();

    // ALPN h2.
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let tls = tls_client(&ca, &[b"h2", b"http/1.1"])
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get(format!("https://{}/api/v1/namespaces/default", sim.addr()))
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"Namespace\""));

    // ALPN http/1.1.
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let tls = tls_client(&ca, &[b"http/1.1"])
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("/version")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {token}"))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    assert_eq!(send.send_request(req).await.unwrap().status(), 200);

    // kube's own client verifies the server against the kubeconfig's CA.
    let client = sim.client("router").await.unwrap();
    client.apiserver_version().await.unwrap();
    let stats = sim.stats();
    assert_eq!(stats.connections.h2, 1);
    assert!(stats.connections.h1 >= 2);
    sim.shutdown().await;
}
