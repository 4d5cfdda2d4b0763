//! End to end: `certwatch run` (against the lab's simulator) as a process, checked through the
//! files, `/readyz`, `/metrics` and the process's exit status.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use route_secrets::route::Route;
use route_secrets::route::admission::{admitted_condition, router_ingress};

const SIM_HOSTS: &str = "apps.sim.example";

fn bundle(dir: &Path, namespace: &str, route: &str) -> std::path::PathBuf {
    dir.join(format!("{namespace}:{route}.pem"))
}

fn not_after(pem_bundle: &[u8]) -> i64 {
    let text = String::from_utf8_lossy(pem_bundle);
    let block = pem::parse_many(text.as_bytes())
        .unwrap()
        .into_iter()
        .next()
        .unwrap();
    let (_, cert) = x509_parser::parse_x509_certificate(block.contents()).unwrap();
    cert.validity().not_after.timestamp()
}

async fn secret(client: &kube::Client, namespace: &str, name: &str) -> Secret {
    Api::<Secret>::namespaced(client.clone(), namespace)
        .get(name)
        .await
        .unwrap()
}

async fn wait_for_bundle(dir: &Path, namespace: &str, route: &str, expected: Vec<u8>) {
    let path = bundle(dir, namespace, route);
    eventually(
        &format!("{} to hold the expected bundle", path.display()),
        || (read_or_empty(&path) == expected).then_some(()),
    )
    .await;
}

async fn wait_for_absence(dir: &Path, namespace: &str, route: &str) {
    let path = bundle(dir, namespace, route);
    let link = format!("{namespace}_{route}.pem");
    eventually(&format!("{} to be removed", path.display()), || {
        let listed = crt_list(dir).iter().any(|(name, _)| *name == link);
        (!path.exists() && !listed && !dir.join("links").join(&link).exists()).then_some(())
    })
    .await;
}

