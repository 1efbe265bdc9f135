//! The executor role: connects to the driver (retrying with backoff for a bounded time),
//! registers, runs launched tasks on its pinned task pool, reports their states in batches, and
//! heartbeats from its event loop, which tasks never block (they run on the pool's threads).
//!
//! It exits cleanly on `StopExecutor`; it exits with an error when registration is refused or
//! the driver goes away (Spark's fate-sharing): [`run`] returns why.
//!
//! The parts: this file holds [`run`] (connect with backoff, the pool and the loop), the
//! configuration, errors and summary; `core.rs` the protocol as a sans-IO state machine
//! ([`ExecutorCore`]: handshake, registration, heartbeats, the driver's frames as [`Action`]s,
//! completions as batched status updates); `endpoint.rs` the IO side on the event loop (the
//! socket, the timer, the task runner).

pub mod core;
mod endpoint;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_engine::pool::{PoolConfig, ShutdownMode, TaskPool};
use flint_engine::runtime::{Runtime, RuntimeConfig};
use mio::net::TcpStream;

pub use self::core::{Action, ExecutorCore};
use self::endpoint::ExecutorEndpoint;
pub use self::endpoint::ExecutorMsg;
use crate::conn::Connection;
use crate::handshake::{random_nonce, Secret};
use crate::transport::client::{Backoff, BACKOFF_INITIAL};
use crate::transport::Exit;
use crate::wire::FRAME_SIZE_MAX_DEFAULT;
use flint_engine::functions::Registry;

/// How an executor runs.
#[derive(Debug, Clone)]
pub struct ExecutorConfig {
    /// The driver's address.
    pub driver: SocketAddr,
    /// This executor's id (unique among the driver's executors).
    pub executor_id: String,
    /// The host name it reports.
    pub host: String,
    /// Tasks it runs at once (pool workers).
    pub cores: u32,
    /// The shared secret, if the driver requires one.
    pub secret: Option<Secret>,
    /// How long to keep trying to connect.
    pub connect_timeout: Duration,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Attempts it holds at once per core, running and queued; launches past it fail at once.
    /// A driver sends at most its own `tasks_per_core` per core, which it caps at
    /// [`crate::driver::TASKS_PER_CORE_MAX`], the default here.
    pub tasks_per_core: u32,
    /// Where the task threads run: worker `i` on the `i`-th listed CPU. Default: not pinned
    /// (a launcher that knows the machine, such as `flint local`, hands out CPUs).
    pub pin: Pinning,
}

impl ExecutorConfig {
    /// Defaults for an executor of `driver`.
    pub fn new(driver: SocketAddr, executor_id: impl Into<String>) -> Self {
        ExecutorConfig {
            driver,
            executor_id: executor_id.into(),
            host: "127.0.0.1".into(),
            cores: 1,
            secret: None,
            connect_timeout: Duration::from_secs(30),
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            tasks_per_core: crate::driver::TASKS_PER_CORE_MAX,
            pin: Pinning::None,
        }
    }

    /// Attempts it holds at once: `tasks_per_core` for each core.
    fn in_flight_max(&self) -> usize {
        (self.tasks_per_core as usize).saturating_mul(self.cores.max(1) as usize)
    }
}

/// Why an executor ended other than by `StopExecutor`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutorError {
    /// The driver could not be reached.
    #[error("cannot connect to the driver at {addr} within {timeout_ms} ms: {error}")]
    Connect {
        /// The driver's address.
        addr: SocketAddr,
        /// How long it tried.
        timeout_ms: u128,
        /// The last error.
        error: String,
    },
    /// The driver refused the handshake or the registration.
    #[error("registration refused: {0}")]
    Refused(String),
    /// The driver went away.
    #[error("the driver went away: {0}")]
    DriverGone(String),
    /// Local failure to start.
    #[error("cannot start: {0}")]
    Start(String),
}

/// What an executor did, once the driver stopped it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorSummary {
    /// Task attempts that reached a final state here.
    pub task_attempts: u64,
}

