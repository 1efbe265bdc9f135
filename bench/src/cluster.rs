//! A cluster for a load run: a [`Driver`] in this process and its executors, which are `flint
//! executor` processes started here (the default), threads in this process running
//! [`executor::run`], or processes started elsewhere that connect to `--driver-listen`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::executor::{self, ExecutorConfig, ExecutorError, ExecutorSummary};
use flint_net::handshake::{random_nonce, Secret};
use flint_net::Registry;

use crate::fault::{Relay, Target};

/// The environment variable that carries the shared secret to executors (as `flint` reads it).
pub const SECRET_ENV: &str = "FLINT_SECRET";

/// The command that builds the executor binary `flint-load` starts.
pub const BUILD_FLINT: &str = "cargo build --release -p flint-cli --bin flint";

/// Where the executors come from.
#[derive(Debug, Clone)]
pub enum ExecutorSource {
    /// `flint executor` processes started from this binary; their stderr is kept when
    /// `logs` is true.
    Processes {
        /// The `flint` binary.
        binary: PathBuf,
        /// Let executors write to this process's stderr.
        logs: bool,
    },
    /// Threads in this process, each running [`executor::run`].
    Threads,
    /// No executors: the driver's local mode runs tasks on an in-process pool of
    /// `executors x cores` workers, with no sockets (to separate the network's cost).
    LocalMode,
    /// Executors started elsewhere connect to the driver's address; wait this long for them.
    External {
        /// How long to wait for the executors.
        wait: Duration,
    },
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Executors.
    pub executors: u32,
    /// Cores (task threads) per executor (ignored for external executors).
    pub cores: u32,
    /// Where they come from.
    pub source: ExecutorSource,
    /// The driver's settings (its `listen` and `secret` are set here for local executors).
    pub driver: DriverConfig,
    /// Executor process 0 connects through a [`Relay`] (a `cut` fault needs one).
    pub relay_first: bool,
}

/// A running cluster; [`Cluster::stop`] stops the executors and the driver.
pub struct Cluster {
    /// The driver (shared, so async callers can hold it).
    pub driver: std::sync::Arc<Driver>,
    children: Vec<Child>,
    threads: Vec<JoinHandle<Result<ExecutorSummary, ExecutorError>>>,
    /// Executor 0's relay, when it connects through one.
    relay: Option<Relay>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("driver", &self.driver)
            .field("processes", &self.children.len())
            .field("threads", &self.threads.len())
            .finish()
    }
}

/// The `flint` binary next to the running one (`target/release/flint` beside
/// `target/release/flint-load`), or `explicit`; a clear error says how to build it.
pub fn flint_binary(explicit: Option<&Path>) -> Result<PathBuf, String> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()
            .map_err(|e| format!("cannot find this executable: {e}"))?
            .with_file_name(format!("flint{}", std::env::consts::EXE_SUFFIX)),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "the executor binary {} is missing: build it with `{BUILD_FLINT}` (or pass \
             --flint-bin PATH, or --in-process to run executors as threads)",
            path.display()
        ))
    }
}

/// A fresh random secret of 64 hex digits.
pub fn random_secret() -> Result<(Secret, String), String> {
    let text: String = random_nonce()
        .map_err(|e| format!("no randomness: {e}"))?
        .iter()
        .flat_map(|b| [b >> 4, b & 15])
        .map(|nibble| char::from(b"0123456789abcdef"[nibble as usize]))
        .collect();
    Ok((
        Secret::new(text.clone().into_bytes()).map_err(|e| e.to_string())?,
        text,
    ))
}

/// The driver of `spec`; for local executors on 127.0.0.1 with a fresh random secret (so
/// nothing else on this machine can join), returned as text too.
fn start_driver(spec: &ClusterSpec) -> Result<(Driver, Option<String>, Option<Secret>), String> {
    let mut config = spec.driver.clone();
    let secret_text = match spec.source {
        ExecutorSource::External { .. } => None,
        _ => {
            let (secret, text) = random_secret()?;
            config.secret = Some(secret);
            config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
            Some(text)
        }
    };
    let driver_secret = config.secret.clone();
    let mut builder = Driver::builder().config(config);
    if let ExecutorSource::LocalMode = spec.source {
        builder = builder.local(
            spec.executors.saturating_mul(spec.cores),
            Registry::with_builtins(),
        );
    }
    let driver = builder
        .start()
        .map_err(|e| format!("cannot start the driver: {e}"))?;
    Ok((driver, secret_text, driver_secret))
}

