//! Measures the simulator's own capacity on this machine: watches held open,
//! watch-event fan-out, and requests per second, through real HTTP/2 clients.
//!
//! ```sh
//! cargo run --release -p kube-sim --example sim_capacity -- --watches 10000
//! ```
//!
//! The simulator and the load generator share one process (and this machine's
//! cores), so the figures are lower bounds for the simulator alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use http::Method;
use kube_sim::loadgen::{H2Connection, H2Pool};
use kube_sim::{GenerateSpec, SimConfig, Simulator};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Measure kube-sim: open watches, event fan-out, requests per second")]
struct Args {
    /// Routes (and distinct secrets) to generate; one watch per secret is opened.
    #[arg(long, default_value_t = 10_000)]
    watches: usize,
    /// Namespaces the routes are spread over.
    #[arg(long, default_value_t = 100)]
    namespaces: usize,
    /// Streams per HTTP/2 connection (the server's advertised limit).
    #[arg(long, default_value_t = 100)]
    streams_per_connection: usize,
    /// Namespace-wide watchers for the broadcast fan-out phase.
    #[arg(long, default_value_t = 1_000)]
    broadcast_watchers: usize,
    /// Updates sent to the broadcast watchers.
    #[arg(long, default_value_t = 100)]
    broadcast_updates: usize,
    /// Concurrent requests in the request-rate phase.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// HTTP/2 connections for the request-rate phase.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Duration of the request-rate phase.
    #[arg(long, default_value = "5s", value_parser = |s: &str| kube_common::duration::parse(s).map_err(|e| e.to_string()))]
    duration: Duration,
}

fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let sim = Simulator::start(SimConfig {
        history_limit: 100_000,
        watch_buffer: 10_000,
        ..SimConfig::default()
    })
    .await?;
    println!(
        "kube-sim capacity on {} cores",
        std::thread::available_parallelism()?.get()
    );

    let t = Instant::now();
    let cluster = sim.generate(&GenerateSpec::new(args.watches, args.namespaces))?;
    println!(
        "generate: {} routes, {} secrets with ECDSA P-256 certificates, {} namespaces, RBAC: {:.2} s",
        cluster.routes.len(),
        cluster.secrets,
        cluster.namespaces.len(),
        t.elapsed().as_secs_f64()
    );

    // Phase 1: one watch per secret, as the router identity, over HTTP/2.
    let router_token = sim.token("router")?;
    let rv = sim.store().resource_version();
    let paths: Vec<String> = cluster
        .routes
        .iter()
        .map(|r| {
            format!(
                "/api/v1/namespaces/{}/secrets?watch=true&fieldSelector=metadata.name%3D{}&resourceVersion={rv}&allowWatchBookmarks=true&timeoutSeconds=3600",
                r.namespace, r.secret
            )
        })
        .collect();
    let pool = H2Pool::new(sim.addr(), &router_token, args.streams_per_connection);
    let t = Instant::now();
    let watches = pool.open_watches(&paths).await?;
    let opened = t.elapsed().as_secs_f64();
    let stats = sim.stats();
    println!(
        "open watches: {} over {} HTTP/2 connections in {:.2} s ({:.0} watches/s); server reports open_watches={} open_connections.h2={} inflight={}; process RSS {:.0} MiB",
        watches.len(),
        pool.connections(),
        opened,
        watches.len() as f64 / opened,
        stats.open_watches,
        stats.open_connections.h2,
        stats.inflight,
        rss_mib().unwrap_or(f64::NAN)
    );

    // Phase 2: one update per secret, each delivered to its one watcher.
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(tokio::sync::Notify::new());
    let total = watches.len() as u64;
    let mut readers = Vec::with_capacity(watches.len());
    for mut w in watches {
        let received = received.clone();
        let done = done.clone();
        readers.push(tokio::spawn(async move {
            if let Some(e) = w.next_event().await
                && e["type"] == "MODIFIED"
                && received.fetch_add(1, Ordering::AcqRel) + 1 == total
            {
                done.notify_one();
            }
            w
        }));
    }
    let t = Instant::now();
    let store = sim.store();
    for r in &cluster.routes {
        store.merge_patch(
            "secrets",
            r.namespace.as_str(),
            &r.secret,
            json!({"metadata": {"annotations": {"rotated": "1"}}}),
        )?;
    }
    let written = t.elapsed().as_secs_f64();
    tokio::time::timeout(Duration::from_secs(120), done.notified()).await?;
    let elapsed = t.elapsed().as_secs_f64();
    println!(
        "fan-out, one event per watcher: {} updates written in {:.2} s, {} events delivered in {:.2} s ({:.0} events/s end to end)",
        cluster.routes.len(),
        written,
        received.load(Ordering::Acquire),
        elapsed,
        received.load(Ordering::Acquire) as f64 / elapsed
    );
    let mut watches = Vec::with_capacity(readers.len());
    for r in readers {
        watches.push(r.await?);
    }

    // Phase 3: broadcast — many watchers of one namespace, each update to all.
    let admin_token = sim.token("admin")?;
    store.create(
        "secrets",
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "hot", "namespace": "fanout"}, "stringData": {"v": "0"}}),
    )?;
    let rv = sim.store().resource_version();
    let broadcast_paths: Vec<String> = (0..args.broadcast_watchers)
        .map(|_| format!("/api/v1/namespaces/fanout/secrets?watch=true&resourceVersion={rv}"))
        .collect();
    let bpool = H2Pool::new(sim.addr(), &admin_token, args.streams_per_connection);
    let bwatches = bpool.open_watches(&broadcast_paths).await?;
    let expected = (args.broadcast_watchers * args.broadcast_updates) as u64;
    let delivered = Arc::new(AtomicU64::new(0));
    let bdone = Arc::new(tokio::sync::Notify::new());
    let updates = args.broadcast_updates;
    let mut breaders = Vec::new();
    for mut w in bwatches {
        let delivered = delivered.clone();
        let bdone = bdone.clone();
        breaders.push(tokio::spawn(async move {
            for _ in 0..updates {
                if w.next_line().await.is_none() {
                    break;
                }
                if delivered.fetch_add(1, Ordering::AcqRel) + 1 == expected {
                    bdone.notify_one();
                }
            }
        }));
    }
    let t = Instant::now();
    for i in 0..args.broadcast_updates {
        store.merge_patch(
            "secrets",
            "fanout",
            "hot",
            json!({"stringData": {"v": (i + 1).to_string()}}),
        )?;
    }
    tokio::time::timeout(Duration::from_secs(300), bdone.notified()).await?;
    let elapsed = t.elapsed().as_secs_f64();
    println!(
        "fan-out, broadcast: {} watchers x {} updates = {} events in {:.2} s ({:.0} events/s)",
        args.broadcast_watchers,
        args.broadcast_updates,
        delivered.load(Ordering::Acquire),
        elapsed,
        delivered.load(Ordering::Acquire) as f64 / elapsed
    );
    for r in breaders {
        r.await?;
    }

    // Phase 4: request rate — GETs of the router's own secrets (authenticated,
    // RBAC-checked against resourceNames) while all the watches stay open.
    sim.reset_stats();
    let mut conns = Vec::new();
    for _ in 0..args.connections.max(1) {
        conns.push(H2Connection::connect(sim.addr(), &router_token).await?);
    }
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + args.duration;
    let routes = Arc::new(cluster.routes.clone());
    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..args.concurrency {
        let conn = conns[w % conns.len()].clone();
        let ok = ok.clone();
        let failed = failed.clone();
        let routes = routes.clone();
        workers.push(tokio::spawn(async move {
            let mut i = w;
            while tokio::time::Instant::now() < deadline {
                let r = &routes[i % routes.len()];
                i += 7919;
                let path = format!("/api/v1/namespaces/{}/secrets/{}", r.namespace, r.secret);
                match conn.request(Method::GET, &path, None).await {
                    Ok((status, _)) if status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    let stats = sim.stats();
    println!(
        "requests: GET secret as the router, {} concurrent over {} HTTP/2 connections, {} watches open: {} ok, {} failed in {:.2} s ({:.0} requests/s); peak_inflight={} bytes_sent={}",
        args.concurrency,
        conns.len(),
        stats.open_watches,
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        elapsed,
        ok.load(Ordering::Relaxed) as f64 / elapsed,
        stats.peak_inflight,
        stats.bytes_sent
    );

    // Phase 5: the same over HTTP/1.1 (kube-rs's default transport): one keep-alive
    // connection per concurrent request.
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let deadline = tokio::time::Instant::now() + args.duration;
    let t = Instant::now();
    let mut workers = Vec::new();
    for w in 0..args.concurrency {
        let ok = ok.clone();
        let failed = failed.clone();
        let routes = routes.clone();
        let addr = sim.addr();
        let token = router_token.clone();
        workers.push(tokio::spawn(async move {
            let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let _ = tcp.set_nodelay(true);
            let Ok((mut send, conn)) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await
            else {
                failed.fetch_add(1, Ordering::Relaxed);
                return;
            };
            tokio::spawn(conn);
            let mut i = w;
            while tokio::time::Instant::now() < deadline {
                let r = &routes[i % routes.len()];
                i += 7919;
                let req = http::Request::get(format!(
                    "/api/v1/namespaces/{}/secrets/{}",
                    r.namespace, r.secret
                ))
                .header("host", addr.to_string())
                .header("authorization", format!("Bearer {token}"))
                .body(http_body_util::Empty::<bytes::Bytes>::new());
                let Ok(req) = req else { break };
                let result = async {
                    let resp = send.send_request(req).await.ok()?;
                    let status = resp.status();
                    http_body_util::BodyExt::collect(resp.into_body())
                        .await
                        .ok()?;
                    Some(status)
                }
                .await;
                match result {
                    Some(s) if s == 200 => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }
    for w in workers {
        w.await?;
    }
    let elapsed = t.elapsed().as_secs_f64();
    println!(
        "requests: GET secret as the router over HTTP/1.1, {} connections: {} ok, {} failed in {:.2} s ({:.0} requests/s)",
        args.concurrency,
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        elapsed,
        ok.load(Ordering::Relaxed) as f64 / elapsed,
    );
    println!(
        "process RSS at the end: {:.0} MiB",
        rss_mib().unwrap_or(f64::NAN)
    );
    drop(watches);
    sim.shutdown().await;
    Ok(())
}
