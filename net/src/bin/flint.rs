//! `flint`: run a local cluster, a driver, or an executor from the command line.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitCode};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig, ExecutorError};
use flint_net::functions::Registry;
use flint_net::handshake::Secret;
use flint_net::job::{Job, JobOutcome};
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
    /// Task slots the driver gives each executor core (pipelining depth, at most 1024).
    #[arg(long, default_value_t = 256)]
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
    /// Executor processes to start.
    #[arg(long, default_value_t = 2)]
    executors: u32,
    /// Cores (task threads) per executor.
    #[arg(long, default_value_t = 1)]
    cores: u32,
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
    let mut children = Vec::new();
    for index in 0..args.executors {
        let child = Command::new(&exe)
            .args([
                "executor",
                "--driver",
                &addr.to_string(),
                "--cores",
                &args.cores.to_string(),
            ])
            .args(["--id", &format!("local-{index}")])
            .env(SECRET_ENV, String::from_utf8_lossy(&secret_bytes).as_ref())
            .spawn()
            .map_err(|e| format!("cannot start an executor: {e}"))?;
        children.push(child);
    }
    let result = driver
        .wait_for_executors(args.executors as usize, Duration::from_secs(30))
        .map_err(|e| e.to_string())
        .and_then(|()| run_job(&driver, &args.job));
    let _ = driver.stop_executors(Duration::from_secs(5));
    reap(children, Duration::from_secs(5));
    driver.shutdown();
    let summary = result?;
    print_summary(
        &summary,
        &args.job,
        &[
            ("executors", args.executors.to_string()),
            ("cores", args.cores.to_string()),
        ],
    );
    Ok(exit_code(&summary))
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
        .and_then(|()| run_job(&driver, &args.job));
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

/// Submits the job, shows progress, waits, and summarizes.
fn run_job(driver: &Driver, args: &JobArgs) -> Result<Summary, String> {
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

/// Waits for executor processes to exit; kills those still running after `timeout`.
fn reap(mut children: Vec<Child>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !children.is_empty() {
        children.retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        if Instant::now() >= deadline {
            for child in &mut children {
                let _ = child.kill();
                let _ = child.wait();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
