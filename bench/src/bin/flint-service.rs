//! `flint-service`: the service benchmark. An axum server in this process answers each request
//! with one job on a Flint cluster (the driver's local mode, or `flint executor` processes),
//! then with the same work done in the handler; a closed-loop HTTP client measures both and
//! prints requests per second, their ratio, latency and CPU per request (see `service`).
//!
//! With executor processes, build both binaries first:
//! `cargo build --release -p flint-net --bin flint -p flint-bench --bin flint-service`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use flint_bench::fault::Fault;
use flint_bench::service::{self, ServiceResult, ServiceSpec};

#[derive(Parser, Debug)]
#[command(
    name = "flint-service",
    version,
    about = "The service benchmark: an axum server running one Flint job per request, beside \
        the same work inline"
)]
struct Args {
    /// Executor processes per run, comma-separated (0: the driver's local mode); one row each.
    #[arg(long, value_delimiter = ',', default_value = "0,2",
          value_parser = clap::value_parser!(u32).range(0..=64))]
    executors: Vec<u32>,
    /// Task threads per executor (default 1), or the local-mode pool's workers (default 2).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    cores: Option<u32>,
    /// What each task runs (a built-in: noop, spin:US, hash, ...).
    #[arg(long, default_value = "spin:20", value_name = "SPEC")]
    task: String,
    /// Payload bytes per task.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=65_536))]
    payload: u64,
    /// Tasks in each request's job.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    tasks_per_request: u32,
    /// Concurrent keep-alive connections of the load generator.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    connections: u64,
    /// The server's tokio worker threads (default: one per core, inline's best case).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    server_threads: Option<u64>,
    /// Seconds of load before each measured period.
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    warmup: f64,
    /// Seconds of each measured period (Flint, then inline).
    #[arg(long, default_value_t = 3.0, value_name = "S")]
    duration: f64,
    /// The `flint` binary for executor processes (default: beside this one).
    #[arg(long)]
    flint_bin: Option<PathBuf>,
    /// One JSON object per run instead of a table.
    #[arg(long)]
    json: bool,
    /// A fault on executor process 0 during the measured Flint period: freeze:AFTER_S:FOR_S
    /// (SIGSTOP, then SIGCONT), slow:FACTOR (runs 1/FACTOR of the time) or cut:AFTER_S:FOR_S
    /// (its connections stop forwarding, nothing closes). The JSON has p99.9, the slowest
    /// request and the extra attempts.
    #[arg(long, value_name = "FAULT")]
    fault: Option<Fault>,
    /// Turns hedged attempts and suspicion off (the driver's default is on), to compare.
    #[arg(long)]
    no_hedging: bool,
    /// Measures only the Flint route (no inline period, no ratio).
    #[arg(long)]
    flint_only: bool,
}

fn main() -> ExitCode {
    match run(&Args::parse()) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint-service: {message}");
            ExitCode::from(2)
        }
    }
}

fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if value.is_finite() && (0.0..1e6).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!(
            "{flag} must be between 0 and 1e6 seconds, not {value}"
        ))
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    let warmup = seconds("--warmup", args.warmup)?;
    let duration = seconds("--duration", args.duration)?;
    if duration.is_zero() {
        return Err("--duration must be positive".into());
    }
    let mut all_succeeded = true;
    for (row, &executors) in args.executors.iter().enumerate() {
        let spec = ServiceSpec {
            executors,
            cores: args.cores.unwrap_or(if executors == 0 { 2 } else { 1 }),
            task: args.task.clone(),
            payload_bytes: args.payload as usize,
            tasks_per_request: args.tasks_per_request,
            connections: args.connections as usize,
            warmup,
            duration,
            server_threads: args.server_threads.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get()),
                |n| n as usize,
            ),
            flint_bin: args.flint_bin.clone(),
            fault: args.fault,
            hedging: !args.no_hedging,
            inline: !args.flint_only,
        };
        let result = service::run(&spec)?;
        if args.json {
            println!("{}", result.json());
        } else {
            if row == 0 {
                println!("{}", ServiceResult::table_header());
            }
            println!("{}", result.table_row());
        }
        all_succeeded &= result.succeeded() && result.flint.requests > 0;
    }
    Ok(if all_succeeded {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
