//! HAProxy as certwatch's child in master-worker mode (Debian's 2.6): started on its
//! files, reloaded through the master CLI (a new worker loads the files as they are
//! then), a reload of a broken configuration refused with HAProxy's words while the old
//! worker keeps serving, and a soft stop.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use certwatch::haproxy::process::{
    Drain, HaproxyProcess, ProcessError, ProcessOptions, Stopped, check_config,
};
use certwatch::haproxy::runtime::{Command, RuntimeClient, RuntimeOptions, current_instance};
use common::eventually_async;
use common::haproxy::{haproxy_config, leaf_der, presented, self_signed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_reloaded_and_stopped_through_the_master_cli() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let socket = root.join("haproxy.sock");
    let cert_dir = root.join("certs");
    std::fs::create_dir_all(&cert_dir).unwrap();
    let bundle = cert_dir.join("one.pem");
    let first = self_signed("one.example");
    std::fs::write(&bundle, &first).unwrap();
    std::fs::write(
        cert_dir.join("crt-list"),
        format!("{} one.example\n", bundle.display()),
    )
    .unwrap();
    let (config, port, _default) = haproxy_config(&root, &socket, &cert_dir);
    check_config("haproxy".as_ref(), &config).await.unwrap();

    let options = ProcessOptions::new("haproxy", &config, root.join("master.sock"));
    let (mut haproxy, worker) = HaproxyProcess::start(options.clone()).await.unwrap();
    assert_ne!(Some(worker), haproxy.pid(), "the worker is not the master");
    let timeout = Duration::from_secs(10);
    assert_eq!(
        current_instance(&socket, timeout).await.unwrap().pid,
        worker
    );
    assert_eq!(
        presented(port, "one.example").await,
        Some(leaf_der(first.as_bytes()))
    );

    // A connection to the first worker, opened before the reload.
    let client = RuntimeClient::spawn(RuntimeOptions::new(&socket));
    let before = client.execute(vec![Command::new("show info")]).await;
    assert_eq!(before.connected.unwrap().instance.pid, worker);

    // The files change, HAProxy reloads: the new worker serves the new file.
    let second = self_signed("one.example");
    std::fs::write(&bundle, &second).unwrap();
    let reloaded = haproxy.reload().await.unwrap();
    assert_ne!(reloaded.worker, worker);
    assert_eq!(
        current_instance(&socket, timeout).await.unwrap().pid,
        reloaded.worker
    );
    eventually_async("the new worker to serve the new file", || async {
        (presented(port, "one.example").await == Some(leaf_der(second.as_bytes()))).then_some(())
    })
    .await;
    let processes = haproxy.master().processes().await.unwrap();
    assert_eq!(processes.current_worker(), Some(reloaded.worker));
    assert_eq!(processes.master.reloads, 1);
    // The old connection still reaches the old worker (it keeps the old process
    // alive), until it is closed.
    let old = client.execute(vec![Command::new("show info")]).await;
    assert_eq!(old.connected.unwrap().instance.pid, worker);
    assert!(processes.old_workers.iter().any(|old| old.pid == worker));
    client.reconnect().await;
    let fresh = client.execute(vec![Command::new("show info")]).await;
    assert_eq!(fresh.connected.unwrap().instance.pid, reloaded.worker);

    // A broken configuration: the reload fails with HAProxy's words, the worker of the
    // last good load keeps serving.
    let good = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{good}\nbogus directive\n")).unwrap();
    let refused = check_config("haproxy".as_ref(), &config).await.unwrap_err();
    assert!(refused.to_string().contains("bogus"), "{refused}");
    match haproxy.reload().await {
        Err(ProcessError::ConfigRefused { log, .. }) => {
            assert!(log.contains("bogus"), "{log}");
        }
        other => panic!("expected ConfigRefused, got {other:?}"),
    }
    assert_eq!(
        current_instance(&socket, timeout).await.unwrap().pid,
        reloaded.worker
    );
    assert_eq!(
        presented(port, "one.example").await,
        Some(leaf_der(second.as_bytes()))
    );
    // Fixed, it reloads again.
    std::fs::write(&config, &good).unwrap();
    let again = haproxy.reload().await.unwrap();
    assert_ne!(again.worker, reloaded.worker);

    // An open runtime API connection would hold the soft stop until the grace ends.
    drop(client);
    let master = haproxy.pid().unwrap();
    let drain = Drain::new(Duration::from_secs(60));
    assert_eq!(haproxy.stop(&drain).await, Stopped::Soft);
    assert!(
        !std::path::Path::new(&format!("/proc/{master}")).exists(),
        "the master is gone"
    );
    assert!(!std::path::Path::new(&format!("/proc/{}", again.worker)).exists());
}

/// A configuration HAProxy refuses at start: the start fails with HAProxy's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_configuration_fails_the_start() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let config = root.join("haproxy.cfg");
    std::fs::write(&config, "global\n  bogus directive\n").unwrap();
    let options = ProcessOptions::new("haproxy", &config, root.join("master.sock"));
    match HaproxyProcess::start(options).await {
        Err(ProcessError::Exited { log, .. }) => assert!(log.contains("bogus"), "{log}"),
        other => panic!("expected Exited, got {other:?}"),
    }
}
