//! The PrometheusRule in `deploy/base` and its plain twin in `deploy/alerts`: the two
//! hold the same rules, and the unit tests shipped beside them
//! (`deploy/alerts/certwatch.rules.test.yaml`) pass under promtool (Debian's
//! `prometheus` package). Then promtool checks every rule, and `promtool test rules`
//! shows each alert firing, or staying silent, on series scraped from real runs of
//! `certwatch run`:
//!
//! - a healthy daemon (certificates valid for 7 days): only the expiring-soon alert
//!   fires, once per secret, and the 3-day alert fires once the series is evaluated 5 days later;
//! - a troubled daemon (a route whose secret is missing, a bundle that cannot be
//!   written, a failing reload command, an unreachable HAProxy): every other alert fires,
//!   the unserved-change alert only once the change is more than a minute old.
//!
//! Gauges are replayed at their scraped value; counters rise at the rate measured
//! between two scrapes. Expiration timestamps are moved to promtool's clock (its
//! `time()` starts at 0 where the scrape happened).

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use common::*;
use kube::api::{Api, PostParams};
use route_secrets::route::Route;
use serde_yaml::Value;

fn rule_groups() -> Value {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/base/prometheusrule.yaml");
    let rule: Value = serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    let mut file = serde_yaml::Mapping::new();
    file.insert("groups".into(), rule["spec"]["groups"].clone());
    Value::Mapping(file)
}

