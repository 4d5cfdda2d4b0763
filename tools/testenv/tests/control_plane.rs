//! The harness against the real control plane: it starts, serves both identities with
//! real RBAC, installs a generated cluster, accounts for requests, and leaves no
//! process behind however the test ends.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams};
use kube_sim::GenerateSpec;
use testenv::process::{Supervised, pid_is_running};
use testenv::{ControlPlane, ControlPlaneOptions, Installer, ROUTER_USER, TestEnvError};

/// Waits (at most a minute: the machine is shared) until every pid is gone.
fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while pids.iter().any(|pid| pid_is_running(*pid)) {
        assert!(Instant::now() < deadline, "still running: {pids:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_code(error: kube::Error) -> u16 {
    match error {
        kube::Error::Api(status) => status.code,
        other => panic!("expected an API error, got {other}"),
    }
}

/// Starts; the admin can do anything; the router only what the generated RBAC grants;
/// the generated cluster is there as kube-sim generates it; the audit log and /metrics
/// account for the requests; dropping stops both processes and removes the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_both_identities_and_accounts_for_requests() {
    let control_plane = ControlPlane::start().await.unwrap();
    let admin = control_plane.admin_client().await.unwrap();
    let spec = GenerateSpec {
        secrets: Some(6),
        ..GenerateSpec::new(12, 3)
    };
    let before = control_plane.metrics().await.unwrap();
    let cluster = Installer::new(admin.clone()).generate(&spec).await.unwrap();
    assert_eq!(cluster.routes.len(), 12);
    assert_eq!(cluster.distinct_secrets().len(), 6);
    let after = control_plane.metrics().await.unwrap();
    let delta = after.since(&before);
    assert_eq!(delta.requests("POST", "secrets", Some("201")), 6.0);
    assert_eq!(delta.requests("POST", "routes", Some("201")), 12.0);

    // The routes are real Route objects, validated by the CRD.
    let routes = Api::<route_secrets::route::Route>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(routes.items.len(), 12);

    // The router may read its secrets only by name (a list needs the name's field
    // selector), and nothing else.
    let router = control_plane.router_client().await.unwrap();
    let first = &cluster.routes[0];
    let secrets: Api<Secret> = Api::namespaced(router.clone(), &first.namespace);
    let secret = secrets.get(&first.secret).await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let by_name = ListParams::default().fields(&format!("metadata.name={}", first.secret));
    assert_eq!(secrets.list(&by_name).await.unwrap().items.len(), 1);
    assert_eq!(
        status_code(secrets.list(&ListParams::default()).await.unwrap_err()),
        403
    );
    let forbidden = Api::<Secret>::namespaced(router.clone(), "kube-system");
    assert_eq!(
        status_code(forbidden.get("anything").await.unwrap_err()),
        403
    );

    // A request with a user agent, to tell clients apart in the audit log.
    let request = http::Request::get(format!(
        "/api/v1/namespaces/{}/secrets/{}",
        first.namespace, first.secret
    ))
    .header(http::header::USER_AGENT, "testenv-check/1")
    .body(Vec::new())
    .unwrap();
    router.request_text(request).await.unwrap();

    // The audit log has each of the router's requests, with its answer.
    let audit = control_plane.audit().unwrap();
    let summary = audit.summary(ROUTER_USER);
    let count = |verb: &str, code: u16| {
        summary
            .get(&(verb.to_owned(), "secrets".to_owned(), code))
            .copied()
            .unwrap_or(0)
    };
    assert_eq!(count("get", 200), 2, "{summary:?}");
    assert_eq!(count("list", 200), 1, "{summary:?}");
    assert_eq!(count("list", 403), 1, "{summary:?}");
    assert_eq!(count("get", 403), 1, "{summary:?}");
    let tagged: Vec<_> = audit
        .of_user(ROUTER_USER)
        .filter(|request| request.user_agent.as_deref() == Some("testenv-check/1"))
        .collect();
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    assert_eq!(tagged[0].name.as_deref(), Some(first.secret.as_str()));

    // The kubeconfig file: both contexts, the router's current, private.
    let kubeconfig = kube::config::Kubeconfig::read_from(control_plane.kubeconfig_path()).unwrap();
    assert_eq!(kubeconfig.current_context.as_deref(), Some("router"));
    assert_eq!(kubeconfig.contexts.len(), 2);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(control_plane.kubeconfig_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let pids = control_plane.pids();
    let dir = control_plane.dir().to_path_buf();
    assert!(pids.iter().all(|pid| pid_is_running(*pid)));
    drop(control_plane);
    wait_gone(&pids);
    assert!(!dir.exists(), "{} is removed", dir.display());
}

/// A test that panics still stops both processes (the destructor runs while
/// unwinding).
#[test]
fn a_panicking_test_stops_its_control_plane() {
    let (pids_tx, pids_rx) = std::sync::mpsc::channel();
    let test = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _control_plane = runtime.block_on(async {
            let control_plane =
                ControlPlane::start_with(ControlPlaneOptions::from_env().audit(false))
                    .await
                    .unwrap();
            pids_tx.send(control_plane.pids()).unwrap();
            control_plane
        });
        panic!("the test failed");
    });
    assert!(test.join().is_err(), "the thread panicked");
    let pids = pids_rx.recv().unwrap();
    wait_gone(&pids);
}

