//! Real traffic through the HAProxy certwatch configures and runs
//! (`--haproxy-config-dir`), the binary against the simulator: HTTP and HTTPS (with SNI)
//! requests reach the routes' backends (real servers on this machine, registered as
//! Services and EndpointSlices), by termination and insecure policy, with the route's
//! certificate; weights split the traffic; an endpoint change reaches HAProxy without a
//! reload, a new route with one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;

use common::haproxy::{info_field, leaf_of};
use common::routing::{Routing, RoutingLaunch};
use common::traffic::{
    Backend, create_service, http_get, https_get, set_endpoints, set_endpoints_each,
};
use common::{
    Certwatch, SimProcess, create_route_spec, create_tls_secret, eventually, eventually_async,
    free_port, grant_secret,
};
use kube::api::{Api, PostParams};
use route_secrets::route::Route;

const NS: &str = "app-0";

/// The secret of route `name`, for `host`, created and granted.
async fn route_secret(admin: &kube::Client, name: &str, host: &str) {
    let secret = format!("{name}-tls");
    create_tls_secret(admin, NS, &secret, host).await;
    grant_secret(admin, NS, &secret).await;
}

/// A route with its own secret (created and granted) for `host`.
async fn tls_route(
    admin: &kube::Client,
    name: &str,
    host: &str,
    termination: &str,
    policy: &str,
    to: serde_json::Value,
) {
    route_secret(admin, name, host).await;
    tls_route_only(admin, name, host, termination, policy, to).await;
}

/// A route whose secret [`route_secret`] made.
async fn tls_route_only(
    admin: &kube::Client,
    name: &str,
    host: &str,
    termination: &str,
    policy: &str,
    to: serde_json::Value,
) {
    let secret = format!("{name}-tls");
    let mut spec = serde_json::json!({
        "host": host,
        "to": to,
        "tls": {"termination": termination, "externalCertificate": {"name": secret}},
    });
    if !policy.is_empty() {
        spec["tls"]["insecureEdgeTerminationPolicy"] = policy.into();
    }
    create_route_spec(admin, NS, name, spec).await;
}

fn to(service: &str) -> serde_json::Value {
    serde_json::json!({"kind": "Service", "name": service})
}

