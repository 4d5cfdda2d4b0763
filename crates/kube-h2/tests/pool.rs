//! The pooled client against a real HTTP server, through `kube::Api<Secret>`.
//!
//! Assertions are on counts (connections, open watches, protocol per request), never on
//! elapsed time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{pin::Pin, sync::atomic::Ordering, time::Duration};

use futures::{Stream, StreamExt, future::join_all};
use k8s_openapi::api::core::v1::Secret;
use kube::{
    Api,
    api::{ListParams, WatchEvent, WatchParams},
};
use kube_h2::{ClientOptions, ConnectError, PooledClient, Protocol, build_client};
use support::{ServerOptions, TestServer, eventually};

/// Upper bound for steps that must finish; only reached when the pool is broken.
const HANG_GUARD: Duration = Duration::from_secs(120);

type Watch = Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<Secret>>> + Send>>;

/// Opens a watch on one secret and waits for its first event, so the stream is known
/// to be established end to end.
async fn open_watch(api: Api<Secret>, name: String) -> Watch {
    let params = WatchParams::default().fields(&format!("metadata.name={name}"));
    let mut stream = api
        .watch(&params, "0")
        .await
        .expect("watch request")
        .boxed();
    match stream.next().await {
        Some(Ok(WatchEvent::Added(secret))) => {
            assert_eq!(secret.metadata.name.as_deref(), Some(name.as_str()));
        }
        other => panic!("first event of {name}: {other:?}"),
    }
    stream
}

/// Opens `n` watches at once.
async fn open_watches(api: &Api<Secret>, range: std::ops::Range<usize>) -> Vec<Watch> {
    let tasks = range.map(|i| tokio::spawn(open_watch(api.clone(), format!("secret-{i}"))));
    // A hang guard, not a timing assertion: a pool that queues watches behind others
    // that never end would otherwise hang the test forever.
    tokio::time::timeout(HANG_GUARD, join_all(tasks))
        .await
        .expect("not every watch opened: requests are stuck waiting for a stream")
        .into_iter()
        .map(|joined| joined.expect("watch task"))
        .collect()
}

fn client(server: &TestServer, options: ClientOptions) -> (PooledClient, Api<Secret>) {
    let pooled = build_client(server.kube_config(), options).expect("build client");
    let api = Api::namespaced(pooled.client(), "ns");
    (pooled, api)
}

