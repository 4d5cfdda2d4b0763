//! A failed load is an event, not a stop, in routing mode (`--haproxy-config-dir`),
//! through the binary and a real HAProxy (Debian's 2.6): a link removed under `links/`
//! by others makes HAProxy's next load fail (the crt-list names a missing file); the
//! failure is counted (`certwatch_routing_load_failures_total`) and logged with
//! HAProxy's words, the link is written again, the files are loaded again, the route
//! added meanwhile is served, and SIGTERM ends certwatch.
//!
//! No timing is asserted: counts, log lines, files and handshakes (the wait for the
//! exit after SIGTERM is a hang guard only).

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::haproxy::*;
use common::routing::{Routing, RoutingLaunch};
use common::*;

/// Whether the HAProxy answering on `config_dir`'s admin socket loaded the
/// configuration written there last (its `setenv` digest).
fn holds_written_config(config_dir: &std::path::Path) -> bool {
    let config = std::fs::read_to_string(config_dir.join("haproxy.cfg")).unwrap();
    let written = config
        .lines()
        .find_map(|line| line.trim().strip_prefix("setenv CERTWATCH_CONFIG_DIGEST "))
        .unwrap()
        .trim()
        .to_owned();
    let socket = config_dir.join("run").join("haproxy.sock");
    let Ok(mut stream) = std::os::unix::net::UnixStream::connect(&socket) else {
        return false;
    };
    use std::io::{Read, Write};
    let _ = stream.write_all(b"show env CERTWATCH_CONFIG_DIGEST\n");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.trim() == format!("CERTWATCH_CONFIG_DIGEST={written}")
}

fn host(i: usize) -> String {
    format!("route-{i}.app-0.apps.sim.example")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_load_is_counted_repaired_and_loaded_again() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    let sim = SimProcess::start(&root, &["--generate", "routes=3,namespaces=1"]);
    let admin = sim.client("admin").await;
    // Secrets granted before certwatch asks about the namespace (its access answers
    // are cached); their routes come later.
    for name in ["new", "later"] {
        let secret = format!("tls-{name}");
        grant_secret(&admin, "app-0", &secret).await;
        create_tls_secret(
            &admin,
            "app-0",
            &secret,
            &format!("{name}.app-0.apps.sim.example"),
        )
        .await;
    }
    let Routing {
        mut certwatch,
        https,
        cert_dir,
        config_dir,
        ..
    } = RoutingLaunch::on(&sim, &root)
        .min_reload_interval("0s")
        .ready()
        .await;
    let https_port = https.port();
    let failures = |certwatch: &Certwatch| {
        certwatch
            .metric("certwatch_routing_load_failures_total")
            .unwrap_or(0.0)
    };
    assert_eq!(failures(&certwatch), 0.0);

    // Others remove a link the crt-list names.
    let (removed, _) = crt_list(&cert_dir)[0].clone();
    let link = cert_dir.join("links").join(&removed);
    std::fs::remove_file(&link).unwrap();

    // A route added: its load reads a crt-list naming the missing link and fails.
    create_route(
        &admin,
        "app-0",
        "new",
        Some("new.app-0.apps.sim.example"),
        "tls-new",
    )
    .await;
    let expected = leaf_of(&admin, "app-0", "tls-new").await;
    eventually_async("the added route to be served", || async {
        (presented(https_port, "new.app-0.apps.sim.example").await == Some(expected.clone()))
            .then_some(())
    })
    .await;
    // The failure was an event: counted, logged with HAProxy's words, the link written
    // again, the files loaded again, every route served.
    eventually("the failed load to be counted", || {
        (failures(&certwatch) >= 1.0).then_some(())
    })
    .await;
    eventually("HAProxy to hold the configuration written last", || {
        holds_written_config(&config_dir).then_some(())
    })
    .await;
    let log = certwatch.log_text();
    assert!(
        log.contains("HAProxy could not load the routes' configuration and files"),
        "{log}"
    );
    assert!(
        log.contains(&removed),
        "HAProxy's words name the file: {log}"
    );
    assert!(
        log.contains("files the crt-list names were removed by others; writing them again"),
        "{log}"
    );
    assert!(std::fs::metadata(&link).is_ok(), "the link is back");
    eventually("HAProxy to hold the configuration written last", || {
        holds_written_config(&config_dir).then_some(())
    })
    .await;
    // HAProxy can hold the new configuration before certwatch has seen its new worker
    // answer: the reload is logged once it has.
    eventually("certwatch to see the load after the failure", || {
        let log = certwatch.log_text();
        let failed = log.find("HAProxy could not load the routes' configuration")?;
        log[failed..]
            .contains("HAProxy reloaded on the routes' configuration")
            .then_some(())
    })
    .await;
    for i in 0..3 {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(
            presented(https_port, &host(i)).await,
            Some(expected),
            "route-{i}"
        );
    }

    // A later change is loaded too (no failure this time).
    let before = failures(&certwatch);
    create_route(
        &admin,
        "app-0",
        "later",
        Some("later.app-0.apps.sim.example"),
        "tls-later",
    )
    .await;
    let later = leaf_of(&admin, "app-0", "tls-later").await;
    eventually_async("the later route to be served", || async {
        (presented(https_port, "later.app-0.apps.sim.example").await == Some(later.clone()))
            .then_some(())
    })
    .await;
    eventually("HAProxy to hold the configuration written last", || {
        holds_written_config(&config_dir).then_some(())
    })
    .await;
    assert_eq!(failures(&certwatch), before);

    // SIGTERM ends certwatch (`terminate` waits for the exit, as a hang guard only).
    assert!(certwatch.terminate().success());
}
