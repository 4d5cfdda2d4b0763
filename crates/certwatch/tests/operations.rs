//! Operating `certwatch run`, through the real binary: configuration checked at
//! start-up, signals, logs a collector can read, a full cert dir, a random UID under a
//! root-owned volume, token files, and a demo that stays in its own directory.
//!
//! Some of these need root (mounting a small tmpfs, switching to another UID): the
//! test command (`scripts/test`) runs as root, as CI does.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::Command;

use common::*;

fn must_be_root(what: &str) {
    assert_eq!(
        rustix::process::geteuid().as_raw(),
        0,
        "{what} needs root (run the suite with scripts/test as root, as CI does)"
    );
}

/// Every bad setting ends the process at once with a non-zero status and a message
/// naming the flag; none is retried against the API server.
#[test]
fn configuration_is_checked_at_start_up() {
    /// Extra arguments, environment, and what the message must name.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (&["--reload-timeout", "60"], &[], "--reload-timeout"),
        (&["--sync-timeout", "2"], &[], "--sync-timeout"),
        (&["--route-selector", "shard in a"], &[], "--route-selector"),
        (
            &[],
            &[("CERTWATCH_ROUTE_SELECTOR", "a b=c")],
            "--route-selector",
        ),
        (&["--namespace-selector", "=x"], &[], "--namespace-selector"),
        (&["--listen", "127.0.0.1:notaport"], &[], "--listen"),
        (&["--listen", "9090"], &[], "--listen"),
        (&["--namespace", "Team_A"], &[], "--namespace"),
        (
            &[],
            &[("CERTWATCH_WRITE_STATUS", "perhaps")],
            "--write-status",
        ),
        (
            &["--max-concurrent-syncs", "0"],
            &[],
            "--max-concurrent-syncs",
        ),
        (&["--access-check", "subject"], &[], "--router-identity"),
    ];
    for (args, env, flag) in cases {
        let mut full = vec![
            "run",
            "--cert-dir",
            "/nonexistent/certwatch-test",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ];
        full.extend_from_slice(args);
        let output = run_to_exit(&full, env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success(),
            "{args:?} {env:?} was accepted:\n{stderr}"
        );
        assert!(stderr.contains(flag), "{args:?} {env:?}: {stderr}");
    }
}

/// SIGHUP neither kills the daemon (before or after it is ready) nor goes unnoticed:
/// it is logged and runs the reload command once more. Also: the forms of settings
/// people type are accepted (`localhost:PORT`, `1m30s`, `CERTWATCH_WRITE_STATUS=1`),
/// and a text log written to a file carries no colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_resynchronises_and_never_kills() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(
        temp.path(),
        &["--generate", "routes=3,namespaces=1", "--latency", "300ms"],
    );
    let runs = temp.path().join("runs");
    let reload = format!("echo run >> '{}'", runs.display());
    let mut certwatch = Certwatch::launch(
        Launch::new(
            &sim.kubeconfig,
            &temp.path().join("certs"),
            &temp.path().join("certwatch.log"),
        )
        .listen("localhost:0")
        .env("CERTWATCH_WRITE_STATUS", "1")
        .args(&[
            "--reload-command",
            &reload,
            "--reload-debounce",
            "50ms",
            "--reload-timeout",
            "1m30s",
        ]),
    );
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    // Before ready (every request takes 300 ms): the process survives.
    certwatch.signal("HUP");
    certwatch.wait_ready().await;
    assert!(certwatch.exited().is_none());
    eventually("the start-up reload", || (count() == 1).then_some(())).await;

    certwatch.signal("HUP");
    eventually("the reload after SIGHUP", || (count() == 2).then_some(())).await;
    assert!(certwatch.exited().is_none());
    let log = certwatch.log_text();
    assert!(log.matches("SIGHUP").count() >= 2, "{log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    assert_eq!(certwatch.terminate().code(), Some(0));
    assert_eq!(count(), 2);
}

