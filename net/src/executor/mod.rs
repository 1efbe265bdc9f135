//! The executor role: connects to the driver (retrying with backoff for a bounded time),
//! registers, runs launched tasks, reports their states in batches, and heartbeats from its
//! event loops, which long tasks never block (they run on the pool's threads).
//!
//! Lanes (thread per core, run to completion): an executor of `cores` N runs N lanes (at most
//! [`crate::wire::limits::LANES_MAX`]; more cores share them), each an event-loop thread with its own
//! connection to the driver, its own [`ExecutorCore`] and its own task runner. Lane 0 registers
//! the executor (`RegisterExecutor` with `lanes`) and is given a lane key; lanes 1.. then
//! connect, run the same handshake and join with the key (`JoinLane`). The driver sees one
//! executor of N cores and sends each launch to one lane, so a short task runs on the lane
//! thread that read it (see `flint_engine::runner`), and the rest go to the task pool the
//! lanes share, so a long one never delays a lane's reads, heartbeats or kills. With one core
//! there is one lane, as before lanes existed. Lane `i`'s loop runs on `pin`'s `i`-th CPU when
//! there are several (the pool's workers as listed).
//!
//! It exits cleanly on `StopExecutor` (on any lane); it exits with an error when registration
//! is refused or the driver goes away, on any lane (Spark's fate-sharing: one lane lost, the
//! executor ends): [`run`] returns the first lane's reason. One exception: a lane that a full
//! driver refuses before it joins (`TABLE_FULL`) is left out, logged, and the executor runs on
//! the lanes it has (all its cores still work through the pool), rather than leave and come
//! back in a loop.
//!
//! The parts: this file holds [`run`] (connect with backoff, the pool, the lanes), the
//! configuration, errors and summary; `core.rs` one lane's protocol as a sans-IO state machine
//! ([`ExecutorCore`]: handshake, registration or joining, heartbeats, the driver's frames as
//! [`Action`]s, completions as batched status updates); `endpoint.rs` a lane's IO side on its
//! event loop (the socket, the timer, the task runner).

pub mod core;
mod drain;
mod endpoint;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_engine::pool::{ShutdownMode, TaskPool, TaskPoolConfig};
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
    /// Tasks it runs at once (pool workers), and its lanes (one per core, at most
    /// [`crate::wire::limits::LANES_MAX`]: see the module docs).
    pub cores: u32,
    /// The shared secret, if the driver requires one.
    pub secret: Option<Secret>,
    /// How long to keep trying to connect.
    pub connect_timeout: Duration,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Attempts it holds at once per core, running and queued; launches past it fail at once.
    /// A driver sends at most its own `tasks_per_core` per core, which it caps at
    /// [`crate::wire::limits::TASKS_PER_CORE_MAX`], the default here.
    pub tasks_per_core: u32,
    /// Where the task threads run: worker `i` on the `i`-th listed CPU. Default: not pinned
    /// (a launcher that knows the machine, such as `flint local`, hands out CPUs).
    pub pin: Pinning,
    /// On SIGTERM, drain for at most this long, then leave (see `drain.rs`: the driver gives it
    /// no new task, the running ones may end, those still running are reported killed so they
    /// run elsewhere at once). None (the default): SIGTERM is not caught. A process setting;
    /// `flint executor` takes it from `$FLINT_DRAIN_TIMEOUT_MS`, which executor pods carry.
    pub drain_on_sigterm: Option<Duration>,
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
            tasks_per_core: crate::wire::limits::TASKS_PER_CORE_MAX,
            pin: Pinning::None,
            drain_on_sigterm: None,
        }
    }

    /// Its lanes: one per core, at most [`crate::wire::limits::LANES_MAX`] (see the module docs).
    pub fn lanes(&self) -> u32 {
        self.cores.clamp(1, crate::wire::limits::LANES_MAX)
    }

    /// Attempts it holds at once: `tasks_per_core` for each core.
    fn in_flight_max(&self) -> usize {
        (self.tasks_per_core as usize).saturating_mul(self.cores.max(1) as usize)
    }
}

