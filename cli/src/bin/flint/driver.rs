//! `flint driver`: listen for executors, wait for N, run a job, stop them, print a summary.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flint_cli::run::{
    driver_config, exit_code, print_summary, run_job, validate, wait_for_executors, JobArgs,
};
use flint_cli::stop::Stop;
use flint_engine::affinity::Pinning;
use flint_net::driver::{Driver, DriverConfig};

use crate::common::{pinning, WAIT_MAX_S};
use crate::secrets::SecretArgs;
use crate::serving::{linger, serve_driver, DriverObserveArgs};

/// `flint driver`'s flags.
#[derive(Args)]
pub struct DriverArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Executors to wait for before the job starts (1 to 100,000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    executors: u64,
    /// How long to wait for them, in seconds (1 to 86,400).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=WAIT_MAX_S))]
    wait_s: u64,
    #[command(flatten)]
    secret: SecretArgs,
    /// CPU the driver's loop is pinned to: a list like 0 (its first CPU is used), or none (the
    /// default: not pinned).
    #[arg(long, default_value = "none", value_parser = pinning)]
    pin_cores: Pinning,
    #[command(flatten)]
    job: JobArgs,
    #[command(flatten)]
    observe: DriverObserveArgs,
}

/// Runs `flint driver`.
pub fn run(args: DriverArgs) -> Result<ExitCode, String> {
    validate(&args.job)?;
    let secret = args.secret.optional()?;
    let config = DriverConfig {
        listen: args.listen,
        secret: secret.clone(),
        allow_insecure_bind: args.secret.allow_insecure_bind,
        pin: args.pin_cores.clone(),
        ..driver_config(&args.job)
    };
    let stop = Stop::catch("flint driver")?;
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| e.to_string())?;
    let _servers = serve_driver(&driver, &args.observe.serve, secret, "flint driver")?;
    eprintln!(
        "flint driver: listening on {}, waiting for {} executors",
        args.listen, args.executors
    );
    let count = args.executors as usize;
    let wait = Duration::from_secs(args.wait_s);
    let result = wait_for_executors(&driver, count, wait, &|| stop.reason())
        .and_then(|()| run_job(&driver, &args.job, &|| stop.reason()));
    linger(&args.observe);
    let _ = driver.stop_executors(Duration::from_secs(5));
    driver.shutdown();
    if let Some(code) = stop.exit("flint driver") {
        return Ok(code);
    }
    let summary = result?;
    print_summary(
        &summary,
        &args.job,
        &[("executors", args.executors.to_string())],
    );
    Ok(exit_code(&summary))
}