/// `--log-format json`: every line on stderr is a JSON object, stdout stays empty
/// (the address is a field of a log event), `:PORT` listens on every interface.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_only() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=2,namespaces=1"]);
    let log = temp.path().join("certwatch.log");
    let mut certwatch = Certwatch::launch(
        Launch::new(&sim.kubeconfig, &temp.path().join("certs"), &log)
            .listen(":0")
            .json(),
    );
    assert!(certwatch.addr.ip().is_unspecified(), "{}", certwatch.addr);
    certwatch.wait_ready().await;
    assert_eq!(certwatch.terminate().code(), Some(0));
    let text = certwatch.log_text();
    assert!(text.lines().count() > 3, "{text}");
    for line in text.lines() {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        assert!(event["level"].is_string(), "{line}");
    }
    assert_eq!(
        std::fs::read_to_string(log.with_extension("stdout")).unwrap(),
        ""
    );
}

/// `--log-format json` holds for the errors that end the process too: a kubeconfig
/// that cannot be read, a port in use, a bad option value (with the format given as
/// a flag or through `CERTWATCH_LOG_FORMAT`). Each writes one JSON `ERROR` event
/// naming the cause, nothing else, and nothing on stdout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fatal_errors_are_json_in_json_mode() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=1,namespaces=1"]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = format!("127.0.0.1:{}", taken.local_addr().unwrap().port());
    let certs = temp.path().join("certs");
    let kubeconfig = sim.kubeconfig.to_str().unwrap();
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str, i32);
    let cases: &[Case] = &[
        (
            &[
                "--kubeconfig",
                "/nonexistent/kubeconfig",
                "--log-format",
                "json",
            ],
            &[],
            "cannot read the kubeconfig /nonexistent/kubeconfig",
            1,
        ),
        (
            &[
                "--kubeconfig",
                kubeconfig,
                "--listen",
                &port,
                "--log-format=json",
            ],
            &[],
            &format!("cannot listen on {port}"),
            1,
        ),
        (
            &["--kubeconfig", kubeconfig, "--listen", "nowhere"],
            &[("CERTWATCH_LOG_FORMAT", "json")],
            "invalid value 'nowhere' for '--listen <ADDR>'",
            2,
        ),
    ];
    for (args, env, cause, status) in cases {
        let mut full = vec!["run", "--cert-dir", certs.to_str().unwrap()];
        full.extend_from_slice(args);
        let output = run_to_exit(&full, env);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(*status), "{args:?}: {stderr}");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "", "{args:?}");
        let events: Vec<serde_json::Value> = stderr
            .lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|error| panic!("{args:?}: not JSON ({error}): {line}"))
            })
            .collect();
        let last = events
            .last()
            .unwrap_or_else(|| panic!("{args:?}: no event"));
        assert_eq!(last["level"], "ERROR", "{args:?}: {stderr}");
        let error = last["error"].as_str().unwrap_or_default();
        assert!(error.contains(cause), "{args:?}: {cause:?} in {stderr}");
    }
    drop(taken);
}

