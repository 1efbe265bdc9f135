//! Running one job from the command line: the job flags every job-running command takes
//! ([`JobArgs`]), the driver settings they imply ([`driver_config`]), submitting the job with a
//! progress bar and an abort check ([`run_job`]), and printing its summary ([`print_summary`],
//! [`exit_code`]). Shared by the `flint` CLI and by binaries in other crates (`flint-k8s`).

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;

use crate::driver::{Driver, DriverConfig};
use crate::functions::Registry;
use crate::job::{Job, JobOutcome};
use crate::summary::{indexed_payload, json_string, Recorder, Summary};

/// The job every job-running command takes.
#[derive(Args, Clone, Debug)]
pub struct JobArgs {
    /// Tasks in the job.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: u64,
    /// Function each task runs: noop, echo, hash, sleep:MS, spin:US, fail:P, crash:P.
    #[arg(long, default_value = "noop")]
    pub task: String,
    /// Payload bytes per task: task i's payload is i as u64 LE, repeated and truncated to this
    /// length (`hash` needs at least 8).
    #[arg(long, default_value_t = 0)]
    pub payload: usize,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Task slots the driver gives each executor core (pipelining depth, at most 1024).
    #[arg(long, default_value_t = 256)]
    pub queue_depth: u32,
    /// Attempts per task before its job fails.
    #[arg(long, default_value_t = 4)]
    pub max_failures: u32,
    /// An executor silent this long is lost.
    #[arg(long, default_value_t = 3000)]
    pub heartbeat_timeout_ms: u64,
}

/// The driver settings the job flags imply (task slots, heartbeats, attempts).
pub fn driver_config(job: &JobArgs) -> DriverConfig {
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

/// Checks the job flags: the function exists, `hash` has a payload to hash.
pub fn validate(job: &JobArgs) -> Result<(), String> {
    if job.task == "hash" && job.payload < 8 {
        return Err("--task hash needs --payload of at least 8 bytes".into());
    }
    Registry::with_builtins()
        .resolve(&job.task)
        .map(|_| ())
        .map_err(|e| format!("--task: {e}"))
}

/// Submits the job, shows progress (on a terminal), waits, and summarizes. `abort` is asked
/// every 200 ms; a reason from it cancels the job and is the error.
pub fn run_job(
    driver: &Driver,
    args: &JobArgs,
    abort: &dyn Fn() -> Option<String>,
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
                if let Some(reason) = abort() {
                    pending.cancel();
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

/// Prints the summary to stdout: one JSON object (the job's task and payload, then `extra`)
/// with `--json`, else the table.
pub fn print_summary(summary: &Summary, job: &JobArgs, extra: &[(&str, String)]) {
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

/// Success when every task succeeded.
pub fn exit_code(summary: &Summary) -> ExitCode {
    if summary.succeeded == summary.tasks {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A string field for the summary: quoted with `--json`, as is in the table.
pub fn json_or_plain(job: &JobArgs, text: &str) -> String {
    if job.json {
        json_string(text)
    } else {
        text.to_owned()
    }
}
