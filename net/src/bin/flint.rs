//! `flint`: run a local cluster, a driver, or an executor from the command line.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use flint_engine::lifecycle::{AllocatorConfig, DynamicConfig};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig, ExecutorError};
use flint_net::functions::Registry;
use flint_net::handshake::Secret;
use flint_net::job::{Job, JobOutcome};
use flint_net::local::{LocalConfig, LocalExecutors};
use flint_net::summary::{indexed_payload, json_string, Recorder, Summary};

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
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a driver and executor processes on this machine, run a job, print a summary.
    Local(LocalArgs),
    /// Listen for executors, wait for N of them, run a job, stop them, print a summary.
    Driver(DriverArgs),
    /// Connect to a driver and run its tasks until it stops this executor.
    Executor(ExecutorArgs),
}

/// The job every job-running command takes.
#[derive(Args, Clone, Debug)]
struct JobArgs {
    /// Tasks in the job.
    #[arg(long, default_value_t = 100_000)]
    tasks: u64,
    /// Function each task runs: noop, echo, hash, sleep:MS, spin:US, fail:P, crash:P.
    #[arg(long, default_value = "noop")]
    task: String,
    /// Payload bytes per task: task i's payload is i as u64 LE, repeated and truncated to this
    /// length (`hash` needs at least 8).
    #[arg(long, default_value_t = 0)]
    payload: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Task slots the driver gives each executor core (pipelining depth).
    #[arg(long, default_value_t = 64)]
    queue_depth: u32,
    /// Attempts per task before its job fails.
    #[arg(long, default_value_t = 4)]
    max_failures: u32,
    /// An executor silent this long is lost.
    #[arg(long, default_value_t = 3000)]
    heartbeat_timeout_ms: u64,
}

#[derive(Args)]
struct LocalArgs {
    /// Executor processes to keep running (without --dynamic); one that dies is replaced.
    #[arg(long, default_value_t = 2)]
    executors: u32,
    /// Cores (task threads) per executor.
    #[arg(long, default_value_t = 1)]
    cores: u32,
    /// Dynamic allocation: the executor count follows the backlog between --min-executors and
    /// --max-executors; executors idle for --idle-timeout-ms are released.
    #[arg(long)]
    dynamic: bool,
    /// With --dynamic: the fewest executors.
    #[arg(long, default_value_t = 1)]
    min_executors: u32,
    /// With --dynamic: the most executors.
    #[arg(long, default_value_t = 8)]
    max_executors: u32,
    /// With --dynamic: an executor idle this long is released.
    #[arg(long, default_value_t = 2000)]
    idle_timeout_ms: u64,
    /// Executors started at most per round.
    #[arg(long, default_value_t = 4)]
    batch_size: u32,
    /// Time between rounds of starting executors.
    #[arg(long, default_value_t = 200)]
    batch_delay_ms: u64,
    /// An executor not registered this long after it was started is killed and replaced.
    #[arg(long, default_value_t = 15000)]
    pending_timeout_ms: u64,
    /// Executor failures tolerated; one more stops the application with an error.
    #[arg(long, default_value_t = 10)]
    max_executor_failures: u32,
    /// After the job, wait up to this long for dynamic allocation to release idle executors
    /// down to --min-executors (shows in `executors_end`).
    #[arg(long, default_value_t = 0)]
    idle_wait_ms: u64,
    /// Print a line per executor event (started with its pid, registered, exited, deleted).
    #[arg(long)]
    executor_events: bool,
    #[command(flatten)]
    job: JobArgs,
}

#[derive(Args)]
struct DriverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Executors to wait for before the job starts.
    #[arg(long)]
    executors: usize,
    /// How long to wait for them, in seconds.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
    /// File holding the shared secret (else $FLINT_SECRET, else none).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Listen on a non-loopback address without a secret.
    #[arg(long)]
    allow_insecure_bind: bool,
    #[command(flatten)]
    job: JobArgs,
}

