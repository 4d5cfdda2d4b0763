//! certwatch: watches the per-route Kubernetes TLS secrets that ingress routes
//! reference and serves them to a proxy. This file only wires subcommands to the
//! crates that implement them.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// jemalloc instead of glibc's malloc: at 10,000 watches glibc spent a sixth of the
/// start-up CPU consolidating and unlinking free chunks (docs/BENCHMARKS.md, "The
/// allocator"). The `system-allocator` feature leaves glibc's malloc in place, for heap
/// profilers that interpose it (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "certwatch",
    version,
    about = "Watches per-route Kubernetes TLS secrets and serves them to an ingress proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Sim(kube_sim::cli::SimArgs),
    Run(certwatch::run::RunArgs),
    Demo(certwatch::demo::DemoArgs),
    Bench(certwatch::bench::BenchArgs),
    /// One strategy run of `certwatch bench`, in a process of its own.
    #[command(hide = true)]
    BenchClient(certwatch::bench::ClientArgs),
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        // kube-runtime's watcher logs every 403 it retries with a Debug dump of the
        // error; certwatch reports those failures itself (once per change, counted in
        // /metrics), so only the watcher's errors are kept. RUST_LOG overrides this.
        Command::Run(args) => {
            certwatch::logging::init(args.log_format, "info,kube_runtime::watcher=error");
        }
        Command::Demo(args) => certwatch::logging::init(args.log_format, "warn"),
        _ => init_tracing(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("certwatch: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Sim(args) => kube_sim::cli::run(args).await.map_err(|e| e.to_string()),
            Command::Run(args) => certwatch::run::main(args).await.map_err(|e| e.to_string()),
            Command::Demo(args) => certwatch::demo::main(args).await.map_err(|e| e.to_string()),
            Command::Bench(args) => certwatch::bench::run(args).await.map_err(|e| e.to_string()),
            Command::BenchClient(args) => certwatch::bench::run_client(args)
                .await
                .map_err(|e| e.to_string()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("certwatch: {e}");
            ExitCode::FAILURE
        }
    }
}
