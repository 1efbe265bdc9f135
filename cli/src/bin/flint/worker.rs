//! `flint worker`: the standalone worker, which registers with the master and starts
//! executor processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flint_net::observe::metrics::ClusterRole;
use flint_net::standalone::worker::{WorkerConfig, WorkerError};

use crate::secrets::SecretArgs;
use crate::serving::{serve_cluster, ObserveArgs, Serving};

/// `flint worker`'s flags.
#[derive(Args)]
pub struct WorkerArgs {
    /// The master's address.
    #[arg(long)]
    master: SocketAddr,
    /// Cores to offer (1 to 65536).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    cores: u32,
    /// Memory to offer, in MiB (0 to 1099511627776).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=1 << 40))]
    memory_mb: u64,
    /// Where executors get their directories (default: a temporary directory per worker id).
    #[arg(long)]
    work_dir: Option<PathBuf>,
    /// Where to listen for `flint status --master ADDR` (this worker and its executors); the
    /// host and port it is known by. Default: no listener, known by the address it reaches the
    /// master from.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve Prometheus metrics about this worker on this address (needs --listen: they come
    /// from its status answer); the token rule of `flint master --metrics-listen`.
    #[arg(long, requires = "listen")]
    metrics_listen: Option<SocketAddr>,
    /// Serve this worker's web page and JSON API on this address (needs --listen).
    #[arg(long, requires = "listen")]
    ui_listen: Option<SocketAddr>,
    /// The observe token for --metrics-listen and --ui-listen (see `flint master --help`).
    #[arg(long)]
    observe_token_file: Option<PathBuf>,
    /// This worker's id: 1 to 64 letters, digits, '-', '_' or '.', not "." or ".." (default:
    /// worker-HOST-PORT with --listen, else worker-PID).
    #[arg(long, value_parser = parse_id)]
    id: Option<String>,
    /// Time between SIGTERM and SIGKILL when killing an executor, in milliseconds (0 to 600000).
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    kill_timeout_ms: u64,
    /// A program applications may name as their executor command, besides `flint executor`
    /// (repeatable). Any other command an application asks for is refused.
    #[arg(long = "allow-command", value_name = "PATH")]
    allow_commands: Vec<PathBuf>,
    /// The shared secret (the master's) is handed to the executors this worker starts.
    #[command(flatten)]
    secret: SecretArgs,
}

/// A worker id from the command line: what the worker's directories and the master accept.
fn parse_id(text: &str) -> Result<String, String> {
    if flint_net::standalone::worker::valid_id(text) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?} is not an id: use 1 to {} letters, digits, '-', '_' or '.', not \".\" or \"..\"",
            flint_net::standalone::worker::ID_LEN_MAX
        ))
    }
}

/// Runs `flint worker` until its registration is refused.
pub fn run(args: WorkerArgs) -> Result<ExitCode, String> {
    let secret = args.secret.required("flint worker")?;
    let id = args.id.clone().unwrap_or_else(|| default_id(args.listen));
    let mut config = WorkerConfig::new(args.master, id.clone(), args.cores, args.memory_mb);
    if let Some(dir) = args.work_dir {
        config.work_dir = dir;
    }
    config.listen = args.listen;
    let _servers = match args.listen {
        Some(status) if args.metrics_listen.is_some() || args.ui_listen.is_some() => {
            if status.port() == 0 {
                return Err(
                    "--metrics-listen and --ui-listen need a --listen port other than 0".into(),
                );
            }
            let observe = ObserveArgs {
                metrics_listen: args.metrics_listen,
                ui_listen: args.ui_listen,
                observe_token_file: args.observe_token_file.clone(),
            };
            serve_cluster(
                status,
                &observe,
                secret.clone(),
                ClusterRole::Worker,
                &format!("flint worker {id}"),
            )?
        }
        _ => Serving::default(),
    };
    config.secret = secret;
    config.allow_insecure_bind = args.secret.allow_insecure_bind;
    config.kill_timeout = Duration::from_millis(args.kill_timeout_ms);
    config.stop_on_signal = true;
    config.allowed_commands = args.allow_commands.clone();
    config.executor_program =
        std::env::current_exe().map_err(|e| format!("cannot find the flint binary: {e}"))?;
    eprintln!(
        "flint worker {id}: {} cores, {} MiB, work dir {}, master {}",
        args.cores,
        args.memory_mb,
        config.work_dir.display(),
        args.master
    );
    match flint_net::standalone::worker::run(config) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(error) => {
            eprintln!("flint worker {id}: {error}");
            Ok(ExitCode::from(match error {
                WorkerError::Refused(_) => 3,
                WorkerError::Start(_) => 1,
            }))
        }
    }
}

/// worker-HOST-PORT with a --listen port, else worker-PID.
fn default_id(listen: Option<SocketAddr>) -> String {
    match listen {
        // An IPv6 address's colons are no part of an id.
        Some(addr) if addr.port() != 0 => format!("worker-{}-{}", addr.ip(), addr.port()).replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '-',
            "-",
        ),
        _ => format!("worker-{}", std::process::id()),
    }
}
