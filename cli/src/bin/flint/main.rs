//! `flint`: run a local cluster, a driver, or an executor from the command line; run a standalone
//! cluster (`master`, `worker`), submit a job to it (`submit`) and look at it (`status`).
//!
//! One file per command, each with its flags (`XArgs`) and its `run`; what several share lives
//! in `common.rs` (limits, parsers, waiting), `secrets.rs` (the shared-secret flags, one group
//! every command that meets a peer flattens in) and `serving.rs` (metrics and web UI flags and
//! servers). The command files import those three and never each other.

mod common;
mod driver;
mod executor;
mod local;
mod master;
mod secrets;
mod serving;
mod status;
mod submit;
mod worker;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "flint",
    version,
    about = "Flint: a lock-free task scheduling engine",
    propagate_version = true
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
    /// How log lines look on stderr: `text`, or `json` (one JSON object per line, with the
    /// spans: job, task attempt). Which lines: $RUST_LOG (default info for master and worker,
    /// warn otherwise). $FLINT_LOG_FORMAT=json does the same (executors a `flint local` or a
    /// worker starts inherit it).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a driver and executor processes on this machine, run a job, print a summary.
    Local(local::LocalArgs),
    /// Listen for executors, wait for N of them, run a job, stop them, print a summary.
    Driver(driver::DriverArgs),
    /// Connect to a driver and run its tasks until it stops this executor.
    Executor(executor::ExecutorArgs),
    /// Run a standalone master: workers register with it, applications get executors from it.
    Master(master::MasterArgs),
    /// Run a standalone worker: registers with the master and starts executor processes.
    Worker(worker::WorkerArgs),
    /// Run a job on a standalone cluster: a driver that gets its executors from the master.
    Submit(submit::SubmitArgs),
    /// Show a standalone master's workers, applications and executors.
    Status(status::StatusArgs),
}

fn main() -> ExitCode {
    // `submit --master k8s://...` belongs to flint-k8s: hand over before parsing.
    if let Some(code) = k8s_submit() {
        return code;
    }
    let cli = Cli::parse();
    init_logging(&cli);
    let result = match cli.command {
        Cmd::Local(args) => local::run(args),
        Cmd::Driver(args) => driver::run(args),
        Cmd::Executor(args) => executor::run(args),
        Cmd::Master(args) => master::run(args),
        Cmd::Worker(args) => worker::run(args),
        Cmd::Submit(args) => submit::run(args),
        Cmd::Status(args) => status::run(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint: {message}");
            ExitCode::from(2)
        }
    }
}

/// Logging to stderr: $RUST_LOG's filter (info for the daemons, warn otherwise), text or JSON.
fn init_logging(cli: &Cli) {
    // Daemons say at info what they do (connection attempts and their backoff included).
    let default_filter = match cli.command {
        Cmd::Master(_) | Cmd::Worker(_) => "info",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| default_filter.into());
    // Executors this process starts (flint local, a worker's) log the same way.
    let log_format = match std::env::var("FLINT_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => cli.log_format,
    };
    if log_format == LogFormat::Json {
        // Single-threaded still: nothing else reads the environment yet.
        std::env::set_var("FLINT_LOG_FORMAT", "json");
    }
    match log_format {
        LogFormat::Text => tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
        LogFormat::Json => tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init(),
    }
}

/// `flint submit --master k8s://...` runs `flint-k8s` (found beside this binary) with the same
/// arguments: the Kubernetes client lives in its own crate, which depends on this one.
fn k8s_submit() -> Option<ExitCode> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let text: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let k8s = text.first().is_some_and(|c| c == "submit")
        && text.iter().enumerate().any(|(i, a)| {
            a.starts_with("--master=k8s://")
                || (a == "--master" && text.get(i + 1).is_some_and(|m| m.starts_with("k8s://")))
        });
    if !k8s {
        return None;
    }
    let exe = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("flint-k8s")));
    let Some(exe) = exe.filter(|exe| exe.is_file()) else {
        eprintln!(
            "flint: --master k8s://... needs the flint-k8s binary beside flint; build it with \
             `cargo build --release -p flint-k8s`"
        );
        return Some(ExitCode::from(2));
    };
    use std::os::unix::process::CommandExt;
    let error = std::process::Command::new(&exe).args(&args).exec();
    eprintln!("flint: cannot run {}: {error}", exe.display());
    Some(ExitCode::from(2))
}
