//! High availability through the binary: several `certwatch run --write-status`
//! replicas under one router name against kube-sim. Every replica serves every route
//! (files per replica); one writes status, elected on a Lease. Counts come from the
//! simulator's request log: start-up writes each route's status once, each later change
//! costs one write, a killed leader's pending changes are written by a follower, and a
//! rolling restart writes nothing and never leaves a running replica without a route.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Certwatch, FAST_ELECTION, SimProcess, eventually, eventually_async};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams};
use route_secrets::route::Route;

/// Routes of the scenarios; `CERTWATCH_HA_ROUTES` sets another number for a measured
/// run (docs/deploy.md states the API cost per replica at 10,000), in a namespace per
/// hundred routes.
fn routes() -> usize {
    std::env::var("CERTWATCH_HA_ROUTES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(300)
}

fn generate_spec() -> String {
    let routes = routes();
    format!(
        "routes={routes},namespaces={},secrets={routes}",
        (routes / 100).max(3)
    )
}
const ROUTER_NAME: &str = "ha";

/// Short election timings, so that a take-over costs seconds (the bound on it is a
/// measurement in docs/BENCHMARKS.md, never an assertion here); `CERTWATCH_HA_DEFAULTS=1`
/// runs the daemon's defaults (15 s, 10 s, 2 s) for a measured run.
fn election() -> Vec<&'static str> {
    if std::env::var_os("CERTWATCH_HA_DEFAULTS").is_some() {
        return Vec::new();
    }
    FAST_ELECTION.to_vec()
}

struct Replica {
    name: String,
    certwatch: Certwatch,
    cert_dir: PathBuf,
}

fn start_replica(sim: &SimProcess, dir: &Path, name: &str) -> Replica {
    let cert_dir = dir.join(name).join("certs");
    let mut args = vec!["--write-status", "--router-name", ROUTER_NAME];
    args.extend(election());
    args.extend_from_slice(&["--lease-identity", name]);
    let certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &dir.join(format!("{name}.log")),
        &args,
    );
    Replica {
        name: name.to_owned(),
        certwatch,
        cert_dir,
    }
}

/// Lines of a replica's crt-list (0 when it has none yet).
fn served(cert_dir: &Path) -> usize {
    // (The crt-list has one line per served route.)
    std::fs::read_to_string(cert_dir.join("crt-list"))
        .map(|text| text.lines().count())
        .unwrap_or(0)
}

fn is_leader(replica: &Replica) -> bool {
    replica
        .certwatch
        .metric("certwatch_status_leader")
        .is_some_and(|value| value == 1.0)
}

async fn one_leader(replicas: &[Replica]) -> usize {
    eventually("exactly one replica leads", || {
        let leading: Vec<usize> = (0..replicas.len())
            .filter(|i| is_leader(&replicas[*i]))
            .collect();
        (leading.len() == 1).then(|| leading[0])
    })
    .await
}

/// The router's status writes so far, as (route, code), and the log's last sequence.
fn status_writes(sim: &SimProcess, since: u64) -> (Vec<(String, u64)>, u64) {
    let (status, body) = sim.admin("GET", &format!("/sim/requests?since={since}"), "");
    assert_eq!(status, 200, "{body}");
    let requests: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let last = requests
        .iter()
        .filter_map(|r| r["seq"].as_u64())
        .max()
        .unwrap_or(since);
    let writes = requests
        .iter()
        .filter(|r| {
            r["user"] == kube_sim::ROUTER_USER
                && r["verb"] == "update"
                && r["resource"] == "routes/status"
        })
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r["namespace"].as_str().unwrap_or(""),
                    r["name"].as_str().unwrap_or("")
                ),
                r["code"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    (writes, last)
}

async fn delete_secrets(admin: &kube::Client, routes: &[kube_sim::GeneratedRoute]) {
    for route in routes {
        Api::<Secret>::namespaced(admin.clone(), &route.namespace)
            .delete(&route.secret, &DeleteParams::default())
            .await
            .unwrap();
    }
}

