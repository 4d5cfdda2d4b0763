//! HAProxy never outlives the certwatch that started it, and never runs twice, through
//! the binary and a real HAProxy (Debian's 2.6), in both modes certwatch runs it
//! (`--haproxy-config`, the admin's configuration; `--haproxy-config-dir`, certwatch's):
//!
//! - `kill -9` of certwatch: every HAProxy process on the test's configuration ends
//!   (counted in `/proc`), and nothing listens on its TLS port any more;
//! - an HAProxy left running by an earlier certwatch (its watchdog killed with it, so
//!   nothing stopped it) is stopped by the next certwatch before it starts its own:
//!   exactly one master and one worker, one listener, and after a rotation every
//!   handshake gets the new certificate.
//!
//! No timing is asserted: process and listener counts, and what handshakes return.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::haproxy::*;
use common::routing::{free_loopback, routing_args};
use common::*;

fn host(i: usize) -> String {
    format!("route-{i}.app-0.apps.sim.example")
}

/// The processes whose arguments hold `-f <config>`, split into HAProxy's and its
/// watchdog shells' (which carry the same arguments).
fn processes_on(config: &Path) -> (Vec<u32>, Vec<u32>) {
    let config = config.as_os_str().as_encoded_bytes();
    let mut haproxy = Vec::new();
    let mut shells = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
        if !args
            .windows(2)
            .any(|pair| pair[0] == b"-f" && pair[1] == config)
        {
            continue;
        }
        let program = args[0].rsplit(|byte| *byte == b'/').next().unwrap();
        if program.ends_with(b"sh") {
            shells.push(pid);
        } else {
            haproxy.push(pid);
        }
    }
    (haproxy, shells)
}

fn haproxy_on(config: &Path) -> Vec<u32> {
    processes_on(config).0
}

/// HAProxy masters on `config`: the processes whose parent is not one of them (a
/// worker's parent is its master).
fn masters_on(config: &Path) -> Vec<u32> {
    let all = haproxy_on(config);
    all.iter()
        .copied()
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // `pid (comm) state ppid ...`: the parent after the command's name.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            ppid.is_none_or(|ppid| !all.contains(&ppid))
        })
        .collect()
}

/// TCP sockets listening on `port` (IPv4, this network namespace).
fn listeners(port: u16) -> usize {
    let wanted = format!(":{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&wanted) && fields[3] == "0A"
        })
        .count()
}

fn kill9(pid: u32) {
    send_signal(pid, "9");
}

/// One of the two modes in which certwatch runs HAProxy.
struct Mode {
    args: Vec<String>,
    /// HAProxy's configuration file.
    config: PathBuf,
    /// Its TLS port.
    port: u16,
}

fn config_mode(root: &Path) -> Mode {
    let socket = root.join("haproxy.sock");
    let (config, port, _default) = haproxy_config(root, &socket, &root.join("certs"));
    Mode {
        args: vec![
            "--haproxy-socket".to_owned(),
            socket.display().to_string(),
            "--haproxy-config".to_owned(),
            config.display().to_string(),
        ],
        config,
        port,
    }
}

fn config_dir_mode(root: &Path) -> Mode {
    let config_dir = root.join("haproxy");
    let https = free_loopback();
    Mode {
        args: routing_args(&config_dir, free_loopback(), https),
        config: config_dir.join("haproxy.cfg"),
        port: https.port(),
    }
}

async fn never_outlived_never_two(root: &Path, mode: Mode) {
    let sim = SimProcess::start(root, &["--generate", "routes=3,namespaces=1"]);
    let admin = sim.client("admin").await;
    let cert_dir = root.join("certs");
    let args: Vec<&str> = mode.args.iter().map(String::as_str).collect();
    let start = |log: &str| Certwatch::start(&sim.kubeconfig, &cert_dir, &root.join(log), &args);

    // 1. kill -9: HAProxy ends with certwatch.
    let first = start("first.log");
    first.wait_ready().await;
    assert_eq!(masters_on(&mode.config).len(), 1, "one HAProxy");
    assert!(
        haproxy_on(&mode.config).len() >= 2,
        "a master and its worker"
    );
    assert_eq!(listeners(mode.port), 1);
    kill9(first.pid());
    eventually("HAProxy to end with the certwatch that started it", || {
        haproxy_on(&mode.config).is_empty().then_some(())
    })
    .await;
    assert_eq!(listeners(mode.port), 0);
    drop(first);

    // 2. An HAProxy left running (its watchdog killed first, then certwatch): the next
    // certwatch stops it before starting its own.
    let second = start("second.log");
    second.wait_ready().await;
    let (left, shells) = processes_on(&mode.config);
    assert_eq!(masters_on(&mode.config).len(), 1);
    assert_eq!(shells.len(), 2, "one watchdog and its guard: {shells:?}");
    for shell in shells {
        kill9(shell);
    }
    kill9(second.pid());
    drop(second);
    let mut still = haproxy_on(&mode.config);
    still.sort_unstable();
    let mut left = left;
    left.sort_unstable();
    assert_eq!(
        still, left,
        "HAProxy outlives its watchdog killed with certwatch"
    );
    let before = leaf_of(&admin, "app-0", "tls-1").await;
    assert_eq!(presented(mode.port, &host(1)).await, Some(before.clone()));

    let third = start("third.log");
    third.wait_ready().await;
    let now = haproxy_on(&mode.config);
    assert_eq!(masters_on(&mode.config).len(), 1, "one HAProxy: {now:?}");
    assert!(
        now.iter().all(|pid| !left.contains(pid)),
        "the leftover is gone: {now:?} {left:?}"
    );
    assert_eq!(listeners(mode.port), 1);
    assert_eq!(
        third
            .log_text()
            .matches("HAProxy processes of an earlier run are still running")
            .count(),
        1,
        "the leftover was found and stopped"
    );

    // Every handshake gets the certificate of a rotation.
    let rotated = rotate_secret(&admin, "app-0", "tls-1", &host(1)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    assert_ne!(rotated_leaf, before);
    eventually_async("the rotation to be served", || async {
        (presented(mode.port, &host(1)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;
    let mut rotated_answers = 0;
    for _ in 0..20 {
        if presented(mode.port, &host(1)).await == Some(rotated_leaf.clone()) {
            rotated_answers += 1;
        }
    }
    assert_eq!(rotated_answers, 20);

    // SIGTERM: HAProxy stops with certwatch.
    let mut third = third;
    assert!(third.terminate().success());
    eventually("HAProxy to stop with certwatch", || {
        haproxy_on(&mode.config).is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_on_the_admins_configuration_ends_with_certwatch_and_never_runs_twice() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let mode = config_mode(&root);
    never_outlived_never_two(&root, mode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_on_certwatchs_configuration_ends_with_certwatch_and_never_runs_twice() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let mode = config_dir_mode(&root);
    never_outlived_never_two(&root, mode).await;
}