/// Sends `count` HTTPS requests for `sni` and counts who answered.
async fn spread(https: SocketAddr, sni: &str, count: usize) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for _ in 0..count {
        let response = https_get(https, sni, "/", false).await.expect("an answer");
        *counts
            .entry(
                response
                    .backend
                    .unwrap_or_else(|| format!("status {}", response.status)),
            )
            .or_default() += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_reach_each_routes_backends_through_the_haproxy_certwatch_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(dir.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;

    let blue = [Backend::http("blue-1").await, Backend::http("blue-2").await];
    let green = Backend::http("green-1").await;
    let secure = Backend::https("secure-1", "secure.app-0.svc").await;
    for service in ["blue", "green", "secure"] {
        create_service(&admin, NS, service).await;
    }
    set_endpoints_each(&admin, NS, "blue", &[&blue[0], &blue[1]]).await;
    set_endpoints(&admin, NS, "green", &[&green]).await;
    set_endpoints(&admin, NS, "secure", &[&secure]).await;

    tls_route(&admin, "edge-none", "edge.example", "edge", "", to("blue")).await;
    tls_route(
        &admin,
        "edge-redirect",
        "redirect.example",
        "edge",
        "Redirect",
        to("blue"),
    )
    .await;
    tls_route(
        &admin,
        "edge-allow",
        "allow.example",
        "edge",
        "Allow",
        to("green"),
    )
    .await;
    tls_route(
        &admin,
        "weighted",
        "weighted.example",
        "edge",
        "None",
        serde_json::json!({"kind": "Service", "name": "blue", "weight": 1}),
    )
    .await;
    // blue: weight 1 over 2 endpoints, green: weight 3 over 1: per-endpoint weights
    // 42, 42 and 256 (the router's scaling), so green gets 256/340 of the requests.
    let mut weighted: Route = Api::<Route>::namespaced(admin.clone(), NS)
        .get("weighted")
        .await
        .unwrap();
    weighted.spec.alternate_backends = Some(vec![
        serde_json::from_value(
            serde_json::json!({"kind": "Service", "name": "green", "weight": 3}),
        )
        .unwrap(),
    ]);
    Api::<Route>::namespaced(admin.clone(), NS)
        .replace("weighted", &PostParams::default(), &weighted)
        .await
        .unwrap();
    tls_route(
        &admin,
        "reencrypt",
        "secure.example",
        "reencrypt",
        "",
        to("secure"),
    )
    .await;
    // Granted before certwatch asks about the namespace (its access answers are cached).
    route_secret(&admin, "late", "late.example").await;

    let Routing {
        certwatch,
        http,
        https,
        config_dir,
        ..
    } = RoutingLaunch::on(&sim, dir.path())
        .min_reload_interval("1s")
        .ready()
        .await;

    // HTTPS with SNI: the route's certificate, its backend.
    let edge = eventually_async("edge.example served over HTTPS", || async {
        https_get(https, "edge.example", "/", false)
            .await
            .filter(|r| r.status == 200)
    })
    .await;
    assert!(
        edge.backend
            .as_deref()
            .is_some_and(|b| b.starts_with("blue-")),
        "{edge:?}"
    );
    assert_eq!(
        edge.certificate,
        Some(leaf_of(&admin, NS, "edge-none-tls").await)
    );
    // The crt-list offers ALPN `h2,http/1.1` (as the router's): this client offers
    // HTTP/1.1 only, and gets it; one offering h2 gets h2.
    assert_eq!(edge.alpn.as_deref(), Some("http/1.1"));
    let h2 = https_get(https, "edge.example", "/", true).await.unwrap();
    assert_eq!(h2.alpn.as_deref(), Some("h2"));
    // Plain HTTP: None refuses (no route), Redirect sends to HTTPS, Allow serves.
    let refused = http_get(http, "edge.example", "/").await.unwrap();
    assert_eq!(
        (refused.status, refused.backend.as_deref()),
        (503, None),
        "{refused:?}"
    );
    let redirected = http_get(http, "redirect.example", "/cart?x=1")
        .await
        .unwrap();
    assert_eq!(redirected.status, 302, "{redirected:?}");
    assert_eq!(
        redirected.location.as_deref(),
        Some("https://redirect.example/cart?x=1")
    );
    let allowed = http_get(http, "allow.example", "/").await.unwrap();
    assert_eq!(
        (allowed.status, allowed.backend.as_deref()),
        (200, Some("green-1"))
    );
    let allowed_tls = https_get(https, "allow.example", "/", false).await.unwrap();
    assert_eq!(allowed_tls.backend.as_deref(), Some("green-1"));
    assert_eq!(
        allowed_tls.certificate,
        Some(leaf_of(&admin, NS, "edge-allow-tls").await)
    );
    // A name no route has: the default certificate, and no backend.
    let unknown = https_get(https, "unknown.example", "/", false)
        .await
        .unwrap();
    assert_eq!((unknown.status, unknown.backend.as_deref()), (503, None));
    assert_ne!(unknown.certificate, edge.certificate);
    // Reencrypt: HAProxy opens its own TLS connection to the backend.
    let reencrypted = https_get(https, "secure.example", "/r", false)
        .await
        .unwrap();
    assert_eq!(
        (reencrypted.status, reencrypted.backend.as_deref()),
        (200, Some("secure-1"))
    );
    assert_eq!(
        reencrypted.certificate,
        Some(leaf_of(&admin, NS, "reencrypt-tls").await)
    );
    assert_eq!(secure.seen.lock().unwrap().last().unwrap().1, "/r");
    // Weights, over many requests (round robin: exact proportions per cycle).
    let counts = spread(https, "weighted.example", 340).await;
    let green_share = counts.get("green-1").copied().unwrap_or(0);
    assert!((230..=280).contains(&green_share), "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 340, "{counts:?}");

    // An endpoint change reaches HAProxy without a reload: the worker stays the same.
    let socket = config_dir.join("run/haproxy.sock");
    let worker = info_field(&socket, "Pid");
    let loads = certwatch.metric("certwatch_routing_loads_total").unwrap();
    let blue_3 = Backend::http("blue-3").await;
    set_endpoints_each(&admin, NS, "blue", &[&blue[0], &blue[1], &blue_3]).await;
    eventually_async("the new endpoint gets traffic", || async {
        let counts = spread(https, "edge.example", 9).await;
        counts.contains_key("blue-3").then_some(())
    })
    .await;
    assert_eq!(
        info_field(&socket, "Pid"),
        worker,
        "no reload for an endpoint change"
    );
    assert_eq!(
        certwatch.metric("certwatch_routing_loads_total"),
        Some(loads)
    );
    // An endpoint that goes gets no more requests.
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(admin.clone(), NS)
        .delete("blue-0", &Default::default())
        .await
        .unwrap();
    eventually_async("the removed endpoint gets no traffic", || async {
        let counts = spread(https, "edge.example", 12).await;
        (!counts.contains_key("blue-1") && counts.contains_key("blue-2")).then_some(())
    })
    .await;
    assert_eq!(
        info_field(&socket, "Pid"),
        worker,
        "no reload for an endpoint removal"
    );
    assert!(
        certwatch
            .metric("certwatch_routing_server_commands_total{result=\"ok\"}")
            .unwrap()
            > 0.0
    );
    assert_eq!(
        certwatch.metric("certwatch_routing_server_commands_total{result=\"error\"}"),
        Some(0.0)
    );

    // A new route is loaded by a reload.
    tls_route_only(&admin, "late", "late.example", "edge", "", to("green")).await;
    let late = eventually_async("the new route served", || async {
        https_get(https, "late.example", "/", false)
            .await
            .filter(|r| r.status == 200)
    })
    .await;
    assert_eq!(late.backend.as_deref(), Some("green-1"));
    assert_eq!(
        late.certificate,
        Some(leaf_of(&admin, NS, "late-tls").await)
    );
    // The new worker can answer before certwatch has seen it take over: the load is
    // counted once it has.
    eventually("the new route's load counted", || {
        certwatch
            .metric("certwatch_routing_loads_total")
            .filter(|count| *count > loads)
    })
    .await;

    // HAProxy outlives no certwatch, even one killed outright.
    certwatch.signal("KILL");
    eventually_async("HAProxy gone with certwatch", || async {
        std::os::unix::net::UnixStream::connect(&socket)
            .is_err()
            .then_some(())
    })
    .await;
    assert!(
        http_get(http, "allow.example", "/").await.is_none(),
        "HAProxy still listens after certwatch was killed"
    );
    // And its processes end (softly, or killed after the watchdog's grace).
    let config = config_dir.join("haproxy.cfg");
    eventually_async("HAProxy's processes gone", || async {
        let output = std::process::Command::new("pgrep")
            .args(["-f", config.to_str().unwrap()])
            .output()
            .expect("pgrep (procps) must be installed");
        output.stdout.is_empty().then_some(())
    })
    .await;
}

/// The sidecar's script (HAProxy's master is its child), stopped with the test.
struct Sidecar(std::process::Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        // SIGINT: the script stops HAProxy at once (SIGTERM would first serve on for
        // the shutdown delay), its workers with it.
        let _ = std::process::Command::new("kill")
            .arg("-INT")
            .arg(self.0.id().to_string())
            .status();
        let _ = self.0.wait();
    }
}

/// HAProxy's master CLI `show proc`: the master's reload count and the current
/// workers' pids; `None` while the master does not answer (it re-executes itself on a
/// reload).
fn show_proc(master: &Path) -> Option<(u64, Vec<u32>)> {
    use std::io::{Read as _, Write as _};
    // The master CLI answers once the request has ended (half-closed).
    let mut stream = std::os::unix::net::UnixStream::connect(master).ok()?;
    stream.write_all(b"show proc\n").ok()?;
    stream.shutdown(std::net::Shutdown::Write).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let mut reloads = None;
    let mut workers = Vec::new();
    for line in answer.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            [_, "master", count, ..] => reloads = count.parse().ok(),
            // Workers of the current configuration have 0 reloads; older ones, still
            // finishing their connections, more.
            [pid, "worker", "0", ..] => workers.push(pid.parse().ok()?),
            _ => {}
        }
    }
    Some((reloads?, workers))
}