/// Bundles, crt-list and metrics after start-up; then every kind of secret and route
/// change reaches the files; SIGTERM ends the process with status 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_follow_secrets_and_routes() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=6,namespaces=2"]);
    let cert_dir = temp.path().join("certs");
    let mut certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &["--write-status", "--router-name", "e2e"],
    );
    certwatch.wait_ready().await;
    let cert_dir = cert_dir.canonicalize().unwrap();
    let admin = sim.client("admin").await;

    // Route i lives in app-(i % 2) and uses secret tls-i.
    let routes: Vec<(String, String, String)> = (0..6)
        .map(|i| {
            (
                format!("app-{}", i % 2),
                format!("route-{i}"),
                format!("tls-{i}"),
            )
        })
        .collect();
    assert_eq!(
        std::fs::metadata(&cert_dir).unwrap().permissions().mode() & 0o777,
        0o700
    );
    for (namespace, route, secret_name) in &routes {
        let path = bundle(&cert_dir, namespace, route);
        let expected = expected_bundle(&secret(&admin, namespace, secret_name).await);
        assert_eq!(read_or_empty(&path), expected, "{}", path.display());
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // The crt-list names the bundle through its colon-free link.
        let link = cert_dir
            .join("links")
            .join(format!("{namespace}_{route}.pem"));
        assert_eq!(std::fs::read(&link).unwrap(), expected);
    }
    let expected_list: Vec<(String, String)> = routes
        .iter()
        .map(|(namespace, route, _)| {
            (
                format!("{namespace}_{route}.pem"),
                format!("{route}.{namespace}.{SIM_HOSTS}"),
            )
        })
        .collect();
    assert_eq!(crt_list(&cert_dir), expected_list, "oldest route first");

    let metrics = certwatch.metrics();
    for (sample, value) in [
        ("certwatch_ready", 1.0),
        ("certwatch_routes_admitted", 6.0),
        ("certwatch_watched_secrets", 6.0),
        ("certwatch_synced_secrets", 6.0),
        ("certwatch_registered_routes", 6.0),
        ("certwatch_bundles", 6.0),
        ("certwatch_secret_first_sync_duration_seconds_count", 6.0),
        ("certwatch_secret_first_sync_failures_total", 0.0),
        ("certwatch_reloads_total", 0.0),
    ] {
        assert_eq!(
            metric_value(&metrics, sample),
            Some(value),
            "{sample}\n{metrics}"
        );
    }
    let first = read_or_empty(&bundle(&cert_dir, "app-0", "route-0"));
    assert_eq!(
        metric_value(
            &metrics,
            "certwatch_certificate_expiration_timestamp_seconds{route_namespace=\"app-0\",route=\"route-0\",secret=\"tls-0\"}"
        ),
        Some(not_after(&first) as f64)
    );
    assert!(
        !metrics.contains("certwatch_api_errors_total{"),
        "{metrics}"
    );

    // A secret update reaches its file.
    let rotated = rotate_secret(
        &admin,
        "app-0",
        "tls-0",
        &format!("route-0.app-0.{SIM_HOSTS}"),
    )
    .await;
    wait_for_bundle(&cert_dir, "app-0", "route-0", expected_bundle(&rotated)).await;

    // A deleted secret takes its route out; re-creating it brings the route back.
    let secrets = Api::<Secret>::namespaced(admin.clone(), "app-1");
    secrets
        .delete("tls-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for_absence(&cert_dir, "app-1", "route-1").await;
    // --write-status: the rejection is recorded in the route's status, with its reason.
    let routes_app1 = Api::<Route>::namespaced(admin.clone(), "app-1");
    eventually_async("the rejection in the route's status", || async {
        let route = routes_app1.get("route-1").await.ok()?;
        let ingress = router_ingress(&route, "e2e")?;
        let condition = admitted_condition(ingress)?;
        (condition.reason.as_deref() == Some("ExternalCertificateValidationFailed")
            && condition.status.as_str() == "False")
            .then_some(())
    })
    .await;
    eventually("the rejection by reason in the metrics", || {
        (certwatch.metric("certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"secret_missing\"}")
            == Some(1.0))
        .then_some(())
    })
    .await;
    // The rejected route still exists: its certificate's expiration stays visible.
    assert!(
        certwatch
            .metric("certwatch_certificate_expiration_timestamp_seconds{route_namespace=\"app-1\",route=\"route-1\",secret=\"tls-1\"}")
            .is_some()
    );
    let mut recreated = Secret {
        data: Some(new_tls_data(&format!("route-1.app-1.{SIM_HOSTS}"))),
        type_: Some("kubernetes.io/tls".to_owned()),
        ..Secret::default()
    };
    recreated.metadata.name = Some("tls-1".to_owned());
    let recreated = secrets
        .create(&PostParams::default(), &recreated)
        .await
        .unwrap();
    wait_for_bundle(&cert_dir, "app-1", "route-1", expected_bundle(&recreated)).await;
    eventually("the re-admission in the metrics", || {
        let metrics = certwatch.metrics();
        (metric_value(
            &metrics,
            "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"secret_missing\"}",
        ) == Some(0.0))
        .then_some(())
    })
    .await;

    // Route edits, one row each: the change, and the crt-list after it (oldest route
    // first). A switch of secret also rewrites the bundle.
    enum Change {
        Patch(serde_json::Value),
        Delete,
    }
    let line = |namespace: &str, route: &str| {
        (
            format!("{namespace}_{route}.pem"),
            format!("{route}.{namespace}.{SIM_HOSTS}"),
        )
    };
    let renamed = format!("renamed.app-0.{SIM_HOSTS}");
    let renamed_line = ("app-0_route-2.pem".to_owned(), renamed.clone());
    let steps = [
        (
            "a host change: same bundle, new SNI filter",
            ("app-0", "route-2"),
            Change::Patch(serde_json::json!({"spec": {"host": renamed}})),
            vec![
                line("app-0", "route-0"),
                line("app-1", "route-1"),
                renamed_line.clone(),
                line("app-1", "route-3"),
                line("app-0", "route-4"),
                line("app-1", "route-5"),
            ],
            None,
        ),
        (
            "a switch to another secret the router may read",
            ("app-0", "route-4"),
            Change::Patch(
                serde_json::json!({"spec": {"tls": {"externalCertificate": {"name": "tls-0"}}}}),
            ),
            vec![
                line("app-0", "route-0"),
                line("app-1", "route-1"),
                renamed_line.clone(),
                line("app-1", "route-3"),
                line("app-0", "route-4"),
                line("app-1", "route-5"),
            ],
            Some(expected_bundle(&rotated)),
        ),
        (
            "no external certificate any more",
            ("app-1", "route-3"),
            Change::Patch(serde_json::json!({"spec": {"tls": {"externalCertificate": null}}})),
            vec![
                line("app-0", "route-0"),
                line("app-1", "route-1"),
                renamed_line.clone(),
                line("app-0", "route-4"),
                line("app-1", "route-5"),
            ],
            None,
        ),
        (
            "a deleted route",
            ("app-1", "route-5"),
            Change::Delete,
            vec![
                line("app-0", "route-0"),
                line("app-1", "route-1"),
                renamed_line.clone(),
                line("app-0", "route-4"),
            ],
            None,
        ),
    ];
    for (what, (namespace, name), change, expected, bundle_after) in steps {
        let routes = Api::<Route>::namespaced(admin.clone(), namespace);
        match change {
            Change::Patch(patch) => {
                routes
                    .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                    .await
                    .unwrap();
            }
            Change::Delete => {
                routes.delete(name, &DeleteParams::default()).await.unwrap();
            }
        }
        if let Some(bundle) = bundle_after {
            wait_for_bundle(&cert_dir, namespace, name, bundle).await;
        }
        eventually(&format!("{what}: the crt-list"), || {
            (crt_list(&cert_dir) == expected).then_some(())
        })
        .await;
        if expected
            .iter()
            .all(|(link, _)| *link != format!("{namespace}_{name}.pem"))
        {
            wait_for_absence(&cert_dir, namespace, name).await;
        }
    }
    let metrics = certwatch.metrics();
    // route-3 without an external certificate is admitted as the router admits it
    // (with the default certificate): no bundle, no line.
    assert_eq!(
        metric_value(&metrics, "certwatch_routes_admitted"),
        Some(5.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "certwatch_bundles"),
        Some(4.0),
        "{metrics}"
    );
    // route-3 and route-5 are gone; route-4 left tls-4, route-3 tls-3, route-5 tls-5.
    assert_eq!(
        metric_value(&metrics, "certwatch_registered_routes"),
        Some(4.0),
        "{metrics}"
    );
    // The expiration series go with their routes, and follow a change of secret.
    for (series, present) in [
        (
            "route_namespace=\"app-1\",route=\"route-5\",secret=\"tls-5\"",
            false,
        ),
        (
            "route_namespace=\"app-1\",route=\"route-3\",secret=\"tls-3\"",
            false,
        ),
        (
            "route_namespace=\"app-0\",route=\"route-4\",secret=\"tls-4\"",
            false,
        ),
        (
            "route_namespace=\"app-0\",route=\"route-4\",secret=\"tls-0\"",
            true,
        ),
    ] {
        let sample = format!("certwatch_certificate_expiration_timestamp_seconds{{{series}}}");
        assert_eq!(
            metric_value(&metrics, &sample).is_some(),
            present,
            "{sample}\n{metrics}"
        );
    }

    let status = certwatch.terminate();
    assert_eq!(status.code(), Some(0), "{}", certwatch.log_text());
    // Stopping removes nothing: the proxy keeps serving.
    assert!(bundle(&cert_dir, "app-0", "route-0").exists());
    let log = certwatch.log_text();
    for (namespace, name) in [("app-0", "tls-0"), ("app-1", "tls-1")] {
        let (_, key) = tls_of(&secret(&admin, namespace, name).await);
        let key = String::from_utf8(key).unwrap();
        let body: String = key
            .lines()
            .filter(|line| !line.starts_with("-----"))
            .collect();
        assert!(!log.contains(&body[..40]), "key material in the log");
    }
}

