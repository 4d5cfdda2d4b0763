//! certwatch-lab: the demo, the simulator, the benchmarks and the embedded run. This file
//! only wires subcommands to the crates that implement them.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// The production binary's allocator, so that the benchmarks' in-process daemon is
/// measured as it runs in production (docs/BENCHMARKS.md, "The allocator").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "certwatch-lab",
    version,
    about = "certwatch's workshop: the demo, the Kubernetes API simulator, the benchmarks, \
and the daemon against a simulated cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Demo(certwatch_lab::demo::DemoArgs),
    Sim(kube_sim::cli::SimArgs),
    Bench(certwatch_lab::bench::BenchArgs),
    Run(Box<certwatch_lab::embedded::LabRunArgs>),
    /// One strategy run of `certwatch-lab bench`, in a process of its own.
    #[command(hide = true)]
    BenchClient(certwatch_lab::bench::ClientArgs),
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
        // As `certwatch run` logs (see its main).
        Command::Run(args) => {
            certwatch::logging::init_with_level(
                args.run.log_format,
                "info,kube_runtime::watcher=error",
                Some(args.run.log_level),
            );
        }
        Command::Demo(args) => certwatch::logging::init(args.log_format, "warn"),
        _ => init_tracing(),
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("certwatch-lab: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Sim(args) => kube_sim::cli::run(args).await.map_err(|e| e.to_string()),
            Command::Run(args) => certwatch_lab::embedded::run(*args)
                .await
                .map_err(|e| e.to_string()),
            Command::Demo(args) => certwatch_lab::demo::main(args)
                .await
                .map_err(|e| e.to_string()),
            Command::Bench(args) => certwatch_lab::bench::run(args)
                .await
                .map_err(|e| e.to_string()),
            Command::BenchClient(args) => certwatch_lab::bench::run_client(args)
                .await
                .map_err(|e| e.to_string()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("certwatch-lab: {error}");
            ExitCode::FAILURE
        }
    }
}
