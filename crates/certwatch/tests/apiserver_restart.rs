//! Control-plane restarts are routine (upgrades roll the API servers): `certwatch run`
//! against a real kube-apiserver + etcd (testenv) whose kube-apiserver is killed and,
//! 20 s later, started again on the same port. certwatch keeps serving meanwhile, and
//! changes made once the API answers again reach its outputs promptly: its watches
//! resume from their resourceVersions as soon as the server is back, without waiting
//! out the backoff that the outage grew.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Certwatch, eventually, expected_bundle, read_or_empty, real_cluster, rotate_secret};
use kube_sim::GenerateSpec;

/// How long the API server stays down.
const OUTAGE: Duration = Duration::from_secs(20);

fn bundle(cert_dir: &Path, namespace: &str, route: &str) -> PathBuf {
    cert_dir.join(format!("{namespace}:{route}.pem"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_after_an_apiserver_restart_reach_the_outputs() {
    let (mut control_plane, _, cluster) = real_cluster(&GenerateSpec::new(20, 2)).await;
    let temp = tempfile::tempdir().unwrap();
    let cert_dir = temp.path().join("certs");
    let certwatch = Certwatch::start(
        control_plane.kubeconfig_path(),
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[],
    );
    certwatch.wait_ready().await;

    control_plane.kill_apiserver();
    let killed = jiff::Timestamp::now();
    tokio::time::sleep(OUTAGE).await;
    assert!(
        certwatch.is_ready(),
        "certwatch stopped being ready during the outage"
    );
    if let Err(error) = control_plane.start_apiserver().await {
        panic!("{error}");
    }
    let answering = Instant::now();
    let admin = control_plane.admin_client().await.unwrap();
    let route = &cluster.routes[0];
    let secret = rotate_secret(&admin, &route.namespace, &route.secret, &route.host).await;
    let changed = Instant::now();
    let path = bundle(&cert_dir, &route.namespace, &route.route);
    let want = expected_bundle(&secret);
    eventually("the rotated certificate in its bundle", || {
        (read_or_empty(&path) == want).then_some(())
    })
    .await;
    let arrived = Instant::now();
    eprintln!(
        "API answering again -> change made: {:?}; change made -> in the outputs: {:?}; \
         API answering again -> in the outputs: {:?}",
        changed - answering,
        arrived - changed,
        arrived - answering
    );
    // The audit log is read once it shows every watch resumed: the resumptions are
    // spread over a moment after the prober sees the server back, and the rotation can
    // reach its bundle before the last of them is made.
    let resumed_after_kill = |request: &testenv::AuditedRequest| {
        request.received.is_some_and(|received| received > killed)
            && resumes_a_watch(request)
            && request.code == Some(200)
    };
    let audit = eventually("every watch resumed, in the audit log", || {
        let audit = control_plane.audit().ok()?;
        let resumed_of = |resource: &str, namespace: Option<&str>, name: Option<&str>| {
            audit.of_user(testenv::ROUTER_USER).any(|request| {
                resumed_after_kill(request)
                    && request.resource.as_deref() == Some(resource)
                    && (namespace.is_none() || request.namespace.as_deref() == namespace)
                    && (name.is_none() || request.name.as_deref() == name)
            })
        };
        let secrets = cluster.routes.iter().all(|route| {
            resumed_of(
                "secrets",
                Some(route.namespace.as_str()),
                Some(route.secret.as_str()),
            )
        });
        (secrets && resumed_of("routes", None, None)).then_some(audit)
    })
    .await;
    // Resumed from their resourceVersions: after the restart each secret's watch went
    // on from where it was. A restarted kube-apiserver's watch cache starts at the
    // current resourceVersion, so it answers such a watch 410 (too old): each key then
    // lists once more (a streaming list), and nothing else; no retry storm.
    let after: Vec<_> = audit
        .of_user(testenv::ROUTER_USER)
        .filter(|request| request.received.is_some_and(|received| received > killed))
        .collect();
    let resumed = |request: &&&testenv::AuditedRequest| resumes_a_watch(request);
    let mut relisted = 0;
    for (namespace, secret) in cluster
        .routes
        .iter()
        .map(|route| (&route.namespace, &route.secret))
    {
        let of_secret: Vec<_> = after
            .iter()
            .filter(|request| {
                request.resource.as_deref() == Some("secrets")
                    && request.namespace.as_deref() == Some(namespace.as_str())
                    && request.name.as_deref() == Some(secret.as_str())
            })
            .collect();
        let what = format!("secret {namespace}/{secret}: {of_secret:#?}");
        assert!(
            of_secret
                .iter()
                .any(|request| resumed(request) && request.code == Some(200)),
            "not resumed from its resourceVersion: {what}"
        );
        assert!(
            of_secret.iter().all(|request| request.verb == "watch"),
            "{what}"
        );
        let lists = of_secret
            .iter()
            .filter(|request| request.is_streaming_list())
            .count();
        assert!(lists <= 1, "{what}");
        relisted += lists;
        assert!(of_secret.len() <= 3, "{what}");
    }
    let routes: Vec<_> = after
        .iter()
        .filter(|request| request.resource.as_deref() == Some("routes"))
        .collect();
    assert!(routes.iter().any(resumed), "{routes:#?}");
    assert!(
        routes
            .iter()
            .filter(|request| request.verb == "list")
            .count()
            <= 1,
        "{routes:#?}"
    );
    eprintln!(
        "after the restart: {} requests of the router; {relisted} of {} secrets listed again \
         (410 from the restarted watch cache)",
        after.len(),
        cluster.routes.len()
    );
    // One prober for the process: the outage's end is noticed once, not per watch.
    let log = certwatch.log_text();
    assert_eq!(
        log.matches("the API server answers again; resuming every watch")
            .count(),
        1,
        "{log}"
    );
}

/// A watch that goes on from a resourceVersion (not a streaming list starting over).
fn resumes_a_watch(request: &testenv::AuditedRequest) -> bool {
    request.verb == "watch"
        && request.request_uri.contains("resourceVersion=")
        && !request.is_streaming_list()
}
