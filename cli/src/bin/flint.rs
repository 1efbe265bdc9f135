//! `flint`: run a local cluster, a driver, or an executor from the command line; run a standalone
//! cluster (`master`, `worker`), submit a job to it (`submit`) and look at it (`status`).

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use flint_cli::run::{
    driver_config, exit_code, json_or_plain, print_summary, run_job, validate, JobArgs,
};
use flint_engine::affinity::Pinning;
use flint_engine::lifecycle::{AllocatorConfig, DynamicConfig};
use flint_engine::standalone::{AppSpec, Config as StandaloneConfig, NO_WORKER_FITS};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig, ExecutorError};
use flint_net::handshake::Secret;
use flint_net::lifecycle::local::{LocalConfig, LocalExecutors, LocalStats};
use flint_net::lifecycle::master_source::{MasterScaler, MasterSource};
use flint_net::lifecycle::mirror::{MirrorConfig, SourceMirror};
use flint_net::observe::http::{Access, HttpServer};
use flint_net::observe::metrics::ClusterRole;
use flint_net::observe::token::ObserveToken;
use flint_net::observe::ui::{self, Serve};
use flint_net::observe::{ClusterView, EventSink};
use flint_net::standalone::app_client::{AppClient, AppClientConfig, AppInfo};
use flint_net::standalone::master::{MasterConfig, MasterHandle};
use flint_net::standalone::worker::{WorkerConfig, WorkerError};
use flint_net::standalone::BlockingClient;
use flint_net::wire::{AppStatus, ExecutorStatus, List, Message, Role, WorkerStatus};
use flint_net::Registry;

/// The environment variable that carries the shared secret.
const SECRET_ENV: &str = "FLINT_SECRET";

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

/// Serving what a role shows: Prometheus metrics and the web UI.
#[derive(Args, Clone, Default)]
struct ObserveArgs {
    /// Serve Prometheus metrics (OpenMetrics text at /metrics) on this address. With a shared
    /// secret every request needs it as a token (`?token=` or `Authorization: Bearer`);
    /// without one, loopback addresses only.
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Serve the web UI (HTML at /, refreshed every 2 s, read-only; /metrics too) on this
    /// address; the same token rule as --metrics-listen.
    #[arg(long)]
    ui_listen: Option<SocketAddr>,
}

/// The same for drivers, which end with their job.
#[derive(Args, Clone, Default)]
struct DriverObserveArgs {
    #[command(flatten)]
    serve: ObserveArgs,
    /// With --metrics-listen or --ui-listen: keep serving this long after the job ends (before
    /// executors stop), so a last scrape or look sees its end, in milliseconds (0 to 3600000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    observe_linger_ms: u64,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a driver and executor processes on this machine, run a job, print a summary.
    Local(LocalArgs),
    /// Listen for executors, wait for N of them, run a job, stop them, print a summary.
    Driver(DriverArgs),
    /// Connect to a driver and run its tasks until it stops this executor.
    Executor(ExecutorArgs),
    /// Run a standalone master: workers register with it, applications get executors from it.
    Master(MasterArgs),
    /// Run a standalone worker: registers with the master and starts executor processes.
    Worker(WorkerArgs),
    /// Run a job on a standalone cluster: a driver that gets its executors from the master.
    Submit(SubmitArgs),
    /// Show a standalone master's workers, applications and executors.
    Status(StatusArgs),
}

#[derive(Args)]
struct MasterArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Directory for the journal of workers and applications; a restarted master recovers them.
    /// The master's shared secret is kept here too (`secret`, mode 0600) unless --secret-file
    /// or $FLINT_SECRET names one.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// A worker silent this long is dead, in milliseconds (100 to 3600000). Spark's default is
    /// 60 s; 15 s notices a lost host four times sooner while tolerating a dozen missed
    /// heartbeats (one a second).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    worker_timeout_ms: u64,
    /// How often workers heartbeat, in milliseconds (10 to 60000, and below
    /// --worker-timeout-ms).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_interval_ms: u64,
    /// How long a restarted master waits for journaled workers and drivers, in milliseconds
    /// (0 to 3600000; default: the worker timeout).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    recovery_timeout_ms: Option<u64>,
    /// Pack executors onto as few workers as possible (default: spread them out).
    #[arg(long)]
    packed: bool,
    /// Abnormal executor exits in a row, with none running, that remove an application
    /// (1 to 10000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_executor_retries: u32,
    /// Cores an application that sets no maximum of its own gets at most (1 to 1000000;
    /// Spark's spark.deploy.defaultCores), so one application cannot take the whole cluster.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    default_cores: u32,
    /// An executor a worker has not reported running this long after its launch is marked
    /// failed and placed elsewhere, in milliseconds (100 to 3600000).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    launch_timeout_ms: u64,
    /// File holding the shared secret; created (random, mode 0600) if it does not exist.
    /// Default: $FLINT_SECRET if set, else STATE_DIR/secret, else a new file in a fresh
    /// temporary directory. The master prints where it is.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without a shared secret: anyone who can reach the master can register workers and
    /// applications (and so run executors on the workers). Loopback only, unless
    /// --allow-insecure-bind.
    #[arg(long)]
    insecure: bool,
    /// With --insecure: listen on a non-loopback address too.
    #[arg(long)]
    allow_insecure_bind: bool,
    #[command(flatten)]
    observe: ObserveArgs,
}