fn promtool(args: &[&str], dir: &Path) -> String {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool must be on PATH (Debian package prometheus; scripts/test installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// One scrape: its samples (series as printed, value) and when it was taken.
struct Scrape {
    samples: Vec<(String, f64)>,
    unix: f64,
}

fn scrape(certwatch: &Certwatch) -> Scrape {
    let unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let samples = certwatch
        .metrics()
        .lines()
        .filter(|line| line.starts_with("certwatch_") && !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect();
    Scrape { samples, unix }
}

impl Scrape {
    fn value(&self, series: &str) -> Option<f64> {
        self.samples
            .iter()
            .find(|(name, _)| name == series)
            .map(|(_, value)| *value)
    }

    /// The series the rules read, as promtool input: gauges constant, counters rising
    /// from `earlier`'s value to this one's per step, expirations moved to promtool's
    /// clock, the age of the oldest unserved change growing with time (the change stays
    /// unserved), `interval` seconds per step; and the scrape's own series: the target
    /// is up.
    fn input_series(&self, earlier: Option<&Scrape>, steps: u32, interval: u32) -> String {
        let mut out = format!(
            "      - series: 'up{{job=\"certwatch\",namespace=\"certwatch\"}}'\n        values: '1x{steps}'\n"
        );
        for (series, value) in &self.samples {
            let name = series.split('{').next().unwrap();
            let values = if name == "certwatch_certificate_expiration_timestamp_seconds" {
                format!("{}x{steps}", (value - self.unix).round())
            } else if name == "certwatch_oldest_unserved_change_age_seconds" {
                format!("{}+{interval}x{steps}", value.round())
            } else if name.ends_with("_total") {
                let start = earlier.and_then(|e| e.value(series)).unwrap_or(*value);
                format!("{start}+{}x{steps}", value - start)
            } else if [
                "certwatch_ready",
                "certwatch_routes_rejected",
                "certwatch_haproxy_in_sync",
                "certwatch_status_leader",
                "certwatch_status_writes_enabled",
            ]
            .contains(&name)
            {
                format!("{value}x{steps}")
            } else {
                continue;
            };
            let _ = writeln!(
                out,
                "      - series: '{series}'\n        values: '{values}'"
            );
        }
        out
    }
}

/// `(alert, eval time, expected label sets)` as promtool's `alert_rule_test`.
fn alert_tests(cases: &[(&str, &str, Vec<String>)]) -> String {
    let mut out = String::new();
    for (alert, at, expected) in cases {
        let _ = writeln!(out, "      - eval_time: {at}\n        alertname: {alert}");
        if expected.is_empty() {
            out.push_str("        exp_alerts: []\n");
        } else {
            out.push_str("        exp_alerts:\n");
            for labels in expected {
                let _ = writeln!(out, "          - exp_labels: {{{labels}}}");
            }
        }
    }
    out
}

/// `deploy/alerts/certwatch.rules.yaml` is the PrometheusRule's `spec.groups`, and the
/// unit tests beside it pass, as an operator runs them.
#[test]
fn the_shipped_rule_file_matches_and_its_tests_pass() {
    let alerts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/alerts");
    let plain: Value = serde_yaml::from_str(
        &std::fs::read_to_string(alerts.join("certwatch.rules.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        plain,
        rule_groups(),
        "deploy/alerts/certwatch.rules.yaml differs from deploy/base/prometheusrule.yaml's spec.groups"
    );
    let checked = promtool(&["check", "rules", "certwatch.rules.yaml"], &alerts);
    assert!(checked.contains("SUCCESS: 17 rules found"), "{checked}");
    let tested = promtool(&["test", "rules", "certwatch.rules.test.yaml"], &alerts);
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert is tested firing at least once.
    let tests: Value = serde_yaml::from_str(
        &std::fs::read_to_string(alerts.join("certwatch.rules.test.yaml")).unwrap(),
    )
    .unwrap();
    let firing: Vec<&str> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|test| test["alert_rule_test"].as_sequence().unwrap())
        .filter(|case| {
            case["exp_alerts"]
                .as_sequence()
                .is_some_and(|alerts| !alerts.is_empty())
        })
        .map(|case| case["alertname"].as_str().unwrap())
        .collect();
    for group in rule_groups()["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            assert!(firing.contains(&alert), "{alert} is never tested firing");
        }
    }
}

/// Every alert waits (`for:`), links a runbook that docs/deploy.md has, and pages
/// (critical) only for the platform's problems: a tenant's rejected route, expiring
/// certificate or failing backend is a warning or less.
#[test]
fn every_alert_waits_links_its_runbook_and_pages_only_for_the_platform() {
    let deploy_md = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/deploy.md"),
    )
    .unwrap();
    // GitHub's anchors: the heading lower-cased.
    let anchors: Vec<String> = deploy_md
        .lines()
        .filter_map(|line| line.strip_prefix("### "))
        .map(|heading| heading.trim().to_lowercase())
        .collect();
    let tenants = [
        "CertwatchCertificateExpiringSoon",
        "CertwatchCertificateExpiresIn3Days",
        "CertwatchRoutesRejected",
        "CertwatchBackendWithoutServers",
        "CertwatchHTTP5xxRatio",
    ];
    let pages = [
        "CertwatchDown",
        "CertwatchAbsent",
        "CertwatchNoStatusWriter",
        "CertwatchHAProxyLoadsFailing",
        "CertwatchHAProxyDown",
    ];
    let mut seen = Vec::new();
    for group in rule_groups()["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let alert = rule["alert"].as_str().unwrap();
            seen.push(alert.to_owned());
            assert!(rule["for"].as_str().is_some(), "{alert} has no for:");
            let url = rule["annotations"]["runbook_url"].as_str().unwrap();
            let (page, anchor) = url.split_once('#').unwrap();
            assert!(page.ends_with("/docs/deploy.md"), "{alert}: {url}");
            assert_eq!(anchor, alert.to_lowercase(), "{alert}: {url}");
            assert!(
                anchors.iter().any(|heading| heading == anchor),
                "docs/deploy.md has no runbook heading for {alert}"
            );
            let severity = rule["labels"]["severity"].as_str().unwrap();
            if tenants.contains(&alert) {
                assert!(
                    ["warning", "info"].contains(&severity),
                    "{alert}: {severity}"
                );
            } else if pages.contains(&alert) {
                assert_eq!(severity, "critical", "{alert}");
            }
        }
    }
    for new in [
        "CertwatchNoStatusWriter",
        "CertwatchTwoStatusWriters",
        "CertwatchHAProxyLoadsFailing",
        "CertwatchDefaultCertificateExpiring",
    ] {
        assert!(seen.iter().any(|alert| alert == new), "{new}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_alert_parses_and_fires_on_a_real_run() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path();

    // Every rule, with its annotation templates, as Prometheus would load it.
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rule_groups()).unwrap(),
    )
    .unwrap();
    let checked = promtool(&["check", "rules", "rules.yaml"], dir);
    assert!(checked.contains("SUCCESS: 17 rules found"), "{checked}");
    // The unit tests compare labels; annotations (checked above) are left out.
    let mut groups = rule_groups();
    for group in groups["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            rule.as_mapping_mut().unwrap().remove("annotations");
        }
    }
    std::fs::write(
        dir.join("tested.yaml"),
        serde_yaml::to_string(&groups).unwrap(),
    )
    .unwrap();

    let sim = SimProcess::start(
        dir,
        &[
            "--generate",
            "routes=3,namespaces=1,validity=7d",
            "--latency",
            "100ms",
        ],
    );
    // A healthy daemon.
    let mut healthy = Certwatch::start(
        &sim.kubeconfig,
        &dir.join("healthy"),
        &dir.join("healthy.log"),
        &["--reload-command", "true", "--reload-debounce", "10ms"],
    );
    healthy.wait_ready().await;
    let good = scrape(&healthy);
    assert_eq!(healthy.terminate().code(), Some(0));

    // A troubled one: a route whose secret does not exist, a bundle that cannot be
    // written (a directory stands in its place), a failing reload command, no HAProxy
    // behind the socket.
    let admin = sim.client("admin").await;
    let route: Route = serde_json::from_value(serde_json::json!({
        "apiVersion": "route.openshift.io/v1",
        "kind": "Route",
        "metadata": {"name": "orphan", "namespace": "app-0"},
        "spec": {
            "host": "orphan.app-0.apps.sim.example",
            "to": {"kind": "Service", "name": "orphan"},
            "tls": {"termination": "edge", "externalCertificate": {"name": "missing"}}
        }
    }))
    .unwrap();
    Api::<Route>::namespaced(admin, "app-0")
        .create(&PostParams::default(), &route)
        .await
        .unwrap();
    let troubled_dir = dir.join("troubled");
    std::fs::create_dir_all(troubled_dir.join("app-0:route-0.pem")).unwrap();
    std::fs::write(troubled_dir.join("app-0:route-0.pem/x"), b"").unwrap();
    let socket = dir.join("no-haproxy.sock");
    let troubled = Certwatch::start(
        &sim.kubeconfig,
        &troubled_dir,
        &dir.join("troubled.log"),
        &[
            "--reload-command",
            "exit 1",
            "--reload-debounce",
            "10ms",
            "--haproxy-socket",
            socket.to_str().unwrap(),
        ],
    );
    let early = scrape(&troubled);
    let late = eventually("the troubles to repeat", || {
        let now = scrape(&troubled);
        let at_least = |series: &str, n: f64| now.value(series).is_some_and(|v| v >= n);
        (at_least("certwatch_reload_failures_total", 2.0)
            && at_least("certwatch_haproxy_sync_failures_total", 2.0)
            && at_least("certwatch_bundle_write_failures_total", 2.0)
            && at_least(
                "certwatch_routes_rejected{reason=\"ExternalCertificateValidationFailed\",cause=\"rbac\"}",
                1.0,
            ))
        .then_some(now)
    })
    .await;
    assert_eq!(late.value("certwatch_ready"), Some(0.0));
    // The routes wait for the HAProxy that is not there.
    assert!(
        late.value("certwatch_routes_admitted_not_served")
            .is_some_and(|routes| routes >= 1.0)
    );
    assert!(
        late.value("certwatch_oldest_unserved_change_age_seconds")
            .is_some()
    );

    let expiring: Vec<String> = good
        .samples
        .iter()
        .filter(|(series, _)| {
            series.starts_with("certwatch_certificate_expiration_timestamp_seconds{")
        })
        .map(|(series, _)| {
            let labels = &series[series.find('{').unwrap() + 1..series.len() - 1];
            labels.replace("=\"", ": \"")
        })
        .collect();
    assert_eq!(expiring.len(), 3, "{expiring:?}");
    // The expiry alerts name the secret, not the route: one alert per secret.
    let secrets: Vec<String> = good
        .samples
        .iter()
        .filter(|(series, _)| {
            series.starts_with("certwatch_certificate_expiration_timestamp_seconds{")
        })
        .map(|(series, _)| {
            let value = |label: &str| {
                let start = series.find(&format!("{label}=\"")).unwrap() + label.len() + 2;
                series[start..start + series[start..].find('"').unwrap()].to_owned()
            };
            format!(
                "route_namespace: \"{}\", secret: \"{}\"",
                value("route_namespace"),
                value("secret")
            )
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(!secrets.is_empty(), "{expiring:?}");
    let with = |labels: &[String], extra: &str| -> Vec<String> {
        labels
            .iter()
            .map(|labels| format!("{labels}, {extra}"))
            .collect()
    };
    let none = Vec::new;
    let tests = format!(
        "rule_files: [tested.yaml]\nevaluation_interval: 1m\ntests:\n\
         - name: healthy\n    interval: 1m\n    input_series:\n{}    alert_rule_test:\n{}\
         - name: healthy, five days later\n    interval: 2m\n    input_series:\n{}    alert_rule_test:\n{}\
         - name: troubled\n    interval: 1m\n    input_series:\n{}    alert_rule_test:\n{}",
        good.input_series(None, 60, 60),
        alert_tests(&[
            (
                "CertwatchCertificateExpiringSoon",
                "30m",
                with(&secrets, "severity: info")
            ),
            ("CertwatchCertificateExpiresIn3Days", "30m", none()),
            ("CertwatchDown", "30m", none()),
            ("CertwatchAbsent", "30m", none()),
            ("CertwatchNotReady", "30m", none()),
            ("CertwatchRoutesRejected", "30m", none()),
            ("CertwatchBundleWritesFailing", "30m", none()),
            ("CertwatchReloadFailing", "30m", none()),
            ("CertwatchHAProxyOutOfSync", "30m", none()),
            ("CertwatchChangeUnserved", "30m", none()),
            // Status writes are off (the default): no writer is expected.
            ("CertwatchNoStatusWriter", "30m", none()),
            ("CertwatchTwoStatusWriters", "30m", none()),
        ]),
        good.input_series(None, 3700, 120),
        alert_tests(&[(
            "CertwatchCertificateExpiresIn3Days",
            "5d",
            with(&secrets, "severity: warning"),
        )]),
        late.input_series(Some(&early), 60, 60),
        alert_tests(&[
            (
                "CertwatchNotReady",
                "30m",
                vec!["severity: critical".to_owned()]
            ),
            (
                "CertwatchRoutesRejected",
                "30m",
                vec!["reason: ExternalCertificateValidationFailed, severity: warning".to_owned()],
            ),
            (
                "CertwatchBundleWritesFailing",
                "30m",
                vec!["severity: critical".to_owned()]
            ),
            (
                "CertwatchReloadFailing",
                "30m",
                vec!["severity: critical".to_owned()]
            ),
            (
                "CertwatchHAProxyOutOfSync",
                "30m",
                vec!["severity: critical".to_owned()]
            ),
            // Within the first minute the change is younger than a minute, and the
            // alert waits 5 minutes more.
            ("CertwatchChangeUnserved", "0m", none()),
            ("CertwatchChangeUnserved", "4m", none()),
            (
                "CertwatchChangeUnserved",
                "7m",
                vec!["severity: critical".to_owned()]
            ),
        ]),
    );
    let tests = tests.replace("\n- name:", "\n  - name:");
    std::fs::write(dir.join("tests.yaml"), &tests).unwrap();
    let output = Command::new("promtool")
        .args(["test", "rules", "tests.yaml"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}{}\n{tests}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
