//! The drain of the HAProxy certwatch runs, through the binary with a real HAProxy: once
//! `--shutdown-delay` has passed after SIGTERM, HAProxy is stopped softly (its
//! listeners close) and a request in flight finishes, for as long as the termination
//! grace period leaves after the delay (never longer than `--haproxy-hard-stop-after`);
//! at that bound, or on a second SIGTERM or SIGINT, HAProxy is stopped at once. In both
//! modes certwatch runs HAProxy: on the configuration it writes (`--haproxy-config-dir`)
//! and on an admin's (`--haproxy-config`).
//!
//! Each request is held by its backend until the test releases it; what is asserted
//! is the outcome: the answer the client got (a 200, or the connection closed without
//! one), certwatch's exit status, and that no HAProxy process is left. The request
//! that finishes is released more than 10 s after the soft stop: longer than the
//! watchdog's patience for a certwatch that died.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::routing::RoutingLaunch;
use common::traffic::{Backend, Release, create_service, set_endpoints};
use common::{Certwatch, Launch, SimProcess, create_route_spec, eventually, free_port};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NS: &str = "app-0";

/// Longer than the watchdog's patience (10 s) for HAProxy's connections after the
/// certwatch that started it died: a request released this long after the soft stop
/// finishes only if certwatch itself waits for it.
const PAST_THE_WATCHDOG: Duration = Duration::from_secs(12);

/// HAProxy processes (not their watchdog shells) running on `config`.
fn haproxy_on(config: &Path) -> Vec<u32> {
    let config = config.as_os_str().as_encoded_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
            let program = args.first()?.rsplit(|byte| *byte == b'/').next()?;
            let on_config = args
                .windows(2)
                .any(|pair| pair[0] == b"-f" && pair[1] == config);
            (on_config && !program.ends_with(b"sh")).then_some(pid)
        })
        .collect()
}

/// A request for `host` to `addr` (`Connection: close`), read to its end: the
/// status, or `None` when the connection closed without an answer.
async fn request(addr: SocketAddr, host: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response)
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// A certwatch routing `held.example` to a backend that holds its requests.
struct Routed {
    certwatch: Certwatch,
    /// HAProxy's plain HTTP listener.
    http: SocketAddr,
    config: PathBuf,
    backend: Backend,
    release: Release,
    _sim: SimProcess,
}

/// certwatch with the HAProxy it configures (`--haproxy-config-dir`), `args` added,
/// routing `held.example` to a held backend; ready.
async fn routed(dir: &Path, args: &[&str]) -> Routed {
    let sim = SimProcess::start(dir, &["--generate", "routes=0,namespaces=1"]);
    let admin = sim.client("admin").await;
    let (backend, release) = Backend::held("held").await;
    create_service(&admin, NS, "held").await;
    set_endpoints(&admin, NS, "held", &[&backend]).await;
    create_route_spec(
        &admin,
        NS,
        "held",
        serde_json::json!({"host": "held.example", "to": {"kind": "Service", "name": "held"}}),
    )
    .await;
    let routing = RoutingLaunch::on(&sim, dir).args(args).ready().await;
    Routed {
        http: routing.http,
        config: routing.config(),
        certwatch: routing.certwatch,
        backend,
        release,
        _sim: sim,
    }
}

/// Sends a request through `routed`'s HAProxy and waits until the backend holds it.
async fn in_flight(routed: &Routed) -> tokio::task::JoinHandle<Option<u16>> {
    // The route is served once HAProxy answers for it; the first request may meet a
    // server still being checked: it is sent again until the backend has one.
    let http = routed.http;
    let mut sent = None;
    eventually("a request held by the backend", || {
        if routed.backend.served() == 1 {
            return Some(());
        }
        if sent
            .as_ref()
            .is_none_or(tokio::task::JoinHandle::is_finished)
        {
            sent = Some(tokio::spawn(request(http, "held.example")));
        }
        None
    })
    .await;
    sent.unwrap()
}

/// Waits until certwatch has stopped HAProxy softly: it says so, and HAProxy's
/// listener refuses connections.
async fn soft_stopped(routed: &Routed) {
    eventually("HAProxy's soft stop", || {
        routed
            .certwatch
            .log_text()
            .contains("HAProxy stops softly")
            .then_some(())
    })
    .await;
    eventually("HAProxy's listener closed", || {
        std::net::TcpStream::connect(routed.http)
            .is_err()
            .then_some(())
    })
    .await;
}