/// A burst of changes while the reload command runs costs exactly one more run; the
/// command sees the complete crt-list; its failures are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_command_runs_once_per_burst() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=2,namespaces=1"]);
    let runs = temp.path().join("runs");
    let hold = temp.path().join("hold");
    let fail = temp.path().join("fail");
    let script = temp.path().join("reload.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nwc -l < \"$CERTWATCH_CRT_LIST\" | tr -d ' ' >> '{runs}'\nwhile [ -e '{hold}' ]; do sleep 0.02; done\n[ ! -e '{fail}' ]\n",
            runs = runs.display(),
            hold = hold.display(),
            fail = fail.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cert_dir = temp.path().join("certs");
    let command = script.display().to_string();
    let mut certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &["--reload-command", &command, "--reload-debounce", "100ms"],
    );
    certwatch.wait_ready().await;
    let admin = sim.client("admin").await;
    let run_lines = || std::fs::read_to_string(&runs).unwrap_or_default();
    let reloads_done = |n: f64| {
        let metrics = certwatch.metrics();
        metric_value(&metrics, "certwatch_reloads_total") == Some(n)
            && metric_value(&metrics, "certwatch_reload_running") == Some(0.0)
    };

    // One run for start-up, and it saw both routes in the crt-list.
    eventually("the start-up reload", || reloads_done(1.0).then_some(())).await;
    assert_eq!(run_lines(), "2\n");

    // Hold the next run, then change a secret 20 times while it runs.
    std::fs::write(&hold, b"").unwrap();
    let host = format!("route-0.app-0.{SIM_HOSTS}");
    rotate_secret(&admin, "app-0", "tls-0", &host).await;
    eventually("the second run to start", || {
        (run_lines().lines().count() == 2).then_some(())
    })
    .await;
    let mut last = None;
    for _ in 0..20 {
        last = Some(rotate_secret(&admin, "app-0", "tls-0", &host).await);
    }
    let cert_dir = cert_dir.canonicalize().unwrap();
    wait_for_bundle(
        &cert_dir,
        "app-0",
        "route-0",
        expected_bundle(&last.unwrap()),
    )
    .await;
    std::fs::remove_file(&hold).unwrap();
    // Every change of the burst was announced before its file appeared, so exactly
    // one run covers them all and nothing is left pending.
    eventually("the run after the burst", || {
        reloads_done(3.0).then_some(())
    })
    .await;
    let metrics = certwatch.metrics();
    assert_eq!(
        metric_value(&metrics, "certwatch_reload_pending"),
        Some(0.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "certwatch_reload_failures_total"),
        Some(0.0)
    );
    assert_eq!(run_lines(), "2\n2\n2\n");

    // A failing command is counted.
    std::fs::write(&fail, b"").unwrap();
    rotate_secret(
        &admin,
        "app-0",
        "tls-1",
        &format!("route-1.app-0.{SIM_HOSTS}"),
    )
    .await;
    eventually("the failed run", || {
        (certwatch.metric("certwatch_reload_failures_total") == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(certwatch.metric("certwatch_reloads_total"), Some(4.0));

    let status = certwatch.terminate();
    assert_eq!(status.code(), Some(0));
}

/// The API server is not there when certwatch starts: it stays up, not ready, counts
/// the errors, and becomes ready once the server appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_started_late() {
    let temp = tempfile::tempdir().unwrap();
    let port = free_port();
    let kubeconfig = temp.path().join("late.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: router\n  user:\n    token: router-token\ncontexts:\n- name: router\n  context:\n    cluster: sim\n    user: router\ncurrent-context: router\n"
        ),
    )
    .unwrap();
    let cert_dir = temp.path().join("certs");
    let mut certwatch = Certwatch::start(
        &kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[],
    );
    // A second one is stopped while it waits: SIGTERM ends it cleanly too.
    let mut stopped = Certwatch::start(
        &kubeconfig,
        &temp.path().join("stopped"),
        &temp.path().join("stopped.log"),
        &[],
    );
    assert_eq!(certwatch.get("/healthz").0, 200);
    eventually("a counted connection error", || {
        certwatch
            .metric("certwatch_api_errors_total{source=\"routes\",code=\"transport\"}")
            .filter(|errors| *errors >= 1.0)
    })
    .await;
    let (status, body) = certwatch.get("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("waiting for the list of routes"), "{body}");
    assert_eq!(certwatch.metric("certwatch_ready"), Some(0.0));
    assert_eq!(stopped.get("/readyz").0, 503);
    assert_eq!(stopped.terminate().code(), Some(0));

    let listen = format!("127.0.0.1:{port}");
    let sim = SimProcess::start_on(
        temp.path(),
        &listen,
        &[
            "--router-token",
            "router-token",
            "--generate",
            "routes=3,namespaces=1",
        ],
    );
    certwatch.wait_ready().await;
    let admin = sim.client("admin").await;
    let cert_dir = cert_dir.canonicalize().unwrap();
    for i in 0..3 {
        let expected = expected_bundle(&secret(&admin, "app-0", &format!("tls-{i}")).await);
        assert_eq!(
            read_or_empty(&bundle(&cert_dir, "app-0", &format!("route-{i}"))),
            expected
        );
    }
    assert_eq!(certwatch.terminate().code(), Some(0));

    // No route in scope at all is a complete start-up too: ready, with an empty list.
    let empty_dir = temp.path().join("empty");
    let mut empty = Certwatch::start(
        &kubeconfig,
        &empty_dir,
        &temp.path().join("empty.log"),
        &["--route-selector", "nothing=here"],
    );
    empty.wait_ready().await;
    assert_eq!(
        std::fs::read_to_string(empty_dir.join("crt-list")).unwrap(),
        ""
    );
    assert_eq!(empty.metric("certwatch_routes_admitted"), Some(0.0));
    assert_eq!(empty.terminate().code(), Some(0));
}

/// Errors injected through the simulator's admin API before certwatch starts: exactly
/// those are counted, by code, and start-up completes. (500, not 503: kube's client
/// retries 429, 503 and 504 itself, so those never reach certwatch.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_errors_at_startup_are_retried_and_counted() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=3,namespaces=1"]);
    for rule in [
        r#"{"verb":"list","resource":"routes","code":500,"count":2}"#,
        r#"{"verb":"watch","resource":"secrets","code":500,"count":1,"name":"tls-1"}"#,
        r#"{"verb":"watch","resource":"secrets","code":429,"count":1,"name":"tls-2"}"#,
    ] {
        let (status, body) = sim.admin("POST", "/sim/faults/fail", rule);
        assert_eq!(status, 200, "{body}");
    }
    let cert_dir = temp.path().join("certs");
    let mut certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[],
    );
    certwatch.wait_ready().await;
    let metrics = certwatch.metrics();
    assert_eq!(
        metric_value(
            &metrics,
            "certwatch_api_errors_total{source=\"routes\",code=\"500\"}"
        ),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(
            &metrics,
            "certwatch_api_errors_total{source=\"secrets\",code=\"500\"}"
        ),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "certwatch_routes_admitted"),
        Some(3.0),
        "{metrics}"
    );
    // Every request by resource, verb and code, the 429 included.
    for (sample, expected) in [
        (
            "certwatch_api_requests_total{resource=\"routes\",verb=\"list\",code=\"500\"}",
            2.0,
        ),
        (
            "certwatch_api_requests_total{resource=\"secrets\",verb=\"watch\",code=\"500\"}",
            1.0,
        ),
        (
            "certwatch_api_requests_total{resource=\"secrets\",verb=\"watch\",code=\"429\"}",
            1.0,
        ),
        (
            "certwatch_api_requests_total{resource=\"secrets\",verb=\"watch\",code=\"200\"}",
            3.0,
        ),
    ] {
        assert_eq!(
            metric_value(&metrics, sample),
            Some(expected),
            "{sample}\n{metrics}"
        );
    }
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// Namespace selector (following label changes) and an explicit namespace list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_scope() {
    let temp = tempfile::tempdir().unwrap();
    // app-0 has certwatch.io/shard=0, app-1 has certwatch.io/shard=1.
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=4,namespaces=2"]);
    let selected = temp.path().join("selected");
    let listed = temp.path().join("listed");
    let mut by_selector = Certwatch::start(
        &sim.kubeconfig,
        &selected,
        &temp.path().join("selector.log"),
        &["--namespace-selector", "certwatch.io/shard=0"],
    );
    let mut by_list = Certwatch::launch(
        Launch::new(&sim.kubeconfig, &listed, &temp.path().join("list.log"))
            .args(&["--namespace", "app-1"])
            .json(),
    );
    by_selector.wait_ready().await;
    by_list.wait_ready().await;
    let (selected, listed) = (
        selected.canonicalize().unwrap(),
        listed.canonicalize().unwrap(),
    );
    let names =
        |dir: &Path| -> Vec<String> { crt_list(dir).into_iter().map(|(name, _)| name).collect() };
    assert_eq!(names(&selected), ["app-0_route-0.pem", "app-0_route-2.pem"]);
    assert_eq!(names(&listed), ["app-1_route-1.pem", "app-1_route-3.pem"]);

    // app-1 joins the selection, then app-0 leaves it.
    let admin = sim.client("admin").await;
    let namespaces = Api::<Namespace>::all(admin);
    let relabel =
        |shard: &str| serde_json::json!({"metadata": {"labels": {"certwatch.io/shard": shard}}});
    namespaces
        .patch(
            "app-1",
            &PatchParams::default(),
            &Patch::Merge(relabel("0")),
        )
        .await
        .unwrap();
    eventually("app-1's routes to be served", || {
        (names(&selected).len() == 4).then_some(())
    })
    .await;
    namespaces
        .patch(
            "app-0",
            &PatchParams::default(),
            &Patch::Merge(relabel("1")),
        )
        .await
        .unwrap();
    // The bundles of dropped routes go once the crt-list without them is on disk.
    eventually("app-0's routes to be dropped", || {
        (names(&selected) == ["app-1_route-1.pem", "app-1_route-3.pem"]
            && !bundle(&selected, "app-0", "route-0").exists())
        .then_some(())
    })
    .await;
    assert_eq!(names(&listed), ["app-1_route-1.pem", "app-1_route-3.pem"]);
    assert_eq!(by_selector.terminate().code(), Some(0));
    assert_eq!(by_list.terminate().code(), Some(0));
    // --log-format json: one JSON object per line.
    let log = by_list.log_text();
    assert!(log.lines().count() > 3, "{log}");
    for line in log.lines() {
        let event: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            event["level"].is_string() && event["message"].is_string(),
            "{line}"
        );
    }
}