/// Where the endpoint leaves its exit reason for [`run`].
type ExitSlot = Exit<Result<ExecutorSummary, ExecutorError>>;

/// Runs an executor until the driver stops it (`Ok`, with what it did) or it must exit (`Err`).
/// A driver whose connection table is full refuses the handshake saying so
/// (`TABLE_FULL`): the executor tries again with backoff (logged at info) until
/// `connect_timeout` has passed.
pub fn run(config: ExecutorConfig, registry: Registry) -> Result<ExecutorSummary, ExecutorError> {
    let deadline = flint_engine::runtime::deadline_after(config.connect_timeout);
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match run_once(config.clone(), registry.clone(), remaining) {
            Err(ExecutorError::Refused(reason))
                if reason.contains(crate::conn::TABLE_FULL)
                    && Instant::now() + backoff.peek() < deadline =>
            {
                tracing::info!(
                    driver = %config.driver,
                    "the driver refused us: {reason}; retrying in {} ms",
                    backoff.peek().as_millis()
                );
                std::thread::sleep(backoff.next_delay());
            }
            other => return other,
        }
    }
}

/// One connection to the driver, until it ends.
fn run_once(
    config: ExecutorConfig,
    registry: Registry,
    connect_timeout: Duration,
) -> Result<ExecutorSummary, ExecutorError> {
    let stream = connect(config.driver, connect_timeout)?;
    // Submissions try every worker's inbox, so together they hold all `in_flight_max`.
    let mut pool = TaskPool::new(PoolConfig {
        workers: config.cores.max(1) as usize,
        inbox_capacity: config.tasks_per_core.max(1) as usize,
        pin: config.pin.clone(),
        thread_name: "flint-task".into(),
        ..PoolConfig::default()
    })
    .map_err(|e| ExecutorError::Start(format!("task pool: {e}")))?;
    let mut runtime = Runtime::new(RuntimeConfig {
        threads: 1,
        thread_name: "flint-executor".into(),
        ..RuntimeConfig::default()
    })
    .map_err(|e| ExecutorError::Start(format!("runtime: {e}")))?;
    let exit = Arc::new(ExitSlot::default());
    let nonce =
        random_nonce().map_err(|e| ExecutorError::Start(format!("no random nonce: {e}")))?;
    let endpoint = ExecutorEndpoint::new(
        ExecutorCore::new(&config, nonce),
        Connection::new(stream, config.frame_size_max, usize::MAX / 2),
        (pool.handle(), registry),
        config.in_flight_max(),
        exit.clone(),
    );
    runtime
        .handle()
        .spawn("executor", endpoint)
        .map_err(|e| ExecutorError::Start(format!("executor endpoint: {e}")))?;
    let reason = exit.wait();
    pool.shutdown(ShutdownMode::Cancel);
    runtime.shutdown();
    reason
}

/// Connects with exponential backoff (50 ms doubling to 1 s) until `timeout`.
fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream, ExecutorError> {
    let deadline = flint_engine::runtime::deadline_after(timeout);
    let mut backoff = Backoff::new(BACKOFF_INITIAL, Duration::from_secs(1));
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match std::net::TcpStream::connect_timeout(&addr, remaining.max(Duration::from_millis(1))) {
            Ok(stream) => {
                stream
                    .set_nonblocking(true)
                    .map_err(|e| ExecutorError::Start(format!("set_nonblocking: {e}")))?;
                return Ok(TcpStream::from_std(stream));
            }
            Err(error) if deadline.saturating_duration_since(Instant::now()) <= backoff.peek() => {
                return Err(ExecutorError::Connect {
                    addr,
                    timeout_ms: timeout.as_millis(),
                    error: error.to_string(),
                });
            }
            Err(error) => {
                let wait = backoff.next_delay();
                tracing::debug!(%addr, "connect failed ({error}); retrying in {} ms", wait.as_millis());
                std::thread::sleep(wait);
            }
        }
    }
}
