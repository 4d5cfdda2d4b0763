//! Memory per watched object: what the monitor keeps for one idle, synced watch.
//!
//! Ten thousand watches stay open for the daemon's whole life, so bytes per watch is
//! the monitor's figure of merit (the budget is 150 MiB for everything at
//! 10,000 secrets). The heap is counted by a global allocator that tracks live bytes (stats_alloc);
//! the server is an in-process fake whose answers cost next to nothing, so what is
//! counted is the monitor's: the spawned watch task, the protocol state, the cached
//! object, the registry entry and the open response body as `kube::Client` hands it
//! out (the HTTP/2 stream state below it belongs to the transport and is not counted).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;
use std::convert::Infallible;

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::join_all;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use k8s_openapi::api::core::v1::Secret;
use secret_monitor::{
    EventSink, InitialList, MonitorOptions, ObjectEvent, ObjectKey, SecretMonitor,
};
use serde_json::json;

/// The system allocator, counting what is allocated and freed.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Bytes allocated now. stats_alloc adds a realloc's growth to `bytes_allocated` and
/// its shrinkage to `bytes_deallocated` (`bytes_reallocated` is the same change again,
/// netted: adding it would count every realloc twice).
fn live_bytes() -> isize {
    let stats = ALLOCATOR.stats();
    let signed = |bytes: usize| isize::try_from(bytes).unwrap_or(isize::MAX);
    signed(stats.bytes_allocated) - signed(stats.bytes_deallocated)
}

/// A TLS secret of realistic size: about what a certificate and an EC key take,
/// base64-encoded.
fn tls_secret(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
                     "resourceVersion": "7"},
        "data": {"tls.crt": "Y".repeat(1_100), "tls.key": "Y".repeat(320)},
    })
}

/// A server that has every secret (a realistic TLS secret's size) and serves both ways
/// of listing; every watch then stays open and quiet.
fn fake_client() -> kube::Client {
    let service = tower::service_fn(|request: http::Request<kube::client::Body>| async move {
        let query = request.uri().query().unwrap_or_default().to_owned();
        let name = form_urlencoded::parse(query.as_bytes())
            .find(|(key, _)| key == "fieldSelector")
            .and_then(|(_, value)| value.strip_prefix("metadata.name=").map(str::to_owned))
            .unwrap_or_default();
        let secret = tls_secret(&name);
        let body: BoxBody<Bytes, Infallible> = if query.contains("sendInitialEvents=true") {
            let bookmark = json!({"type": "BOOKMARK", "object": {
                "kind": "Secret", "apiVersion": "v1",
                "metadata": {"resourceVersion": "7",
                             "annotations": {"k8s.io/initial-events-end": "true"}}}});
            let added = json!({"type": "ADDED", "object": secret});
            let events = Bytes::from(format!("{added}\n{bookmark}\n"));
            BodyExt::boxed(StreamBody::new(
                futures::stream::iter([Ok(http_body::Frame::data(events))])
                    .chain(futures::stream::pending()),
            ))
        } else if query.contains("watch=true") {
            BodyExt::boxed(StreamBody::new(futures::stream::pending::<
                Result<http_body::Frame<Bytes>, Infallible>,
            >()))
        } else {
            let list = json!({"apiVersion": "v1", "kind": "SecretList",
                "metadata": {"resourceVersion": "7"}, "items": [secret]});
            Full::new(Bytes::from(list.to_string())).boxed()
        };
        Ok::<_, Infallible>(http::Response::new(body))
    });
    kube::Client::new(service, "ns")
}

/// A handler that keeps nothing, as the daemon's sink keeps nothing per secret here:
/// what is counted is the monitor's, not a test channel's buffer.
struct Ignore;

impl EventSink<Secret> for Ignore {
    fn deliver(&mut self, _event: ObjectEvent<Secret>) {}
}

/// Live heap bytes per synced, idle watch after registering `count` keys (beyond a
/// warm-up that allocates whatever is allocated once).
async fn bytes_per_watch(initial_list: InitialList, count: usize) -> isize {
    let monitor = SecretMonitor::with_options(
        fake_client(),
        MonitorOptions {
            initial_list,
            ..MonitorOptions::default()
        },
    );
    let mut handles = Vec::with_capacity(count + 100);
    for registration in join_all(
        (0..100).map(|i| monitor.add_sink(ObjectKey::new("ns", format!("warm-{i}")), Ignore)),
    )
    .await
    {
        handles.push(registration.unwrap());
    }
    settle().await;
    let before = live_bytes();
    for registration in join_all(
        (0..count).map(|i| monitor.add_sink(ObjectKey::new("ns", format!("secret-{i}")), Ignore)),
    )
    .await
    {
        handles.push(registration.unwrap());
    }
    settle().await;
    let after = live_bytes();
    // Every watch is open: the keys' objects are cached.
    assert!(handles.iter().all(|handle| monitor.get(handle).is_ok()));
    (after - before) / isize::try_from(count).unwrap()
}

/// Lets every watch task reach its idle wait (after the first sync, the watch request
/// of a list-then-watch key is still on its way).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_watch_costs_a_few_kilobytes() {
    // One test in this binary, so that no other test's allocations are counted.
    let text = tls_secret("secret-0").to_string();
    let before = live_bytes();
    let object: Secret = serde_json::from_str(&text).unwrap();
    println!("the cached object: {} bytes", live_bytes() - before);
    drop(object);
    for (initial_list, name) in [
        (InitialList::Streaming, "streaming list"),
        (InitialList::ListThenWatch, "list then watch"),
    ] {
        let bytes = bytes_per_watch(initial_list, 2_000).await;
        println!("{name}: {bytes} bytes per watch");
        // Measured (debug build): 3.6-3.7 KB per watch with this secret, 1.7 KB of it
        // the cached Secret (4.2-4.4 KB while each key's entry held a watch channel, a
        // cancellation token and a BTreeMap of handlers; 7.1 KB before reallocations
        // were counted once); kube-client's line buffer alone was 8 KiB per watch, and
        // the watcher stream 2.4 KiB more.
        assert!(
            (1_000..8_192).contains(&bytes),
            "{name}: {bytes} bytes per watch"
        );
    }
}
