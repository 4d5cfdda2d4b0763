//! `certwatch-lab bench --json` as a process, on tiny scenarios: the keys every line must
//! carry and the request counts each strategy must produce. Counts, never times.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::process::Command;

use serde_json::Value;

const KEYS: [&str; 14] = [
    "scenario",
    "strategy",
    "routes",
    "secrets",
    "latency_ms",
    "ready_ms",
    "requests",
    "requests_per_secret",
    "peak_inflight",
    "connections",
    "open_watches",
    "rss_bytes",
    "cpu_ms",
    "errors",
];

/// Runs `certwatch-lab bench --json` with `args`; returns the lines by strategy.
fn bench(args: &[&str]) -> BTreeMap<String, Value> {
    let output = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"))
        .args(["bench", "--json"])
        .args(args)
        .output()
        .expect("certwatch runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "bench failed: {stderr}");
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 output");
    let mut lines = BTreeMap::new();
    for line in stdout.lines() {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not JSON: {line:?}: {e}; stderr: {stderr}"));
        for key in KEYS {
            assert!(value.get(key).is_some(), "{key} missing from {line}");
        }
        let strategy = value["strategy"].as_str().expect("strategy").to_owned();
        lines.insert(strategy, value);
    }
    lines
}

fn count(line: &Value, verb: &str, resource: &str) -> u64 {
    line["requests"][verb][resource].as_u64().unwrap_or(0)
}

fn number(line: &Value, key: &str) -> u64 {
    line[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a count in {line}"))
}

#[test]
fn strategies_make_the_requests_they_model() {
    let lines = bench(&[
        "--routes",
        "20",
        "--namespaces",
        "3",
        "--latency",
        "10ms",
        "--serial-routes",
        "0",
        "--name",
        "tiny",
    ]);
    assert_eq!(lines.len(), 3, "one line per strategy: {lines:?}");

    let serial = &lines["serial"];
    assert_eq!(serial["scenario"], "tiny");
    assert_eq!(number(serial, "routes"), 20);
    assert_eq!(number(serial, "secrets"), 20);
    assert_eq!(number(serial, "latency_ms"), 10);
    assert_eq!(number(serial, "measured_routes"), 20);
    assert_eq!(number(serial, "errors"), 0);
    // As the reference code measured: one streaming list per secret that stays open as
    // its watch, registered one at a time; plus one route list. Nothing else.
    assert_eq!(count(serial, "watch", "secrets"), 20);
    assert_eq!(count(serial, "list", "secrets"), 0);
    assert_eq!(count(serial, "get", "secrets"), 0);
    assert_eq!(count(serial, "create", "subjectaccessreviews"), 0);
    assert_eq!(count(serial, "list", "routes"), 1);
    assert_eq!(number(serial, "requests_total"), 21);
    let per_secret = serial["requests_per_secret"].as_f64().expect("a number");
    assert!((1.0..=1.05).contains(&per_secret), "{per_secret}");
    assert_eq!(number(serial, "open_watches"), 20);
    let peak = number(serial, "peak_inflight");
    assert!(
        (1..=2).contains(&peak),
        "one registration at a time: {peak}"
    );
    // Each registration returns on a 100 ms poll of its cache sync, never sooner.
    let per_secret_ms = serial["per_secret_ms"].as_f64().expect("a number");
    assert!(per_secret_ms >= 100.0, "{per_secret_ms}");
    assert_eq!(number(serial, "model_ready_ms"), 20 * 100);
    assert!(
        serial["extrapolated_ready_ms"].is_null(),
        "every route was measured"
    );

    let concurrent = &lines["concurrent"];
    assert_eq!(number(concurrent, "measured_routes"), 20);
    assert_eq!(number(concurrent, "errors"), 0);
    // One streaming watch per secret, one rules review per namespace, the route listing.
    assert_eq!(count(concurrent, "watch", "secrets"), 20);
    assert_eq!(count(concurrent, "list", "secrets"), 0);
    assert_eq!(count(concurrent, "get", "secrets"), 0);
    assert_eq!(count(concurrent, "create", "selfsubjectrulesreviews"), 3);
    assert_eq!(count(concurrent, "create", "subjectaccessreviews"), 0);
    let per_secret = concurrent["requests_per_secret"]
        .as_f64()
        .expect("a number");
    assert!(per_secret <= 2.0 + 3.0 / 20.0, "{per_secret}");
    assert_eq!(
        number(concurrent, "requests_total"),
        number(concurrent, "requests_needed")
    );
    assert_eq!(number(concurrent, "open_watches"), 20);
    assert!(
        number(concurrent, "peak_inflight") > 2,
        "registrations overlapped"
    );
    // Twenty watches share one HTTP/2 connection; the simulator saw the same.
    assert_eq!(number(concurrent, "connections"), 1);
    assert_eq!(number(&concurrent["connections_by_protocol"], "h2"), 1);
    assert_eq!(number(concurrent, "sim_connections"), 1);
    assert!(number(concurrent, "rss_bytes") > 0);
    assert_eq!(concurrent["targets"]["requests"]["met"], true);
    assert_eq!(concurrent["targets"]["errors"]["met"], true);

    // The daemon's phases come in order: the route list (one latency at least), every
    // route decided, then ready once the files are written.
    let daemon = &lines["daemon"];
    let phases = &daemon["phases"];
    let listed = number(phases, "routes_listed");
    let decided = number(phases, "pipeline_ready");
    assert!(listed >= 10, "the route list takes a latency: {phases}");
    assert!(listed <= decided, "{phases}");
    assert!(decided <= number(daemon, "ready_ms"), "{phases}");
    assert_eq!(number(phases, "ready"), number(daemon, "ready_ms"));
}

#[test]
fn shared_secrets_get_one_watch_and_a_serial_sample_is_labelled() {
    let lines = bench(&[
        "--routes",
        "20",
        "--secrets",
        "5",
        "--namespaces",
        "2",
        "--latency",
        "5ms",
        "--serial-routes",
        "8",
    ]);

    let serial = &lines["serial"];
    // The oldest 8 routes use secrets 0-4, then 0-2 again: the monitor joins the
    // informers it has, so a secret already registered costs nothing.
    assert_eq!(number(serial, "measured_routes"), 8);
    assert_eq!(number(serial, "measured_secrets"), 5);
    assert_eq!(count(serial, "create", "subjectaccessreviews"), 0);
    assert_eq!(count(serial, "get", "secrets"), 0);
    assert_eq!(count(serial, "watch", "secrets"), 5);
    assert_eq!(number(serial, "open_watches"), 5);
    assert!(
        serial["extrapolated_ready_ms"].as_u64().is_some(),
        "a sample's figure for all routes is labelled as extrapolated"
    );

    let concurrent = &lines["concurrent"];
    assert_eq!(number(concurrent, "measured_routes"), 20);
    assert_eq!(number(concurrent, "measured_secrets"), 5);
    assert_eq!(count(concurrent, "watch", "secrets"), 5);
    assert_eq!(count(concurrent, "create", "selfsubjectrulesreviews"), 2);
    assert_eq!(number(concurrent, "open_watches"), 5);
    assert_eq!(number(concurrent, "errors"), 0);
}

/// Against a real kube-apiserver (started from the shared tool): the server's audit log
/// counts the same requests per strategy as the simulator does.
#[test]
fn the_real_control_plane_sees_the_modelled_requests() {
    let lines = bench(&[
        "--control-plane",
        "--routes",
        "12",
        "--secrets",
        "6",
        "--namespaces",
        "2",
        "--serial-routes",
        "0",
        "--name",
        "real",
    ]);
    assert_eq!(lines.len(), 3, "one line per strategy: {lines:?}");
    let serial = &lines["serial"];
    assert_eq!(number(serial, "latency_ms"), 0, "no latency is injected");
    assert_eq!(number(serial, "measured_secrets"), 6);
    assert_eq!(count(serial, "watch", "secrets"), 6);
    assert_eq!(count(serial, "list", "routes"), 1);
    assert_eq!(number(serial, "requests_total"), 7);
    assert_eq!(number(serial, "open_watches"), 6);
    assert!(
        serial["model_ready_ms"].is_null(),
        "no injected latency to model"
    );
    // How long the registrations waited on the informer's 100 ms poll is a timing, the
    // benchmark's to report (docs/BENCHMARKS.md), not this test's: the phase is reported.
    assert!(serial["phases"]["registrations_total"].is_u64(), "{serial}");
    for strategy in ["concurrent", "daemon"] {
        let line = &lines[strategy];
        assert_eq!(number(line, "errors"), 0, "{line}");
        assert_eq!(number(line, "measured_routes"), 12, "{line}");
        assert_eq!(count(line, "watch", "secrets"), 6, "{line}");
        assert_eq!(
            count(line, "create", "selfsubjectrulesreviews"),
            2,
            "{line}"
        );
        assert_eq!(number(line, "open_watches"), 6, "{line}");
        assert_eq!(number(line, "rejected_429"), 0, "{line}");
        assert!(number(line, "rss_bytes") > 0, "{line}");
        assert!(number(line, "connections") >= 1, "{line}");
    }
}

#[test]
fn bad_arguments_are_refused_with_the_cause() {
    let output = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"))
        .args(["bench", "--scenarios", "no-such-scenario"])
        .output()
        .expect("certwatch runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-scenario"), "{stderr}");
    assert!(
        stderr.contains("customer-2000"),
        "names the built-in ones: {stderr}"
    );
}

#[test]
fn invalid_secrets_reject_their_routes_alone_and_a_reissue_reaches_every_file() {
    let lines = bench(&[
        "--routes",
        "40",
        "--latency",
        "10ms",
        "--strategy",
        "daemon",
        "--bad-secrets",
        "4",
        "--reissue",
        "1s",
    ]);
    let daemon = &lines["daemon"];
    // A rejection beyond the four invalid secrets' routes, or one of them admitted,
    // counts as an error.
    assert_eq!(number(daemon, "errors"), 0, "{daemon}");
    let bad = &daemon["bad_secrets"];
    assert_eq!(number(bad, "secrets"), 4, "{bad}");
    assert_eq!(number(bad, "routes"), 4, "{bad}");
    for kind in ["not_pem", "truncated_pem", "foreign_key", "empty_key"] {
        assert_eq!(bad["by_kind"][kind].as_u64(), Some(1), "{kind}: {bad}");
    }
    // The re-issue rewrites every secret, the invalid ones too: every route's file
    // ends up with its new certificate.
    let reissue = &daemon["reissue"];
    assert_eq!(number(reissue, "secrets"), 40, "{reissue}");
    assert_eq!(number(reissue, "routes"), 40, "{reissue}");
    assert_eq!(number(reissue, "write_errors"), 0, "{reissue}");
    assert_eq!(number(reissue, "never_on_disk"), 0, "{reissue}");
    assert_eq!(number(&reissue["to_file"], "count"), 40, "{reissue}");
    assert!(reissue["all_on_disk_ms"].is_u64(), "{reissue}");
    assert_eq!(
        daemon["targets"]["reissue_never_on_disk"]["met"].as_bool(),
        Some(true),
        "{daemon}"
    );
}

#[test]
fn bad_input_options_need_a_strategy_that_writes_files() {
    let output = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"))
        .args([
            "bench",
            "--routes",
            "4",
            "--strategy",
            "concurrent",
            "--reissue",
            "1s",
        ])
        .output()
        .expect("certwatch runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--reissue"), "{stderr}");
}