#[derive(Args)]
struct WorkerArgs {
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
    /// Serve this worker's web page on this address (needs --listen).
    #[arg(long, requires = "listen")]
    ui_listen: Option<SocketAddr>,
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
    /// File holding the master's shared secret (the file `flint master` printed); else
    /// $FLINT_SECRET. Executors this worker starts get it too.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without a shared secret (the master must run with --insecure too).
    #[arg(long)]
    insecure: bool,
}

#[derive(Args)]
struct SubmitArgs {
    /// The master's address.
    #[arg(long)]
    master: SocketAddr,
    /// Executors to ask for (and wait for before the job starts), 1 to 10000.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    executors: u32,
    /// Cores per executor (1 to 65536).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    cores: u32,
    /// Memory per executor, in MiB (0 to 1099511627776).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=1 << 40))]
    memory_mb: u64,
    /// The application's name.
    #[arg(long, default_value = "flint-submit")]
    name: String,
    /// Address the driver listens on for executors (must be reachable from the workers).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// How long to wait for the executors, in seconds (1 to 86400).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    wait_s: u64,
    /// File holding the master's shared secret (the file `flint master` printed); else
    /// $FLINT_SECRET. The workers give their executors their own copy.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without a shared secret (the master must run with --insecure too).
    #[arg(long)]
    insecure: bool,
    /// With --insecure: listen on a non-loopback address too.
    #[arg(long)]
    allow_insecure_bind: bool,
    /// Print a line per executor state change the master reports and per executor the
    /// lifecycle handler removes from the scheduler.
    #[arg(long)]
    executor_events: bool,
    /// Dynamic allocation through the master: between --executors and this many executors
    /// (1 to 10000), following the backlog; executors idle for --idle-timeout-ms are killed.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_executors: Option<u32>,
    /// With --max-executors: an executor idle this long is released, in milliseconds
    /// (0 to 86400000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(0..=86_400_000))]
    idle_timeout_ms: u64,
    /// With --max-executors: after the job, wait up to this long (milliseconds, 0 to 3600000)
    /// for idle executors to be released down to --executors (shows in `executors_end`).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    idle_wait_ms: u64,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    observe: DriverObserveArgs,
}

