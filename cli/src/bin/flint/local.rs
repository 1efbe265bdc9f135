//! `flint local`: a driver and executor processes on this machine, one job, a summary.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use flint_cli::run::{
    driver_config, exit_code, print_summary, run_job, validate, wait_for_executors, JobArgs,
};
use flint_cli::stop::Stop;
use flint_engine::affinity::Pinning;
use flint_engine::lifecycle::{AllocatorConfig, DynamicConfig};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::handshake::{Secret, SECRET_ENV};
use flint_net::lifecycle::local::{LocalConfig, LocalExecutors};
use flint_net::lifecycle::ExecutorStats;
use flint_net::observe::EventSink;

use crate::common::{pinning, wait_for_release, EXECUTOR_CORES_MAX, WAIT_MAX_S};
use crate::serving::{linger, serve_driver, DriverObserveArgs};

/// `flint local`'s flags.
#[derive(Args)]
pub struct LocalArgs {
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

/// Runs `flint local`.
pub fn run(args: LocalArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    let stop = Stop::catch("flint local")?;
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
    let abort = || stop.reason().or_else(|| executors.failed());
    // With --dynamic --min-executors 0 nothing starts before the job's backlog asks for it.
    let wait = Duration::from_secs(30);
    let result = wait_for_executors(&driver, initial as usize, wait, &abort)
        .and_then(|()| run_job(&driver, &args.job, &abort));
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
    if let Some(code) = stop.exit("flint local") {
        return Ok(code);
    }
    let summary = result?;
    print_summary(&summary, &args.job, &local_fields(&args, &stats));
    Ok(exit_code(&summary))
}

/// `--pin-cores` for `flint local`: `auto` (the CPUs of the affinity mask), `none`, or a list.
fn local_pinning(text: &str) -> Result<Pinning, String> {
    match text {
        "auto" => Ok(Pinning::all()),
        other => pinning(other),
    }
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
fn local_fields(args: &LocalArgs, stats: &ExecutorStats) -> Vec<(&'static str, String)> {
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