/// The environment variable that makes this test binary play the owner of a
/// supervised process (see `a_killed_test_process_leaves_no_process_behind`).
const OWNER_ROLE_ENV: &str = "TESTENV_SELF_TEST_OWNER_LOG";

/// A child process killed when the test ends, whichever way.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test process killed outright (no destructor runs) leaves nothing behind: this
/// test runs itself again as the owner of a supervised process, kills that owner with
/// SIGKILL, and checks that the supervised process goes too.
#[test]
fn a_killed_test_process_leaves_no_process_behind() {
    if let Some(log) = std::env::var_os(OWNER_ROLE_ENV) {
        // The owner: supervise a long sleep, say its pid, then wait to be killed.
        let sleeper = Supervised::spawn(
            "sleep",
            &PathBuf::from("sleep"),
            &["1000".to_owned()],
            &PathBuf::from(log),
        )
        .unwrap();
        println!("supervised pid {}", sleeper.pid());
        // Killed long before this; bounded so that a broken driver leaks nothing.
        std::thread::sleep(Duration::from_secs(120));
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let mut owner = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "a_killed_test_process_leaves_no_process_behind",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(OWNER_ROLE_ENV, temp.path().join("sleep.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = owner.0.stdout.take().unwrap();
    let pid: u32 = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        // libtest prints "test NAME ... " on the same line first.
        .find_map(|line| line.split_once("supervised pid ")?.1.trim().parse().ok())
        .expect("the owner reports the supervised pid");
    assert!(pid_is_running(pid));
    owner.0.kill().unwrap(); // SIGKILL: no destructor, no unwinding.
    owner.0.wait().unwrap();
    wait_gone(&[pid]);
}

/// Where no control plane can be found, starting one fails (it is never skipped) with a
/// message that says how to get one.
#[test]
fn a_missing_control_plane_is_an_error_that_says_how_to_get_one() {
    let empty = tempfile::tempdir().unwrap();
    let error = testenv::binaries::check_tool_dir(empty.path().to_path_buf(), true).unwrap_err();
    assert!(matches!(error, TestEnvError::ControlPlaneNotFound { .. }));
    let message = error.to_string();
    assert!(
        message.contains("CERTWATCH_TEST_CONTROL_PLANE"),
        "{message}"
    );
    assert!(message.contains("shared/tools/kube-apiserver"), "{message}");
    // The shared tool itself is complete.
    testenv::binaries::tool_dir().unwrap();
}
