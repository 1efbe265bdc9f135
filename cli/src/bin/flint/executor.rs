//! `flint executor`: connect to a driver and run its tasks until it stops this executor.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flint_engine::affinity::Pinning;
use flint_net::executor::{self, ExecutorConfig, ExecutorError};
use flint_net::Registry;

use crate::common::{pinning, EXECUTOR_CORES_MAX, WAIT_MAX_S};
use crate::secrets::SecretArgs;

/// `flint executor`'s flags.
#[derive(Args)]
pub struct ExecutorArgs {
    /// The driver's address.
    #[arg(long)]
    driver: SocketAddr,
    /// Task threads (1 to 1024), and as many lanes: connections to the driver, each with its
    /// own event-loop thread (at most 16; more cores share them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=EXECUTOR_CORES_MAX))]
    cores: u32,
    /// This executor's id (default: exec-PID): 1 to 128 letters, digits, '.', '_', '-', ':'.
    #[arg(long, value_parser = executor_id)]
    id: Option<String>,
    #[command(flatten)]
    secret: SecretArgs,
    /// How long to keep trying to reach the driver, in seconds (1 to 86,400).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=WAIT_MAX_S))]
    connect_timeout_s: u64,
    /// CPUs the task threads are pinned to, thread i on the i-th: a list like 0,2-3, or none
    /// (the default: not pinned).
    #[arg(long, default_value = "none", value_parser = pinning)]
    pin_cores: Pinning,
}

/// Runs `flint executor`.
pub fn run(args: ExecutorArgs) -> Result<ExitCode, String> {
    args.secret.listens_nowhere("flint executor")?;
    if let Some(worker_pid) = std::env::var_os(WORKER_PID_ENV) {
        watch_worker(worker_pid.to_string_lossy().parse().ok());
    }
    let id = args
        .id
        .unwrap_or_else(|| format!("exec-{}", std::process::id()));
    let config = ExecutorConfig {
        cores: args.cores,
        secret: args.secret.optional()?,
        connect_timeout: Duration::from_secs(args.connect_timeout_s),
        pin: args.pin_cores,
        drain_on_sigterm: executor::drain_timeout_from_env()?,
        ..ExecutorConfig::new(args.driver, id.clone())
    };
    match executor::run(config, Registry::with_builtins()) {
        Ok(summary) => {
            say_whole_line(&format!(
                "flint executor {id}: ran {} task attempts",
                summary.task_attempts
            ));
            Ok(ExitCode::SUCCESS)
        }
        Err(error) => {
            say_whole_line(&format!("flint executor {id}: {error}"));
            Ok(ExitCode::from(match error {
                ExecutorError::Refused(_) => 3,
                _ => 1,
            }))
        }
    }
}

/// `--id`: 1 to 128 characters out of letters, digits, `.`, `_`, `-` and `:`.
fn executor_id(text: &str) -> Result<String, String> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':');
    if text.is_empty() || text.len() > 128 || !text.chars().all(valid) {
        return Err(format!(
            "{:?} is not an executor id: use 1 to 128 letters, digits, '.', '_', '-' or ':'",
            text.chars().take(64).collect::<String>()
        ));
    }
    Ok(text.to_owned())
}

/// Set by a standalone worker for the executors it starts: its own pid.
const WORKER_PID_ENV: &str = "FLINT_WORKER_PID";

/// An executor started by a worker exits when that worker dies (Spark's `WorkerWatcher`): it
/// checks every 200 ms that its parent is still the worker (a dead parent's children are
/// reparented), so a killed worker does not leave executors the master has declared lost.
fn watch_worker(worker_pid: Option<u32>) {
    let parent = std::os::unix::process::parent_id();
    let gone = move || match worker_pid {
        Some(pid) => std::os::unix::process::parent_id() != pid,
        None => std::os::unix::process::parent_id() != parent,
    };
    let watcher = std::thread::Builder::new()
        .name("flint-worker-watch".into())
        .spawn(move || loop {
            if gone() {
                eprintln!("flint executor: its worker is gone; exiting");
                std::process::exit(1);
            }
            std::thread::sleep(Duration::from_millis(200));
        });
    if let Err(error) = watcher {
        eprintln!("flint executor: cannot watch the worker: {error}");
    }
}

/// Writes `line` and a newline to stderr in one write, so the lines of executors sharing a
/// terminal (`flint local`) do not interleave mid-line as `eprintln!`'s several writes can.
fn say_whole_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
