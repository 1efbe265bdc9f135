//! Embedding Flint in a service that ships its own executor binary.
//!
//! A service's tasks run its own functions, so its executors are its own program: the same
//! binary (or another) calls [`executor::run`] with a [`Registry`] holding those functions.
//! Stock `flint executor`s only know the built-ins and would fail these tasks.
//!
//! This example is both halves:
//! - `embed` starts a driver (with a fresh secret), starts two executor processes of this very
//!   binary, runs a `word_count` job on them, prints the counts and stops them;
//! - `embed executor --driver ADDR --id ID` is the executor: it reads the secret from
//!   `$FLINT_SECRET` and runs tasks until the driver stops it.
//!
//! `cargo run --release -p flint-net --example embed`

use std::net::SocketAddr;
use std::process::{Child, Command};
use std::time::Duration;

use bytes::Bytes;
use flint_net::driver::Driver;
use flint_net::executor::{self, ExecutorConfig};
use flint_net::handshake::{random_nonce, Secret};
use flint_net::job::{Job, JobOutcome};
use flint_net::{Registry, TaskError};

type Error = Box<dyn std::error::Error>;

/// The service's functions, registered by name on every executor.
fn registry() -> Registry {
    let mut registry = Registry::with_builtins();
    registry.register("word_count", |_, payload| {
        let text = std::str::from_utf8(&payload).map_err(|e| TaskError::new(e.to_string()))?;
        let words = text.split_whitespace().count() as u64;
        Ok(Bytes::copy_from_slice(&words.to_le_bytes()))
    });
    registry
}

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("executor") => run_executor(&args[1..]),
        None => run_service(),
        Some(other) => Err(format!("unknown command {other:?} (try `executor`)").into()),
    }
}

/// The executor side: `executor --driver ADDR --id ID`.
fn run_executor(args: &[String]) -> Result<(), Error> {
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .ok_or_else(|| format!("missing {name}"))
    };
    let driver: SocketAddr = flag("--driver")?.parse()?;
    let config = ExecutorConfig {
        secret: Secret::from_env("FLINT_SECRET")?,
        ..ExecutorConfig::new(driver, flag("--id")?.as_str())
    };
    executor::run(config, registry())?;
    Ok(())
}

/// The service side: a driver, two executors of this binary, one job.
fn run_service() -> Result<(), Error> {
    let secret_text: String = random_nonce()?.iter().map(|b| format!("{b:02x}")).collect();
    let driver = Driver::builder()
        .secret(Some(Secret::new(secret_text.as_bytes())?))
        .start()?;
    let addr = driver.local_addr().ok_or("the driver has no address")?;
    println!("driver listening on {addr}");
    let exe = std::env::current_exe()?;
    let mut executors: Vec<Child> = Vec::new();
    for id in ["svc-1", "svc-2"] {
        let child = Command::new(&exe)
            .args(["executor", "--driver", &addr.to_string(), "--id", id])
            .env("FLINT_SECRET", &secret_text)
            .spawn()?;
        executors.push(child);
    }
    let result = run_job(&driver);
    driver.stop_executors(Duration::from_secs(10))?;
    for mut child in executors {
        child.wait()?;
    }
    result
}

fn run_job(driver: &Driver) -> Result<(), Error> {
    driver.wait_for_executors(2, Duration::from_secs(30))?;
    let lines = ["the quick brown fox", "jumps over", "the lazy dog", ""];
    let payloads = lines.iter().map(|l| Bytes::from_static(l.as_bytes()));
    let handle = driver.submit(Job::new("word_count", payloads.collect()))?;
    match handle.wait_timeout(Duration::from_secs(30)) {
        Ok(JobOutcome::Succeeded(results)) => {
            for (line, result) in lines.iter().zip(results) {
                let count = result
                    .first_chunk::<8>()
                    .map_or(0, |b| u64::from_le_bytes(*b));
                println!("{count:>2} words: {line:?}");
            }
            Ok(())
        }
        Ok(other) => Err(format!("job ended: {other:?}").into()),
        Err(_) => Err("job timed out".into()),
    }
}