impl Cluster {
    /// Starts the driver and the executors and waits until every executor has registered.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, String> {
        if spec.executors == 0 || spec.cores == 0 {
            return Err("--executors and --cores must be at least 1".into());
        }
        let (driver, secret_text, driver_secret) = start_driver(&spec)?;
        let addr = driver.local_addr().ok_or("the driver has no address")?;
        let mut cluster = Cluster {
            driver: std::sync::Arc::new(driver),
            children: Vec::new(),
            threads: Vec::new(),
            relay: None,
        };
        let wait = match &spec.source {
            ExecutorSource::Processes { binary, logs } => {
                let secret_text = secret_text.as_deref().unwrap_or_default();
                cluster.spawn_processes(&spec, binary, *logs, addr, secret_text)?;
                Duration::from_secs(30)
            }
            ExecutorSource::Threads => {
                cluster.spawn_threads(&spec, addr, driver_secret)?;
                Duration::from_secs(30)
            }
            ExecutorSource::LocalMode => {
                cluster.wait_for(1, Duration::from_secs(10))?;
                return Ok(cluster);
            }
            ExecutorSource::External { wait } => {
                eprintln!(
                    "flint-load: driver listening on {addr}; waiting {} s for {} executors \
                     (`flint executor --driver {addr}`)",
                    wait.as_secs(),
                    spec.executors
                );
                *wait
            }
        };
        cluster.wait_for(spec.executors as usize, wait)?;
        Ok(cluster)
    }

    /// `spec.executors` executor processes of `binary`, each on its own CPUs.
    fn spawn_processes(
        &mut self,
        spec: &ClusterSpec,
        binary: &Path,
        logs: bool,
        addr: SocketAddr,
        secret_text: &str,
    ) -> Result<(), String> {
        if spec.relay_first {
            self.relay = Some(Relay::start(addr)?);
        }
        for index in 0..spec.executors {
            let to = match &self.relay {
                Some(relay) if index == 0 => relay.addr,
                _ => addr,
            };
            let child = Command::new(binary)
                .args(["executor", "--driver", &to.to_string()])
                .args(["--cores", &spec.cores.to_string()])
                .args(["--id", &format!("load-{index}")])
                // Each process on its own CPUs, as `flint local` does.
                .args([
                    "--pin-cores",
                    &Pinning::spread(index as usize, spec.cores as usize).to_string(),
                ])
                .env(SECRET_ENV, secret_text)
                .stdout(Stdio::null())
                .stderr(if logs {
                    Stdio::inherit()
                } else {
                    Stdio::null()
                })
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
            self.children.push(child);
        }
        Ok(())
    }

    /// `spec.executors` executors as threads of this process.
    fn spawn_threads(
        &mut self,
        spec: &ClusterSpec,
        addr: SocketAddr,
        secret: Option<Secret>,
    ) -> Result<(), String> {
        for index in 0..spec.executors {
            let config = ExecutorConfig {
                cores: spec.cores,
                secret: secret.clone(),
                connect_timeout: Duration::from_secs(10),
                // Threads of one process: the pool's workers float (not pinned) rather
                // than several executors sharing the same cores.
                ..ExecutorConfig::new(addr, format!("thread-{index}"))
            };
            let thread = std::thread::Builder::new()
                .name(format!("load-executor-{index}"))
                .spawn(move || executor::run(config, Registry::with_builtins()))
                .map_err(|e| format!("cannot start an executor thread: {e}"))?;
            self.threads.push(thread);
        }
        Ok(())
    }

    /// Waits for `count` registered executors, failing early if a local executor process exits.
    fn wait_for(&mut self, count: usize, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.driver.executors() >= count {
                return Ok(());
            }
            for child in &mut self.children {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "an executor process exited before registering ({status}); rerun with \
                         --executor-logs to see why"
                    ));
                }
            }
            if let Some(finished) = self.threads.iter().position(JoinHandle::is_finished) {
                let thread = self.threads.swap_remove(finished);
                let why = match thread.join() {
                    Ok(Ok(_)) => "stopped".to_string(),
                    Ok(Err(error)) => error.to_string(),
                    Err(_) => "panicked".to_string(),
                };
                return Err(format!(
                    "an executor thread ended before registering: {why}"
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "timed out after {} s waiting for {count} executors ({} registered)",
                    timeout.as_secs(),
                    self.driver.executors()
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Stops the executors (asking them to exit, then killing processes that do not) and the
    /// driver.
    /// The executor processes' pids (none for threads, local mode or external executors).
    pub fn executor_pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Where a fault lands: executor process 0 (and its relay, if it has one).
    pub fn fault_target(&self) -> Option<Target> {
        let pid = self.children.first()?.id();
        let relay = self.relay.clone();
        Some(Target { pid, relay })
    }

    pub fn stop(mut self) {
        let _ = self.driver.stop_executors(Duration::from_secs(5));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.children.is_empty() {
            self.children
                .retain_mut(|child| matches!(child.try_wait(), Ok(None)));
            if Instant::now() >= deadline {
                for child in &mut self.children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let threads = std::mem::take(&mut self.threads);
        // The last holder of the driver shuts it down; callers that still hold it drop theirs.
        if let Ok(driver) = std::sync::Arc::try_unwrap(self.driver) {
            driver.shutdown();
        }
        for thread in threads {
            let _ = thread.join();
        }
    }
}
