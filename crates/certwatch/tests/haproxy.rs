//! A real HAProxy (Debian's `haproxy`), started by the test from the files certwatch
//! wrote, then kept current by certwatch through the runtime API: rotations, new
//! routes and removed routes reach the TLS handshakes with no reload.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::haproxy::*;
use common::*;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use route_secrets::route::Route;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_follows_through_the_runtime_api() {
    let case = HaproxyCase::start(3).await;
    let (admin, socket, cert_dir) = (
        case.admin.clone(),
        case.socket.clone(),
        case.cert_dir.clone(),
    );
    let socket_arg = socket.display().to_string();
    let mut certwatch = case.certwatch(
        "certwatch.log",
        // A route added after a grant is admitted at its first retry.
        &[
            "--haproxy-socket",
            &socket_arg,
            "--access-denied-ttl",
            "500ms",
        ],
    );
    // The files are ready; certwatch waits for HAProxy to serve them.
    certwatch.wait_files_ready().await;
    assert!(!certwatch.is_ready(), "not ready before HAProxy serves");

    // HAProxy loads what certwatch wrote: its crt-list, plus a default certificate for
    // names no route claims.
    let (haproxy, port, default_leaf) = start_haproxy(&case.root, &socket, &cert_dir);
    let host = |i: usize| format!("route-{i}.app-0.apps.sim.example");
    eventually_async("HAProxy to serve TLS", || {
        presented(port, "default.invalid")
    })
    .await;
    let pid = info_field(&socket, "Pid");
    assert_eq!(pid, u64::from(haproxy.child.id()));

    // Every route's certificate for its SNI, as loaded from the files.
    for i in 0..3 {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
    assert_eq!(
        presented(port, "nobody.example").await,
        Some(default_leaf.clone())
    );

    // certwatch finds HAProxy and sees it already holds every certificate: ready.
    certwatch.wait_ready().await;
    eventually("certwatch to reach HAProxy", || {
        (certwatch.metric("certwatch_haproxy_in_sync") == Some(1.0)).then_some(())
    })
    .await;
    // (Only `show info` may have failed: while HAProxy was not running yet.)
    let metrics = certwatch.metrics();
    assert!(!metrics.contains("command=\"set ssl cert\""), "{metrics}");
    assert_eq!(errors_besides_show_info(&metrics), 0, "{metrics}");

    // A rotation: set + commit, same process.
    let rotated = rotate_secret(&admin, "app-0", "tls-0", &host(0)).await;
    let rotated_leaf = leaf_der(&tls_of(&rotated).0);
    eventually_async("HAProxy to serve the rotated certificate", || async {
        (presented(port, &host(0)).await == Some(rotated_leaf.clone())).then_some(())
    })
    .await;

    // A new route with a new secret (granted to the router first): new + set + commit
    // + add to the crt-list.
    grant_secret(&admin, "app-0", "tls-new").await;
    let new_host = "fresh.app-0.apps.sim.example";
    let secret = create_tls_secret(&admin, "app-0", "tls-new", new_host).await;
    let new_leaf = leaf_der(&tls_of(&secret).0);
    let routes = Api::<Route>::namespaced(admin.clone(), "app-0");
    create_route(&admin, "app-0", "fresh", Some(new_host), "tls-new").await;
    eventually_async("HAProxy to serve the new route", || async {
        (presented(port, new_host).await == Some(new_leaf.clone())).then_some(())
    })
    .await;

    // A host change: the old name falls back to the default certificate.
    routes
        .patch(
            "route-2",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"host": "moved.app-0.apps.sim.example"}})),
        )
        .await
        .unwrap();
    let route2_leaf = leaf_of(&admin, "app-0", "tls-2").await;
    eventually_async("HAProxy to serve route-2 under its new host", || async {
        (presented(port, "moved.app-0.apps.sim.example").await == Some(route2_leaf.clone())
            && presented(port, &host(2)).await == Some(default_leaf.clone()))
        .then_some(())
    })
    .await;

    // A deleted route: del from the crt-list, del the certificate.
    routes
        .delete("route-1", &DeleteParams::default())
        .await
        .unwrap();
    eventually_async("HAProxy to stop serving route-1", || async {
        (presented(port, &host(1)).await == Some(default_leaf.clone())).then_some(())
    })
    .await;
    eventually("route-1's certificate to leave HAProxy", || {
        (!runtime_api(&socket, "show ssl cert").contains("app-0_route-1.pem")).then_some(())
    })
    .await;

    // All of it without a reload: the same process, never restarted.
    assert_eq!(info_field(&socket, "Pid"), pid);
    let mut haproxy = haproxy;
    assert!(
        haproxy.child.try_wait().unwrap().is_none(),
        "HAProxy exited"
    );
    let metrics = certwatch.metrics();
    for command in [
        "set ssl cert",
        "commit ssl cert",
        "new ssl cert",
        "add ssl crt-list",
        "del ssl crt-list",
        "del ssl cert",
    ] {
        assert!(
            metric_value(
                &metrics,
                &format!("certwatch_haproxy_commands_total{{command=\"{command}\",result=\"ok\"}}")
            )
            .is_some_and(|count| count >= 1.0),
            "{command}\n{metrics}"
        );
    }
    assert_eq!(errors_besides_show_info(&metrics), 0, "{metrics}");
    assert_eq!(certwatch.terminate().code(), Some(0));

    // certwatch restarts while HAProxy keeps running; what changed meanwhile is found
    // by comparing HAProxy's certificates (their fingerprints) with the secrets.
    let rotated_again = rotate_secret(&admin, "app-0", "tls-0", &host(0)).await;
    let rotated_again_leaf = leaf_der(&tls_of(&rotated_again).0);
    routes
        .delete("fresh", &DeleteParams::default())
        .await
        .unwrap();
    let mut certwatch = case.certwatch("certwatch-2.log", &["--haproxy-socket", &socket_arg]);
    certwatch.wait_ready().await;
    eventually_async("HAProxy to catch up after the restart", || async {
        (presented(port, &host(0)).await == Some(rotated_again_leaf.clone())
            && presented(port, new_host).await == Some(default_leaf.clone()))
        .then_some(())
    })
    .await;
    assert!(!cert_dir.join("app-0:fresh.pem").exists());
    assert_eq!(info_field(&socket, "Pid"), pid);
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// The files an earlier run of certwatch left for `route` (its bundle and link), with
/// a self-signed certificate for `host`; its crt-list line.
fn left_by_an_earlier_run(
    cert_dir: &std::path::Path,
    route: &str,
    host: &str,
) -> (String, Vec<u8>) {
    let names =
        certwatch::files::bundle_names(&route_secrets::route::RouteKey::new("app-0", route))
            .unwrap();
    let pem = self_signed(host);
    std::fs::write(cert_dir.join(&names.bundle), &pem).unwrap();
    let link = cert_dir.join("links").join(&names.link);
    std::os::unix::fs::symlink(std::path::Path::new("..").join(&names.bundle), &link).unwrap();
    (
        format!("{} {host}\n", link.display()),
        leaf_der(pem.as_bytes()),
    )
}

