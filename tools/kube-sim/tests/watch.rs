//! Watches through kube-runtime (`watcher` with both initial list strategies,
//! `watch_object`) and raw requests: resourceVersion semantics, 410 Expired,
//! bookmarks, streaming lists, timeouts, selector transitions, slow watchers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use http::Method;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher::watch_object;
use kube::runtime::watcher::{self, Event};
use kube_sim::loadgen::H2Connection;
use kube_sim::{INITIAL_EVENTS_END, ServerFeatures, SimConfig};
use serde_json::{Value, json};

fn name_of(s: &Secret) -> String {
    s.metadata.name.clone().unwrap_or_default()
}

async fn run_watcher(strategy_streaming: bool) {
    let sim = start().await;
    for i in 0..3 {
        sim.store()
            .create(
                "secrets",
                opaque_secret("default", &format!("w{i}"), &[("v", "0")]),
            )
            .unwrap();
    }
    let client = sim.client("admin").await.unwrap();
    let api: Api<Secret> = Api::namespaced(client, "default");
    let mut config = watcher::Config::default().page_size(2);
    if strategy_streaming {
        config = config.streaming_lists();
    }
    let mut stream = watcher::watcher(api, config).boxed();
    let mut initial = Vec::new();
    loop {
        match stream.try_next().await.unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(s) => initial.push(name_of(&s)),
            Event::InitDone => break,
            other => panic!("unexpected before InitDone: {other:?}"),
        }
    }
    initial.sort();
    assert_eq!(initial, ["w0", "w1", "w2"]);
    sim.store()
        .merge_patch("secrets", "default", "w1", json!({"data": {"v": b64("1")}}))
        .unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        Event::Apply(s) => {
            assert_eq!(name_of(&s), "w1");
            assert_eq!(s.data.unwrap()["v"].0, b"1");
        }
        other => panic!("expected Apply, got {other:?}"),
    }
    sim.store().delete("secrets", "default", "w2").unwrap();
    match stream.try_next().await.unwrap().unwrap() {
        Event::Delete(s) => assert_eq!(name_of(&s), "w2"),
        other => panic!("expected Delete, got {other:?}"),
    }
    let log = sim.request_log();
    let lists = log
        .iter()
        .filter(|r| r.verb == "list" && r.resource == "secrets")
        .count();
    let watches: Vec<_> = log
        .iter()
        .filter(|r| r.verb == "watch" && r.resource == "secrets")
        .collect();
    if strategy_streaming {
        assert_eq!(lists, 0);
        assert_eq!(watches.len(), 1);
        assert!(watches[0].send_initial_events);
    } else {
        assert_eq!(lists, 2, "two pages of two");
        assert_eq!(watches.len(), 1);
        assert!(!watches[0].send_initial_events);
    }
    assert_eq!(sim.stats().open_watches, 1);
    drop(stream);
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_with_list_then_watch() {
    run_watcher(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_with_streaming_list() {
    run_watcher(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_object_follows_deletion_and_recreation() {
    let sim = start().await;
    let client = sim.client("admin").await.unwrap();
    let api: Api<Secret> = Api::namespaced(client, "default");
    let mut stream = watch_object(api, "target").boxed();
    assert!(
        stream.try_next().await.unwrap().unwrap().is_none(),
        "absent at first"
    );
    sim.store()
        .create("secrets", opaque_secret("default", "target", &[("a", "1")]))
        .unwrap();
    sim.store()
        .create("secrets", opaque_secret("default", "bystander", &[]))
        .unwrap();
    let got = stream.try_next().await.unwrap().unwrap().unwrap();
    assert_eq!(name_of(&got), "target");
    sim.store().delete("secrets", "default", "target").unwrap();
    assert!(stream.try_next().await.unwrap().unwrap().is_none());
    sim.store()
        .create("secrets", opaque_secret("default", "target", &[("a", "2")]))
        .unwrap();
    let again = stream.try_next().await.unwrap().unwrap().unwrap();
    assert_eq!(again.data.unwrap()["a"].0, b"2");
    // The watch was a per-object field-selector watch.
    let watch = sim
        .request_log()
        .into_iter()
        .find(|r| r.verb == "watch")
        .unwrap();
    assert_eq!(watch.name.as_deref(), Some("target"));
    assert_eq!(
        watch.field_selector.as_deref(),
        Some("metadata.name=target")
    );
    sim.shutdown().await;
}

async fn lines(conn: &H2Connection, path: &str, n: usize) -> Vec<Value> {
    let mut w = conn.watch(path).await.unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        out.push(w.next_event().await.expect("watch ended early"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_version_semantics() {
    let sim = start().await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let a = sim
        .store()
        .create("secrets", opaque_secret("default", "a", &[]))
        .unwrap();
    let rv_a = rv_of(&a);
    sim.store()
        .create("secrets", opaque_secret("default", "b", &[]))
        .unwrap();
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "a",
            json!({"metadata": {"labels": {"x": "y"}}}),
        )
        .unwrap();

    // Unset and "0": the current objects as ADDED.
    let ev = lines(&conn, "/api/v1/namespaces/default/secrets?watch=true", 2).await;
    assert!(ev.iter().all(|e| e["type"] == "ADDED"));
    let ev = lines(
        &conn,
        "/api/v1/namespaces/default/secrets?watch=true&resourceVersion=0",
        2,
    )
    .await;
    assert!(ev.iter().all(|e| e["type"] == "ADDED"));
    // An explicit resourceVersion: exactly what happened after it.
    let ev = lines(
        &conn,
        &format!("/api/v1/namespaces/default/secrets?watch=true&resourceVersion={rv_a}"),
        2,
    )
    .await;
    assert_eq!(ev[0]["type"], "ADDED");
    assert_eq!(ev[0]["object"]["metadata"]["name"], "b");
    assert_eq!(ev[1]["type"], "MODIFIED");
    assert_eq!(ev[1]["object"]["metadata"]["name"], "a");
    // Deletion: DELETED with a new resourceVersion.
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&fieldSelector=metadata.name%3Db&resourceVersion=".to_string().as_str())
        .await
        .unwrap();
    assert_eq!(w.next_event().await.unwrap()["type"], "ADDED");
    let before = sim.store().resource_version();
    sim.store().delete("secrets", "default", "b").unwrap();
    let del = w.next_event().await.unwrap();
    assert_eq!(del["type"], "DELETED");
    assert_eq!(rv_of(&del["object"]), before + 1);
    // A resourceVersion from the future is refused.
    let err = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&resourceVersion=999999")
        .await;
    assert!(err.is_err());
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_resource_version_yields_410_and_watcher_relists() {
    let sim = start_with(SimConfig {
        history_limit: 5,
        ..SimConfig::default()
    })
    .await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let first = sim
        .store()
        .create("secrets", opaque_secret("default", "h", &[("n", "0")]))
        .unwrap();
    for i in 1..10 {
        sim.store()
            .merge_patch(
                "secrets",
                "default",
                "h",
                json!({"data": {"n": b64(&i.to_string())}}),
            )
            .unwrap();
    }
    let ev = lines(
        &conn,
        &format!(
            "/api/v1/namespaces/default/secrets?watch=true&resourceVersion={}",
            rv_of(&first)
        ),
        1,
    )
    .await;
    assert_eq!(ev[0]["type"], "ERROR");
    assert_eq!(ev[0]["object"]["kind"], "Status");
    assert_eq!(ev[0]["object"]["code"], 410);
    assert_eq!(ev[0]["object"]["reason"], "Expired");
    assert!(
        ev[0]["object"]["message"]
            .as_str()
            .unwrap()
            .starts_with("too old resource version")
    );

    // kube's watcher resumes from its last resourceVersion; after a compaction that
    // is too old, so it gets the 410, re-lists and converges.
    let client = sim.client("admin").await.unwrap();
    let api: Api<Secret> = Api::namespaced(client, "default");
    let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
    while !matches!(stream.try_next().await.unwrap().unwrap(), Event::InitDone) {}
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "h",
            json!({"data": {"n": b64("final")}}),
        )
        .unwrap();
    assert!(matches!(
        stream.try_next().await.unwrap().unwrap(),
        Event::Apply(_)
    ));
    // The global resourceVersion moves on where this watcher does not look, the
    // history is compacted, and the watch is closed: resuming is now too old.
    sim.store()
        .create("secrets", opaque_secret("kube-system", "elsewhere", &[]))
        .unwrap();
    sim.faults().compact_history();
    sim.faults().close_all_watches();
    let mut saw_410 = false;
    loop {
        match stream.next().await.unwrap() {
            Err(watcher::Error::WatchError(status)) if status.code == 410 => saw_410 = true,
            Err(e) => panic!("unexpected error {e}"),
            Ok(Event::InitApply(s)) if saw_410 => {
                assert_eq!(s.data.unwrap()["n"].0, b"final");
                break;
            }
            Ok(_) => {}
        }
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_bookmarks_only_when_allowed() {
    let sim = start_with(SimConfig {
        bookmark_interval: Duration::from_millis(50),
        ..SimConfig::default()
    })
    .await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let s = sim
        .store()
        .create("secrets", opaque_secret("default", "bm", &[]))
        .unwrap();
    let mut w = conn
        .watch(&format!("/api/v1/namespaces/default/secrets?watch=true&allowWatchBookmarks=true&resourceVersion={}", rv_of(&s)))
        .await
        .unwrap();
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "bm",
            json!({"metadata": {"labels": {"a": "b"}}}),
        )
        .unwrap();
    let modified = w.next_event().await.unwrap();
    assert_eq!(modified["type"], "MODIFIED");
    // Something unrelated moves the global resourceVersion; bookmarks carry it.
    sim.store()
        .create("secrets", opaque_secret("kube-system", "elsewhere", &[]))
        .unwrap();
    let current = sim.store().resource_version();
    loop {
        let e = w.next_event().await.unwrap();
        assert_eq!(e["type"], "BOOKMARK");
        assert_eq!(e["object"]["kind"], "Secret");
        if rv_of(&e["object"]) == current {
            break;
        }
        assert!(rv_of(&e["object"]) >= rv_of(&modified["object"]));
    }
    // Without allowWatchBookmarks: no BOOKMARK before the watch times out.
    let mut plain = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1&resourceVersion=0")
        .await
        .unwrap();
    let mut types = Vec::new();
    while let Some(e) = plain.next_event().await {
        types.push(e["type"].as_str().unwrap().to_string());
    }
    assert_eq!(
        types,
        ["ADDED"],
        "one ADDED, then a clean end at the timeout"
    );
    sim.shutdown().await;
}

/// Opens a watch, makes `changes` other secrets once it is registered, and returns
/// every event the watch got until the server ended it.
async fn events_until_the_end(
    sim: &kube_sim::Simulator,
    conn: &H2Connection,
    path: &str,
    changes: usize,
) -> Vec<Value> {
    let mut watch = conn.watch(path).await.unwrap();
    for _ in 0..changes {
        sim.store()
            .create(
                "secrets",
                json!({
                    "apiVersion": "v1", "kind": "Secret",
                    "metadata": {"namespace": "default", "generateName": "other-"},
                }),
            )
            .unwrap();
    }
    let mut events = Vec::new();
    while let Some(event) = watch.next_event().await {
        events.push(event);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_allows_bookmarks_gets_one_at_the_latest_version_before_its_timeout() {
    // The periodic bookmarks at their default minute: the one seen is the last one.
    let sim = start().await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let own = sim
        .store()
        .create("secrets", opaque_secret("default", "own", &[]))
        .unwrap();
    let watch = |bookmarks: bool, timeout: u32| {
        format!(
            "/api/v1/namespaces/default/secrets?watch=true&fieldSelector=metadata.name%3Down\
             &resourceVersion={}&timeoutSeconds={timeout}{}",
            rv_of(&own),
            if bookmarks {
                "&allowWatchBookmarks=true"
            } else {
                ""
            }
        )
    };
    // Changes of other objects move the global resourceVersion past the watched
    // one's; the client then resumes from the latest version, not its object's own.
    let events = events_until_the_end(&sim, &conn, &watch(true, 3), 5).await;
    let latest = sim.store().resource_version();
    assert_eq!(latest, rv_of(&own) + 5);
    let seen: Vec<(&str, u64)> = events
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), rv_of(&e["object"])))
        .collect();
    assert_eq!(seen, [("BOOKMARK", latest)]);
    // None without allowWatchBookmarks, none when the timeout leaves no room for it,
    // and none when nothing changed since the watch started (the changes above came
    // before it): the version the client started from is as good.
    for (bookmarks, timeout, changes) in [(false, 3, 1), (true, 2, 1), (true, 3, 0)] {
        let path = watch(bookmarks, timeout);
        let events = events_until_the_end(&sim, &conn, &path, changes).await;
        assert!(
            events.is_empty(),
            "bookmarks {bookmarks}, timeout {timeout} s, {changes} changes"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_list_protocol() {
    let sim = start().await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    for i in 0..3 {
        sim.store()
            .create("secrets", opaque_secret("default", &format!("s{i}"), &[]))
            .unwrap();
    }
    let rv = sim.store().resource_version();
    let path = "/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0";
    let mut w = conn.watch(path).await.unwrap();
    for _ in 0..3 {
        assert_eq!(w.next_event().await.unwrap()["type"], "ADDED");
    }
    let end = w.next_event().await.unwrap();
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
        "true"
    );
    assert_eq!(rv_of(&end["object"]), rv);
    sim.store()
        .create("secrets", opaque_secret("default", "s3", &[]))
        .unwrap();
    let live = w.next_event().await.unwrap();
    assert_eq!(
        (
            live["type"].as_str(),
            live["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("s3"))
    );

    // Without allowWatchBookmarks the stream is accepted but the end of the initial
    // events is not announced: the next line after them is the next change.
    let mut quiet = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan")
        .await
        .unwrap();
    for _ in 0..4 {
        assert_eq!(quiet.next_event().await.unwrap()["type"], "ADDED");
    }
    sim.store()
        .create("secrets", opaque_secret("default", "s4", &[]))
        .unwrap();
    let next = quiet.next_event().await.unwrap();
    assert_eq!(
        (
            next["type"].as_str(),
            next["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("s4"))
    );

    // Invalid combinations: 422 Invalid, as kube-apiserver answers.
    let admin = sim.client("admin").await.unwrap();
    for bad in [
        "/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&allowWatchBookmarks=true",
        "/api/v1/namespaces/default/secrets?watch=true&resourceVersionMatch=NotOlderThan&resourceVersion=0",
        "/api/v1/namespaces/default/secrets?sendInitialEvents=true",
    ] {
        let (code, st) = get(&admin, bad).await;
        assert_eq!(
            (code, st["reason"].as_str()),
            (422, Some("Invalid")),
            "{bad}: {st}"
        );
    }
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_selector_transitions_and_timeout() {
    let sim = start().await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let mut s = opaque_secret("default", "moving", &[]);
    s["metadata"]["labels"] = json!({"app": "a"});
    let created = sim.store().create("secrets", s).unwrap();
    let mut w = conn
        .watch(&format!("/api/v1/namespaces/default/secrets?watch=true&labelSelector=app%3Da&resourceVersion={}", rv_of(&created)))
        .await
        .unwrap();
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "moving",
            json!({"metadata": {"labels": {"app": "b"}}}),
        )
        .unwrap();
    let gone = w.next_event().await.unwrap();
    assert_eq!(gone["type"], "DELETED");
    assert_eq!(
        gone["object"]["metadata"]["labels"]["app"], "a",
        "the last state that matched"
    );
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "moving",
            json!({"metadata": {"labels": {"x": "1"}}}),
        )
        .unwrap();
    sim.store()
        .merge_patch(
            "secrets",
            "default",
            "moving",
            json!({"metadata": {"labels": {"app": "a"}}}),
        )
        .unwrap();
    let back = w.next_event().await.unwrap();
    assert_eq!(back["type"], "ADDED");

    // timeoutSeconds ends the watch cleanly and it leaves the open-watch count.
    let mut short = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1&resourceVersion=0")
        .await
        .unwrap();
    while short.next_event().await.is_some() {}
    drop(w);
    stats_reach(&sim, "closed watches to leave the count", |s| {
        s.open_watches == 0
    })
    .await;
    sim.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_cannot_keep_up_is_terminated() {
    let sim = start_with(SimConfig {
        watch_buffer: 4,
        ..SimConfig::default()
    })
    .await;
    let token = sim.token("admin").unwrap();
    let created = sim
        .store()
        .create("secrets", opaque_secret("default", "busy", &[]))
        .unwrap();
    // A raw h2 client that never releases flow-control capacity: after its 64 KiB
    // window the server cannot send, and the watcher's buffer fills.
    let tcp = tokio::net::TcpStream::connect(sim.addr()).await.unwrap();
    let (client, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(conn);
    let mut client = client.ready().await.unwrap();
    let req = http::Request::builder()
        .uri(format!(
            "http://{}/api/v1/namespaces/default/secrets?watch=true&resourceVersion={}",
            sim.addr(),
            rv_of(&created)
        ))
        .header("authorization", format!("Bearer {token}"))
        .body(())
        .unwrap();
    let (resp, _) = client.send_request(req, true).unwrap();
    let resp = resp.await.unwrap();
    assert_eq!(resp.status(), 200);
    let payload = "x".repeat(2048);
    for i in 0..200 {
        sim.store()
            .merge_patch(
                "secrets",
                "default",
                "busy",
                json!({"data": {"blob": b64(&format!("{i}{payload}"))}}),
            )
            .unwrap();
    }
    assert_eq!(sim.slow_watchers_terminated(), 1);
    // Reading now delivers what was buffered, then the stream ends.
    let mut body = resp.into_body();
    let mut events = 0;
    while let Some(chunk) = body.data().await {
        let chunk = chunk.unwrap();
        events += chunk.iter().filter(|b| **b == b'\n').count();
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    assert!(
        events > 0 && events < 200,
        "got {events} of 200 events before the end"
    );
    sim.shutdown().await;
}

/// A server without streaming lists, in the two ways real ones lack them, set at
/// start or through the admin API; the answers are kube-apiserver's, byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_without_streaming_lists_refuse_as_kube_apiserver_does() {
    let sim = start_with(SimConfig {
        features: ServerFeatures {
            watch_list: false,
            ..ServerFeatures::default()
        },
        ..SimConfig::default()
    })
    .await;
    let client = client_without_retries(&sim, "admin").await;
    let streaming = "/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let refused = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"ListOptions.meta.k8s.io \\\"\\\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled\",\"reason\":\"Invalid\",\"details\":{\"group\":\"meta.k8s.io\",\"kind\":\"ListOptions\",\"causes\":[{\"reason\":\"FieldValueForbidden\",\"message\":\"Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled\",\"field\":\"sendInitialEvents\"}]},\"code\":422}";
    let (code, _, status) = raw(&client, Method::GET, streaming, None, "application/json").await;
    assert_eq!(code, 422);
    assert_eq!(status, serde_json::from_str::<Value>(refused).unwrap());
    // List-then-watch still works.
    let (code, _) = get(
        &client,
        "/api/v1/namespaces/default/secrets?watch=true&timeoutSeconds=1",
    )
    .await;
    assert_eq!(code, 200);

    // Storage without watch progress: 200, one ERROR event, end of stream.
    let (code, features) = admin(
        &sim,
        Method::PUT,
        "/sim/features",
        Some(json!({"watch_list": true, "watch_progress": false})),
    )
    .await;
    assert_eq!(
        (code, features["watch_progress"].as_bool()),
        (200, Some(false))
    );
    assert_eq!(
        sim.features(),
        ServerFeatures {
            watch_list: true,
            watch_progress: false
        }
    );
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    let mut w = conn.watch(streaming).await.unwrap();
    let error = w.next_event().await.unwrap();
    let want: Value = serde_json::from_str("{\"type\":\"ERROR\",\"object\":{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"a watch stream was requested by the client but the required storage feature RequestWatchProgress is disabled\",\"reason\":\"InternalError\",\"code\":500}}").unwrap();
    assert_eq!(error, want);
    assert!(
        w.next_event().await.is_none(),
        "the stream ends after the error"
    );
    let last = sim.request_log().pop().unwrap();
    assert_eq!(
        (last.verb.as_str(), last.code, last.send_initial_events),
        ("watch", 200, true)
    );

    // Back to a current server.
    sim.set_features(ServerFeatures::default());
    let mut w = conn.watch(streaming).await.unwrap();
    assert_eq!(w.next_event().await.unwrap()["type"], "BOOKMARK");
    sim.shutdown().await;
}

/// Objects are encoded once when written; what lists and streaming lists send from
/// that encoding is byte for byte what serializing the object gives (a GET), and a
/// list of an older version never gets a newer version's JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_encodings_are_sent_as_serialized() {
    let sim = start().await;
    let token = sim.token("admin").unwrap();
    let conn = H2Connection::connect(sim.addr(), &token).await.unwrap();
    sim.store()
        .create("secrets", opaque_secret("default", "e0", &[("v", "0")]))
        .unwrap();
    sim.store()
        .create("secrets", opaque_secret("default", "e1", &[("v", "0")]))
        .unwrap();
    let before = sim.store().resource_version();
    sim.store()
        .merge_patch("secrets", "default", "e1", json!({"data": {"v": b64("1")}}))
        .unwrap();
    let get_raw = |name: &str| {
        let path = format!("/api/v1/namespaces/default/secrets/{name}");
        let conn = &conn;
        async move {
            let (status, body) = conn.request(Method::GET, &path, None).await.unwrap();
            assert_eq!(status, 200);
            body
        }
    };
    let (e0, e1) = (get_raw("e0").await, get_raw("e1").await);

    // A streaming list: each ADDED line is the object's GET body in an event.
    let mut w = conn
        .watch("/api/v1/namespaces/default/secrets?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
        .await
        .unwrap();
    for object in [&e0, &e1] {
        let mut expected = b"{\"type\":\"ADDED\",\"object\":".to_vec();
        expected.extend_from_slice(object);
        expected.push(b'}');
        let line = w.next_line().await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&line),
            String::from_utf8_lossy(&expected)
        );
    }

    // A list: the items are the GET bodies.
    let (status, body) = conn
        .request(Method::GET, "/api/v1/namespaces/default/secrets", None)
        .await
        .unwrap();
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body);
    let items = format!(
        ",\"items\":[{},{}]}}",
        String::from_utf8_lossy(&e0),
        String::from_utf8_lossy(&e1)
    );
    assert!(text.ends_with(&items), "{text}");

    // The list at the version before the patch: e1 as it was, not the stored JSON.
    let (status, old) = conn
        .request(
            Method::GET,
            &format!("/api/v1/namespaces/default/secrets?resourceVersion={before}&resourceVersionMatch=Exact"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    let old: Value = serde_json::from_slice(&old).unwrap();
    let old_e1 = &old["items"][1];
    assert_eq!(old_e1["metadata"]["name"], "e1");
    assert_eq!(old_e1["data"]["v"], b64("0"));
    assert_eq!(rv_of(old_e1), before);
    assert_eq!(
        old["items"][0],
        serde_json::from_slice::<Value>(&e0).unwrap()
    );
    sim.shutdown().await;
}