/// [`show_proc`] once the master answers.
async fn processes(master: &Path) -> (u64, Vec<u32>) {
    eventually("HAProxy's master CLI answers", || show_proc(master)).await
}

/// HAProxy as deploy/base runs it: a sidecar that waits for certwatch's complete files
/// and runs HAProxy in master-worker mode on them; certwatch (`--run-haproxy false`)
/// renders the routes' configuration into the shared directory and drives that HAProxy:
/// certificates and endpoint changes through its runtime API, route changes by reloads
/// through its master CLI. Readiness means that HAProxy serves the routes. HAProxy
/// outlives a certwatch restart; the next certwatch reloads it only when what it
/// renders differs from what HAProxy holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_haproxy_routes_what_certwatch_renders_and_reloads_through_its_master_cli() {
    let dir = tempfile::tempdir().unwrap();
    let sim = SimProcess::start(dir.path(), &["--generate", "routes=1,namespaces=1"]);
    let admin = sim.client("admin").await;
    let blue = [Backend::http("blue-1").await, Backend::http("blue-2").await];
    let green = Backend::http("green-1").await;
    for service in ["blue", "green"] {
        create_service(&admin, NS, service).await;
    }
    set_endpoints(&admin, NS, "blue", &[&blue[0]]).await;
    set_endpoints(&admin, NS, "green", &[&green]).await;
    tls_route(&admin, "shop", "shop.example", "edge", "", to("blue")).await;
    // Granted before certwatch asks about the namespace (its access answers are cached).
    route_secret(&admin, "late", "late.example").await;

    let config_dir = dir.path().join("run-haproxy");
    let cert_dir = dir.path().join("certs");
    std::fs::create_dir_all(&config_dir).unwrap();
    let (http_port, https_port) = (free_port(), free_port());
    let http_bind = format!("127.0.0.1:{http_port}");
    let https_bind = format!("127.0.0.1:{https_port}");
    let master = config_dir.join("master.sock");

    // The sidecar first, as the pod starts its containers together: it waits.
    let (script, env) = common::haproxy::sidecar_of_the_deployment(&config_dir, &cert_dir);
    assert!(
        script.contains(&format!("-S {}", master.display())),
        "{script}"
    );
    let path = format!("/usr/sbin:{}", std::env::var("PATH").unwrap_or_default());
    let start_sidecar = |log: &str| {
        Sidecar(
            // SIGINT at its default: a shell cannot trap a signal ignored when it
            // starts, as it is for the tests when they run in a background job.
            std::process::Command::new("env")
                .args(["--default-signal=INT", "sh", "-c"])
                .arg(&script)
                .envs(env.iter().map(|(name, value)| (name, value)))
                .env("PATH", &path)
                .stdin(std::process::Stdio::null())
                .stdout(std::fs::File::create(dir.path().join(format!("{log}.log"))).unwrap())
                .stderr(std::fs::File::create(dir.path().join(format!("{log}.stderr"))).unwrap())
                .spawn()
                .unwrap(),
        )
    };
    let sidecar = start_sidecar("haproxy");
    assert!(
        env.iter().any(|(name, value)| name == "OPENSSL_CONF"
            && Path::new(value) == config_dir.join("openssl.cnf")),
        "{env:?}"
    );

    // certwatch configured by the variables the Deployment sets.
    let launch = |log: &str| {
        common::Launch::new(&sim.kubeconfig, &cert_dir, &dir.path().join(log))
            .env("CERTWATCH_HAPROXY_CONFIG_DIR", config_dir.to_str().unwrap())
            .env("CERTWATCH_RUN_HAPROXY", "false")
            .env("CERTWATCH_HAPROXY_MASTER_SOCKET", master.to_str().unwrap())
            .env("CERTWATCH_HTTP_BIND", &http_bind)
            .env("CERTWATCH_HTTPS_BIND", &https_bind)
            .args(&[
                "--haproxy-min-reload-interval",
                "1s",
                // Within the test machine's descriptor limit.
                "--haproxy-max-connections",
                "2000",
            ])
    };
    let certwatch = Certwatch::launch(launch("certwatch.log"));
    certwatch.wait_ready().await;
    let https: SocketAddr = https_bind.parse().unwrap();
    let http: SocketAddr = http_bind.parse().unwrap();

    // Ready means served by the sidecar's HAProxy: the route reaches its backend under
    // its certificate at once.
    let shop = https_get(https, "shop.example", "/", false).await.unwrap();
    assert_eq!(
        (shop.status, shop.backend.as_deref()),
        (200, Some("blue-1")),
        "{shop:?}"
    );
    assert_eq!(
        shop.certificate,
        Some(leaf_of(&admin, NS, "shop-tls").await)
    );
    let refused = http_get(http, "shop.example", "/").await.unwrap();
    assert_eq!((refused.status, refused.backend.as_deref()), (503, None));
    // HAProxy started on the first complete files: no reload was needed.
    let (reloads, workers) = processes(&master).await;
    assert_eq!(reloads, 0, "{}", certwatch.log_text());
    assert_eq!(workers.len(), 1);
    let socket = config_dir.join("run/haproxy.sock");
    assert_eq!(u64::from(workers[0]), info_field(&socket, "Pid"));
    // At certwatch's OpenSSL security level.
    assert!(
        std::fs::read_to_string(config_dir.join("openssl.cnf"))
            .unwrap()
            .contains("@SECLEVEL=1")
    );
    let loads = certwatch.metric("certwatch_routing_loads_total").unwrap();
    assert_eq!(loads, 1.0);

    // An endpoint change reaches traffic without a reload.
    set_endpoints_each(&admin, NS, "blue", &[&blue[0], &blue[1]]).await;
    eventually_async("the new endpoint gets traffic", || async {
        spread(https, "shop.example", 6)
            .await
            .contains_key("blue-2")
            .then_some(())
    })
    .await;
    assert_eq!(processes(&master).await, (0, workers.clone()), "no reload");
    assert_eq!(
        certwatch.metric("certwatch_routing_loads_total"),
        Some(loads)
    );
    assert!(
        certwatch
            .metric("certwatch_routing_server_commands_total{result=\"ok\"}")
            .unwrap()
            > 0.0
    );

    // A route added needs a backend: certwatch reloads the sidecar's HAProxy through
    // its master CLI, once, and the route is served by the new worker.
    let before = https_get(https, "late.example", "/", false).await.unwrap();
    assert_eq!((before.status, before.backend.as_deref()), (503, None));
    tls_route_only(&admin, "late", "late.example", "edge", "", to("green")).await;
    let late = eventually_async("the added route served", || async {
        https_get(https, "late.example", "/", false)
            .await
            .filter(|r| r.status == 200)
    })
    .await;
    assert_eq!(late.backend.as_deref(), Some("green-1"));
    assert_eq!(
        late.certificate,
        Some(leaf_of(&admin, NS, "late-tls").await)
    );
    let (reloads, new_workers) = processes(&master).await;
    assert_eq!(reloads, 1, "{}", certwatch.log_text());
    assert_eq!(new_workers.len(), 1);
    assert_ne!(new_workers, workers);
    // The controller counts its reload once the master has answered for it.
    let routes_reloads = "certwatch_haproxy_reloads_total{reason=\"routes\",result=\"ok\"}";
    eventually("the reload counted by certwatch", || {
        (certwatch.metric(routes_reloads) == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(
        certwatch.metric("certwatch_routing_loads_total"),
        Some(loads + 1.0)
    );
    // The endpoint added at run time is in the new worker too (the files had it).
    eventually_async("both endpoints after the reload", || async {
        let counts = spread(https, "shop.example", 6).await;
        (counts.contains_key("blue-1") && counts.contains_key("blue-2")).then_some(())
    })
    .await;

    // A route removed: its backend goes by a second reload.
    Api::<Route>::namespaced(admin.clone(), NS)
        .delete("late", &Default::default())
        .await
        .unwrap();
    eventually_async("the removed route no longer served", || async {
        https_get(https, "late.example", "/", false)
            .await
            .filter(|r| r.status == 503 && r.backend.is_none())
    })
    .await;
    eventually("the second reload counted", || {
        (show_proc(&master)?.0 == 2 && certwatch.metric(routes_reloads) == Some(2.0)).then_some(())
    })
    .await;
    assert_eq!(processes(&master).await.0, 2, "one reload per route change");

    // HAProxy is the sidecar's: it keeps serving while certwatch restarts, and a new
    // certwatch is ready once that HAProxy holds what it renders.
    let mut certwatch = certwatch;
    assert_eq!(certwatch.terminate().code(), Some(0));
    let during = https_get(https, "shop.example", "/", false).await.unwrap();
    assert_eq!(during.status, 200, "{during:?}");
    let again = Certwatch::launch(launch("certwatch-2.log"));
    again.wait_ready().await;
    // It renders what HAProxy holds (the same routes and endpoints): no reload.
    assert_eq!(processes(&master).await.0, 2, "{}", again.log_text());
    assert_eq!(again.metric(routes_reloads), None);
    let after = https_get(https, "shop.example", "/", false).await.unwrap();
    assert_eq!(after.status, 200, "{after:?}");
    let late_after = https_get(https, "late.example", "/", false).await.unwrap();
    assert_eq!(late_after.status, 503, "{late_after:?}");

    // A route added while certwatch is away: the next certwatch finds HAProxy on older
    // files, reloads it once, and is ready only once the route is served.
    let mut again = again;
    assert_eq!(again.terminate().code(), Some(0));
    tls_route_only(&admin, "late", "late.example", "edge", "", to("green")).await;
    let third = Certwatch::launch(launch("certwatch-3.log"));
    third.wait_ready().await;
    let late = https_get(https, "late.example", "/", false).await.unwrap();
    assert_eq!(
        (late.status, late.backend.as_deref()),
        (200, Some("green-1")),
        "{late:?}"
    );
    assert_eq!(processes(&master).await.0, 3, "{}", third.log_text());
    eventually("the reload counted by the third certwatch", || {
        (third.metric(routes_reloads) == Some(1.0)).then_some(())
    })
    .await;
    assert_eq!(processes(&master).await.0, 3);

    // The sidecar started again (its container restarted) loads the files, which miss
    // an endpoint change made since through the runtime API: certwatch notices the new
    // HAProxy without any news from the cluster and reloads it once onto the endpoints.
    set_endpoints(&admin, NS, "blue", &[&blue[0]]).await;
    eventually_async("the gone endpoint gets no traffic", || async {
        let counts = spread(https, "shop.example", 8).await;
        (counts.keys().collect::<Vec<_>>() == ["blue-1"]).then_some(())
    })
    .await;
    assert_eq!(processes(&master).await.0, 3, "no reload for it");
    let written = std::fs::read_to_string(config_dir.join("haproxy.cfg")).unwrap();
    assert!(
        written.contains(&format!(" {} ", blue[1].addr)),
        "the files still name the gone endpoint:\n{written}"
    );
    drop(sidecar);
    let _sidecar = start_sidecar("haproxy-2");
    eventually("the restarted HAProxy reloaded onto the endpoints", || {
        let (reloads, _) = show_proc(&master)?;
        (reloads == 1 && third.metric(routes_reloads) == Some(2.0)).then_some(())
    })
    .await;
    let counts = spread(https, "shop.example", 12).await;
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["blue-1"], "{counts:?}");
}
