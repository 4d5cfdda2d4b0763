//! A reload reads only files that are there, in routing mode (`--haproxy-config-dir`),
//! through the binary and a real HAProxy (Debian's 2.6): a secret flipped between
//! `kubernetes.io/tls` and `Opaque` (its route served, then rejected and its link no
//! longer wanted) while routes are added (each one a reload that may be reading the
//! crt-list at that moment) never makes a load fail: a link leaves `links/` only once
//! no load that may have read a crt-list naming it is still running.
//!
//! No timing is asserted: counts of loads and failures, and handshakes.

// Helpers outside #[test] functions unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::haproxy::*;
use common::routing::{Routing, RoutingLaunch};
use common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};

const NAMESPACE: &str = "app-0";
const FLIPS: usize = 12;

fn host(name: &str) -> String {
    format!("{name}.{NAMESPACE}.apps.sim.example")
}

/// Creates secret `flip` of `type_` with a fresh certificate for the flipping host.
async fn create_flip(admin: &kube::Client, type_: &str) -> Secret {
    let mut secret = Secret {
        data: Some(new_tls_data(&host("flip"))),
        type_: Some(type_.to_owned()),
        ..Secret::default()
    };
    secret.metadata.name = Some("flip".to_owned());
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap()
}

/// Deletes secret `flip` (a secret's type cannot change: a flip is a new secret).
async fn delete_flip(admin: &kube::Client) {
    Api::<Secret>::namespaced(admin.clone(), NAMESPACE)
        .delete("flip", &DeleteParams::default())
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_flipping_between_opaque_and_tls_never_fails_a_load() {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().canonicalize().unwrap();
    // Enough certificates that every load takes HAProxy a while: a crt-list read at
    // its start names what the flush after it no longer wants.
    let sim = SimProcess::start(&root, &["--generate", "routes=300,namespaces=1"]);
    let admin = sim.client("admin").await;
    // Secrets granted before certwatch asks about the namespace (its access answers
    // are cached); their routes come later.
    grant_secret(&admin, NAMESPACE, "flip").await;
    for i in 0..FLIPS {
        let name = format!("add-{i}");
        grant_secret(&admin, NAMESPACE, &name).await;
        create_tls_secret(&admin, NAMESPACE, &name, &host(&name)).await;
    }
    let secret = create_flip(&admin, "kubernetes.io/tls").await;
    create_route(&admin, NAMESPACE, "flip", Some(&host("flip")), "flip").await;

    let Routing {
        mut certwatch,
        https,
        cert_dir,
        ..
    } = RoutingLaunch::on(&sim, &root)
        .min_reload_interval("0s")
        .ready()
        .await;
    let https_port = https.port();
    let metric = |certwatch: &Certwatch, name: &str| certwatch.metric(name).unwrap_or(0.0);
    let flip_link = cert_dir.join("links").join(format!("{NAMESPACE}_flip.pem"));
    let mut leaf = leaf_der(&tls_of(&secret).0);
    eventually_async("the flipping route to be served", || async {
        (presented(https_port, &host("flip")).await == Some(leaf.clone())).then_some(())
    })
    .await;
    let loads_before = metric(&certwatch, "certwatch_routing_loads_total");

    let mut rejections = 0;
    for i in 0..FLIPS {
        // A route added: its load starts, reading the crt-list that names the flipping
        // route's link, while the flipping secret goes away (its route rejected, its
        // line out of the crt-list, its link no longer wanted).
        let name = format!("add-{i}");
        create_route(&admin, NAMESPACE, &name, Some(&host(&name)), &name).await;
        eventually("the added route to enter the crt-list", || {
            crt_list(&cert_dir)
                .iter()
                .any(|(_, sni)| *sni == host(&name))
                .then_some(())
        })
        .await;
        delete_flip(&admin).await;
        create_flip(&admin, "Opaque").await;
        // The Opaque secret is a rejection; its link no longer wanted.
        eventually("the flipping route to leave the crt-list", || {
            (!crt_list(&cert_dir)
                .iter()
                .any(|(_, sni)| *sni == host("flip")))
            .then_some(())
        })
        .await;
        rejections += 1;
        delete_flip(&admin).await;
        let secret = create_flip(&admin, "kubernetes.io/tls").await;
        leaf = leaf_der(&tls_of(&secret).0);
        eventually_async("the flipping route to be served again", || async {
            (presented(https_port, &host("flip")).await == Some(leaf.clone())).then_some(())
        })
        .await;
    }
    assert_eq!(rejections, FLIPS);

    // Every route added is served, the flipping one with its last certificate, and no
    // load failed on the way.
    for i in 0..FLIPS {
        let name = format!("add-{i}");
        let expected = leaf_of(&admin, NAMESPACE, &name).await;
        eventually_async(&format!("{name} to be served"), || async {
            (presented(https_port, &host(&name)).await == Some(expected.clone())).then_some(())
        })
        .await;
    }
    eventually_async("the flipping route to be served", || async {
        (presented(https_port, &host("flip")).await == Some(leaf.clone())).then_some(())
    })
    .await;
    for i in [0, 150, 299] {
        let expected = leaf_of(&admin, NAMESPACE, &format!("tls-{i}")).await;
        let sni = format!("route-{i}.{NAMESPACE}.apps.sim.example");
        eventually_async(&format!("route-{i} to be served"), || async {
            (presented(https_port, &sni).await == Some(expected.clone())).then_some(())
        })
        .await;
    }
    // The added routes' backends reach HAProxy only by a load (their certificates may
    // be served before it, through the runtime API), so loads come of the flips; how
    // many the changes fall into depends on the machine's pace (changes that come
    // during a load are taken by the next one), and a load counts once certwatch has
    // seen HAProxy's new worker take over: the test waits for the first.
    eventually("a load of the added routes to be counted", || {
        (metric(&certwatch, "certwatch_routing_loads_total") - loads_before >= 1.0).then_some(())
    })
    .await;
    let failures = metric(&certwatch, "certwatch_routing_load_failures_total");
    let log = certwatch.log_text();
    assert_eq!(failures, 0.0, "{log}");
    assert!(
        !log.contains("HAProxy could not load the routes' configuration"),
        "{log}"
    );
    assert!(
        std::fs::metadata(&flip_link).is_ok(),
        "the flipping route's link is there"
    );
    assert!(certwatch.terminate().success());
}
