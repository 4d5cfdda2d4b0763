//! The lab's commands are `certwatch-lab`'s (the production `certwatch` refuses them and
//! names this binary): each one it points at runs here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};

fn lab() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_certwatch-lab"));
    command.env("RUST_LOG", "warn");
    command
}

/// Stops `child` when dropped, so that a failed assertion leaves no process behind.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits until `done` holds, failing if the child exits first.
fn wait_for(child: &mut Running, what: &str, done: impl Fn() -> bool) {
    while !done() {
        if let Some(status) = child.0.try_wait().unwrap() {
            panic!("certwatch-lab exited before {what}: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn pem_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().ends_with(".pem"))
            .count()
    })
}

/// Each lab command parses its own options (`demo` also runs end to end in demo.rs).
#[test]
fn the_lab_lists_and_takes_its_commands() {
    let help = lab().arg("--help").output().unwrap();
    assert!(help.status.success(), "{help:?}");
    let help = String::from_utf8_lossy(&help.stdout);
    for command in ["demo", "sim", "bench", "run"] {
        assert!(
            help.lines()
                .any(|line| line.trim_start().starts_with(&format!("{command} "))),
            "{command} missing:\n{help}"
        );
    }
    for (command, option) in [
        ("demo", "--routes"),
        ("sim", "--write-kubeconfig"),
        ("bench", "--scenarios"),
        ("run", "--embedded"),
    ] {
        let output = lab().args([command, "--help"]).output().unwrap();
        assert!(output.status.success(), "{command}: {output:?}");
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains(option), "{command} without {option}:\n{text}");
    }
}

/// `certwatch-lab sim` serves a simulated cluster and writes its kubeconfig, and
/// `certwatch-lab run --embedded` brings the daemon up against one started in-process:
/// every generated route's bundle is written.
#[test]
fn the_lab_runs_the_simulator_and_the_embedded_daemon() {
    let temp = tempfile::tempdir().unwrap();
    let kubeconfig = temp.path().join("sim.kubeconfig");
    let mut sim = Running(
        lab()
            .args(["sim", "--listen", "127.0.0.1:0", "--generate"])
            .arg("routes=3,namespaces=1")
            .arg("--write-kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&mut sim, "writing its kubeconfig", || {
        std::fs::read_to_string(&kubeconfig).is_ok_and(|text| text.contains("127.0.0.1"))
    });
    drop(sim);

    let certs = temp.path().join("certs");
    let mut run = Running(
        lab()
            .args([
                "run",
                "--embedded",
                "--embedded-generate",
                "routes=3,namespaces=1",
            ])
            .arg("--cert-dir")
            .arg(&certs)
            .args(["--listen", "127.0.0.1:0", "--shutdown-delay", "0s"])
            .args(["--progress", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_for(&mut run, "writing 3 bundles", || pem_files(&certs) >= 3);
}