/// `--help` explains every option, with its environment variable.
#[test]
fn help_names_every_option_and_variable() {
    let output = std::process::Command::new(certwatch_binary())
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for flag in [
        "kubeconfig",
        "context",
        "namespace",
        "namespace-selector",
        "route-selector",
        "cert-dir",
        "reload-command",
        "reload-debounce",
        "haproxy-socket",
        "listen",
        "log-format",
        "router-name",
        "write-status",
        "access-check",
        "router-identity",
        "max-concurrent-syncs",
        "sync-timeout",
        "tls-profile",
        "tls-ciphers",
        "tls-ciphersuites",
        "tls-min-version",
        "metrics-unauthenticated",
        "shutdown-delay",
        "termination-grace-period",
        "haproxy-hard-stop-after",
        "haproxy-health-bind",
        "proxy-protocol",
        "access-log",
    ] {
        assert!(
            help.contains(&format!("--{flag}")),
            "--{flag} missing:\n{help}"
        );
        let variable = format!("CERTWATCH_{}", flag.to_uppercase().replace('-', "_"));
        assert!(help.contains(&variable), "{variable} missing:\n{help}");
    }
    for endpoint in ["/healthz", "/readyz", "/metrics"] {
        assert!(help.contains(endpoint), "{endpoint} missing");
    }
    // The embedded run is the lab's: no such option here (the help only points there).
    assert!(
        !help
            .lines()
            .any(|line| line.trim_start().starts_with("--embedded")),
        "{help}"
    );
}

