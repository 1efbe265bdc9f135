//! `flint submit`: a job on a standalone cluster, run by a driver that gets its executors from
//! the master.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use flint_cli::run::{
    driver_config, exit_code, json_or_plain, print_summary, run_job, validate, JobArgs,
};
use flint_engine::lifecycle::DynamicConfig;
use flint_engine::standalone::{AppSpec, NO_WORKER_FITS};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::lifecycle::master::{MasterExecutors, MasterExecutorsConfig};
use flint_net::observe::EventSink;
use flint_net::standalone::app_client::{AppClient, AppClientConfig, AppClientError, AppInfo};

use crate::common::wait_for_release;
use crate::secrets::SecretArgs;
use crate::serving::{linger, serve_driver, DriverObserveArgs};
use flint_cli::stop::Stop;

/// `flint submit`'s flags.
#[derive(Args)]
pub struct SubmitArgs {
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
    /// The workers give their executors their own copy of the secret.
    #[command(flatten)]
    secret: SecretArgs,
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

/// Runs `flint submit`.
pub fn run(args: SubmitArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    if args.max_executors.is_some_and(|max| max < args.executors) {
        return Err("--max-executors must be at least --executors".into());
    }
    let secret = args.secret.required("flint submit")?;
    let stop = Stop::catch("flint submit")?;
    let config = DriverConfig {
        listen: args.listen,
        secret: secret.clone(),
        allow_insecure_bind: args.secret.allow_insecure_bind,
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
    let executors = start_executors(&args, &client, &driver)?;
    let result = run_submitted(&args, &client, &driver, driver_addr, &stop);
    linger(&args.observe);
    if args.max_executors.is_some() && result.is_ok() {
        wait_for_release(args.idle_wait_ms, || {
            driver.executors() > args.executors as usize
        });
    }
    let executors_end = driver.executors();
    let scaled = executors.stop();
    let info = release_application(client, driver);
    if let Some(code) = stop.exit("flint submit") {
        return Ok(code);
    }
    let (app_id, summary) = result?;
    let fields = [
        ("app_id", json_or_plain(&args.job, &app_id)),
        ("executors", args.executors.to_string()),
        ("cores", args.cores.to_string()),
        ("executors_placed", info.executors_added.to_string()),
        ("workers_lost", info.workers_removed.to_string()),
        ("executors_removed", scaled.removed.to_string()),
        ("executors_end", executors_end.to_string()),
        ("executors_peak", scaled.peak.to_string()),
        ("executors_released", scaled.deleted.to_string()),
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

/// The executors' lifecycle: executors the master reports gone leave the scheduler with their
/// reason (usually the driver has already seen their connection close); with
/// `--max-executors`, dynamic allocation through the master.
fn start_executors(
    args: &SubmitArgs,
    client: &Arc<AppClient>,
    driver: &Arc<Driver>,
) -> Result<MasterExecutors, String> {
    let dynamic = args.max_executors.map(|max| DynamicConfig {
        min: args.executors,
        max,
        tasks_per_executor: args.cores.saturating_mul(args.job.tasks_per_core),
        idle_timeout_us: args.idle_timeout_ms.saturating_mul(1000),
    });
    let config = MasterExecutorsConfig {
        dynamic,
        sync_timeout: Duration::from_secs(2),
        events: args
            .executor_events
            .then(|| EventSink::new(|line| eprintln!("flint submit: {line}"))),
    };
    MasterExecutors::start(config, client.clone(), driver.clone())
        .map_err(|e| format!("cannot start the executors' lifecycle: {e}"))
}

/// Waits for the master to register the application and for `--executors` to register with
/// the driver, then runs the job: the application's id and the job's summary.
fn run_submitted(
    args: &SubmitArgs,
    client: &AppClient,
    driver: &Driver,
    driver_addr: SocketAddr,
    stop: &Stop,
) -> Result<(String, flint_cli::summary::Summary), String> {
    let app_id = wait_registered(args, client, stop)?;
    eprintln!(
        "flint submit: application {app_id}, driver on {driver_addr}, waiting for {} executors",
        args.executors
    );
    wait_for_placed(args, client, driver, stop)?;
    eprintln!(
        "flint submit: {} executors registered; running the job",
        driver.executors()
    );
    let abort = || {
        stop.reason().or_else(|| {
            client
                .removed()
                .map(|reason| format!("the master removed the application: {reason}"))
        })
    };
    run_job(driver, &args.job, &abort).map(|summary| (app_id, summary))
}

/// Waits up to `--wait-s` for the master to register the application, or for a signal.
fn wait_registered(args: &SubmitArgs, client: &AppClient, stop: &Stop) -> Result<String, String> {
    let wait = Duration::from_secs(args.wait_s);
    let deadline = Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match client.wait_registered(left.min(Duration::from_millis(200))) {
            Ok(app_id) => return Ok(app_id),
            Err(AppClientError::NotRegistered { .. }) if !left.is_zero() => {
                if let Some(reason) = stop.reason() {
                    return Err(reason);
                }
            }
            Err(AppClientError::NotRegistered { .. }) => {
                let timeout_ms = wait.as_millis();
                return Err(AppClientError::NotRegistered { timeout_ms }.to_string());
            }
            Err(error) => return Err(error.to_string()),
        }
    }
}

/// Waits up to `--wait-s` for `--executors` to register, asking the master why they are not
/// there yet: a request no worker can fit, or the application's removal, fails at once.
fn wait_for_placed(
    args: &SubmitArgs,
    client: &AppClient,
    driver: &Driver,
    stop: &Stop,
) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(args.wait_s);
    loop {
        if let Some(reason) = stop.reason() {
            return Err(reason);
        }
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
