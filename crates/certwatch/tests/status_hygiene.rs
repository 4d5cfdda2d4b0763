//! Status hygiene against a real control plane (testenv: kube-apiserver + etcd, the
//! Route CRD, real RBAC): a route that leaves certwatch's selection (its labels, its
//! namespace's labels) loses certwatch's `status.ingress[]` entry, and
//! `certwatch clear-status --router-name NAME` removes every entry of that name; another
//! router's entries on the same routes stay untouched throughout.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Certwatch, eventually_async, real_cluster};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube_sim::GenerateSpec;
use route_secrets::route::Route;
use route_secrets::route::admission::router_ingress;
use serde_json::json;

const ROUTES: usize = 6;
const ROUTER_NAME: &str = "hygiene";
const OTHER_ROUTER: &str = "someone-else";

/// How many routes carry an entry of `router`.
async fn with_entry(admin: &kube::Client, router: &str) -> usize {
    let routes = Api::<Route>::all(admin.clone())
        .list(&kube::api::ListParams::default())
        .await
        .unwrap();
    routes
        .items
        .iter()
        .filter(|route| router_ingress(route, router).is_some())
        .count()
}

/// The entries of `router` on each route, by `namespace/name`.
async fn entries(admin: &kube::Client, router: &str) -> Vec<(String, serde_json::Value)> {
    let routes = Api::<Route>::all(admin.clone())
        .list(&kube::api::ListParams::default())
        .await
        .unwrap();
    let mut entries: Vec<(String, serde_json::Value)> = routes
        .items
        .iter()
        .filter_map(|route| {
            let key = route.key()?;
            let entry = router_ingress(route, router)?;
            Some((key.to_string(), serde_json::to_value(entry).unwrap()))
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries
}

async fn label(
    api: &Api<impl kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug>,
    name: &str,
    key: &str,
    value: Option<&str>,
) {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {key: value}}})),
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_leaving_the_selection_and_clear_status_drop_only_this_routers_entries() {
    let (control_plane, admin, cluster) = real_cluster(&GenerateSpec::new(ROUTES, 2)).await;
    let mut namespaces: Vec<String> = cluster.routes.iter().map(|r| r.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    assert_eq!(namespaces.len(), 2);
    // Every route in the shard (route label) of selected namespaces (namespace label),
    // and admitted by another router too.
    for namespace in &namespaces {
        label(
            &Api::<Namespace>::all(admin.clone()),
            namespace,
            "team",
            Some("x"),
        )
        .await;
    }
    for route in &cluster.routes {
        let api = Api::<Route>::namespaced(admin.clone(), &route.namespace);
        label(&api, &route.route, "shard", Some("a")).await;
        let host = format!("{}.other.example", route.route);
        api.patch_status(
            &route.route,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ingress": [{
                "host": host,
                "routerName": OTHER_ROUTER,
                "conditions": [{"type": "Admitted", "status": "True"}],
            }]}})),
        )
        .await
        .unwrap();
    }
    let foreign = entries(&admin, OTHER_ROUTER).await;
    assert_eq!(foreign.len(), ROUTES);

    let temp = tempfile::tempdir().unwrap();
    let mut certwatch = Certwatch::start(
        control_plane.kubeconfig_path(),
        &temp.path().join("certs"),
        &temp.path().join("certwatch.log"),
        &[
            "--write-status",
            "--router-name",
            ROUTER_NAME,
            "--route-selector",
            "shard=a",
            "--namespace-selector",
            "team=x",
        ],
    );
    certwatch.wait_ready().await;
    eventually_async("every route has this router's entry", || async {
        (with_entry(&admin, ROUTER_NAME).await == ROUTES).then_some(())
    })
    .await;

    // One route's label changes: it leaves the shard, and its entry goes.
    let moved = &cluster.routes[0];
    label(
        &Api::<Route>::namespaced(admin.clone(), &moved.namespace),
        &moved.route,
        "shard",
        Some("b"),
    )
    .await;
    eventually_async("the relabelled route lost this router's entry", || async {
        (with_entry(&admin, ROUTER_NAME).await == ROUTES - 1).then_some(())
    })
    .await;
    let routes = Api::<Route>::namespaced(admin.clone(), &moved.namespace)
        .list(&kube::api::ListParams::default().fields(&format!("metadata.name={}", moved.route)))
        .await
        .unwrap();
    assert!(router_ingress(&routes.items[0], ROUTER_NAME).is_none());

    // A namespace's label changes: its routes leave the selection.
    let other_namespace = namespaces
        .iter()
        .find(|namespace| **namespace != moved.namespace)
        .unwrap();
    let in_other = cluster
        .routes
        .iter()
        .filter(|route| &route.namespace == other_namespace)
        .count();
    assert!(in_other > 0);
    label(
        &Api::<Namespace>::all(admin.clone()),
        other_namespace,
        "team",
        None,
    )
    .await;
    eventually_async(
        "the deselected namespace's routes lost this router's entry",
        || async { (with_entry(&admin, ROUTER_NAME).await == ROUTES - 1 - in_other).then_some(()) },
    )
    .await;
    // The other router's entries are exactly as they were.
    assert_eq!(entries(&admin, OTHER_ROUTER).await, foreign);

    // The uninstall: the router stops, `clear-status` removes what is left.
    assert!(with_entry(&admin, ROUTER_NAME).await > 0);
    certwatch.terminate();
    let kubeconfig = control_plane.kubeconfig_path().to_str().unwrap();
    let output = common::run_to_exit(
        &[
            "clear-status",
            "--router-name",
            ROUTER_NAME,
            "--kubeconfig",
            kubeconfig,
            "--context",
            "admin",
        ],
        &[],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(with_entry(&admin, ROUTER_NAME).await, 0);
    assert_eq!(entries(&admin, OTHER_ROUTER).await, foreign);
    // A second run finds nothing to do, and says so.
    let again = common::run_to_exit(
        &[
            "clear-status",
            "--router-name",
            ROUTER_NAME,
            "--kubeconfig",
            kubeconfig,
            "--context",
            "admin",
        ],
        &[],
    );
    assert!(again.status.success());
    let said = String::from_utf8_lossy(&again.stdout).into_owned()
        + &String::from_utf8_lossy(&again.stderr);
    assert!(said.contains("cleared=0"), "{said}");
    assert!(said.contains(&format!("routes={ROUTES}")), "{said}");
}