/// The production binary holds the daemon only: the lab's commands are not in its help,
/// and typed anyway they fail with a message that names `certwatch-lab` and the command
/// to run there, without running anything else (a `certwatch-lab` beside it and on PATH,
/// here a stand-in script that would print its arguments, is never started; neither is
/// it for `CERTWATCH_EMBEDDED`). The lab binary runs these commands: tools/lab/tests.
#[test]
fn lab_commands_are_refused_with_the_lab_binary_named() {
    use std::os::unix::fs::PermissionsExt as _;
    let help = std::process::Command::new(certwatch_binary())
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success(), "{help:?}");
    let help = String::from_utf8_lossy(&help.stdout);
    let commands: Vec<&str> = help
        .lines()
        .skip_while(|line| *line != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(commands, ["run", "clear-status", "help"], "{help}");
    for word in ["demo", "bench", " sim"] {
        assert!(!help.contains(word), "{word:?} in the help:\n{help}");
    }
    assert!(help.contains("certwatch-lab"), "{help}");

    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("bin");
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(certwatch_binary(), dir.join("certwatch")).unwrap();
    let lab = dir.join("certwatch-lab");
    std::fs::write(&lab, "#!/bin/sh\necho \"lab: $*\"\n").unwrap();
    std::fs::set_permissions(&lab, std::fs::Permissions::from_mode(0o755)).unwrap();
    for (args, instead) in [
        (&["demo"][..], "`certwatch-lab demo`"),
        (&["demo", "--routes", "4"][..], "`certwatch-lab demo`"),
        (&["demo", "--help"][..], "`certwatch-lab demo`"),
        (
            &["sim", "--listen", "127.0.0.1:0"][..],
            "`certwatch-lab sim`",
        ),
        (&["bench", "--help"][..], "`certwatch-lab bench`"),
        (
            &["run", "--embedded", "--cert-dir", "/tmp/x"][..],
            "`certwatch-lab run --embedded`",
        ),
        (
            &[
                "run",
                "--cert-dir",
                "/tmp/x",
                "--embedded-generate",
                "routes=1,namespaces=1",
            ][..],
            "`certwatch-lab run --embedded`",
        ),
    ] {
        let output = std::process::Command::new(dir.join("certwatch"))
            .args(args)
            .env("PATH", &dir)
            .env_remove("CERTWATCH_LOG_FORMAT")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert!(output.stdout.is_empty(), "{args:?}: {output:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(instead), "{args:?}: {stderr}");
        assert!(
            stderr.contains("cargo build --release -p certwatch-lab"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("lab:"), "{args:?}: {stderr}");
    }

    // Asked for JSON logs, the same message as the error event's field.
    let output = std::process::Command::new(dir.join("certwatch"))
        .args(["demo", "--log-format", "json"])
        .env("PATH", &dir)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let event: serde_json::Value = serde_json::from_str(stderr.trim()).unwrap();
    assert_eq!(event["level"], "ERROR", "{stderr}");
    assert!(
        event["error"]
            .as_str()
            .is_some_and(|error| error.contains("`certwatch-lab demo`")),
        "{stderr}"
    );

    // CERTWATCH_EMBEDDED is not the production binary's: `run` stays the daemon's (its
    // own refusal of a missing --cert-dir, not the lab).
    let output = std::process::Command::new(dir.join("certwatch"))
        .arg("run")
        .env("PATH", &dir)
        .env("CERTWATCH_EMBEDDED", "true")
        .env_remove("CERTWATCH_CERT_DIR")
        .env_remove("CERTWATCH_LOG_FORMAT")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert!(output.stdout.is_empty(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--cert-dir"), "{stderr}");
    assert!(!stderr.contains("certwatch-lab"), "{stderr}");
}