/// Unmounts a test tmpfs, also when the test fails.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A cert dir that is full at start-up: certwatch decides every route, stays not
/// ready and says why, counts only the bundles really written, writes no crt-list
/// naming missing files; once there is room it writes everything and becomes ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_cert_dir_at_start_up() {
    must_be_root("mounting a small tmpfs");
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=20,namespaces=2"]);
    let cert_dir = temp.path().join("certs");
    std::fs::create_dir(&cert_dir).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs"])
        .arg(&cert_dir)
        .status()
        .unwrap();
    assert!(mounted.success());
    let _mount = Mount(cert_dir.clone());
    // As after an earlier run: the links directory exists. Then nothing fits.
    std::fs::create_dir(cert_dir.join("links")).unwrap();
    let filler = cert_dir.join("filler");
    {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
    }

    let certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[],
    );
    let body = eventually("every route decided, files missing", || {
        let (status, body) = certwatch.get("/readyz");
        (status == 503 && body.contains("every route present at start-up is decided"))
            .then_some(body)
    })
    .await;
    assert!(body.contains(" of 20 bundles are written"), "{body}");
    assert!(body.contains("writes fail"), "{body}");
    let metrics = certwatch.metrics();
    assert_eq!(metric_value(&metrics, "certwatch_ready"), Some(0.0));
    let bundles = metric_value(&metrics, "certwatch_bundles").unwrap();
    let on_disk = std::fs::read_dir(&cert_dir)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".pem")
        })
        .count();
    assert!(bundles < 20.0, "{metrics}");
    assert_eq!(
        bundles, on_disk as f64,
        "certwatch_bundles counts files on disk"
    );
    assert!(
        metric_value(&metrics, "certwatch_bundle_write_failures_total").unwrap() > 0.0,
        "{metrics}"
    );
    // A crt-list, if any could be written, names only bundles on disk.
    let list = std::fs::read_to_string(cert_dir.join("crt-list")).unwrap_or_default();
    assert_eq!(list.lines().count(), on_disk);
    for line in list.lines() {
        let path = line.split(' ').next().unwrap();
        assert!(std::fs::metadata(path).is_ok(), "{path} listed but missing");
    }
    assert!(!certwatch.log_text().contains("ready: every route"));

    std::fs::remove_file(&filler).unwrap();
    certwatch.wait_ready().await;
    let metrics = certwatch.metrics();
    assert_eq!(metric_value(&metrics, "certwatch_bundles"), Some(20.0));
    let list = std::fs::read_to_string(cert_dir.join("crt-list")).unwrap();
    assert_eq!(list.lines().count(), 20);
    for line in list.lines() {
        let path = line.split(' ').next().unwrap();
        assert!(std::fs::metadata(path).is_ok(), "{path} listed but missing");
    }
    // The failures were logged at a bounded rate, not once per bundle and retry.
    let log = certwatch.log_text();
    let failure_lines = log.matches("will retry").count();
    assert!(
        (1..=5).contains(&failure_lines),
        "{failure_lines} failure lines:\n{log}"
    );
}