/// Waits for certwatch's exit; asserts it exited 0 and left no HAProxy behind.
async fn exited_leaving_no_haproxy(routed: &mut Routed) {
    let status = eventually("certwatch's exit", || routed.certwatch.exited()).await;
    assert!(status.success(), "{status}");
    assert_eq!(haproxy_on(&routed.config), Vec::<u32>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_finishes_after_the_soft_stop_past_the_watchdogs_patience() {
    let dir = tempfile::tempdir().unwrap();
    let mut routed = routed(
        dir.path(),
        &["--shutdown-delay", "1s", "--termination-grace-period", "1h"],
    )
    .await;
    let answer = in_flight(&routed).await;

    routed.certwatch.signal("TERM");
    soft_stopped(&routed).await;
    tokio::time::sleep(PAST_THE_WATCHDOG).await;
    // Still draining: certwatch and HAProxy wait for the request.
    assert_eq!(routed.certwatch.exited(), None);
    assert!(!haproxy_on(&routed.config).is_empty());
    routed.release.release();

    assert_eq!(answer.await.unwrap(), Some(200));
    exited_leaving_no_haproxy(&mut routed).await;
    let log = routed.certwatch.log_text();
    assert!(log.contains("stopped=Soft"), "{log}");
    assert!(!log.contains("stopping HAProxy at once"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_outlasting_what_the_grace_period_leaves_is_cut_at_that_bound() {
    let dir = tempfile::tempdir().unwrap();
    // The grace period leaves 2 s after the delay: the bound of the drain.
    let mut routed = routed(
        dir.path(),
        &["--shutdown-delay", "1s", "--termination-grace-period", "3s"],
    )
    .await;
    let answer = in_flight(&routed).await;

    routed.certwatch.signal("TERM");
    soft_stopped(&routed).await;
    // The backend never answers: certwatch stops HAProxy at the bound, and exits.
    exited_leaving_no_haproxy(&mut routed).await;
    assert_eq!(answer.await.unwrap(), None, "cut without an answer");
    let log = routed.certwatch.log_text();
    assert!(log.contains("bound=2s"), "{log}");
    assert!(
        log.contains("did not finish its connections within the bound"),
        "{log}"
    );
    assert!(log.contains("stopped=Bound"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_during_the_drain_stops_haproxy_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut routed = routed(
        dir.path(),
        &["--shutdown-delay", "1s", "--termination-grace-period", "1h"],
    )
    .await;
    let answer = in_flight(&routed).await;

    routed.certwatch.signal("TERM");
    soft_stopped(&routed).await;
    routed.certwatch.signal("INT");
    exited_leaving_no_haproxy(&mut routed).await;
    assert_eq!(answer.await.unwrap(), None, "cut without an answer");
    let log = routed.certwatch.log_text();
    assert!(log.contains("second signal"), "{log}");
    assert!(log.contains("stopped=Cut"), "{log}");
}

/// A backend on loopback for the admin's configuration (no EndpointSlice names it):
/// takes connections, reads a line, and answers `done\n` once released. Returns its
/// address, the connections taken so far, and the release.
async fn held_tcp() -> (
    SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    Release,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (release, gate) = Release::new();
    let counter = std::sync::Arc::clone(&taken);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (counter, mut gate) = (std::sync::Arc::clone(&counter), gate.clone());
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                if stream.read_exact(&mut byte).await.is_err() {
                    return;
                }
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if gate.wait_for(|open| *open).await.is_ok() {
                    let _ = stream.write_all(b"done\n").await;
                }
            });
        }
    });
    (addr, taken, release)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_admins_configuration_a_connection_finishes_after_the_soft_stop() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let sim = SimProcess::start(&root, &["--generate", "routes=1,namespaces=1"]);
    let (backend, taken, release) = held_tcp().await;
    let socket = root.join("haproxy.sock");
    let (config, _tls_port, _default) =
        common::haproxy::haproxy_config(&root, &socket, &root.join("certs"));
    // A plain TCP frontend to the held backend beside the admin's TLS one.
    let front = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!(
        "frontend held\n  bind {front}\n  default_backend held\nbackend held\n  server held {backend}\n"
    ));
    std::fs::write(&config, text).unwrap();
    let mut certwatch = Certwatch::launch(
        Launch::new(
            &sim.kubeconfig,
            &root.join("certs"),
            &root.join("certwatch.log"),
        )
        .args(&[
            "--haproxy-socket",
            socket.to_str().unwrap(),
            "--haproxy-config",
            config.to_str().unwrap(),
            "--shutdown-delay",
            "1s",
            "--termination-grace-period",
            "1h",
        ]),
    );
    certwatch.wait_ready().await;
    let mut stream = TcpStream::connect(front).await.unwrap();
    stream.write_all(b"x").await.unwrap();
    eventually("the connection held by the backend", || {
        (taken.load(std::sync::atomic::Ordering::SeqCst) == 1).then_some(())
    })
    .await;

    certwatch.signal("TERM");
    eventually("HAProxy's soft stop", || {
        certwatch
            .log_text()
            .contains("HAProxy stops softly")
            .then_some(())
    })
    .await;
    eventually("HAProxy's listener closed", || {
        std::net::TcpStream::connect(front).is_err().then_some(())
    })
    .await;
    tokio::time::sleep(PAST_THE_WATCHDOG).await;
    assert_eq!(certwatch.exited(), None);
    assert!(!haproxy_on(&config).is_empty());
    release.release();

    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer).await;
    assert_eq!(answer, "done\n");
    let status = eventually("certwatch's exit", || certwatch.exited()).await;
    assert!(status.success(), "{status}");
    assert_eq!(haproxy_on(&config), Vec::<u32>::new());
    assert!(certwatch.log_text().contains("stopped=Soft"));
}