/// A HAProxy run by others (`--haproxy-socket` alone) serves the routes certwatch has
/// decided while another route is still undecided (its secret cannot be read): they
/// are added at once. What it held before (an older certificate of a route, a route of
/// an earlier run that is gone) is neither replaced nor removed until every route is
/// decided; then it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_haproxy_gets_decided_routes_before_start_up_is_decided() {
    let case = HaproxyCase::start(3).await;
    let (admin, socket, cert_dir) = (
        case.admin.clone(),
        case.socket.clone(),
        case.cert_dir.clone(),
    );
    let host = |i: usize| format!("route-{i}.app-0.apps.sim.example");
    let gone_host = "gone.app-0.apps.sim.example";
    // route-2 stays undecided while its secret's watch fails.
    let (status, body) = case.sim.admin(
        "POST",
        "/sim/faults/fail",
        r#"{"verb":"watch","resource":"secrets","code":500,"count":1000000,"name":"tls-2"}"#,
    );
    assert_eq!(status, 200, "{body}");
    // An earlier run left route-0 with another certificate, and a route now gone.
    std::fs::create_dir_all(cert_dir.join("links")).unwrap();
    let (line_0, old_leaf_0) = left_by_an_earlier_run(&cert_dir, "route-0", &host(0));
    let (line_gone, gone_leaf) = left_by_an_earlier_run(&cert_dir, "gone", gone_host);
    let crt_list = format!("{line_0}{line_gone}");
    std::fs::write(cert_dir.join("crt-list"), &crt_list).unwrap();
    let (haproxy, port, default_leaf) = start_haproxy(&case.root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS", || {
        presented(port, "default.invalid")
    })
    .await;
    assert_eq!(presented(port, &host(0)).await, Some(old_leaf_0.clone()));
    assert_eq!(presented(port, gone_host).await, Some(gone_leaf.clone()));
    let pid = info_field(&socket, "Pid");

    let socket_arg = socket.display().to_string();
    let mut certwatch = case.certwatch(
        "certwatch.log",
        &["--haproxy-socket", &socket_arg, "--sync-timeout", "10m"],
    );
    // route-1, decided, is added while start-up is not decided.
    let leaf_1 = leaf_of(&admin, "app-0", "tls-1").await;
    eventually_async("HAProxy to serve route-1", || async {
        (presented(port, &host(1)).await == Some(leaf_1.clone())).then_some(())
    })
    .await;
    let (status, body) = certwatch.get("/readyz");
    assert_eq!(
        (status, body.as_str()),
        (
            503,
            "not ready: 2 of 3 routes present at start-up decided\n"
        )
    );
    // Nothing HAProxy held was replaced or removed, and the crt-list is the old one.
    assert_eq!(presented(port, &host(0)).await, Some(old_leaf_0));
    assert_eq!(presented(port, gone_host).await, Some(gone_leaf));
    assert_eq!(presented(port, &host(2)).await, Some(default_leaf.clone()));
    assert_eq!(
        std::fs::read_to_string(cert_dir.join("crt-list")).unwrap(),
        crt_list
    );
    let metrics = certwatch.metrics();
    let commands = |command: &str| {
        metric_value(
            &metrics,
            &format!("certwatch_haproxy_commands_total{{command=\"{command}\",result=\"ok\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(
        (
            commands("new ssl cert"),
            commands("set ssl cert"),
            commands("add ssl crt-list"),
            commands("del ssl crt-list"),
            commands("del ssl cert"),
        ),
        (1.0, 1.0, 1.0, 0.0, 0.0),
        "{metrics}"
    );

    // route-2's secret can be read again: start-up is decided, and HAProxy gets the
    // rest (route-0's certificate replaced, route-2 added, the gone route removed).
    let (status, body) = case.sim.admin("DELETE", "/sim/faults", "");
    assert_eq!(status, 200, "{body}");
    certwatch.wait_ready().await;
    for i in [0, 2] {
        let expected = leaf_of(&admin, "app-0", &format!("tls-{i}")).await;
        assert_eq!(presented(port, &host(i)).await, Some(expected), "route-{i}");
    }
    assert_eq!(presented(port, gone_host).await, Some(default_leaf));
    let metrics = certwatch.metrics();
    assert!(
        metric_value(
            &metrics,
            "certwatch_haproxy_commands_total{command=\"del ssl cert\",result=\"ok\"}"
        )
        .is_some_and(|count| count >= 1.0),
        "{metrics}"
    );
    assert_eq!(errors_besides_show_info(&metrics), 0, "{metrics}");
    assert_eq!(info_field(&socket, "Pid"), pid, "no reload, no restart");
    drop(haproxy);
    assert_eq!(certwatch.terminate().code(), Some(0));
}

/// A change made through the API in the step test.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Nothing: the state after start-up.
    StartUp,
    /// A route whose name (253 characters) makes `<namespace>:<route>.pem` too long
    /// for a file name.
    AddLongNamedRoute,
    /// A route without `spec.host`: written, never listed.
    AddHostlessRoute,
    /// A certificate rotation.
    RotateRoute0,
    /// Deleting routes: the crt-list stops naming them before their files go.
    DeleteLongNamedRoute,
    DeleteRoute1,
}