#[derive(Args)]
struct ExecutorArgs {
    /// The driver's address.
    #[arg(long)]
    driver: SocketAddr,
    /// Task threads.
    #[arg(long, default_value_t = 1)]
    cores: u32,
    /// This executor's id (default: exec-PID).
    #[arg(long)]
    id: Option<String>,
    /// File holding the shared secret (else $FLINT_SECRET, else none).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// How long to keep trying to reach the driver, in seconds.
    #[arg(long, default_value_t = 30)]
    connect_timeout_s: u64,
}

fn main() -> ExitCode {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Local(args) => local(args),
        Cmd::Driver(args) => driver(args),
        Cmd::Executor(args) => executor(args),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint: {message}");
            ExitCode::from(2)
        }
    }
}

fn load_secret(file: Option<&PathBuf>) -> Result<Option<Secret>, String> {
    match file {
        Some(path) => Secret::from_file(path).map(Some),
        None => Secret::from_env(SECRET_ENV),
    }
}

fn driver_config(job: &JobArgs) -> DriverConfig {
    let mut config = DriverConfig {
        tasks_per_core: job.queue_depth.max(1),
        heartbeat_timeout: Duration::from_millis(job.heartbeat_timeout_ms),
        ..DriverConfig::default()
    };
    config.heartbeat_interval =
        (config.heartbeat_timeout / 6).clamp(Duration::from_millis(10), Duration::from_secs(1));
    config.scheduler.max_failures = job.max_failures.max(1);
    config
}

fn validate(job: &JobArgs) -> Result<(), String> {
    if job.task == "hash" && job.payload < 8 {
        return Err("--task hash needs --payload of at least 8 bytes".into());
    }
    Registry::with_builtins()
        .resolve(&job.task)
        .map(|_| ())
        .map_err(|e| format!("--task: {e}"))
}

fn local(args: LocalArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    if args.executors == 0 || args.cores == 0 {
        return Err("--executors and --cores must be at least 1".into());
    }
    // Local processes share a fresh random secret, so nothing else on this machine can join.
    let secret_bytes: Vec<u8> = flint_net::handshake::random_nonce()
        .map_err(|e| format!("no randomness: {e}"))?
        .iter()
        .map(|b| b"0123456789abcdef"[(b & 15) as usize])
        .collect();
    let secret = Secret::new(secret_bytes.clone())?;
    let config = DriverConfig {
        secret: Some(secret),
        ..driver_config(&args.job)
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    let addr = driver.local_addr().ok_or("the driver has no address")?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the flint binary: {e}"))?;
    let (initial, dynamic) = if args.dynamic {
        if args.min_executors > args.max_executors || args.max_executors == 0 {
            return Err(
                "--min-executors must be at most --max-executors, which must be at least 1".into(),
            );
        }
        let dynamic = DynamicConfig {
            min: args.min_executors,
            max: args.max_executors,
            tasks_per_executor: args.cores.saturating_mul(args.job.queue_depth.max(1)),
            idle_timeout_us: args.idle_timeout_ms.saturating_mul(1000),
        };
        (args.min_executors, Some(dynamic))
    } else {
        (args.executors, None)
    };
    let mut local_config = LocalConfig::new(exe, addr);
    local_config.cores = args.cores;
    local_config.events = args.executor_events;
    local_config.env = vec![(
        SECRET_ENV.to_string(),
        String::from_utf8_lossy(&secret_bytes).into_owned(),
    )];
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
    if result.is_ok() && args.dynamic && args.idle_wait_ms > 0 {
        let deadline = Instant::now() + Duration::from_millis(args.idle_wait_ms);
        while Instant::now() < deadline
            && executors.stats().registered > u64::from(args.min_executors)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stats = executors.stats();
    executors.freeze();
    let _ = driver.stop_executors(Duration::from_secs(5));
    executors.shutdown(Duration::from_secs(5));
    drop(driver);
    let summary = result?;
    let mut extra = vec![
        ("cores", args.cores.to_string()),
        ("executors_started", stats.started.to_string()),
        ("executors_peak", stats.peak.to_string()),
        ("executors_end", stats.registered.to_string()),
        ("executors_deleted", stats.deleted.to_string()),
        ("executors_failed", stats.failed.to_string()),
    ];
    if args.dynamic {
        extra.push(("min_executors", args.min_executors.to_string()));
        extra.push(("max_executors", args.max_executors.to_string()));
    } else {
        extra.push(("executors", args.executors.to_string()));
    }
    print_summary(&summary, &args.job, &extra);
    Ok(exit_code(&summary))
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
        ..driver_config(&args.job)
    };
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    eprintln!(
        "flint driver: listening on {}, waiting for {} executors",
        args.listen, args.executors
    );
    let result = driver
        .wait_for_executors(args.executors, Duration::from_secs(args.wait_s))
        .map_err(|e| e.to_string())
        .and_then(|()| run_job(&driver, &args.job, &|| None));
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
    let id = args
        .id
        .unwrap_or_else(|| format!("exec-{}", std::process::id()));
    let config = ExecutorConfig {
        cores: args.cores.max(1),
        secret: load_secret(args.secret_file.as_ref())?,
        connect_timeout: Duration::from_secs(args.connect_timeout_s),
        ..ExecutorConfig::new(args.driver, id.clone())
    };
    match executor::run(config, Registry::with_builtins()) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(error) => {
            eprintln!("flint executor {id}: {error}");
            Ok(ExitCode::from(match error {
                ExecutorError::Refused(_) => 3,
                _ => 1,
            }))
        }
    }
}

