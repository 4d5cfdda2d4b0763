//! `certwatch-lab demo` end to end, as a user runs it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"));
    command.args(args).env("RUST_LOG", "warn");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().expect("run certwatch-lab")
}

/// The demo ignores `run`'s CERTWATCH_CERT_DIR: a directory holding a real
/// bundle is left exactly as it was.
#[test]
fn the_demo_stays_in_its_own_directory() {
    let temp = tempfile::tempdir().unwrap();
    let real = temp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::write(real.join("prod:shop.pem"), b"REAL BUNDLE").unwrap();
    let output = run_to_exit(
        &[
            "demo",
            "--routes",
            "4",
            "--namespaces",
            "2",
            "--latency",
            "0s",
            "--jitter",
            "0s",
            "--progress",
            "off",
        ],
        &[("CERTWATCH_CERT_DIR", real.to_str().unwrap())],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let names: Vec<String> = std::fs::read_dir(&real)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["prod:shop.pem"]);
    assert_eq!(
        std::fs::read(real.join("prod:shop.pem")).unwrap(),
        b"REAL BUNDLE"
    );
    assert!(!stdout.contains(real.to_str().unwrap()), "{stdout}");
    assert!(stdout.contains("matches the new certificate"), "{stdout}");
    // With haproxy on PATH (scripts/test installs it), the demo ends with a real HTTPS
    // request through the HAProxy certwatch runs, answered by the route's backend under
    // the certificate just rotated.
    assert!(
        !stdout.contains("no haproxy on PATH"),
        "install haproxy (scripts/test does): {stdout}"
    );
    let last = stdout.lines().last().unwrap_or("");
    assert!(
        last.starts_with("HTTPS request https://")
            && last.contains(": 200 from demo-backend (")
            && last.contains("hello from demo-backend")
            && last.ends_with("(the rotated one)"),
        "{stdout}"
    );
}