#[derive(Args)]
struct StatusArgs {
    /// The master's address (or a worker's `--listen` address, for that worker alone).
    #[arg(long)]
    master: SocketAddr,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// How long to wait for the answer, in milliseconds (1 to 600000).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    /// File holding the master's shared secret (the file `flint master` printed); else
    /// $FLINT_SECRET.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Run without a shared secret (the master must run with --insecure too).
    #[arg(long)]
    insecure: bool,
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

/// The most task threads a stock `flint executor` runs (its queues grow with them; a bigger
/// machine runs more executors). The driver accepts claims up to
/// `flint_net::driver::EXECUTOR_CORES_MAX` from executors built on `executor::run`.
const EXECUTOR_CORES_MAX: i64 = 256;
/// The longest any command waits for something, in seconds: one day.
const WAIT_MAX_S: u64 = 86_400;

/// `--pin-cores`: `none` or a list of CPUs in this process's affinity mask.
fn pinning(text: &str) -> Result<Pinning, String> {
    Pinning::parse(text).map_err(|e| e.to_string())
}

/// `--pin-cores` for `flint local`: `auto` (the CPUs of the affinity mask), `none`, or a list.
fn local_pinning(text: &str) -> Result<Pinning, String> {
    match text {
        "auto" => Ok(Pinning::all()),
        other => pinning(other),
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

#[derive(Args)]
struct LocalArgs {
    /// Executor processes to keep running (without --dynamic; 1 to 64); one that dies is
    /// replaced.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    executors: u32,
    /// Cores (task threads) per executor (1 to 256).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=EXECUTOR_CORES_MAX))]
    cores: u32,
    /// CPUs the executors are pinned to, each on CPUs no other holds (executors beyond what the
    /// CPUs hold are not pinned): auto (the default: every CPU this process may use), none, or
    /// a list like 0,2-3.
    #[arg(long, default_value = "auto", value_parser = local_pinning)]
    pin_cores: Pinning,
    /// Dynamic allocation: the executor count follows the backlog between --min-executors and
    /// --max-executors; executors idle for --idle-timeout-ms are released.
    #[arg(long)]
    dynamic: bool,
    /// With --dynamic: the fewest executors (0 to 64).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=64))]
    min_executors: u32,
    /// With --dynamic: the most executors (1 to 64).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    max_executors: u32,
    /// With --dynamic: an executor idle this long is released, in milliseconds (1 to
    /// 86,400,000).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=WAIT_MAX_S * 1000))]
    idle_timeout_ms: u64,
    /// Executors started at most per round (1 to 64).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    batch_size: u32,
    /// Time between rounds of starting executors, in milliseconds (1 to 60,000).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    batch_delay_ms: u64,
    /// An executor not registered this long after it was started is killed and replaced, in
    /// milliseconds (100 to 3,600,000).
    #[arg(long, default_value_t = 15000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pending_timeout_ms: u64,
    /// Executor failures tolerated (0 to 10,000); one more stops the application with an error.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    max_executor_failures: u32,
    /// After the job, wait up to this long for dynamic allocation to release idle executors
    /// down to --min-executors (shows in `executors_end`), in milliseconds (0 to 3,600,000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    idle_wait_ms: u64,
    /// Print a line per executor event (started with its pid, registered, exited, deleted).
    #[arg(long)]
    executor_events: bool,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    observe: DriverObserveArgs,
}

#[derive(Args)]
struct DriverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Executors to wait for before the job starts (1 to 100,000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    executors: u64,
    /// How long to wait for them, in seconds (1 to 86,400).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=WAIT_MAX_S))]
    wait_s: u64,
    /// File holding the shared secret (else $FLINT_SECRET, else none).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Listen on a non-loopback address without a secret.
    #[arg(long)]
    allow_insecure_bind: bool,
    /// CPU the driver's loop is pinned to: a list like 0 (its first CPU is used), or none (the
    /// default: not pinned).
    #[arg(long, default_value = "none", value_parser = pinning)]
    pin_cores: Pinning,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    observe: DriverObserveArgs,
}

#[derive(Args)]
struct ExecutorArgs {
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
    /// File holding the shared secret (else $FLINT_SECRET, else none).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// How long to keep trying to reach the driver, in seconds (1 to 86,400).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=WAIT_MAX_S))]
    connect_timeout_s: u64,
    /// CPUs the task threads are pinned to, thread i on the i-th: a list like 0,2-3, or none
    /// (the default: not pinned).
    #[arg(long, default_value = "none", value_parser = pinning)]
    pin_cores: Pinning,
}

fn main() -> ExitCode {
    // `submit --master k8s://...` belongs to flint-k8s: hand over before parsing.
    if let Some(code) = k8s_submit() {
        return code;
    }
    let cli = Cli::parse();
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
    let result = match cli.command {
        Cmd::Local(args) => local(args),
        Cmd::Driver(args) => driver(args),
        Cmd::Executor(args) => executor(args),
        Cmd::Master(args) => master(args),
        Cmd::Worker(args) => worker(args),
        Cmd::Submit(args) => submit(args),
        Cmd::Status(args) => status(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint: {message}");
            ExitCode::from(2)
        }
    }
}

/// Who may read the metrics and pages: with a cluster secret, holders of an observe token of
/// their own (never the secret), made in a new private file whose path is printed; without
/// one, anyone on loopback.
fn observe_access(secret: Option<&Secret>, who: &str) -> Result<Access, String> {
    if secret.is_none() {
        return Ok(Access::Open);
    }
    let (token, path) = ObserveToken::create_in_temp_dir().map_err(|e| e.to_string())?;
    eprintln!(
        "{who}: observe token in {} (Authorization: Bearer TOKEN, or paste it into the page)",
        path.display()
    );
    Ok(Access::Token(token))
}

/// Starts the metrics and UI servers `args` asks for, watching `driver`; `who` names it in
/// what is printed. The token is never printed.
fn serve_driver(
    driver: &Driver,
    args: &ObserveArgs,
    secret: Option<Secret>,
    who: &str,
) -> Result<Vec<HttpServer>, String> {
    let mut servers = Vec::new();
    if args.metrics_listen.is_none() && args.ui_listen.is_none() {
        return Ok(servers);
    }
    let access = observe_access(secret.as_ref(), who)?;
    for (addr, serve, what) in [
        (args.metrics_listen, Serve::Metrics, "metrics"),
        (args.ui_listen, Serve::UiAndMetrics, "web UI"),
    ] {
        if let Some(addr) = addr {
            let server = ui::serve_driver(addr, driver.observer(), access.clone(), serve)
                .map_err(|e| format!("{what}: {e}"))?;
            announce(who, what, &server);
            servers.push(server);
        }
    }
    Ok(servers)
}

/// Starts the metrics and UI servers of a master or worker answering status at `status`.
fn serve_cluster(
    status: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    ui_listen: Option<SocketAddr>,
    secret: Option<Secret>,
    role: ClusterRole,
    who: &str,
) -> Result<Vec<HttpServer>, String> {
    let mut servers = Vec::new();
    if metrics_listen.is_none() && ui_listen.is_none() {
        return Ok(servers);
    }
    let access = observe_access(secret.as_ref(), who)?;
    for (addr, serve, what) in [
        (metrics_listen, Serve::Metrics, "metrics"),
        (ui_listen, Serve::UiAndMetrics, "web UI"),
    ] {
        if let Some(addr) = addr {
            let server =
                ui::serve_cluster(addr, status, secret.clone(), access.clone(), role, serve)
                    .map_err(|e| format!("{what}: {e}"))?;
            announce(who, what, &server);
            servers.push(server);
        }
    }
    Ok(servers)
}

fn announce(who: &str, what: &str, server: &HttpServer) {
    let path = if what == "metrics" { "metrics" } else { "" };
    eprintln!("{who}: {what} on http://{}/{path}", server.local_addr());
}

/// Keeps serving after the job when asked (see `--observe-linger-ms`).
fn linger(args: &DriverObserveArgs) {
    let serving = args.serve.metrics_listen.is_some() || args.serve.ui_listen.is_some();
    if serving && args.observe_linger_ms > 0 {
        std::thread::sleep(Duration::from_millis(args.observe_linger_ms));
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

fn load_secret(file: Option<&PathBuf>) -> Result<Option<Secret>, String> {
    match file {
        Some(path) => Secret::from_file(path).map(Some),
        None => Secret::from_env(SECRET_ENV),
    }
    .map_err(|e| e.to_string())
}

/// The shared secret a worker, `flint submit` or `flint status` proves to the master: required
/// unless `--insecure`.
fn cluster_secret(
    file: Option<&PathBuf>,
    insecure: bool,
    who: &str,
) -> Result<Option<Secret>, String> {
    if insecure {
        if file.is_some() {
            return Err("--insecure and --secret-file exclude each other".into());
        }
        tracing::warn!("{who}: --insecure: no shared secret, nothing authenticates the master");
        return Ok(None);
    }
    match load_secret(file)? {
        Some(secret) => Ok(Some(secret)),
        None => Err(format!(
            "no shared secret: pass --secret-file PATH (the file `flint master` printed when it \
             started, e.g. STATE_DIR/secret) or set ${SECRET_ENV}; --insecure runs without one \
             (the master must too)"
        )),
    }
}

/// The master's shared secret and where it came from: --secret-file (created if missing),
/// $FLINT_SECRET, STATE_DIR/secret (created if missing), or a new file in a fresh directory.
fn master_secret(args: &MasterArgs) -> Result<Option<(Secret, String)>, String> {
    if args.insecure {
        if args.secret_file.is_some() {
            return Err("--insecure and --secret-file exclude each other".into());
        }
        tracing::warn!(
            "flint master: --insecure: no shared secret; anyone who can reach {} can register \
             workers and applications, and so run executors on the workers",
            args.listen
        );
        return Ok(None);
    }
    let path = match (&args.secret_file, &args.state_dir) {
        (Some(path), _) => path.clone(),
        (None, state_dir) => {
            if let Some(secret) = Secret::from_env(SECRET_ENV).map_err(|e| e.to_string())? {
                return Ok(Some((secret, format!("${SECRET_ENV}"))));
            }
            match state_dir {
                Some(dir) => {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| format!("cannot create state dir {}: {e}", dir.display()))?;
                    dir.join("secret")
                }
                None => {
                    use std::os::unix::fs::DirBuilderExt;
                    // A name of its own (not derived from the secret), made here with mode 0700,
                    // so nothing planted in the temporary directory beforehand is used.
                    let tag: String = flint_net::handshake::random_nonce()
                        .map_err(|e| format!("no randomness: {e}"))?
                        .iter()
                        .take(6)
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    let dir = std::env::temp_dir().join(format!("flint-master-{tag}"));
                    std::fs::DirBuilder::new()
                        .mode(0o700)
                        .create(&dir)
                        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
                    dir.join("secret")
                }
            }
        }
    };
    if path.exists() {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    "secret file {} is readable by other users; chmod 600 it",
                    path.display()
                );
            }
        }
        let secret = Secret::from_file(&path).map_err(|e| e.to_string())?;
        return Ok(Some((secret, path.display().to_string())));
    }
    let secret = Secret::generate().map_err(|e| format!("no randomness: {e}"))?;
    secret.write_new_file(&path).map_err(|e| e.to_string())?;
    Ok(Some((secret, path.display().to_string())))
}

fn local(args: LocalArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    // Local processes share a fresh random secret, so nothing else on this machine can join.
    let secret_text = local_secret()?;
    let config = DriverConfig {
        secret: Some(Secret::new(secret_text.clone().into_bytes()).map_err(|e| e.to_string())?),
        ..driver_config(&args.job)
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    // The local secret is nobody's to know: these serve on loopback only, without a token.
    let _servers = serve_driver(&driver, &args.observe.serve, None, "flint local")?;
    let addr = driver.local_addr().ok_or("the driver has no address")?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the flint binary: {e}"))?;
    let (initial, dynamic) = local_allocation(&args)?;
    let mut local_config = LocalConfig::new(exe, addr);
    local_config.cores = args.cores;
    local_config.events = args.executor_events;
    local_config.on_event = Some(EventSink::new(|line| eprintln!("flint local: {line}")));
    if let Pinning::Cores(cpus) = &args.pin_cores {
        local_config.pin_cpus = cpus.clone();
    }
    local_config.env = vec![(SECRET_ENV.to_string(), secret_text)];
    local_config.allocator = AllocatorConfig {
        batch_size: args.batch_size.max(1),
        batch_delay_us: args.batch_delay_ms.saturating_mul(1000),
        pending_timeout_us: args.pending_timeout_ms.saturating_mul(1000),
        failures_max: args.max_executor_failures,
        initial_target: initial,
        dynamic,
        name_prefix: "local-".into(),
    };
    let driver = Arc::new(driver);
    let executors =
        LocalExecutors::start(local_config, driver.clone()).map_err(|e| e.to_string())?;
    let failed = || executors.failed();
    // With --dynamic --min-executors 0 nothing starts before the job's backlog asks for it.
    let result = wait_for(&driver, initial as usize, &failed)
        .and_then(|()| run_job(&driver, &args.job, &failed));
    linger(&args.observe);
    if result.is_ok() && args.dynamic && args.idle_wait_ms > 0 {
        wait_for_release(args.idle_wait_ms, || {
            executors.stats().registered > u64::from(args.min_executors)
        });
    }
    let stats = executors.stats();
    executors.freeze();
    let _ = driver.stop_executors(Duration::from_secs(5));
    executors.shutdown(Duration::from_secs(5));
    drop(driver);
    let summary = result?;
    print_summary(&summary, &args.job, &local_fields(&args, &stats));
    Ok(exit_code(&summary))
}

/// A fresh random secret for `flint local`'s processes, as hex text (it goes in their
/// environment).
fn local_secret() -> Result<String, String> {
    let nonce = flint_net::handshake::random_nonce().map_err(|e| format!("no randomness: {e}"))?;
    Ok(nonce
        .iter()
        .map(|b| char::from(b"0123456789abcdef"[(b & 15) as usize]))
        .collect())
}

/// How many executors `flint local` starts with, and with `--dynamic` between which bounds it
/// scales.
fn local_allocation(args: &LocalArgs) -> Result<(u32, Option<DynamicConfig>), String> {
    if !args.dynamic {
        return Ok((args.executors, None));
    }
    if args.min_executors > args.max_executors || args.max_executors == 0 {
        return Err(
            "--min-executors must be at most --max-executors, which must be at least 1".into(),
        );
    }
    let dynamic = DynamicConfig {
        min: args.min_executors,
        max: args.max_executors,
        tasks_per_executor: args.cores.saturating_mul(args.job.tasks_per_core),
        idle_timeout_us: args.idle_timeout_ms.saturating_mul(1000),
    };
    Ok((args.min_executors, Some(dynamic)))
}

/// The summary's fields for `flint local` beyond the job's.
fn local_fields(args: &LocalArgs, stats: &LocalStats) -> Vec<(&'static str, String)> {
    let mut fields = vec![
        ("cores", args.cores.to_string()),
        ("executors_started", stats.started.to_string()),
        ("executors_peak", stats.peak.to_string()),
        ("executors_end", stats.registered.to_string()),
        ("executors_deleted", stats.deleted.to_string()),
        ("executors_failed", stats.failed.to_string()),
    ];
    if args.dynamic {
        fields.push(("min_executors", args.min_executors.to_string()));
        fields.push(("max_executors", args.max_executors.to_string()));
    } else {
        fields.push(("executors", args.executors.to_string()));
    }
    fields
}

/// Waits (up to 30 s) until `count` executors are registered, or the allocator gives up.
fn wait_for(
    driver: &Driver,
    count: usize,
    failed: &dyn Fn() -> Option<String>,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while driver.executors() < count {
        if let Some(reason) = failed() {
            return Err(reason);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out waiting for {count} executors ({} registered)",
                driver.executors()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

fn driver(args: DriverArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    let config = DriverConfig {
        listen: args.listen,
        secret: load_secret(args.secret_file.as_ref())?,
        allow_insecure_bind: args.allow_insecure_bind,
        pin: args.pin_cores.clone(),
        ..driver_config(&args.job)
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    let secret = load_secret(args.secret_file.as_ref())?;
    let _servers = serve_driver(&driver, &args.observe.serve, secret, "flint driver")?;
    eprintln!(
        "flint driver: listening on {}, waiting for {} executors",
        args.listen, args.executors
    );
    let result = driver
        .wait_for_executors(args.executors as usize, Duration::from_secs(args.wait_s))
        .map_err(|e| e.to_string())
        .and_then(|()| run_job(&driver, &args.job, &|| None));
    linger(&args.observe);
    let _ = driver.stop_executors(Duration::from_secs(5));
    driver.shutdown();
    let summary = result?;
    print_summary(
        &summary,
        &args.job,
        &[("executors", args.executors.to_string())],
    );
    Ok(exit_code(&summary))
}

fn executor(args: ExecutorArgs) -> Result<ExitCode, String> {
    if let Some(worker_pid) = std::env::var_os(WORKER_PID_ENV) {
        watch_worker(worker_pid.to_string_lossy().parse().ok());
    }
    let id = args
        .id
        .unwrap_or_else(|| format!("exec-{}", std::process::id()));
    let config = ExecutorConfig {
        cores: args.cores,
        secret: load_secret(args.secret_file.as_ref())?,
        connect_timeout: Duration::from_secs(args.connect_timeout_s),
        pin: args.pin_cores,
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

fn master(args: MasterArgs) -> Result<ExitCode, String> {
    if args.heartbeat_interval_ms >= args.worker_timeout_ms {
        return Err(format!(
            "--heartbeat-interval-ms ({}) must be below --worker-timeout-ms ({})",
            args.heartbeat_interval_ms, args.worker_timeout_ms
        ));
    }
    let secret = master_secret(&args)?;
    let worker_timeout_us = args.worker_timeout_ms.saturating_mul(1000);
    let config = MasterConfig {
        listen: args.listen,
        allow_insecure_bind: args.allow_insecure_bind,
        secret: secret.as_ref().map(|(secret, _)| secret.clone()),
        state_dir: args.state_dir.clone(),
        heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
        master: StandaloneConfig {
            worker_timeout_us,
            spread_out: !args.packed,
            max_executor_retries: args.max_executor_retries,
            recovery_timeout_us: args
                .recovery_timeout_ms
                .map_or(worker_timeout_us, |ms| ms.saturating_mul(1000)),
            default_cores: args.default_cores,
            launch_timeout_us: args.launch_timeout_ms.saturating_mul(1000),
            ..StandaloneConfig::default()
        },
        ..MasterConfig::default()
    };
    let master = MasterHandle::start(config).map_err(|e| e.to_string())?;
    let status_addr = master.local_addr().unwrap_or(args.listen);
    let _servers = serve_cluster(
        status_addr,
        args.observe.metrics_listen,
        args.observe.ui_listen,
        secret.as_ref().map(|(secret, _)| secret.clone()),
        ClusterRole::Master,
        "flint master",
    )?;
    if let Some((_, source)) = &secret {
        eprintln!(
            "flint master: shared secret in {source}; give workers, `flint submit` and `flint status` --secret-file PATH (or ${SECRET_ENV})"
        );
    }
    eprintln!(
        "flint master: listening on {}",
        master
            .local_addr()
            .map_or_else(|| args.listen.to_string(), |a| a.to_string())
    );
    // The master runs until the process is killed.
    loop {
        std::thread::park();
    }
}

fn worker(args: WorkerArgs) -> Result<ExitCode, String> {
    let secret = cluster_secret(args.secret_file.as_ref(), args.insecure, "flint worker")?;
    let id = args.id.clone().unwrap_or_else(|| match args.listen {
        // An IPv6 address's colons are no part of an id.
        Some(addr) if addr.port() != 0 => format!("worker-{}-{}", addr.ip(), addr.port()).replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '.' && c != '-',
            "-",
        ),
        _ => format!("worker-{}", std::process::id()),
    });
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
            serve_cluster(
                status,
                args.metrics_listen,
                args.ui_listen,
                secret.clone(),
                ClusterRole::Worker,
                &format!("flint worker {id}"),
            )?
        }
        _ => Vec::new(),
    };
    config.secret = secret;
    config.kill_timeout = Duration::from_millis(args.kill_timeout_ms);
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

fn submit(args: SubmitArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    if args.max_executors.is_some_and(|max| max < args.executors) {
        return Err("--max-executors must be at least --executors".into());
    }
    let secret = cluster_secret(args.secret_file.as_ref(), args.insecure, "flint submit")?;
    let config = DriverConfig {
        listen: args.listen,
        secret: secret.clone(),
        allow_insecure_bind: args.allow_insecure_bind,
        ..driver_config(&args.job)
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    let _servers = serve_driver(&driver, &args.observe.serve, secret.clone(), "flint submit")?;
    let driver_addr = driver.local_addr().ok_or("the driver has no address")?;
    let client = Arc::new(
        AppClient::start(AppClientConfig {
            master: args.master,
            secret,
            spec: app_spec(&args, driver_addr),
            executors: Some(args.executors),
            reconnect_max: Duration::from_secs(1),
        })
        .map_err(|e| e.to_string())?,
    );
    let driver = Arc::new(driver);
    let mirror = start_mirror(&args, &client, &driver)?;
    let scaler = start_scaler(&args, &client, &driver)?;
    let result = run_submitted(&args, &client, &driver, driver_addr);
    linger(&args.observe);
    if scaler.is_some() && result.is_ok() {
        wait_for_release(args.idle_wait_ms, || {
            driver.executors() > args.executors as usize
        });
    }
    let executors_end = driver.executors();
    let scaled = scaler.map(|scaler| {
        let stats = scaler.stats();
        scaler.stop();
        stats
    });
    let executors_removed = mirror.removed();
    mirror.stop();
    let info = release_application(client, driver);
    let (app_id, summary) = result?;
    let fields = [
        ("app_id", json_or_plain(&args.job, &app_id)),
        ("executors", args.executors.to_string()),
        ("cores", args.cores.to_string()),
        ("executors_placed", info.executors_added.to_string()),
        ("workers_lost", info.workers_removed.to_string()),
        ("executors_removed", executors_removed.to_string()),
        ("executors_end", executors_end.to_string()),
        (
            "executors_peak",
            scaled.as_ref().map_or(0, |s| s.peak).to_string(),
        ),
        (
            "executors_released",
            scaled.as_ref().map_or(0, |s| s.released).to_string(),
        ),
    ];
    print_summary(&summary, &args.job, &fields);
    Ok(exit_code(&summary))
}

/// The application `flint submit` registers with the master. No secret in its environment: the
/// master journals it. The workers give the executors they start their own copy of the
/// cluster's secret.
fn app_spec(args: &SubmitArgs, driver_addr: SocketAddr) -> AppSpec {
    AppSpec {
        name: args.name.clone(),
        driver_addr: driver_addr.to_string(),
        cores_per_executor: args.cores,
        max_cores: args
            .executors
            .max(args.max_executors.unwrap_or(0))
            .saturating_mul(args.cores),
        memory_mb: args.memory_mb,
        ..AppSpec::default()
    }
}

/// The lifecycle handler: executors the master reports gone leave the scheduler with their
/// reason (usually the driver has already seen their connection close).
fn start_mirror(
    args: &SubmitArgs,
    client: &Arc<AppClient>,
    driver: &Arc<Driver>,
) -> Result<SourceMirror, String> {
    let remover = driver.clone();
    SourceMirror::start(
        MirrorConfig {
            events_prefix: args.executor_events.then(|| "flint submit".to_string()),
            on_event: Some(EventSink::new(|line| eprintln!("{line}"))),
            ..MirrorConfig::default()
        },
        MasterSource::new(client.clone(), Duration::from_secs(2)),
        move |name: &str, reason| {
            let _ = remover.remove_executor(name, reason);
        },
    )
    .map_err(|e| format!("cannot start the executor source: {e}"))
}

/// Dynamic allocation through the master, with `--max-executors`.
fn start_scaler(
    args: &SubmitArgs,
    client: &Arc<AppClient>,
    driver: &Arc<Driver>,
) -> Result<Option<MasterScaler>, String> {
    let Some(max) = args.max_executors else {
        return Ok(None);
    };
    let dynamic = DynamicConfig {
        min: args.executors,
        max,
        tasks_per_executor: args.cores.saturating_mul(args.job.tasks_per_core),
        idle_timeout_us: args.idle_timeout_ms.saturating_mul(1000),
    };
    MasterScaler::start(
        dynamic,
        client.clone(),
        driver.clone(),
        Duration::from_millis(50),
    )
    .map(Some)
    .map_err(|e| format!("cannot start dynamic allocation: {e}"))
}

/// Waits for the master to register the application and for `--executors` to register with
/// the driver, then runs the job: the application's id and the job's summary.
fn run_submitted(
    args: &SubmitArgs,
    client: &AppClient,
    driver: &Driver,
    driver_addr: SocketAddr,
) -> Result<(String, flint_cli::summary::Summary), String> {
    let app_id = client
        .wait_registered(Duration::from_secs(args.wait_s))
        .map_err(|e| e.to_string())?;
    eprintln!(
        "flint submit: application {app_id}, driver on {driver_addr}, waiting for {} executors",
        args.executors
    );
    wait_for_placed(args, client, driver)?;
    eprintln!(
        "flint submit: {} executors registered; running the job",
        driver.executors()
    );
    let abort = || {
        client
            .removed()
            .map(|reason| format!("the master removed the application: {reason}"))
    };
    run_job(driver, &args.job, &abort).map(|summary| (app_id, summary))
}

/// Waits up to `--wait-s` for `--executors` to register, asking the master why they are not
/// there yet: a request no worker can fit, or the application's removal, fails at once.
fn wait_for_placed(args: &SubmitArgs, client: &AppClient, driver: &Driver) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    loop {
        if let Some(reason) = client.removed() {
            return Err(format!("the master removed the application: {reason}"));
        }
        if driver
            .wait_for_executors(args.executors as usize, Duration::from_millis(200))
            .is_ok()
        {
            return Ok(());
        }
        let _ = client.sync(Duration::from_secs(1));
        let waiting = client.info().waiting;
        if waiting.starts_with(NO_WORKER_FITS) {
            return Err(format!("the master cannot place the executors: {waiting}"));
        }
        if Instant::now() >= deadline {
            let why = if waiting.is_empty() {
                String::new()
            } else {
                format!("; the master says: {waiting}")
            };
            return Err(format!(
                "{} executors did not register within {} s ({} did){why}",
                args.executors,
                args.wait_s,
                driver.executors()
            ));
        }
    }
}

/// Asks the master for no more executors, stops the ones there are, and stops the client and
/// the driver: what the master last said about the application.
fn release_application(client: Arc<AppClient>, driver: Arc<Driver>) -> AppInfo {
    // No more executors: the master must not replace the ones that exit now.
    // (If the master is away, the client names 0 as its total when it reconnects.)
    let _ = client.request_executors(0);
    let info = client.info();
    if info.connected && info.removed.is_none() {
        let _ = client.sync(Duration::from_secs(5));
    }
    let _ = driver.stop_executors(Duration::from_secs(5));
    let info = client.info();
    if let Ok(client) = Arc::try_unwrap(client) {
        client.stop(Duration::from_secs(5));
    }
    drop(driver);
    info
}

/// Waits up to `wait_ms` while `more` says idle executors are still to be released.
fn wait_for_release(wait_ms: u64, more: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    while Instant::now() < deadline && more() {
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn status(args: StatusArgs) -> Result<ExitCode, String> {
    let secret = cluster_secret(args.secret_file.as_ref(), args.insecure, "flint status")?;
    let mut client = BlockingClient::connect(
        args.master,
        Role::Client,
        secret,
        Duration::from_millis(args.timeout_ms),
    )
    .map_err(|e| e.to_string())?;
    client
        .send(&Message::StatusRequest {})
        .map_err(|e| e.to_string())?;
    let frame = client.next_frame().map_err(|e| e.to_string())?;
    let message = frame
        .message()
        .map_err(|e| format!("malformed answer: {e}"))?;
    let Message::StatusResponse {
        workers,
        applications,
        executors,
    } = message
    else {
        return Err(format!("unexpected answer {}", message.kind().name()));
    };
    if args.json {
        // The document the master's /api/v1/cluster serves.
        let view = ClusterView::from_status(workers, applications, executors);
        println!("{}", flint_net::observe::api::cluster_json(&view));
    } else {
        print_status_tables(workers, applications, executors);
    }
    Ok(ExitCode::SUCCESS)
}

/// `flint status`: a table each for the workers, applications and executors.
fn print_status_tables(
    workers: List<'_, WorkerStatus<'_>>,
    applications: List<'_, AppStatus<'_>>,
    executors: List<'_, ExecutorStatus<'_>>,
) {
    println!("WORKERS");
    println!(
        "  {:<24} {:<22} {:<8} {:>11} {:>15}",
        "id", "address", "state", "cores used", "memory used MiB"
    );
    for w in workers {
        println!(
            "  {:<24} {:<22} {:<8} {:>11} {:>15}",
            w.worker_id,
            format!("{}:{}", w.host, w.port),
            w.state.to_string().to_uppercase(),
            format!("{}/{}", w.cores_used, w.cores),
            format!("{}/{}", w.memory_used_mb, w.memory_mb)
        );
    }
    println!("APPLICATIONS");
    println!(
        "  {:<24} {:<16} {:<9} {:>6} {:>10}",
        "id", "name", "state", "cores", "requested"
    );
    for a in applications {
        println!(
            "  {:<24} {:<16} {:<9} {:>6} {:>10}",
            a.app_id,
            a.name,
            a.state.to_string().to_uppercase(),
            a.cores_granted,
            a.executors_requested
        );
        if !a.waiting.is_empty() {
            println!("    waiting: {}", a.waiting);
        }
    }
    println!("EXECUTORS");
    println!(
        "  {:<24} {:<8} {:<24} {:>5} {:<9}",
        "application", "id", "worker", "cores", "state"
    );
    for e in executors {
        println!(
            "  {:<24} {:<8} {:<24} {:>5} {:<9}",
            e.app_id,
            e.executor_id,
            e.worker_id,
            e.cores,
            e.state.to_string().to_uppercase()
        );
    }
}

/// Writes `line` and a newline to stderr in one write, so the lines of executors sharing a
/// terminal (`flint local`) do not interleave mid-line as `eprintln!`'s several writes can.
fn say_whole_line(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}
