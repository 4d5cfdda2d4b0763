//! certwatch: watches the per-route Kubernetes TLS secrets that ingress routes
//! reference and serves them to a proxy. This file only wires the command line to the
//! library; the lab's commands (`demo`, `sim`, `bench`, an embedded run) are handed to
//! the `certwatch-lab` binary, which the production build does not contain.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
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

/// The lab's binary, looked for beside this one, then on PATH.
const LAB_BINARY: &str = "certwatch-lab";

#[derive(Debug, Parser)]
#[command(
    name = "certwatch",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CERTWATCH_COMMIT"), ")"),
    about = "Watches per-route Kubernetes TLS secrets and serves them to an ingress proxy",
    after_help = "demo, sim and bench are the lab's (certwatch-lab, built with \
`cargo build --release -p certwatch-lab`): this binary runs certwatch-lab with the same \
arguments when it is installed beside it or on PATH. So does `certwatch run --embedded`."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    Run(Box<certwatch::RunArgs>),
    ClearStatus(certwatch::clear_status::ClearStatusArgs),
    /// The seed's scale against the embedded simulator (lab: certwatch-lab demo).
    #[command(disable_help_flag = true)]
    Demo(LabArgs),
    /// The Kubernetes API simulator on its own (lab: certwatch-lab sim).
    #[command(disable_help_flag = true)]
    Sim(LabArgs),
    /// Start-up benchmarks (lab: certwatch-lab bench).
    #[command(disable_help_flag = true)]
    Bench(LabArgs),
}

/// A lab command's arguments, passed on as they are.
#[derive(Debug, clap::Args)]
struct LabArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    args: Vec<OsString>,
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    if is_embedded_run(&argv) {
        return hand_to_lab(&argv);
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(error) => return command_line_error(&argv, &error),
    };
    let args = match cli.command {
        Command::Run(args) => args,
        Command::ClearStatus(args) => return clear_status(&args),
        Command::Demo(_) | Command::Sim(_) | Command::Bench(_) => return hand_to_lab(&argv),
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
/// requests print as usual.
fn command_line_error(argv: &[OsString], error: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let display = matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if display || !asks_for_json(argv) {
        error.exit();
    }
    certwatch::logging::init(LogFormat::Json, "info");
    let message = error.render().to_string();
    tracing::error!(error = %message.trim_end(), "invalid command line");
    ExitCode::from(2)
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

/// `certwatch run` with an `--embedded*` flag, or `CERTWATCH_EMBEDDED` set: a run
/// against the lab's simulator.
fn is_embedded_run(argv: &[OsString]) -> bool {
    if argv.get(1).map(OsString::as_os_str) != Some(OsStr::new("run")) {
        return false;
    }
    let flagged = argv[2..].iter().any(|arg| {
        arg.to_str()
            .is_some_and(|arg| arg.starts_with("--embedded"))
    });
    let from_env = std::env::var("CERTWATCH_EMBEDDED").is_ok_and(|value| {
        matches!(
            value.to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on" | "y"
        )
    });
    flagged || from_env
}

/// Replaces this process with `certwatch-lab` and the same arguments (same pid, so
/// signals reach the lab's command as they would have reached this one).
fn hand_to_lab(argv: &[OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt as _;
    let command = argv
        .get(1)
        .map_or_else(String::new, |arg| arg.to_string_lossy().into_owned());
    let Some(lab) = find_lab() else {
        eprintln!(
            "certwatch: `certwatch {command}` is a lab command, and {LAB_BINARY} is neither \
beside this binary nor on PATH: the production build contains the daemon only. Build the lab \
with `cargo build --release -p certwatch-lab`, or run `cargo run --release -p certwatch-lab -- \
{command} ...` from the source tree."
        );
        return ExitCode::from(2);
    };
    let error = std::process::Command::new(&lab).args(&argv[1..]).exec();
    eprintln!("certwatch: cannot run {}: {error}", lab.display());
    ExitCode::FAILURE
}

fn find_lab() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join(LAB_BINARY)));
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join(LAB_BINARY));
    beside
        .into_iter()
        .chain(on_path)
        .find(|path| path.is_file())
}
