//! Request accounting against the simulator: the client counts what the server counted,
//! by resource, verb and status, 429s included, and nothing is retried underneath it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::authorization::v1::{SelfSubjectRulesReview, SelfSubjectRulesReviewSpec};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube_common::Verb;
use kube_common::backoff::Retry;
use kube_h2::{ClientOptions, PooledClient, RequestObserver, ResponseRecord, build_client};
use kube_sim::{FailRule, SimConfig, Simulator};

/// What an observer was told, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    resource: String,
    verb: Verb,
    code: Option<u16>,
    retry: bool,
    retry_after: Option<Duration>,
}

#[derive(Default)]
struct Recorder(Mutex<Vec<Seen>>);

impl RequestObserver for Recorder {
    fn response(&self, record: &ResponseRecord<'_>) {
        self.0.lock().unwrap().push(Seen {
            resource: record.resource.to_owned(),
            verb: record.verb,
            code: record.code,
            retry: record.retry,
            retry_after: record.retry_after,
        });
    }
}

async fn admin_client(sim: &Simulator, options: ClientOptions) -> PooledClient {
    let config = sim.client_config("admin").await.expect("admin config");
    build_client(config, options).expect("pooled client")
}

fn put_secret(sim: &Simulator, name: &str) {
    sim.store()
        .upsert(
            "secrets",
            serde_json::json!({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": "ns"},
                "data": {"v": "dg=="},
            }),
        )
        .expect("secret written");
}

fn api_status(error: &kube::Error) -> Option<u16> {
    match error {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_counts_what_the_server_counted() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    put_secret(&sim, "a");
    let recorder = Arc::new(Recorder::default());
    let pooled = admin_client(&sim, ClientOptions::default().observer(recorder.clone())).await;
    let secrets: Api<Secret> = Api::namespaced(pooled.client(), "ns");
    sim.reset_stats();

    let by_name = ListParams::default().fields("metadata.name=a");
    secrets.list(&by_name).await.unwrap();
    secrets.get("a").await.unwrap();
    assert_eq!(
        api_status(&secrets.get("missing").await.unwrap_err()),
        Some(404)
    );
    // Refusals reach the caller as they are: no layer below retries them.
    sim.faults()
        .fail_next(FailRule::new("list", "secrets", 429, 1));
    assert_eq!(
        api_status(&secrets.list(&by_name).await.unwrap_err()),
        Some(429)
    );
    sim.faults()
        .fail_next(FailRule::new("get", "secrets", 503, 1));
    assert_eq!(api_status(&secrets.get("a").await.unwrap_err()), Some(503));
    let mut watch = secrets
        .watch(&WatchParams::default().fields("metadata.name=a"), "0")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(watch.next().await, Some(Ok(WatchEvent::Added(_)))));
    drop(watch);
    let mut created = Secret::default();
    created.metadata.name = Some("b".into());
    secrets
        .create(&PostParams::default(), &created)
        .await
        .unwrap();
    secrets
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    let reviews: Api<SelfSubjectRulesReview> = Api::all(pooled.client());
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some("ns".into()),
        },
        ..SelfSubjectRulesReview::default()
    };
    reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap();

    // The server's own log is the reference.
    let mut server: BTreeMap<(String, String, Option<u16>), u64> = BTreeMap::new();
    for record in sim.request_log() {
        *server
            .entry((record.resource, record.verb.to_string(), Some(record.code)))
            .or_default() += 1;
    }
    let client: BTreeMap<(String, String, Option<u16>), u64> = pooled
        .pool()
        .requests()
        .responses
        .into_iter()
        .map(|r| ((r.resource, r.verb.to_string(), r.code), r.count))
        .collect();
    assert_eq!(client, server);
    let stats = pooled.pool().requests();
    assert_eq!(stats.count("secrets", Verb::List, Some(429)), 1);
    assert_eq!(stats.count("secrets", Verb::Get, Some(503)), 1);
    assert_eq!(stats.count("secrets", Verb::Watch, Some(200)), 1);
    assert_eq!(
        stats.count("selfsubjectrulesreviews", Verb::Create, Some(201)),
        1
    );
    assert_eq!(stats.with_code(429), 1);
    assert_eq!(stats.total(), 9);
    assert_eq!(stats.retries_total(), 0);

    // The observer saw the same, with the server's Retry-After on the refusals.
    let seen = recorder.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 9);
    let refused: Vec<&Seen> = seen
        .iter()
        .filter(|s| matches!(s.code, Some(429 | 503)))
        .collect();
    assert_eq!(refused.len(), 2);
    assert!(
        refused
            .iter()
            .all(|s| s.retry_after == Some(Duration::from_secs(1))),
        "{refused:?}"
    );
    assert!(
        seen.iter()
            .filter(|s| !matches!(s.code, Some(429 | 503)))
            .all(|s| s.retry_after.is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_marked_as_retries_are_counted_as_retries() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    put_secret(&sim, "a");
    let recorder = Arc::new(Recorder::default());
    let pooled = admin_client(&sim, ClientOptions::default().observer(recorder.clone())).await;
    let client = pooled.client();
    let request = || {
        http::Request::get("/api/v1/namespaces/ns/secrets?fieldSelector=metadata.name%3Da")
            .body(Vec::new())
            .unwrap()
    };
    sim.faults()
        .fail_next(FailRule::new("list", "secrets", 429, 1));
    let refused = client
        .request::<serde_json::Value>(request())
        .await
        .unwrap_err();
    assert_eq!(api_status(&refused), Some(429));
    let mut retried = request();
    retried.extensions_mut().insert(Retry);
    client.request::<serde_json::Value>(retried).await.unwrap();

    let stats = pooled.pool().requests();
    assert_eq!(stats.count("secrets", Verb::List, Some(429)), 1);
    assert_eq!(stats.count("secrets", Verb::List, Some(200)), 1);
    assert_eq!(stats.retries_of("secrets", Verb::List), 1);
    assert_eq!(stats.retries_total(), 1);
    let retries: Vec<bool> = recorder.0.lock().unwrap().iter().map(|s| s.retry).collect();
    assert_eq!(retries, [false, true]);
    // Both reached the server: the refusal was not retried below the caller.
    assert_eq!(sim.request_log().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_get_no_response_are_counted_too() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let pooled = admin_client(&sim, ClientOptions::default()).await;
    let secrets: Api<Secret> = Api::namespaced(pooled.client(), "ns");
    secrets.list(&ListParams::default()).await.unwrap();
    let address = sim.addr();
    drop(sim);
    // The server is gone: the request fails without a response.
    let error = secrets.list(&ListParams::default()).await.unwrap_err();
    assert_eq!(api_status(&error), None, "{error}");
    let stats = pooled.pool().requests();
    assert_eq!(stats.count("secrets", Verb::List, Some(200)), 1);
    assert_eq!(stats.count("secrets", Verb::List, None), 1, "{address}");
}