/// The variable that carries an executor's drain timeout on SIGTERM, in milliseconds
/// (executor pods have it: their grace period less a margin).
pub const DRAIN_TIMEOUT_ENV: &str = "FLINT_DRAIN_TIMEOUT_MS";

/// [`ExecutorConfig::drain_on_sigterm`] from [`DRAIN_TIMEOUT_ENV`]: `None` when it is not set,
/// an error when it is not a number of milliseconds up to an hour.
pub fn drain_timeout_from_env() -> Result<Option<Duration>, String> {
    let Some(text) = std::env::var_os(DRAIN_TIMEOUT_ENV) else {
        return Ok(None);
    };
    let text = text.to_string_lossy();
    match text.parse::<u64>() {
        Ok(ms) if ms <= 3_600_000 => Ok(Some(Duration::from_millis(ms))),
        _ => Err(format!(
            "${DRAIN_TIMEOUT_ENV}: {text:?} is not a number of milliseconds up to 3600000"
        )),
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

/// Where the lanes leave the exit reason for [`run`] (the first one set).
type ExitSlot = Exit<Result<ExecutorSummary, ExecutorError>>;

/// Where lane 0 leaves the key the other lanes join with (`None`: it ended first).
type KeySlot = Exit<Option<[u8; 32]>>;

/// Whether a lane's `exit` leaves it out rather than ending the executor: a lane past 0 that a
/// full driver refused before it joined (see the module docs).
pub(crate) fn lane_left_out<T>(lane: u32, exit: &Result<T, ExecutorError>) -> bool {
    matches!(exit, Err(ExecutorError::Refused(why)) if lane > 0 && why.contains(crate::conn::TABLE_FULL))
}

/// What an executor's lanes share.
struct LaneShared {
    exit: Arc<ExitSlot>,
    /// Lane 0's only, when there are other lanes.
    key: Option<Arc<KeySlot>>,
    /// The attempts the lanes ran, added as each stops.
    task_attempts: Arc<AtomicU64>,
    /// Every started lane, for a drain on SIGTERM.
    lanes: drain::Lanes,
}

/// Runs an executor until the driver stops it (`Ok`, with what it did) or it must exit (`Err`).
/// A driver whose connection table is full refuses the handshake saying so
/// (`TABLE_FULL`): the executor tries again with backoff (logged at info) until
/// `connect_timeout` has passed.
pub fn run(config: ExecutorConfig, registry: Registry) -> Result<ExecutorSummary, ExecutorError> {
    if config.drain_on_sigterm.is_some() {
        drain::catch_sigterm().map_err(|e| ExecutorError::Start(format!("SIGTERM: {e}")))?;
    }
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

/// One run of the executor's lanes, until the first ends.
fn run_once(
    config: ExecutorConfig,
    registry: Registry,
    connect_timeout: Duration,
) -> Result<ExecutorSummary, ExecutorError> {
    let deadline = flint_engine::runtime::deadline_after(connect_timeout);
    let stream = connect(config.driver, connect_timeout)?;
    // Submissions try every worker's inbox, so together they hold all `in_flight_max`.
    let mut pool = TaskPool::new(TaskPoolConfig {
        workers: config.cores.max(1) as usize,
        inbox_capacity: config.tasks_per_core.max(1) as usize,
        pin: config.pin.clone(),
        thread_name: "flint-task".into(),
        ..TaskPoolConfig::default()
    })
    .map_err(|e| ExecutorError::Start(format!("task pool: {e}")))?;
    let lanes = config.lanes();
    let mut runtime = Runtime::new(RuntimeConfig {
        threads: lanes as usize,
        thread_name: "flint-executor".into(),
        // One lane runs as before lanes: its loop not pinned.
        pin: if lanes > 1 {
            config.pin.clone()
        } else {
            Pinning::None
        },
        ..RuntimeConfig::default()
    })
    .map_err(|e| ExecutorError::Start(format!("runtime: {e}")))?;
    let shared = LaneShared {
        exit: Arc::new(ExitSlot::default()),
        key: (lanes > 1).then(|| Arc::new(KeySlot::default())),
        task_attempts: Arc::new(AtomicU64::new(0)),
        lanes: drain::Lanes::default(),
    };
    if let Some(timeout) = config.drain_on_sigterm {
        drain::watch(shared.lanes.clone(), shared.exit.clone(), timeout)
            .map_err(|e| ExecutorError::Start(format!("SIGTERM watcher: {e}")))?;
    }
    let starter = LaneStarter {
        config: &config,
        runtime: &runtime,
        pool: &pool,
        registry: &registry,
        shared: &shared,
    };
    starter.spawn(0, stream, |nonce| ExecutorCore::new(&config, nonce));
    if let Some(key) = shared.key.as_ref().and_then(|slot| slot.wait()) {
        starter.start_others(key, deadline);
    }
    let reason = shared.exit.wait();
    pool.shutdown(ShutdownMode::Cancel);
    runtime.shutdown();
    // Every lane has stopped, so each has added what it ran.
    let task_attempts = shared.task_attempts.load(Ordering::SeqCst);
    reason.map(|_| ExecutorSummary { task_attempts })
}

/// What starting a lane takes: the executor's config, the loops, the pool and registry the
/// lanes share, and what they report through.
struct LaneStarter<'a> {
    config: &'a ExecutorConfig,
    runtime: &'a Runtime,
    pool: &'a TaskPool,
    registry: &'a Registry,
    shared: &'a LaneShared,
}

impl LaneStarter<'_> {
    /// Lanes 1.. once lane 0 is registered: each connects (by `deadline`) and joins with
    /// `key`. A lane that cannot connect ends the executor.
    fn start_others(&self, key: [u8; 32], deadline: Instant) {
        let config = self.config;
        for lane in 1..config.lanes() {
            if self.shared.exit.is_set() {
                // A lane has ended already: the executor is going.
                return;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let stream = match connect(config.driver, remaining) {
                Ok(stream) => stream,
                Err(error) => return self.shared.exit.set(Err(error)),
            };
            self.spawn(lane, stream, |nonce| {
                ExecutorCore::new_lane(config, nonce, lane, key)
            });
        }
    }

    /// Starts lane `lane` on its loop over `stream`, its core made by `core` from a fresh
    /// nonce. A failure to start ends the executor.
    fn spawn(&self, lane: u32, stream: TcpStream, core: impl FnOnce([u8; 32]) -> ExecutorCore) {
        let shared = self.shared;
        let started = random_nonce()
            .map_err(|e| ExecutorError::Start(format!("no random nonce: {e}")))
            .and_then(|nonce| {
                let lane_shared = LaneShared {
                    exit: shared.exit.clone(),
                    key: shared.key.clone().filter(|_| lane == 0),
                    task_attempts: shared.task_attempts.clone(),
                    lanes: shared.lanes.clone(),
                };
                let endpoint = ExecutorEndpoint::new(
                    core(nonce),
                    Connection::new(stream, self.config.frame_size_max, usize::MAX / 2),
                    (self.pool.handle(), self.registry.clone()),
                    self.config.in_flight_max(),
                    &lane_shared,
                );
                let name = format!("executor-lane-{lane}");
                (self
                    .runtime
                    .handle()
                    .spawn_on(lane as usize, &name, endpoint))
                .map(|lane_ref| shared.lanes.add(lane_ref))
                .map_err(|e| ExecutorError::Start(format!("executor lane {lane}: {e}")))
            });
        if let Err(error) = started {
            if let Some(key) = &shared.key {
                key.set(None);
            }
            shared.exit.set(Err(error));
        }
    }
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
