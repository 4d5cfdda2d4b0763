//! certwatch: watches the per-route Kubernetes TLS secrets that ingress routes
//! reference and serves them to a proxy. This file only wires the command line to the
//! library. The lab's commands (`demo`, `sim`, `bench`, an embedded run) are the
//! `certwatch-lab` binary's only: this one refuses them with a message naming it.

use std::ffi::OsString;
use std::process::ExitCode;

use certwatch::logging::LogFormat;
use clap::{Parser, Subcommand};

/// jemalloc instead of glibc's malloc: at 10,000 watches glibc spent a sixth of the
/// start-up CPU consolidating and unlinking free chunks (docs/BENCHMARKS.md, "The
/// allocator"). The `system-allocator` feature leaves glibc's malloc in place, for heap
/// profilers that interpose it (heaptrack).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The lab's binary, which holds the commands this one refuses.
const LAB_BINARY: &str = "certwatch-lab";

/// The lab's commands a user may type here out of habit (the lab's own help lists them).
const LAB_COMMANDS: [&str; 3] = ["demo", "sim", "bench"];

#[derive(Debug, Parser)]
#[command(
    name = "certwatch",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CERTWATCH_COMMIT"), ")"),
    about = "Watches per-route Kubernetes TLS secrets and serves them to an ingress proxy",
    after_help = "The lab's commands are in a separate binary, certwatch-lab \
(`cargo build --release -p certwatch-lab`); this one is the daemon only."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Run(Box<certwatch::RunArgs>),
    ClearStatus(certwatch::clear_status::ClearStatusArgs),
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(error) => return command_line_error(&argv, &error),
    };
    let args = match cli.command {
        Command::Run(args) => args,
        Command::ClearStatus(args) => return clear_status(&args),
    };
    let format = args.log_format;
    init_logging(format, Some(args.log_level));
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fatal(format, "cannot start the async runtime", &error),
    };
    match runtime.block_on(certwatch::cli::run(*args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fatal(format, "certwatch run failed", &error),
    }
}

/// `certwatch clear-status`: one pass over every route, logged as text.
fn clear_status(args: &certwatch::clear_status::ClearStatusArgs) -> ExitCode {
    init_logging(LogFormat::Text, None);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fatal(LogFormat::Text, "cannot start the async runtime", &error),
    };
    match runtime.block_on(certwatch::clear_status::clear_status(args)) {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => fatal(LogFormat::Text, "certwatch clear-status failed", &error),
    }
}

/// Installs the log subscriber, and in JSON mode a panic hook that logs panics as JSON
/// events too: a log collector then reads every line certwatch writes.
fn init_logging(format: LogFormat, level: Option<certwatch::logging::LogLevel>) {
    // kube-runtime's watcher logs every 403 it retries with a Debug dump of the error;
    // certwatch reports those failures itself (once per change, counted in /metrics),
    // so only the watcher's errors are kept. --log-level and RUST_LOG merge into this.
    certwatch::logging::init_with_level(format, "info,kube_runtime::watcher=error", level);
    if format == LogFormat::Json {
        std::panic::set_hook(Box::new(|panic| {
            let message = panic
                .payload()
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".to_owned());
            let location = panic
                .location()
                .map(ToString::to_string)
                .unwrap_or_default();
            let thread = std::thread::current();
            tracing::error!(
                panic = %message,
                location,
                thread = thread.name().unwrap_or("unnamed"),
                "a task panicked"
            );
        }));
    }
}

/// Reports the error that ends the process: a line on stderr in text mode, an `ERROR`
/// event in JSON mode (with `what` as its message and the error as its `error` field).
fn fatal(format: LogFormat, what: &str, error: &dyn std::error::Error) -> ExitCode {
    match format {
        LogFormat::Text if what.starts_with("cannot") => eprintln!("certwatch: {what}: {error}"),
        LogFormat::Text => eprintln!("certwatch: {error}"),
        LogFormat::Json => tracing::error!(error = %error, "{what}"),
    }
    ExitCode::FAILURE
}

/// A command line clap refuses: its message (status 2), as an `ERROR` event when the
/// command line (or `CERTWATCH_LOG_FORMAT`) asks for JSON logs. Help and version
/// requests print as usual. A lab command gets a message that names the lab's binary
/// instead of clap's.
fn command_line_error(argv: &[OsString], error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let display = matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if display {
        error.exit();
    }
    let lab = lab_command(argv, error.kind());
    if !asks_for_json(argv) {
        let Some(message) = lab else { error.exit() };
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    certwatch::logging::init(LogFormat::Json, "info");
    let message = lab.unwrap_or_else(|| error.render().to_string());
    tracing::error!(error = %message.trim_end(), "invalid command line");
    ExitCode::from(2)
}

/// For a command line refused because it asks for one of the lab's commands (`demo`,
/// `sim`, `bench`, or `run` with an `--embedded*` option): what to run instead.
fn lab_command(argv: &[OsString], kind: clap::error::ErrorKind) -> Option<String> {
    use clap::error::ErrorKind;
    let command = argv.get(1)?.to_str()?;
    let what = match kind {
        ErrorKind::InvalidSubcommand if LAB_COMMANDS.contains(&command) => {
            format!("`certwatch {command}` is a command of the lab, not of the daemon")
        }
        ErrorKind::UnknownArgument
            if command == "run"
                && argv[2..].iter().any(|arg| {
                    arg.to_str()
                        .is_some_and(|arg| arg.starts_with("--embedded"))
                }) =>
        {
            "a simulated cluster (`certwatch run --embedded`) is the lab's, not the daemon's"
                .to_owned()
        }
        _ => return None,
    };
    let example = if command == "run" {
        "run --embedded"
    } else {
        command
    };
    Some(format!(
        "{what}: run `{LAB_BINARY} {example}` with the same arguments. This binary is the \
production daemon (`run`, `clear-status`); build the lab with `cargo build --release -p \
{LAB_BINARY}`, or run `cargo run --release -p {LAB_BINARY} -- {example} ...` in the source tree."
    ))
}

/// Whether `--log-format json` (or `=json`) is on the command line, or
/// `CERTWATCH_LOG_FORMAT=json` in the environment, read without the parser (which
/// refused the command line).
fn asks_for_json(argv: &[OsString]) -> bool {
    let mut previous_was_flag = false;
    for arg in argv.iter().skip(1) {
        let arg = arg.to_string_lossy();
        if previous_was_flag && arg.eq_ignore_ascii_case("json") {
            return true;
        }
        if arg.eq_ignore_ascii_case("--log-format=json") {
            return true;
        }
        previous_was_flag = arg == "--log-format";
    }
    std::env::var("CERTWATCH_LOG_FORMAT").is_ok_and(|value| value.eq_ignore_ascii_case("json"))
}