/// After every step of a table of route changes, the files certwatch wrote are what
/// they should be, `haproxy -c` accepts them, and the running HAProxy (fed through the
/// runtime API) serves exactly the listed routes with their certificates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_accepts_the_files_after_every_step() {
    let case = HaproxyCase::start(2).await;
    let (admin, socket, cert_dir) = (
        case.admin.clone(),
        case.socket.clone(),
        case.cert_dir.clone(),
    );
    let certwatch = case.certwatch(
        "certwatch.log",
        &[
            "--haproxy-socket",
            socket.to_str().unwrap(),
            "--access-denied-ttl",
            "500ms",
        ],
    );
    certwatch.wait_files_ready().await;
    let (config, _, _) = haproxy_config(&case.root, &socket, &cert_dir);
    let (_haproxy, port, default_leaf) = start_haproxy(&case.root, &socket, &cert_dir);
    eventually_async("HAProxy to serve TLS", || {
        presented(port, "default.invalid")
    })
    .await;

    let long_name = "r".repeat(253);
    let long_route = route_secrets::route::RouteKey::new("app-0", &long_name);
    let long_link = certwatch::files::bundle_names(&long_route).unwrap().link;
    assert!(
        long_link.len() < 255 && long_link.contains('~'),
        "{long_link}"
    );
    let host = |name: &str| format!("{name}.app-0.apps.sim.example");
    let route = |name: &str| (format!("app-0_{name}.pem"), host(name));
    let long = (long_link.clone(), host("long"));
    let routes = Api::<Route>::namespaced(admin.clone(), "app-0");

    // (step, the crt-list after it, oldest route first)
    let steps = [
        (Step::StartUp, vec![route("route-0"), route("route-1")]),
        (
            Step::AddLongNamedRoute,
            vec![route("route-0"), route("route-1"), long.clone()],
        ),
        (
            Step::AddHostlessRoute,
            vec![route("route-0"), route("route-1"), long.clone()],
        ),
        (
            Step::RotateRoute0,
            vec![route("route-0"), route("route-1"), long.clone()],
        ),
        (
            Step::DeleteLongNamedRoute,
            vec![route("route-0"), route("route-1")],
        ),
        (Step::DeleteRoute1, vec![route("route-0")]),
    ];
    let mut rotated = None;
    for (step, expected) in steps {
        match step {
            Step::StartUp => {}
            Step::AddLongNamedRoute => {
                grant_secret(&admin, "app-0", "tls-long").await;
                create_tls_secret(&admin, "app-0", "tls-long", &host("long")).await;
                create_route(&admin, "app-0", &long_name, Some(&host("long")), "tls-long").await;
            }
            Step::AddHostlessRoute => {
                grant_secret(&admin, "app-0", "tls-hostless").await;
                create_tls_secret(&admin, "app-0", "tls-hostless", &host("hostless")).await;
                create_route(&admin, "app-0", "hostless", None, "tls-hostless").await;
                // Rejected as the router rejects it (no host to serve it under): no
                // bundle, no line.
                eventually("the host-less route's rejection", || {
                    let log = certwatch.log_text();
                    (log.contains("app-0/hostless") && log.contains("NoHostValue")).then_some(())
                })
                .await;
                assert!(!cert_dir.join("app-0:hostless.pem").exists());
            }
            Step::RotateRoute0 => {
                let secret = rotate_secret(&admin, "app-0", "tls-0", &host("route-0")).await;
                rotated = Some(leaf_der(&tls_of(&secret).0));
            }
            Step::DeleteLongNamedRoute => {
                routes
                    .delete(&long_name, &DeleteParams::default())
                    .await
                    .unwrap();
            }
            Step::DeleteRoute1 => {
                routes
                    .delete("route-1", &DeleteParams::default())
                    .await
                    .unwrap();
            }
        }
        eventually(&format!("{step:?}: the crt-list"), || {
            (crt_list(&cert_dir) == expected).then_some(())
        })
        .await;
        // A rotation leaves the crt-list as it was: the bundle itself is awaited.
        if let (Step::RotateRoute0, Some((link, _))) = (
            &step,
            expected.iter().find(|(_, sni)| sni == &host("route-0")),
        ) {
            let path = cert_dir.join("links").join(link);
            eventually("route-0's file holds the rotation", || {
                let leaf = std::fs::read(&path).ok().map(|file| leaf_der(&file));
                (leaf.is_some() && leaf == rotated).then_some(())
            })
            .await;
        }
        haproxy_check(&config)
            .unwrap_or_else(|error| panic!("{step:?}: haproxy -c refused:\n{error}"));
        // The running HAProxy serves each listed route with the certificate of its file.
        for (link, sni) in &expected {
            let file = std::fs::read(cert_dir.join("links").join(link)).unwrap();
            let leaf = leaf_der(&file);
            if matches!(step, Step::RotateRoute0) && sni == &host("route-0") {
                assert_eq!(Some(&leaf), rotated.as_ref(), "the file holds the rotation");
            }
            eventually_async(&format!("{step:?}: HAProxy to serve {sni}"), || {
                let leaf = leaf.clone();
                async move { (presented(port, sni).await == Some(leaf)).then_some(()) }
            })
            .await;
        }
        for gone in ["hostless", "long", "route-1"] {
            if !expected.iter().any(|(_, sni)| sni == &host(gone)) {
                assert_eq!(
                    presented(port, &host(gone)).await,
                    Some(default_leaf.clone()),
                    "{step:?}: {gone} must fall back to the default certificate"
                );
            }
        }
    }
    assert_eq!(certwatch.metric("certwatch_haproxy_in_sync"), Some(1.0));
}
