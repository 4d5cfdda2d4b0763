//! High availability against a real control plane (testenv: kube-apiserver + etcd, the
//! Route CRD, real RBAC): two `certwatch run --write-status` replicas under one router
//! name, elected on a real Lease. The server's audit log counts the router's status
//! writes: start-up writes each route's status once, a change costs one write, and
//! after a SIGKILL of the leader the follower writes the changes made meanwhile.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Instant;

use common::{Certwatch, FAST_ELECTION, eventually, eventually_async, real_cluster};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams};
use kube_sim::GenerateSpec;
use testenv::{AuditLog, ControlPlane, ROUTER_USER};

const ROUTES: usize = 100;
const ROUTER_NAME: &str = "ha-real";

fn start_replica(control_plane: &ControlPlane, dir: &Path, name: &str) -> (Certwatch, PathBuf) {
    let cert_dir = dir.join(name).join("certs");
    let certwatch = Certwatch::start(
        control_plane.kubeconfig_path(),
        &cert_dir,
        &dir.join(format!("{name}.log")),
        &[
            "--write-status",
            "--router-name",
            ROUTER_NAME,
            "--lease-identity",
            name,
        ]
        .into_iter()
        .chain(FAST_ELECTION)
        .collect::<Vec<_>>(),
    );
    (certwatch, cert_dir)
}

/// The router's status writes (PUT routes/status) by answer, from `audit`.
fn status_writes(audit: &AuditLog) -> Vec<(String, u16)> {
    audit
        .of_user(ROUTER_USER)
        .filter(|r| {
            r.verb == "update"
                && r.resource.as_deref() == Some("routes")
                && r.subresource.as_deref() == Some("status")
        })
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r.namespace.as_deref().unwrap_or(""),
                    r.name.as_deref().unwrap_or("")
                ),
                r.code.unwrap_or(0),
            )
        })
        .collect()
}

/// What a failed assertion shows besides the writes: whether each replica still runs,
/// and every Lease request the router's user made, in order, with its answer.
fn diagnosis(replicas: &mut [(Certwatch, PathBuf)], audit: &AuditLog) -> String {
    let mut text = String::new();
    for (certwatch, _) in replicas.iter_mut() {
        let state = match certwatch.exited() {
            Some(status) => format!("exited: {status}"),
            None => "running".to_owned(),
        };
        text.push_str(&format!(
            "replica pid {} ({}): {state}\n",
            certwatch.pid(),
            certwatch.log.display()
        ));
    }
    for request in audit
        .of_user(ROUTER_USER)
        .filter(|r| r.resource.as_deref() == Some("leases") && r.verb != "watch")
    {
        text.push_str(&format!(
            "{} {} {} -> {:?}\n",
            request
                .received
                .map(|at| at.to_string())
                .unwrap_or_default(),
            request.verb,
            request.request_uri,
            request.code
        ));
    }
    text
}

fn leads(certwatch: &Certwatch) -> bool {
    certwatch.metric("certwatch_status_leader") == Some(1.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_a_real_lease_write_each_change_once() {
    let (control_plane, admin, cluster) = real_cluster(&GenerateSpec::new(ROUTES, 2)).await;
    let temp = tempfile::tempdir().unwrap();
    let mut replicas = vec![
        start_replica(&control_plane, temp.path(), "a"),
        start_replica(&control_plane, temp.path(), "b"),
    ];
    for (certwatch, _) in &replicas {
        certwatch.wait_ready().await;
    }
    eventually_async("every route Admitted=True in its status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, true).await == ROUTES).then_some(())
    })
    .await;
    let leader = eventually("exactly one replica leads", || {
        let leading: Vec<usize> = (0..2).filter(|i| leads(&replicas[*i].0)).collect();
        (leading.len() == 1).then(|| leading[0])
    })
    .await;
    // The Lease on the real server names the leader.
    let lease = Api::<Lease>::namespaced(admin.clone(), kube_sim::ROUTER_NAMESPACE)
        .get(&format!("certwatch-{ROUTER_NAME}"))
        .await
        .unwrap();
    let holder = lease.spec.unwrap().holder_identity.unwrap();
    assert_eq!(holder, ["a", "b"][leader]);

    let audit = control_plane.audit().unwrap();
    let writes = status_writes(&audit);
    let conflicts = writes.iter().filter(|(_, code)| *code == 409).count();
    eprintln!(
        "real control plane, 2 replicas, {ROUTES} routes: {} status writes, {conflicts} 409s",
        writes.len()
    );
    if writes.len() * 100 > ROUTES * 105 || conflicts * 100 > writes.len() * 2 {
        panic!(
            "{} status writes, {conflicts} 409s: {writes:?}\n{}",
            writes.len(),
            diagnosis(&mut replicas, &audit)
        );
    }

    // One change, one write.
    let before = writes.len();
    let first = &cluster.routes[0];
    Api::<Secret>::namespaced(admin.clone(), &first.namespace)
        .delete(&first.secret, &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("the route rejected in its status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, false).await == 1).then_some(())
    })
    .await;
    let writes = status_writes(&control_plane.audit().unwrap());
    assert_eq!(writes.len() - before, 1, "{:?}", &writes[before..]);

    // SIGKILL of the leader; the follower writes what changed meanwhile.
    let before = writes.len();
    let killed = Instant::now();
    replicas[leader].0.signal("KILL");
    let dead = replicas.remove(leader);
    for route in &cluster.routes[1..4] {
        Api::<Secret>::namespaced(admin.clone(), &route.namespace)
            .delete(&route.secret, &DeleteParams::default())
            .await
            .unwrap();
    }
    eventually_async("4 routes rejected in their status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, false).await == 4).then_some(())
    })
    .await;
    let took = killed.elapsed();
    assert!(leads(&replicas[0].0));
    let writes = status_writes(&control_plane.audit().unwrap());
    let after = &writes[before..];
    eprintln!(
        "leader killed: the follower wrote {} statuses, the last {took:?} after the kill \
         (lease duration 6 s)",
        after.len()
    );
    assert_eq!(
        after.iter().filter(|(_, code)| *code == 200).count(),
        3,
        "{after:?}"
    );
    assert!(after.len() <= 4, "{after:?}");
    drop(dead);
}
