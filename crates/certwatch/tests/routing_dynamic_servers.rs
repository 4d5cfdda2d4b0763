//! Servers added and deleted at run time: a route's endpoints grow from one to more
//! than its backend has servers and spare slots, and every one of them serves, through
//! the HAProxy certwatch runs, without a reload (`add server`, `enable server`); the
//! endpoints that go get no more requests, and their servers leave HAProxy down to the
//! spare slots kept (`del server`), still without a reload.
//!
//! No timing is asserted: which backends answer, counts of requests, servers and loads.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use common::haproxy::{info_field, runtime_api};
use common::routing::RoutingLaunch;
use common::traffic::{Backend, create_service, https_get, set_endpoints_each};
use common::{SimProcess, create_route_spec, create_tls_secret, eventually_async, grant_secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;

const NS: &str = "app-0";

/// Endpoints the route grows to: more than its one server and two spare slots.
const GROWN: usize = 7;

/// Spare slots each backend has and keeps.
const SPARES: usize = 2;

/// The route's backend in HAProxy.
const BACKEND: &str = "be_edge_http:app-0:grow";

/// The names of the backends that answer `count` requests.
async fn answering(https: SocketAddr, count: usize) -> Vec<String> {
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let response = https_get(https, "grow.example", "/", false)
            .await
            .expect("an answer");
        names.push(
            response
                .backend
                .unwrap_or_else(|| format!("status {}", response.status)),
        );
    }
    names
}

/// The route backend's servers in HAProxy: (name, address, operational state,
/// administrative state), from `show servers state`.
fn servers(socket: &Path) -> Vec<(String, String, String, String)> {
    runtime_api(socket, &format!("show servers state {BACKEND}"))
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            (fields.len() > 6 && fields[1] == BACKEND).then(|| {
                (
                    fields[3].to_owned(),
                    fields[4].to_owned(),
                    fields[5].to_owned(),
                    fields[6].to_owned(),
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_beyond_the_spare_slots_are_added_and_removed_without_a_reload() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(dir.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    let mut backends = Vec::new();
    for n in 0..GROWN {
        backends.push(Backend::http(&format!("web-{n}")).await);
    }
    create_service(&admin, NS, "web").await;
    set_endpoints_each(&admin, NS, "web", &[&backends[0]]).await;
    create_tls_secret(&admin, NS, "grow-tls", "grow.example").await;
    grant_secret(&admin, NS, "grow-tls").await;
    create_route_spec(
        &admin,
        NS,
        "grow",
        serde_json::json!({
            "host": "grow.example",
            "to": {"kind": "Service", "name": "web"},
            "tls": {"termination": "edge", "externalCertificate": {"name": "grow-tls"}},
        }),
    )
    .await;

    let spares = SPARES.to_string();
    let certwatch = RoutingLaunch::on(&sim, dir.path())
        .args(&["--haproxy-spare-servers", &spares])
        .min_reload_interval("1s")
        .ready()
        .await;
    let https = certwatch.https;
    let socket = certwatch.socket();

    eventually_async("the route served by its one endpoint", || async {
        let names = answering(https, 1).await;
        (names == ["web-0"]).then_some(())
    })
    .await;
    // Loaded with its one server and the spare slots.
    assert_eq!(servers(&socket).len(), 1 + SPARES, "{:?}", servers(&socket));
    let worker = info_field(&socket, "Pid");
    let loads = certwatch.metric("certwatch_routing_loads_total").unwrap();

    // Seven endpoints: two take the spare slots, four are added to HAProxy.
    let all: Vec<&Backend> = backends.iter().collect();
    set_endpoints_each(&admin, NS, "web", &all).await;
    // Every backend that answered so far (balance random: each try adds some).
    let answered = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = eventually_async("every endpoint answers", || {
        let answered = Arc::clone(&answered);
        async move {
            let names = answering(https, 20).await;
            let mut answered = answered.lock().unwrap();
            answered.extend(names);
            (answered.len() >= GROWN).then(|| answered.clone())
        }
    })
    .await;
    let expected: BTreeSet<String> = (0..GROWN).map(|n| format!("web-{n}")).collect();
    assert_eq!(seen, expected, "only the endpoints answer, each of them");
    let grown = servers(&socket);
    assert_eq!(grown.len(), GROWN, "{grown:?}");
    assert!(
        grown
            .iter()
            .filter(|(name, ..)| name.starts_with("_dynamic-pod-"))
            .count()
            > SPARES,
        "servers were added beside the spare slots: {grown:?}"
    );
    assert_eq!(
        info_field(&socket, "Pid"),
        worker,
        "no reload for endpoints beyond the slots"
    );
    assert_eq!(
        certwatch.metric("certwatch_routing_loads_total"),
        Some(loads)
    );

    // Four endpoints go (their slices deleted): no more requests reach them.
    let slices = Api::<EndpointSlice>::namespaced(admin.clone(), NS);
    for n in 3..GROWN {
        slices
            .delete(&format!("web-{n}"), &Default::default())
            .await
            .unwrap();
    }
    eventually_async("only the endpoints left answer", || async {
        let names = answering(https, 20).await;
        names
            .iter()
            .all(|name| ["web-0", "web-1", "web-2"].contains(&name.as_str()))
            .then_some(())
    })
    .await;
    let served_before: Vec<usize> = backends.iter().map(Backend::served).collect();
    let names = answering(https, 60).await;
    let served_after: Vec<usize> = backends.iter().map(Backend::served).collect();
    assert_eq!(
        served_before[3..],
        served_after[3..],
        "no request reached an endpoint that went"
    );
    let left: BTreeSet<&str> = names.iter().map(String::as_str).collect();
    assert_eq!(
        left,
        BTreeSet::from(["web-0", "web-1", "web-2"]),
        "{names:?}"
    );
    assert_eq!(
        served_after[..3].iter().sum::<usize>() - served_before[..3].iter().sum::<usize>(),
        60
    );
    // The servers the endpoints left are deleted down to the spare slots kept, each of
    // those put in maintenance by the runtime API (administrative state bit 1; a slot
    // rendered `disabled` keeps bit 4 while it serves).
    let shrunk = eventually_async("the servers left deleted", || async {
        let now = servers(&socket);
        (now.len() == 3 + SPARES).then_some(now)
    })
    .await;
    let in_maintenance = shrunk
        .iter()
        .filter(|(.., admin_state)| admin_state.parse::<u32>().is_ok_and(|s| s & 1 == 1))
        .count();
    assert_eq!(in_maintenance, SPARES, "{shrunk:?}");
    assert_eq!(
        info_field(&socket, "Pid"),
        worker,
        "no reload for endpoints removed"
    );
    assert_eq!(
        certwatch.metric("certwatch_routing_loads_total"),
        Some(loads)
    );
    assert_eq!(
        certwatch.metric("certwatch_routing_server_commands_total{result=\"error\"}"),
        Some(0.0)
    );
}