async fn generated(sim: &SimProcess) -> Vec<kube_sim::GeneratedRoute> {
    let admin = sim.client("admin").await;
    let mut routes: Vec<kube_sim::GeneratedRoute> = Api::<Route>::all(admin)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|route| {
            let secret = route
                .spec
                .tls
                .as_ref()
                .and_then(|tls| tls.external_certificate.as_ref())
                .map(|reference| reference.name.clone())
                .unwrap_or_default();
            kube_sim::GeneratedRoute {
                namespace: route.metadata.namespace.clone().unwrap_or_default(),
                route: route.metadata.name.clone().unwrap_or_default(),
                secret,
                host: route.spec.host.clone().unwrap_or_default(),
            }
        })
        .collect();
    routes.sort_by(|a, b| (&a.namespace, &a.route).cmp(&(&b.namespace, &b.route)));
    routes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_write_each_change_once_and_survive_a_killed_leader() {
    let temp = tempfile::tempdir().unwrap();
    let generate = generate_spec();
    let count = routes();
    let sim = SimProcess::start(temp.path(), &["--generate", &generate]);
    let admin = sim.client("admin").await;
    let mut replicas: Vec<Replica> = ["a", "b", "c"]
        .iter()
        .map(|name| start_replica(&sim, temp.path(), name))
        .collect();
    for replica in &replicas {
        replica.certwatch.wait_ready().await;
        // Every replica serves every route, whatever its role.
        assert_eq!(served(&replica.cert_dir), count, "{}", replica.name);
    }
    eventually_async("every route Admitted=True in its status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, true).await == count).then_some(())
    })
    .await;
    let leader = one_leader(&replicas).await;

    // Start-up: each route's status written once, cluster-wide, and (nearly) no 409.
    let (writes, mut seq) = status_writes(&sim, 0);
    let conflicts = writes.iter().filter(|(_, code)| *code == 409).count();
    eprintln!(
        "start-up of {} replicas, {count} routes: {} status writes, {conflicts} 409s",
        replicas.len(),
        writes.len()
    );
    assert!(writes.len() * 100 <= count * 105, "{writes:?}");
    assert!(conflicts * 100 <= writes.len() * 2, "{writes:?}");
    // What the replicas cost the API server: each holds its own watches.
    let (_, stats) = sim.admin("GET", "/sim/stats", "");
    let stats: serde_json::Value = serde_json::from_str(&stats).unwrap();
    eprintln!(
        "API cost of {} replicas at {count} routes: open watches {} ({}), open connections {}, \
         requests by verb {}",
        replicas.len(),
        stats["open_watches"],
        stats["open_watches_by_resource"],
        stats["open_connections"],
        stats["requests"]
    );

    // Each later change: one write.
    let routes = generated(&sim).await;
    delete_secrets(&admin, &routes[..10]).await;
    eventually_async("10 routes rejected in their status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, false).await == 10).then_some(())
    })
    .await;
    let (writes, last) = status_writes(&sim, seq);
    seq = last;
    eprintln!("10 secrets deleted: {} status writes", writes.len());
    assert_eq!(writes.len(), 10, "{writes:?}");
    assert!(writes.iter().all(|(_, code)| *code == 200), "{writes:?}");

    // The leader killed outright (no release): a follower writes the changes made
    // meanwhile once the lease runs out, and only those.
    let killed_at = Instant::now();
    replicas[leader].certwatch.signal("KILL");
    delete_secrets(&admin, &routes[10..15]).await;
    let dead = replicas.remove(leader);
    eventually_async("15 routes rejected in their status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, false).await == 15).then_some(())
    })
    .await;
    let written_after = killed_at.elapsed();
    let successor = one_leader(&replicas).await;
    let (writes, _) = status_writes(&sim, seq);
    eprintln!(
        "leader {} killed: {} took over, {} status writes, the last change written {written_after:?} \
         after the kill ({:?})",
        dead.name,
        replicas[successor].name,
        writes.len(),
        election()
    );
    let written: std::collections::BTreeSet<&str> = writes
        .iter()
        .filter(|(_, code)| *code == 200)
        .map(|(route, _)| route.as_str())
        .collect();
    let changed: std::collections::BTreeSet<String> = routes[10..15]
        .iter()
        .map(|r| format!("{}/{}", r.namespace, r.route))
        .collect();
    assert_eq!(
        written,
        changed.iter().map(String::as_str).collect(),
        "{writes:?}"
    );
    assert!(writes.len() <= 5 + 1, "{writes:?}");
    for replica in &replicas {
        assert_eq!(served(&replica.cert_dir), count - 15, "{}", replica.name);
    }
    // One log line per change of leadership: the successor's lines alternate, and it
    // leads now (under a heavy load a renewal can come too late and leadership can
    // change hands more than once; each change is one line).
    let log = replicas[successor].certwatch.log_text();
    let changes: Vec<bool> = log
        .lines()
        .filter_map(|line| {
            if line.contains("no longer leading") {
                Some(false)
            } else if line.contains("leading: this replica writes route status") {
                Some(true)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(changes.last(), Some(&true), "{log}");
    assert!(changes.windows(2).all(|pair| pair[0] != pair[1]), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_writes_nothing_and_keeps_every_route_served() {
    let temp = tempfile::tempdir().unwrap();
    let generate = generate_spec();
    let count = routes();
    let sim = SimProcess::start(temp.path(), &["--generate", &generate]);
    let admin = sim.client("admin").await;
    let mut running: Vec<Replica> = ["a", "b"]
        .iter()
        .map(|name| start_replica(&sim, temp.path(), name))
        .collect();
    for replica in &running {
        replica.certwatch.wait_ready().await;
    }
    eventually_async("every route Admitted=True in its status", || async {
        (common::routes_with_status(&admin, ROUTER_NAME, true).await == count).then_some(())
    })
    .await;
    one_leader(&running).await;
    let (_, seq) = status_writes(&sim, 0);

    // While the replicas roll, every running replica that was ready keeps serving
    // every route: a watcher reads each one's crt-list over and over.
    let watched: Arc<std::sync::Mutex<Vec<PathBuf>>> = Arc::new(std::sync::Mutex::new(
        running.iter().map(|r| r.cert_dir.clone()).collect(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let fewest = Arc::new(AtomicUsize::new(usize::MAX));
    let reads = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (watched, stop, fewest, reads) = (
            Arc::clone(&watched),
            Arc::clone(&stop),
            Arc::clone(&fewest),
            Arc::clone(&reads),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let dirs = watched.lock().unwrap().clone();
                for dir in dirs {
                    fewest.fetch_min(served(&dir), Ordering::SeqCst);
                    reads.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    // Surge one, then retire one, as a Deployment with maxUnavailable 0 rolls.
    for name in ["c", "d"] {
        let fresh = start_replica(&sim, temp.path(), name);
        fresh.certwatch.wait_ready().await;
        watched.lock().unwrap().push(fresh.cert_dir.clone());
        let mut old = running.remove(0);
        watched.lock().unwrap().retain(|dir| *dir != old.cert_dir);
        let status = old.certwatch.terminate();
        assert!(status.success(), "{} exited with {status}", old.name);
        running.push(fresh);
        one_leader(&running).await;
    }
    // Let the last hand-over settle: the new leader has recorded every outcome again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert!(reads.load(Ordering::SeqCst) > 0);
    assert_eq!(
        fewest.load(Ordering::SeqCst),
        count,
        "a running replica served fewer routes"
    );
    // Nothing changed, so nothing was written.
    let (writes, _) = status_writes(&sim, seq);
    eprintln!(
        "rolling restart of 2 replicas: {} status writes",
        writes.len()
    );
    assert!(writes.is_empty(), "{writes:?}");
    assert_eq!(
        common::routes_with_status(&admin, ROUTER_NAME, true).await,
        count
    );
}
