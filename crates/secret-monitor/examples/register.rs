//! Registers handlers for many secrets at once against the cluster of the current
//! kubeconfig context, and prints what start-up cost: time, and the requests the
//! client sent by resource, verb and status (kube-h2's accounting).
//!
//! ```text
//! cargo run --release -p secret-monitor --example register -- NAMESPACE PREFIX COUNT
//! ```
//!
//! registers `PREFIX-0` ... `PREFIX-{COUNT-1}` in `NAMESPACE` (they need not exist) and
//! keeps the watches open for `HOLD_SECONDS` (env, default 0) before exiting. Used to
//! check streaming-list refusals and the request budget against a real kube-apiserver
//! (`KUBE_APISERVER_FLAGS=--feature-gates=WatchList=false`, `ETCD_BIN=/usr/bin/etcd`).

#![allow(clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::future::join_all;
use secret_monitor::{ObjectKey, SecretMonitor};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info,secret_monitor=info".into()),
        )
        .init();
    let mut args = std::env::args().skip(1);
    let usage = "usage: register NAMESPACE PREFIX COUNT";
    let namespace = args.next().ok_or(usage)?;
    let prefix = args.next().ok_or(usage)?;
    let count: usize = args.next().ok_or(usage)?.parse()?;
    let hold: u64 = std::env::var("HOLD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);

    let config = kube::Config::infer().await?;
    let pooled = kube_h2::build_client(config, kube_h2::ClientOptions::default())?;
    let monitor = SecretMonitor::new(pooled.client());
    let started = Instant::now();
    let outcomes = join_all(
        (0..count)
            .map(|i| monitor.add_handler(ObjectKey::new(&namespace, format!("{prefix}-{i}")))),
    )
    .await;
    let elapsed = started.elapsed();
    let failed = outcomes.iter().filter(|o| o.is_err()).count();
    if let Some(Err(error)) = outcomes.iter().find(|o| o.is_err()) {
        println!("first failure: {error}");
    }
    println!(
        "registered {} of {count} in {:.2} s ({failed} failed)",
        count - failed,
        elapsed.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let requests = pooled.pool().requests();
    for response in &requests.responses {
        println!(
            "  {:<10} {:<6} {:>5}  {}",
            response.resource,
            response.verb,
            response
                .code
                .map_or_else(|| "none".to_owned(), |c| c.to_string()),
            response.count
        );
    }
    println!(
        "requests: {}, retries: {}, connections: {}",
        requests.total(),
        requests.retries_total(),
        pooled.stats().http2_connections_opened + pooled.stats().http1_connections_opened
    );
    Ok(())
}