#[test]
fn a_running_haproxy_gets_every_certificate_pushed() {
    let lines = bench(&[
        "--routes",
        "30",
        "--namespaces",
        "2",
        "--latency",
        "1ms",
        "--strategy",
        "haproxy",
        "--haproxy-start",
        "running",
        "--timeout",
        "2m",
        "--name",
        "push",
    ]);
    let line = &lines["haproxy"];
    assert_eq!(number(line, "routes"), 30);
    assert_eq!(number(line, "errors"), 0, "{line}");
    let startup = &line["haproxy"]["startup"];
    assert_eq!(startup["listed"], 30, "{startup}");
    let push = &startup["push"];
    // Fewer routes than the sample: every route is sampled, and each was served.
    assert_eq!(push["sampled"], 30, "{push}");
    let at = |key: &str| {
        push[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {push}"))
    };
    assert!(at("first_served_ms") <= at("half_served_ms"), "{push}");
    assert!(at("half_served_ms") <= at("all_served_ms"), "{push}");
    assert!(at("files_ready_ms") <= at("first_served_ms"), "{push}");
    assert!(at("handshakes") >= 30, "{push}");
    // The first routes decided are asked from certwatch's start, and served by the time
    // every route is.
    assert!(at("first_route_served_ms") <= at("all_served_ms"), "{push}");
    // HAProxy held no route certificate: each one went through the runtime API, once,
    // and no command failed.
    let commands = push["commands"].as_object().expect("commands");
    for command in [
        "new ssl cert",
        "set ssl cert",
        "commit ssl cert",
        "add ssl crt-list",
    ] {
        assert_eq!(commands[&format!("{command}/ok")], 30, "{command}: {push}");
    }
    assert!(
        commands.keys().all(|key| key.ends_with("/ok")),
        "{commands:?}"
    );
    assert_eq!(at("pushed"), 30);
    // The bounds are reported (their values are this machine's, not asserted here).
    let bounds = line["haproxy"]["bounds"].as_object().expect("bounds");
    assert!(bounds.contains_key("push_first_served_ms"), "{bounds:?}");
    assert!(
        bounds.contains_key("push_all_served_vs_cold_load"),
        "{bounds:?}"
    );
}

/// `--strategy haproxy --haproxy-config deployment`: certwatch with the Deployment's
/// arguments (the routing configuration), HAProxy started by the sidecar's script of
/// deploy/base at the Deployment's threads, every route with a service and one
/// endpoint. Every sampled route is served, HAProxy holds a server per route, the cold
/// load of the same configuration serves too, and every followed rotation is served.
/// The phases of 0.1 s rotate fewer certificates than there are routes (at most 5, 80
/// and 50 at HAProxy's own rate of up to 1,000/s), so that no secret is written twice
/// at once (two PATCHes in flight to one secret may land in either order).
#[test]
fn the_deployments_haproxy_serves_every_route_and_every_rotation() {
    let lines = bench(&[
        "--routes",
        "150",
        "--latency",
        "10ms",
        "--strategy",
        "haproxy",
        "--haproxy-config",
        "deployment",
        "--rotation-seconds",
        "0.1",
    ]);
    let run = &lines["haproxy"];
    assert_eq!(number(run, "errors"), 0, "{run}");
    let haproxy = &run["haproxy"];
    let startup = &haproxy["startup"];
    assert_eq!(startup["config"], "deployment", "{startup}");
    assert_eq!(number(startup, "listed"), 150, "{startup}");
    assert_eq!(
        number(startup, "sampled"),
        150,
        "every route sampled: {startup}"
    );
    assert_eq!(
        number(startup, "servers"),
        150,
        "a server per route's endpoint: {startup}"
    );
    // The Deployment sets no thread count: certwatch's default, the router's 4 or one
    // per CPU where there are fewer.
    let threads =
        certwatch::args::default_haproxy_threads(std::thread::available_parallelism().ok());
    assert_eq!(
        number(startup, "threads"),
        u64::from(threads),
        "the Deployment's: {startup}"
    );
    assert_eq!(
        startup["check"]["ok"], true,
        "haproxy -c accepts the copy: {startup}"
    );
    for haproxy_of in ["served_haproxy", "cold_haproxy"] {
        assert!(
            number(&startup[haproxy_of], "worker_peak_rss_bytes") > 0,
            "{haproxy_of}: {startup}"
        );
    }
    assert!(number(startup, "cold_load_ms") > 0, "{startup}");
    assert!(haproxy["served_vs_cold_load"].is_f64(), "{haproxy}");
    let phases = haproxy["rotations"].as_array().unwrap();
    assert!(phases.len() >= 2, "{haproxy}");
    for phase in phases {
        assert!(number(phase, "probes") > 0, "{phase}");
        assert_eq!(number(phase, "write_errors"), 0, "{phase}");
        // Every write's round trip is in its figure.
        assert_eq!(
            number(&phase["write"], "count"),
            number(phase, "rotations"),
            "{phase}"
        );
        assert_eq!(number(phase, "never_on_disk"), 0, "{phase}");
        assert_eq!(number(phase, "never_served"), 0, "{phase}");
        assert_eq!(
            number(&phase["to_served"], "count"),
            number(phase, "probes"),
            "{phase}"
        );
        assert_eq!(phase["drained"], true, "{phase}");
    }
}

#[test]
fn the_deployments_configuration_is_the_haproxy_strategys() {
    let output = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"))
        .args([
            "bench",
            "--routes",
            "4",
            "--strategy",
            "daemon",
            "--haproxy-config",
            "deployment",
        ])
        .output()
        .expect("certwatch runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--strategy haproxy"), "{stderr}");
}

/// The running-HAProxy start measures the certificates-only configuration; in the
/// deployment's configuration the sidecar starts HAProxy, so the two are refused
/// together, before anything starts.
#[test]
fn a_running_haproxy_is_not_the_deployments() {
    let output = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"))
        .args([
            "bench",
            "--routes",
            "4",
            "--strategy",
            "haproxy",
            "--haproxy-config",
            "deployment",
            "--haproxy-start",
            "running",
        ])
        .output()
        .expect("certwatch-lab runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--haproxy-start running"), "{stderr}");
    assert!(stderr.contains("--haproxy-config deployment"), "{stderr}");
}