/// Submits the job, shows progress, waits, and summarizes; cancels the job and fails if
/// `failed` reports a reason (the executor allocator gave up).
fn run_job(
    driver: &Driver,
    args: &JobArgs,
    failed: &dyn Fn() -> Option<String>,
) -> Result<Summary, String> {
    let payloads: Vec<Bytes> = if args.payload == 0 {
        vec![Bytes::new(); args.tasks as usize]
    } else {
        (0..args.tasks)
            .map(|i| Bytes::from(indexed_payload(i, args.payload)))
            .collect()
    };
    let recorder = Arc::new(Mutex::new(Recorder::new()));
    let start = Instant::now();
    let observer = recorder.clone();
    let job = Job::new(args.task.clone(), payloads).on_result(move |_, result| {
        let latency = start.elapsed();
        let mut recorder = observer.lock().unwrap_or_else(|p| p.into_inner());
        recorder.record(result.map(|bytes| &bytes[..]), latency);
    });
    let handle = driver.submit(job).map_err(|e| e.to_string())?;
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let mut handle = handle;
    let outcome = loop {
        match handle.wait_timeout(Duration::from_millis(200)) {
            Ok(outcome) => break outcome,
            Err(pending) => {
                if let Some(reason) = failed() {
                    pending.cancel();
                    if show_progress {
                        eprintln!();
                    }
                    return Err(reason);
                }
                if show_progress && start.elapsed() > Duration::from_secs(1) {
                    progress(pending.tasks_done(), pending.tasks(), start.elapsed());
                }
                handle = pending;
            }
        }
    };
    let elapsed = start.elapsed();
    if show_progress && elapsed > Duration::from_secs(1) {
        eprintln!();
    }
    if let JobOutcome::Failed(reasons) = &outcome {
        for reason in reasons.iter().take(5) {
            eprintln!("flint: job failed: {reason}");
        }
    }
    let stats = driver.stats().map_err(|e| e.to_string())?;
    let recorder = recorder.lock().unwrap_or_else(|p| p.into_inner());
    let retried = stats
        .launched
        .saturating_sub(stats.succeeded + recorder.summary(0, 0, 0, elapsed).failed);
    Ok(recorder.summary(args.tasks, retried, driver.executors_lost(), elapsed))
}

fn progress(done: u64, total: u64, elapsed: Duration) {
    const WIDTH: u64 = 40;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '-' })
        .collect();
    eprint!(
        "\r[{bar}] {done}/{total} tasks, {:.1} s",
        elapsed.as_secs_f64()
    );
}

fn print_summary(summary: &Summary, job: &JobArgs, extra: &[(&str, String)]) {
    if job.json {
        let mut fields: Vec<(&str, String)> = vec![
            ("task", json_string(&job.task)),
            ("payload", job.payload.to_string()),
        ];
        fields.extend(extra.iter().cloned());
        println!("{}", summary.to_json(&fields));
    } else {
        print!("{}", summary.to_table());
    }
}

fn exit_code(summary: &Summary) -> ExitCode {
    if summary.succeeded == summary.tasks {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