/// The kube_h2 error somewhere in a kube error's source chain.
fn find_pool_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a kube_h2::Error> {
    let mut current = Some(error);
    while let Some(e) = current {
        if let Some(found) = e.downcast_ref::<kube_h2::Error>() {
            return Some(found);
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(inner) = io.get_ref()
            && let Some(found) = inner.downcast_ref::<kube_h2::Error>()
        {
            return Some(found);
        }
        current = e.source();
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_beyond_the_server_limit_open_new_connections() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 10,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let watches = open_watches(&api, 0..35).await;

    assert_eq!(server.state.open_watches(), 35);
    assert_eq!(server.state.connections_accepted(), 4);
    assert!(server.state.peak_watches_per_connection() <= 10);
    assert_eq!(server.state.watches_per_connection(), vec![5, 10, 10, 10]);
    assert_eq!(server.state.http1_requests.load(Ordering::SeqCst), 0);

    let stats = pooled.stats();
    assert_eq!(stats.http2_connections_opened, 4);
    assert_eq!(stats.http2_connections_open, 4);
    assert_eq!(stats.http1_connections_opened, 0);
    assert_eq!(stats.active_streams, 35);
    assert_eq!(stats.peak_streams_per_connection, 10);
    let connections = pooled.pool().connections();
    assert_eq!(connections.len(), 4);
    assert!(connections.iter().all(|c| c.stream_limit == 10));
    assert_eq!(
        connections.iter().map(|c| c.active_streams).sum::<usize>(),
        35
    );
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_watches_share_about_ten_connections() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 100,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let watches = open_watches(&api, 0..1000).await;

    assert_eq!(server.state.open_watches(), 1000);
    let connections = server.state.connections_accepted();
    assert!(
        (10..=12).contains(&connections),
        "1000 watches at 100 streams per connection used {connections} connections"
    );
    assert!(server.state.peak_watches_per_connection() <= 100);
    let stats = pooled.stats();
    assert_eq!(stats.http2_connections_opened as usize, connections);
    assert_eq!(stats.active_streams, 1000);
    assert!(stats.peak_streams_per_connection <= 100);
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_limits_streams_below_what_the_server_allows() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 100,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(
        &server,
        ClientOptions::default().max_streams_per_connection(4),
    );

    let watches = open_watches(&api, 0..9).await;

    assert_eq!(server.state.open_watches(), 9);
    assert_eq!(server.state.watches_per_connection(), vec![1, 4, 4]);
    assert_eq!(pooled.stats().http2_connections_opened, 3);
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_http2_is_served_over_http1() {
    let server = TestServer::start(ServerOptions {
        http2: false,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let watches = open_watches(&api, 0..3).await;
    let again = api.get("secret-x").await.unwrap();
    assert_eq!(again.metadata.name.as_deref(), Some("secret-x"));

    assert_eq!(server.state.open_watches(), 3);
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 0);
    assert_eq!(server.state.http1_requests.load(Ordering::SeqCst), 5);
    let stats = pooled.stats();
    // One probe found out, once; the origin is remembered as HTTP/1.1-only.
    assert_eq!(stats.http1_fallbacks, 1);
    assert_eq!(stats.http2_connections_opened, 0);
    // HTTP/1.1 carries one request per connection at a time: the three open watches
    // and the get need four; the list's connection may or may not have been back in
    // hyper's idle pool when the watches started.
    assert!(
        (4..=5).contains(&stats.http1_connections_opened),
        "{stats:?}"
    );
    assert_eq!(stats.active_streams, 3);
    // The probe plus the HTTP/1.1 connections.
    assert_eq!(
        server.state.connections_accepted() as u64,
        stats.http1_connections_opened + 1
    );
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_only_never_tries_http2() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (pooled, api) = client(
        &server,
        ClientOptions::default().protocol(Protocol::Http1Only),
    );

    let watches = open_watches(&api, 0..3).await;

    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 0);
    assert_eq!(server.state.connections_accepted(), 3);
    let stats = pooled.stats();
    assert_eq!(
        (stats.http1_connections_opened, stats.http1_fallbacks),
        (3, 0)
    );
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_only_reports_a_server_without_http2() {
    let server = TestServer::start(ServerOptions {
        http2: false,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(
        &server,
        ClientOptions::default().protocol(Protocol::Http2Only),
    );

    let error = api.list(&ListParams::default()).await.unwrap_err();

    match find_pool_error(&error) {
        Some(kube_h2::Error::Connect { source, .. }) => {
            assert!(
                matches!(**source, ConnectError::Http2PrefaceRejected(_)),
                "{source}"
            );
        }
        other => panic!("expected a connect error, got {other:?} from {error}"),
    }
    assert_eq!(server.state.http1_requests.load(Ordering::SeqCst), 0);
    assert_eq!(pooled.stats().connect_failures, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_alpn_h2_multiplexes() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 10,
        tls_alpn: Some(vec![b"h2".to_vec(), b"http/1.1".to_vec()]),
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let watches = open_watches(&api, 0..12).await;
    api.list(&ListParams::default()).await.unwrap();

    assert_eq!(server.state.open_watches(), 12);
    assert_eq!(server.state.connections_accepted(), 2);
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 13);
    assert_eq!(server.state.http1_requests.load(Ordering::SeqCst), 0);
    assert_eq!(pooled.stats().http2_connections_opened, 2);
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_alpn_http1_only_falls_back() {
    let server = TestServer::start(ServerOptions {
        tls_alpn: Some(vec![b"http/1.1".to_vec()]),
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let watches = open_watches(&api, 0..2).await;
    api.list(&ListParams::default()).await.unwrap();

    assert_eq!(server.state.open_watches(), 2);
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 0);
    assert_eq!(server.state.http1_requests.load(Ordering::SeqCst), 3);
    let stats = pooled.stats();
    assert_eq!(stats.http1_fallbacks, 1);
    assert_eq!(stats.http2_connections_opened, 0);
    assert_eq!(stats.http1_connections_opened, 3);
    drop(watches);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_rejects_an_untrusted_server() {
    let server = TestServer::start(ServerOptions {
        tls_alpn: Some(vec![b"h2".to_vec()]),
        ..ServerOptions::default()
    })
    .await;
    let mut config = server.kube_config();
    // A CA the server's certificate was not issued by.
    config.root_cert = Some(vec![support::TestCa::new().ca_der]);
    let pooled = build_client(config, ClientOptions::default()).unwrap();
    let api: Api<Secret> = Api::namespaced(pooled.client(), "ns");

    let error = api.list(&ListParams::default()).await.unwrap_err();

    match find_pool_error(&error) {
        Some(kube_h2::Error::Connect { source, .. }) => {
            assert!(matches!(**source, ConnectError::Tls(_)), "{source}");
        }
        other => panic!("expected a TLS connect error, got {other:?} from {error}"),
    }
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_watches_free_their_slots() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 10,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let mut watches = open_watches(&api, 0..10).await;
    assert_eq!(pooled.stats().http2_connections_opened, 1);
    watches.truncate(7);
    eventually("slots of dropped watches released", || {
        pooled.stats().active_streams == 7 && server.state.open_watches() == 7
    })
    .await;

    watches.extend(open_watches(&api, 10..13).await);

    assert_eq!(server.state.open_watches(), 10);
    assert_eq!(server.state.connections_accepted(), 1);
    let stats = pooled.stats();
    assert_eq!(stats.http2_connections_opened, 1);
    assert_eq!(stats.active_streams, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surplus_idle_connections_are_closed() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 5,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let watches = open_watches(&api, 0..15).await;
    assert_eq!(pooled.stats().http2_connections_open, 3);
    drop(watches);

    // One idle connection is kept for the next request; the others close.
    eventually("surplus idle connections closed", || {
        pooled.stats().http2_connections_open == 1 && server.state.connections_open() == 1
    })
    .await;
    assert_eq!(pooled.stats().active_streams, 0);
    api.list(&ListParams::default()).await.unwrap();
    assert_eq!(pooled.stats().http2_connections_opened, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_connection_is_replaced() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let mut watches = open_watches(&api, 0..5).await;
    assert_eq!(pooled.stats().http2_connections_opened, 1);

    server.state.kill_connections();

    // Every watch ends, with an error that names the lost connection, or plainly.
    let mut lost = 0;
    for watch in &mut watches {
        loop {
            match watch.next().await {
                Some(Ok(_bookmark)) => continue,
                Some(Err(error)) => {
                    if matches!(
                        find_pool_error(&error),
                        Some(kube_h2::Error::ConnectionLost { .. })
                    ) {
                        lost += 1;
                    }
                }
                None => {}
            }
            break;
        }
    }
    eventually("dead connection left the pool", || {
        pooled.stats().http2_connections_open == 0
    })
    .await;
    let stats = pooled.stats();
    assert_eq!(stats.active_streams, 0);
    assert_eq!(stats.connections_lost, 1);
    assert!(lost > 0, "no watch reported the lost connection");

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let _again = open_watches(&api, 5..7).await;
    assert_eq!(pooled.stats().http2_connections_opened, 2);
    assert_eq!(server.state.connections_accepted(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_moves_new_streams_to_a_new_connection() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let mut watches = open_watches(&api, 0..3).await;
    server.state.goaway_connections();
    eventually("client saw GOAWAY", || {
        pooled
            .pool()
            .connections()
            .iter()
            .all(|c| !c.accepting_streams)
    })
    .await;

    let mut more = open_watches(&api, 3..5).await;

    assert_eq!(pooled.stats().http2_connections_opened, 2);
    assert_eq!(server.state.connections_accepted(), 2);
    // The watches on the draining connection still stream.
    for watch in watches.iter_mut().chain(more.iter_mut()) {
        assert!(matches!(
            watch.next().await,
            Some(Ok(WatchEvent::Bookmark(_)))
        ));
    }
    assert_eq!(server.state.open_watches(), 5);
    assert_eq!(pooled.stats().active_streams, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_connect_fails_the_request_and_does_not_stick() {
    // Bind and close a port so nothing listens there.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
    let pooled = build_client(config, ClientOptions::default()).unwrap();
    let api: Api<Secret> = Api::namespaced(pooled.client(), "ns");

    for attempt in 1..=2 {
        let error = api.list(&ListParams::default()).await.unwrap_err();
        assert!(
            matches!(
                find_pool_error(&error),
                Some(kube_h2::Error::Connect { source, .. }) if matches!(**source, ConnectError::Tcp(_))
            ),
            "{error}"
        );
        assert_eq!(pooled.stats().connect_failures, attempt);
    }
    assert_eq!(pooled.stats().active_streams, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_reach_the_server() {
    let server = TestServer::start(ServerOptions::default()).await;

    let mut config = server.kube_config();
    config.auth_info =
        serde_json::from_value(serde_json::json!({"token": "static-token"})).unwrap();
    let pooled = build_client(config, ClientOptions::default()).unwrap();
    let api: Api<Secret> = Api::namespaced(pooled.client(), "ns");
    api.list(&ListParams::default()).await.unwrap();

    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "file-token").unwrap();
    let mut config = server.kube_config();
    config.auth_info = serde_json::from_value(
        serde_json::json!({"tokenFile": token_file.path().to_str().unwrap()}),
    )
    .unwrap();
    let pooled = build_client(config, ClientOptions::default()).unwrap();
    let api: Api<Secret> = Api::namespaced(pooled.client(), "ns");
    let _watch = open_watch(api, "s".to_owned()).await;

    assert_eq!(
        server.state.authorizations(),
        vec![
            "Bearer static-token".to_owned(),
            "Bearer file-token".to_owned()
        ]
    );
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_certwatch_user_agent() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (_pooled, api) = client(&server, ClientOptions::default());
    api.list(&ListParams::default()).await.unwrap();
    let _watch = open_watch(api, "s".to_owned()).await;
    assert_eq!(
        server.state.user_agents(),
        [format!("certwatch/{}", env!("CARGO_PKG_VERSION"))]
    );
    assert_eq!(kube_h2::DEFAULT_USER_AGENT, server.state.user_agents()[0]);

    let (_pooled, api) = client(&server, ClientOptions::default().user_agent("router/4.18"));
    api.list(&ListParams::default()).await.unwrap();
    assert_eq!(server.state.user_agents()[1..], ["router/4.18".to_owned()]);

    let error = build_client(
        server.kube_config(),
        ClientOptions::default().user_agent("bad\nagent"),
    )
    .unwrap_err();
    assert!(
        matches!(error, kube_h2::Error::InvalidUserAgent(_)),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_are_refused_with_a_clear_error() {
    let mut config = kube::Config::new("https://kube.example:6443".parse().unwrap());
    config.proxy_url = Some("http://proxy.example:3128".parse().unwrap());
    let error = build_client(config, ClientOptions::default()).unwrap_err();
    assert!(matches!(error, kube_h2::Error::ProxyNotSupported { .. }));
    assert!(error.to_string().contains("proxy.example"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_answering_is_dropped_by_keepalive() {
    let server = TestServer::start(ServerOptions::default()).await;
    let proxy = support::FreezableProxy::start(server.addr).await;
    let config = kube::Config::new(format!("http://{}", proxy.addr).parse().unwrap());
    // PINGs often, but give each answer long enough that a busy CI machine does not
    // drop the healthy connection before the freeze.
    let options = ClientOptions::default()
        .keepalive(Some(Duration::from_millis(100)), Duration::from_secs(1));
    let pooled = build_client(config, options).unwrap();
    let api: Api<Secret> = Api::namespaced(pooled.client(), "ns");

    let mut watches = open_watches(&api, 0..4).await;
    proxy.freeze_existing();

    // Without keep-alive these would wait forever for the next event.
    for watch in &mut watches {
        let ended = tokio::time::timeout(HANG_GUARD, async {
            loop {
                match watch.next().await {
                    Some(Ok(_)) => continue,
                    Some(Err(error)) => return Some(error),
                    None => return None,
                }
            }
        })
        .await
        .expect("a watch on a dead connection never ended");
        if let Some(error) = ended {
            assert!(
                matches!(
                    find_pool_error(&error),
                    Some(kube_h2::Error::ConnectionLost { .. })
                ),
                "{error}"
            );
        }
    }
    eventually("dead connection left the pool", || {
        pooled.stats().http2_connections_open == 0
    })
    .await;
    let stats = pooled.stats();
    assert_eq!(stats.connections_lost, 1, "{stats:?}");
    assert_eq!(stats.active_streams, 0, "{stats:?}");

    // New connections through the proxy flow again.
    api.list(&ListParams::default()).await.unwrap();
    assert_eq!(pooled.stats().http2_connections_opened, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_header_deadline_spares_watch_bodies() {
    let server = TestServer::start(ServerOptions::default()).await;
    let options = ClientOptions::default().response_headers_timeout(Duration::from_secs(1));
    let (pooled, api) = client(&server, options);

    let error = api.get("hang").await.unwrap_err();
    assert!(
        matches!(
            find_pool_error(&error),
            Some(kube_h2::Error::ResponseTimeout { .. })
        ),
        "{error}"
    );
    eventually("the timed-out request gave its slot back", || {
        pooled.stats().active_streams == 0
    })
    .await;

    // The watch's body outlives the deadline (three bookmarks, 500 ms apart).
    let mut watch = open_watch(api.clone(), "slow".to_owned()).await;
    for _ in 0..3 {
        assert!(matches!(
            watch.next().await,
            Some(Ok(WatchEvent::Bookmark(_)))
        ));
    }
    assert_eq!(pooled.stats().active_streams, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_are_sent_over_http2() {
    let server = TestServer::start(ServerOptions::default()).await;
    let (pooled, api) = client(&server, ClientOptions::default());

    let mut secret = Secret::default();
    secret.metadata.name = Some("created".to_owned());
    secret.string_data = Some([("big".to_owned(), "x".repeat(300_000))].into());
    let created = api
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .unwrap();

    assert_eq!(created.metadata.name.as_deref(), Some("created"));
    assert_eq!(created.string_data, secret.string_data);
    assert_eq!(server.state.http2_requests.load(Ordering::SeqCst), 1);
    assert_eq!(pooled.stats().active_streams, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_closes_its_connections() {
    let server = TestServer::start(ServerOptions {
        max_concurrent_streams: 2,
        ..ServerOptions::default()
    })
    .await;
    let (pooled, api) = client(&server, ClientOptions::default());
    let watches = open_watches(&api, 0..4).await;
    assert_eq!(server.state.connections_open(), 2);
    let (kube_client, handle) = pooled.into_parts();

    drop(watches);
    drop(api);
    let closed = handle.clone();
    let closed = tokio::spawn(async move { closed.closed().await });
    drop(kube_client);

    // Woken by the last connection's close, not by looking again.
    tokio::time::timeout(support::PATIENCE, closed)
        .await
        .expect("every connection closed in time")
        .unwrap();
    assert_eq!(handle.stats().http2_connections_open, 0);
    eventually("server saw every connection close", || {
        server.state.connections_open() == 0
    })
    .await;
    eventually("pool is gone", || handle.connections().is_empty()).await;
    assert_eq!(handle.stats().http2_connections_open, 0);
}