/// OpenShift's restricted-v2: a random UID with group 0, in a volume owned by root
/// with mode 3777 (a memory-backed `emptyDir`: a tmpfs, 1777, with the `fsGroup`'s
/// setgid bit). certwatch writes its files there without trying to change the
/// directory's mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_uid_with_group_0_in_a_root_owned_volume() {
    must_be_root("running certwatch as another UID");
    let temp = tempfile::tempdir().unwrap();
    // The other UID must reach the kubeconfig and the cert dir.
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=3,namespaces=1"]);
    let kubeconfig = temp.path().join("readable.kubeconfig");
    std::fs::copy(&sim.kubeconfig, &kubeconfig).unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let cert_dir = temp.path().join("certs");
    std::fs::create_dir(&cert_dir).unwrap();
    std::fs::set_permissions(&cert_dir, std::fs::Permissions::from_mode(0o3777)).unwrap();
    let uid = 1_000_650_000;

    let mut certwatch = Certwatch::launch(
        Launch::new(&kubeconfig, &cert_dir, &temp.path().join("certwatch.log")).user(uid, 0),
    );
    certwatch.wait_ready().await;
    let dir = std::fs::metadata(&cert_dir).unwrap();
    assert_eq!(
        (dir.uid(), dir.mode() & 0o7777),
        (0, 0o3777),
        "left as it was"
    );
    let bundle = std::fs::metadata(cert_dir.join("app-0:route-0.pem")).unwrap();
    assert_eq!(bundle.uid(), uid);
    assert_eq!(bundle.gid(), 0, "the directory's group (setgid)");
    assert_eq!(bundle.mode() & 0o777, 0o600);
    let links = std::fs::metadata(cert_dir.join("links")).unwrap();
    assert_eq!((links.uid(), links.mode() & 0o777), (uid, 0o700));
    assert_eq!(
        std::fs::read_to_string(cert_dir.join("crt-list"))
            .unwrap()
            .lines()
            .count(),
        3
    );
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// A cert dir that every user may write, without the sticky bit (a disk-backed
/// `emptyDir`: root-owned 0777, 2777 with an `fsGroup`), is refused before anything
/// is written, with a message that says how to fix it; one certwatch creates, or owns,
/// is restricted to 0700 instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_world_writable_cert_dir_without_the_sticky_bit_is_refused() {
    use std::os::unix::process::CommandExt as _;
    must_be_root("running certwatch as another UID");
    let temp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=2,namespaces=1"]);
    let kubeconfig = temp.path().join("readable.kubeconfig");
    std::fs::copy(&sim.kubeconfig, &kubeconfig).unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let uid = 1_000_650_000;
    for mode in [0o777, 0o2777] {
        let cert_dir = temp.path().join(format!("certs-{mode:o}"));
        std::fs::create_dir(&cert_dir).unwrap();
        std::fs::set_permissions(&cert_dir, std::fs::Permissions::from_mode(mode)).unwrap();
        let output = Command::new(certwatch_binary())
            .args(["run", "--listen", "127.0.0.1:0", "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--cert-dir")
            .arg(&cert_dir)
            .uid(uid)
            .gid(0)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        for words in [
            format!("cannot prepare the cert directory {}", cert_dir.display()),
            "writable by every user and has no sticky bit".to_owned(),
            format!("mode {mode:04o}, owner uid 0"),
            format!("chmod +t {}", cert_dir.display()),
        ] {
            assert!(stderr.contains(&words), "{words:?} in {stderr}");
        }
        assert_eq!(std::fs::read_dir(&cert_dir).unwrap().count(), 0, "{stderr}");
        let dir = std::fs::metadata(&cert_dir).unwrap();
        assert_eq!(dir.mode() & 0o7777, mode, "left as it was");
    }

    // Its own, world-writable: fixed.
    let own = temp.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(uid), Some(0)).unwrap();
    std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut certwatch = Certwatch::launch(
        Launch::new(&kubeconfig, &own, &temp.path().join("own.log")).user(uid, 0),
    );
    certwatch.wait_ready().await;
    assert_eq!(std::fs::metadata(&own).unwrap().mode() & 0o7777, 0o700);
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// A kubeconfig `tokenFile` ending in a newline (as most tools write files) works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_ending_in_a_newline_works() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=2,namespaces=1"]);
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&sim.kubeconfig).unwrap()).unwrap();
    let current = kubeconfig["current-context"].as_str().unwrap().to_owned();
    let users = kubeconfig["users"].as_sequence_mut().unwrap();
    let user = users
        .iter_mut()
        .find(|user| user["name"].as_str() == Some(current.as_str()))
        .unwrap();
    let token = user["user"]["token"].as_str().unwrap().to_owned();
    let token_file = temp.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    user["user"] = serde_yaml::from_str(&format!("tokenFile: {}", token_file.display())).unwrap();
    let path = temp.path().join("token-file.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();

    let mut certwatch = Certwatch::start(
        &path,
        &temp.path().join("certs"),
        &temp.path().join("certwatch.log"),
        &[],
    );
    certwatch.wait_ready().await;
    assert_eq!(certwatch.metric("certwatch_routes_admitted"), Some(2.0));
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// A route decided the same way again and again is logged once, not once per
/// decision: here a certificate that does not cover the route's host (served, with a
/// warning), rotated four times to another certificate for the same wrong host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_decision_is_logged_once() {
    let temp = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(temp.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    let wrong_host = "elsewhere.example";
    grant_secret(&admin, "app-0", "mismatch").await;
    create_tls_secret(&admin, "app-0", "mismatch", wrong_host).await;
    create_route(
        &admin,
        "app-0",
        "mismatch",
        Some("mismatch.app-0.apps.sim.example"),
        "mismatch",
    )
    .await;
    let cert_dir = temp.path().join("certs");
    let mut certwatch = Certwatch::start(
        &sim.kubeconfig,
        &cert_dir,
        &temp.path().join("certwatch.log"),
        &[],
    );
    certwatch.wait_ready().await;
    let bundle = cert_dir.join("app-0:mismatch.pem");
    for _ in 0..4 {
        let rotated = rotate_secret(&admin, "app-0", "mismatch", wrong_host).await;
        let expected = expected_bundle(&rotated);
        // Each rotation is decided again (the new bundle is written) ...
        eventually("the rotated bundle", || {
            (read_or_empty(&bundle) == expected).then_some(())
        })
        .await;
    }
    assert_eq!(certwatch.terminate().code(), Some(0));
    // ... and the unchanged warning was logged once.
    let log = certwatch.log_text();
    let lines = log
        .lines()
        .filter(|line| {
            line.contains("does not cover the route host") && line.contains("app-0/mismatch")
        })
        .count();
    assert_eq!(lines, 1, "{log}");
}
