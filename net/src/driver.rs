//! The driver role: accepts executors over TCP (or runs an in-process executor in local mode),
//! runs the scheduler state machine on an event loop, and turns its outputs into batched frames.
//!
//! # On the loop
//!
//! The [`DriverEndpoint`] owns the listener, every connection and the [`Scheduler`]. A readable
//! connection is read until it would block; each frame goes through the handshake, then
//! registration, then (for executors) status updates and heartbeats, all fed to the scheduler
//! with the loop's clock. After every event the endpoint *pumps*: it drains the scheduler's
//! outputs, appends one `LaunchTasks` frame per executor batch to that connection's buffer,
//! reports results to jobs, and flushes each touched connection once, so a write carries every
//! frame produced by that event.
//!
//! # Executors and failure
//!
//! The scheduler sees each executor core as `tasks_per_core` slots: short tasks pipeline (an
//! executor has the next tasks queued in its pool when one finishes) while the pool still runs
//! at most `cores` at a time. An executor is lost when its connection closes or fails, when it
//! sends malformed bytes, or when it is silent for `heartbeat_timeout`; the scheduler then puts
//! its running tasks back, in time proportional to them.
//!
//! # Stalls
//!
//! A peer is not trusted to be honest or alive:
//!
//! - an executor may claim at most [`EXECUTOR_CORES_MAX`] cores (registration above is refused
//!   with the reason), and the scheduler's slow start lets a new one fill only a few slots until
//!   it finishes tasks;
//! - one that heartbeats but never finishes is *stalled* (see the scheduler's docs): its attempts
//!   are copied elsewhere, it gets no new work, and a warning naming it is logged every
//!   [`WARN_INTERVAL`] while it stays so;
//! - one that does not read its socket (bytes queued for it and none written for
//!   `heartbeat_timeout`) is lost, like a silent one;
//! - while tasks wait and no executor can run them (all lost, or all excluded), a warning is
//!   logged every [`WARN_INTERVAL`] (the first after one interval) and [`Driver::no_executor_for`] says for how long, so a
//!   caller can give up (`flint driver --no-executor-timeout-s`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::affinity::Pinning;
use flint_engine::hash::FxHashMap;
use flint_engine::pool::{PoolConfig, ShutdownMode, TaskPool};
use flint_engine::runtime::{
    AskError, Ctx, Endpoint, EndpointRef, Reply, Runtime, RuntimeConfig, SendError, TimerId,
};
use flint_engine::scheduler::{
    self, Config as SchedulerConfig, ExecutorId, ExecutorInfo, JobId, Output, RemovalReason,
    Scheduler, Stats, TaskId,
};
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Token};

use crate::admission::Admission;
pub use crate::admission::FUNCTION_NAME_MAX_BYTES;
use crate::conn::{accept_next, refuse, ConnError, Connection, Inbound, TABLE_FULL};
use crate::functions::Registry;
use crate::handshake::{Handshake, Secret};
use crate::job::{Job, JobHandle, JobShared, ResultObserver};
use crate::observe::{DriverView, Ended, LoopTelemetry, Refusal};
use crate::runner::{Completion, TaskRunner};
use crate::wire::{self, batch, KeyValue, List, Message, Role, FRAME_SIZE_MAX_DEFAULT};

/// The most task slots per executor core: executors size their queues for this many.
pub const TASKS_PER_CORE_MAX: u32 = 1024;

/// The most cores an executor may register with; a registration claiming more is refused
/// with the reason. (With [`TASKS_PER_CORE_MAX`] that is at most 2^20 slots.)
pub const EXECUTOR_CORES_MAX: u32 = 1024;

/// How often the driver repeats a warning about a stall (stalled executors, tasks that no
/// executor can run).
pub const WARN_INTERVAL: Duration = Duration::from_secs(5);

/// How often the driver looks for stalls (the checks scan executors).
const HEALTH_INTERVAL: Duration = Duration::from_millis(100);

/// How a driver runs.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// Where to listen for executors. Default `127.0.0.1:0` (any free port).
    pub listen: SocketAddr,
    /// Bind a non-loopback address even without a shared secret.
    pub allow_insecure_bind: bool,
    /// The shared secret executors must prove they hold.
    pub secret: Option<Secret>,
    /// How often executors heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which an executor is declared lost.
    pub heartbeat_timeout: Duration,
    /// Time a new connection has to finish the handshake and register.
    pub handshake_timeout: Duration,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Bytes a connection may have queued unsent before it is dropped as not reading.
    pub outbound_max: usize,
    /// Connections (registered or not) held at once; more are refused at accept.
    pub connections_max: usize,
    /// Task slots per executor core (see the module docs), at most [`TASKS_PER_CORE_MAX`].
    pub tasks_per_core: u32,
    /// Run tasks on an in-process pool of this many cores instead of (or beside) remote
    /// executors: local mode.
    pub local_cores: Option<u32>,
    /// Where the driver's threads run: its loop on the first listed CPU, local mode's workers
    /// on the next ones. Default: not pinned.
    pub pin: Pinning,
    /// The scheduler's settings.
    pub scheduler: SchedulerConfig,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            allow_insecure_bind: false,
            secret: None,
            heartbeat_interval: Duration::from_millis(500),
            heartbeat_timeout: Duration::from_secs(3),
            handshake_timeout: Duration::from_secs(5),
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 256 << 20,
            connections_max: 4096,
            tasks_per_core: 256,
            local_cores: None,
            pin: Pinning::None,
            // Exclusion is off by default, as in Spark: with few executors, excluding one for a
            // job's failures can leave the job nowhere to run until the unschedulable timeout.
            scheduler: SchedulerConfig {
                exclusion: None,
                ..SchedulerConfig::default()
            },
        }
    }
}

/// Why a driver call failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The listener could not be bound.
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// A non-loopback address without a secret.
    #[error("refusing to listen on non-loopback {0} without a shared secret (set a secret, or allow it explicitly)")]
    InsecureBind(SocketAddr),
    /// The runtime or pool could not start.
    #[error("cannot start: {0}")]
    Start(String),
    /// The scheduler refused the job.
    #[error("job refused: {0}")]
    Submit(String),
    /// Something did not happen in time.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// The driver's inbox is full: it is alive but behind. Back off and try again.
    #[error("the driver is busy (its inbox is full); back off and try again")]
    Busy,
    /// Called from the driver's own loop (a [`Job::on_result`] observer, say), where waiting
    /// for the driver's answer would wait forever.
    #[error("called from the driver's own loop, which cannot answer while it waits")]
    SameLoop,
    /// The driver has stopped.
    #[error("the driver has stopped")]
    Stopped,
}

impl From<AskError> for DriverError {
    fn from(error: AskError) -> Self {
        match error {
            AskError::Timeout { timeout_ms } => {
                DriverError::Timeout(format!("the driver's answer ({timeout_ms} ms)"))
            }
            AskError::Full => DriverError::Busy,
            AskError::SameLoop => DriverError::SameLoop,
            AskError::Stopped | AskError::Shutdown => DriverError::Stopped,
        }
    }
}

impl<M> From<SendError<M>> for DriverError {
    fn from(error: SendError<M>) -> Self {
        match error {
            SendError::Full(_) => DriverError::Busy,
            SendError::Stopped(_) | SendError::Shutdown(_) => DriverError::Stopped,
        }
    }
}

/// Counters the driver keeps for whoever embeds it.
#[derive(Debug, Default)]
struct Counters {
    executors: AtomicUsize,
    executors_registered: AtomicU64,
    executors_lost: AtomicU64,
    /// Since when (micros after the driver's start, plus one) tasks have waited with no
    /// executor able to run them; 0 while that is not so.
    starved_since_us: AtomicU64,
}

/// A running driver.
pub struct Driver {
    runtime: Option<Runtime>,
    pool: Option<TaskPool>,
    endpoint: EndpointRef<DriverEndpoint>,
    local_addr: Option<SocketAddr>,
    counters: Arc<Counters>,
    /// The caller side of the limits: ids, room, waiters.
    admission: Arc<Admission>,
    /// The scheduler's counters as the loop last published them.
    stats: Arc<PublishedStats>,
    /// The endpoint's clock origin.
    epoch: Instant,
}

/// The scheduler's [`Stats`], published by the loop after every event so callers read them
/// without asking it.
#[derive(Debug, Default)]
struct PublishedStats {
    launched: AtomicU64,
    succeeded: AtomicU64,
    attempts_failed: AtomicU64,
    speculative_launched: AtomicU64,
    ignored_updates: AtomicU64,
    executors_excluded: AtomicU64,
    attempts_killed: AtomicU64,
    late_failures: AtomicU64,
}

impl PublishedStats {
    fn publish(&self, stats: &Stats) {
        let Stats {
            launched,
            succeeded,
            attempts_failed,
            speculative_launched,
            ignored_updates,
            executors_excluded,
            attempts_killed,
            late_failures,
        } = *stats;
        self.launched.store(launched, Ordering::Relaxed);
        self.succeeded.store(succeeded, Ordering::Relaxed);
        self.attempts_failed
            .store(attempts_failed, Ordering::Relaxed);
        self.speculative_launched
            .store(speculative_launched, Ordering::Relaxed);
        self.ignored_updates
            .store(ignored_updates, Ordering::Relaxed);
        self.executors_excluded
            .store(executors_excluded, Ordering::Relaxed);
        self.attempts_killed
            .store(attempts_killed, Ordering::Relaxed);
        self.late_failures.store(late_failures, Ordering::Relaxed);
    }

    fn read(&self) -> Stats {
        Stats {
            launched: self.launched.load(Ordering::Relaxed),
            succeeded: self.succeeded.load(Ordering::Relaxed),
            attempts_failed: self.attempts_failed.load(Ordering::Relaxed),
            speculative_launched: self.speculative_launched.load(Ordering::Relaxed),
            ignored_updates: self.ignored_updates.load(Ordering::Relaxed),
            executors_excluded: self.executors_excluded.load(Ordering::Relaxed),
            attempts_killed: self.attempts_killed.load(Ordering::Relaxed),
            late_failures: self.late_failures.load(Ordering::Relaxed),
        }
    }
}

/// A job [`Driver::try_submit`] did not take, handed back with why.
#[derive(Debug)]
pub struct Rejected {
    /// Why: [`DriverError::Busy`] (try again later), [`DriverError::Submit`] (over a limit,
    /// or malformed), [`DriverError::Stopped`].
    pub error: DriverError,
    /// The job, untouched (boxed: a rejection is the rare path).
    pub job: Box<Job>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Driver`]. The named settings ([`listen`](Self::listen),
/// [`secret`](Self::secret), [`local`](Self::local)) win over the same fields of
/// [`config`](Self::config), whatever order they are called in.
#[derive(Debug, Default)]
pub struct DriverBuilder {
    config: DriverConfig,
    listen: Option<SocketAddr>,
    secret: Option<Option<Secret>>,
    local: Option<(u32, Registry)>,
}

impl DriverBuilder {
    /// Where to listen.
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// The shared secret (`None`: executors need none).
    pub fn secret(mut self, secret: Option<Secret>) -> Self {
        self.secret = Some(secret);
        self
    }

    /// Local mode: run tasks in this process on `cores` pinned workers, with `registry`'s
    /// functions. No sockets are needed, but executors may still connect.
    pub fn local(mut self, cores: u32, registry: Registry) -> Self {
        self.local = Some((cores.max(1), registry));
        self
    }

    /// Every other setting.
    pub fn config(mut self, config: DriverConfig) -> Self {
        self.config = config;
        self
    }

    /// Starts the driver: binds, starts its loop (and local pool).
    pub fn start(self) -> Result<Driver, DriverError> {
        let mut config = self.config;
        if let Some(listen) = self.listen {
            config.listen = listen;
        }
        if let Some(secret) = self.secret {
            config.secret = secret;
        }
        let registry = match self.local {
            Some((cores, registry)) => {
                config.local_cores = Some(cores);
                registry
            }
            None => Registry::with_builtins(),
        };
        Driver::start(config, registry)
    }
}

impl Driver {
    /// A builder with the defaults.
    pub fn builder() -> DriverBuilder {
        DriverBuilder::default()
    }

    fn start(mut config: DriverConfig, registry: Registry) -> Result<Driver, DriverError> {
        let addr = config.listen;
        if !addr.ip().is_loopback() && config.secret.is_none() && !config.allow_insecure_bind {
            return Err(DriverError::InsecureBind(addr));
        }
        let listener =
            TcpListener::bind(addr).map_err(|error| DriverError::Bind { addr, error })?;
        let local_addr = listener.local_addr().ok();
        // A task's payload travels in a LaunchTasks frame; leave room for the frame's fields.
        config.scheduler.payload_max_bytes = config
            .scheduler
            .payload_max_bytes
            .min(batch::item_bytes_max(config.frame_size_max).saturating_sub(4096));

        let pool = match config.local_cores {
            None => None,
            Some(cores) => Some(
                TaskPool::new(PoolConfig {
                    workers: cores as usize,
                    // Submissions try every worker's inbox: together they hold every slot.
                    inbox_capacity: config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX) as usize,
                    thread_name: "flint-local".into(),
                    pin: config.pin.from_thread(1),
                    ..PoolConfig::default()
                })
                .map_err(|e| DriverError::Start(format!("task pool: {e}")))?,
            ),
        };
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            thread_name: "flint-driver".into(),
            pin: config.pin.clone(),
            ..RuntimeConfig::default()
        })
        .map_err(|e| DriverError::Start(format!("runtime: {e}")))?;
        let counters = Arc::new(Counters::default());
        let admission = Arc::new(Admission::new(
            config.scheduler.pending_tasks_max,
            config.scheduler.jobs_max,
        ));
        let stats = Arc::new(PublishedStats::default());
        let epoch = Instant::now();
        let endpoint = DriverEndpoint {
            scheduler: Scheduler::new(config.scheduler.clone()),
            local: pool.as_ref().map(|pool| (pool.handle(), registry)),
            runner: None,
            config,
            listener,
            listener_token: None,
            peers: FxHashMap::default(),
            tokens: FxHashMap::default(),
            names: std::collections::HashMap::new(),
            links: FxHashMap::default(),
            next_executor: 1,
            jobs: FxHashMap::default(),
            epoch,
            outputs: Vec::new(),
            dirty: Vec::new(),
            counters: counters.clone(),
            stopping: false,
            tick: None,
            retiring: FxHashMap::default(),
            gone: std::collections::VecDeque::new(),
            local_spilled: false,
            health: Health::new(epoch),
            admission: admission.clone(),
            stats: stats.clone(),
            deadlines: std::collections::BinaryHeap::new(),
            executor_waiters: Vec::new(),
            telemetry: Box::new(LoopTelemetry::new(epoch)),
        };
        let endpoint = runtime
            .handle()
            .spawn("driver", endpoint)
            .map_err(|e| DriverError::Start(format!("driver endpoint: {e}")))?;
        Ok(Driver {
            runtime: Some(runtime),
            pool,
            endpoint,
            local_addr,
            counters,
            admission,
            stats,
            epoch,
        })
    }

    /// The address executors connect to.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Executors registered now (the local one included).
    pub fn executors(&self) -> usize {
        self.counters.executors.load(Ordering::SeqCst)
    }

    /// Executors lost so far (connection closed or failed, silent past the timeout, or
    /// reported gone through [`Driver::remove_executor`]).
    pub fn executors_lost(&self) -> u64 {
        self.counters.executors_lost.load(Ordering::SeqCst)
    }

    /// How long tasks have been waiting with no executor able to run them (none registered, or
    /// all excluded), if they are now; checked every 100 ms. A caller that wants to give up
    /// cancels its jobs after a while (`flint driver --no-executor-timeout-s`).
    pub fn no_executor_for(&self) -> Option<Duration> {
        let since = self.counters.starved_since_us.load(Ordering::SeqCst);
        let since = since.checked_sub(1)?;
        Some(
            self.epoch
                .elapsed()
                .saturating_sub(Duration::from_micros(since)),
        )
    }

    /// Waits until at least `count` executors are registered (the loop answers when one
    /// registers; nothing polls).
    pub fn wait_for_executors(&self, count: usize, timeout: Duration) -> Result<(), DriverError> {
        self.endpoint
            .ask(|reply| DriverMsg::WhenExecutors { count, reply }, timeout)
            .map_err(|error| match error {
                AskError::Timeout { .. } => DriverError::Timeout(format!(
                    "{count} executors ({} registered)",
                    self.executors()
                )),
                other => other.into(),
            })
    }

    /// [`wait_for_executors`](Self::wait_for_executors) for async callers: no thread blocks.
    /// Bound it with the caller's own timer.
    pub async fn wait_for_executors_async(&self, count: usize) -> Result<(), DriverError> {
        self.endpoint
            .ask_async(|reply| DriverMsg::WhenExecutors { count, reply })?
            .await
            .map_err(DriverError::from)
    }

    /// Submits a job without waiting for anything: the id is allocated and the limits are
    /// checked on this thread, then the job goes into the driver loop's inbox (waking the loop
    /// only if it is parked). A full inbox hands the job back with [`DriverError::Busy`];
    /// [`submit_async`](Self::submit_async) waits for room instead. What only the loop can
    /// decide (a payload over the frame size, say) arrives as the job's outcome.
    pub fn try_submit(&self, job: Job) -> Result<JobHandle, Rejected> {
        if job.function.len() > FUNCTION_NAME_MAX_BYTES {
            let error = DriverError::Submit(format!(
                "the function name is {} bytes, over {FUNCTION_NAME_MAX_BYTES}",
                job.function.len()
            ));
            return Err(Rejected {
                error,
                job: Box::new(job),
            });
        }
        let id = match self.admission.admit(&job) {
            Ok(id) => id,
            Err(error) => {
                let error = DriverError::Submit(error.to_string());
                return Err(Rejected {
                    error,
                    job: Box::new(job),
                });
            }
        };
        let tasks = job.payloads.len();
        let shared = Arc::new(JobShared::new(job.stream));
        let msg = DriverMsg::Submit {
            id,
            job,
            shared: shared.clone(),
        };
        if let Err(error) = self.endpoint.send(msg) {
            self.admission.release(tasks);
            let busy = matches!(error, SendError::Full(_));
            let DriverMsg::Submit { job, .. } = error.into_inner() else {
                unreachable!("the message sent was a Submit");
            };
            let error = if busy {
                DriverError::Busy
            } else {
                DriverError::Stopped
            };
            return Err(Rejected {
                error,
                job: Box::new(job),
            });
        }
        let endpoint = self.endpoint.clone();
        let admission = self.admission.clone();
        let cancelled = shared.clone();
        let cancel = Box::new(move || {
            cancelled.cancel();
            if endpoint.send(DriverMsg::Cancel(id)).is_err() {
                // The loop is behind: it looks for cancelled jobs at its next tick.
                admission.cancels_pending.store(true, Ordering::Release);
            }
        });
        Ok(JobHandle {
            id: id.0,
            tasks: tasks as u64,
            shared,
            cancel,
            detached: false,
        })
    }

    /// Submits a job from a plain thread: as [`try_submit`](Self::try_submit), but while the
    /// loop's inbox is full it backs off and tries again (for up to a minute) rather than
    /// handing the job back. Async code uses [`submit_async`](Self::submit_async).
    pub fn submit(&self, job: Job) -> Result<JobHandle, DriverError> {
        let deadline = flint_engine::runtime::deadline_after(Duration::from_secs(60));
        let mut tries = 0u32;
        let mut job = job;
        loop {
            match self.try_submit(job) {
                Ok(handle) => return Ok(handle),
                Err(Rejected {
                    error: DriverError::Busy,
                    job: back,
                }) if Instant::now() < deadline => {
                    job = *back;
                    tries = tries.saturating_add(1);
                    if tries < 16 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                Err(rejected) => return Err(rejected.error),
            }
        }
    }

    /// Submits a job from async code: as [`try_submit`](Self::try_submit), but while the
    /// loop's inbox is full it waits (without blocking a thread) until the loop makes room.
    pub async fn submit_async(&self, job: Job) -> Result<JobHandle, DriverError> {
        let mut job = Some(job);
        std::future::poll_fn(|cx| {
            let Some(next) = job.take() else {
                return std::task::Poll::Ready(Err(DriverError::Stopped));
            };
            match self.try_submit(next) {
                Ok(handle) => std::task::Poll::Ready(Ok(handle)),
                Err(Rejected {
                    error: DriverError::Busy,
                    job: back,
                }) => {
                    self.admission.wait_for_room(cx.waker());
                    // The loop may have made room between the try and the registration.
                    match self.try_submit(*back) {
                        Ok(handle) => std::task::Poll::Ready(Ok(handle)),
                        Err(Rejected {
                            error: DriverError::Busy,
                            job: back,
                        }) => {
                            job = Some(*back);
                            std::task::Poll::Pending
                        }
                        Err(rejected) => std::task::Poll::Ready(Err(rejected.error)),
                    }
                }
                Err(rejected) => std::task::Poll::Ready(Err(rejected.error)),
            }
        })
        .await
    }

    /// Jobs submitted and not yet ended.
    pub fn active_jobs(&self) -> usize {
        self.admission.active_jobs()
    }

    /// The scheduler's counters, as the driver's loop last published them (read without
    /// asking the loop).
    pub fn stats(&self) -> Stats {
        self.stats.read()
    }

    /// What an allocator needs: the backlog and each remote executor's running tasks.
    pub fn executors_view(&self) -> Result<ExecutorsView, DriverError> {
        self.endpoint
            .ask(DriverMsg::Executors, Duration::from_secs(10))
            .map_err(DriverError::from)
    }

    /// [`executors_view`](Self::executors_view) for async callers: no thread blocks.
    pub async fn executors_view_async(&self) -> Result<ExecutorsView, DriverError> {
        self.endpoint
            .ask_async(DriverMsg::Executors)?
            .await
            .map_err(DriverError::from)
    }

    /// A handle for watching this driver from other threads (metrics, web UI): it holds no
    /// resources of the driver's and answers errors once the driver is gone.
    pub fn observer(&self) -> DriverObserver {
        DriverObserver {
            endpoint: self.endpoint.clone(),
        }
    }

    /// Executors (by their id on the wire) that are stalled: they hold a straggler and have
    /// finished nothing since it was launched, so they get no new work (and are named in a
    /// warning every [`WARN_INTERVAL`]) until they report a task.
    pub fn stalled_executors(&self) -> Result<Vec<String>, DriverError> {
        self.endpoint
            .ask(DriverMsg::Stalled, Duration::from_secs(10))
            .map_err(DriverError::from)
    }

    /// Tells one remote executor (by its id on the wire) to exit; its removal is not counted
    /// as a loss ([`Driver::executors_lost`]). Answers whether it was registered.
    pub fn stop_executor(&self, name: &str) -> Result<bool, DriverError> {
        let name = name.to_owned();
        self.endpoint
            .ask(
                |reply| DriverMsg::StopExecutor { name, reply },
                Duration::from_secs(10),
            )
            .map_err(DriverError::from)
    }

    /// Removes a remote executor (by its id on the wire) from the scheduler for `reason` and
    /// drops its connection, if it is still registered: what a lifecycle handler does when a
    /// cluster manager reports the executor gone. Its running tasks go back to pending (counted
    /// as failed attempts only if the reason says the application caused it); it counts as
    /// lost ([`Driver::executors_lost`]). When it is already gone (its connection closed
    /// first, as it usually does), a reason that blames the application is still charged to
    /// the attempts it was running then, so a task that crashes every executor fails its job
    /// after `max_failures` crashes.
    pub fn remove_executor(&self, name: &str, reason: RemovalReason) -> Result<(), DriverError> {
        self.endpoint
            .send(DriverMsg::RemoveExecutor {
                name: name.to_owned(),
                reason,
            })
            .map_err(DriverError::from)
    }

    /// Tells every remote executor to exit and waits (up to `timeout`) until they have gone.
    pub fn stop_executors(&self, timeout: Duration) -> Result<(), DriverError> {
        let remote = self
            .endpoint
            .ask(DriverMsg::StopExecutors, Duration::from_secs(10))
            .map_err(DriverError::from)?;
        let local = usize::from(self.pool.is_some());
        wait_until(timeout, || self.executors() <= local)
            .map_err(|_| DriverError::Timeout(format!("{remote} executors to stop")))
    }

    /// Stops the loop (dropping every connection) and the local pool.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(mut runtime) = self.runtime.take() {
            runtime.shutdown();
        }
        if let Some(mut pool) = self.pool.take() {
            pool.shutdown(ShutdownMode::Cancel);
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `condition` every millisecond until it holds or `timeout` passes.
fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> Result<(), ()> {
    let deadline = flint_engine::runtime::deadline_after(timeout);
    loop {
        if condition() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The backlog and the remote executors, as [`Driver::executors_view`] sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutorsView {
    /// Tasks waiting for a slot.
    pub pending_tasks: usize,
    /// Tasks running (launched and not finished).
    pub running_tasks: usize,
    /// Each registered remote executor: its id on the wire and the tasks running on it.
    pub executors: Vec<(String, u32)>,
}

/// Watches a [`Driver`] from any thread: [`Driver::observer`].
#[derive(Clone)]
pub struct DriverObserver {
    endpoint: EndpointRef<DriverEndpoint>,
}

impl std::fmt::Debug for DriverObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverObserver").finish_non_exhaustive()
    }
}

impl DriverObserver {
    /// Everything the driver shows, asked of its loop (one message; the loop keeps the values
    /// anyway). Fails if the loop does not answer within `timeout` or the driver stopped.
    pub fn view(&self, timeout: Duration) -> Result<DriverView, DriverError> {
        self.endpoint
            .ask(DriverMsg::Observe, timeout)
            .map(|view| *view)
            .map_err(DriverError::from)
    }
}

/// Messages to the driver's endpoint.
pub(crate) enum DriverMsg {
    /// Submit a job (admitted by the caller under this id).
    Submit {
        /// Its id.
        id: JobId,
        /// The job.
        job: Job,
        /// Where its results and outcome go.
        shared: Arc<JobShared>,
    },
    /// Cancel a job.
    Cancel(JobId),
    /// Answer once at least this many executors are registered.
    WhenExecutors {
        /// How many.
        count: usize,
        /// The answer.
        reply: Reply<()>,
    },
    /// Send `StopExecutor` to every remote executor; replies with how many.
    StopExecutors(Reply<usize>),
    /// Local tasks completed.
    LocalKick,
    /// The backlog and the executors.
    Executors(Reply<ExecutorsView>),
    /// The stalled executors' ids on the wire.
    Stalled(Reply<Vec<String>>),
    /// What the driver shows (metrics, web UI).
    Observe(Reply<Box<DriverView>>),
    /// Send `StopExecutor` to one executor; replies whether it is registered.
    StopExecutor {
        /// Its id on the wire.
        name: String,
        /// Whether it was registered.
        reply: Reply<bool>,
    },
    /// Remove an executor for a reason a cluster manager gave.
    RemoveExecutor {
        /// Its id on the wire.
        name: String,
        /// Why.
        reason: RemovalReason,
    },
}

/// Where an executor's launches go.
#[derive(Debug, Clone, Copy)]
enum Link {
    Remote(Token),
    Local,
}

enum Phase {
    Handshake(Box<Handshake>),
    Registering,
    Executor(ExecutorId),
    Client,
}

struct Peer {
    conn: Connection,
    phase: Phase,
    opened: Instant,
    last_heard: Instant,
    /// Since when bytes have been queued for it with none written (a peer not reading).
    write_stuck_since: Option<Instant>,
}

/// The driver's watch for stalls (see the module docs).
struct Health {
    next_check: Instant,
    /// Since when tasks have waited with no executor able to run them.
    starved_since: Option<Instant>,
    next_starved_warning: Instant,
    next_stalled_warning: Instant,
}

impl Health {
    fn new(now: Instant) -> Health {
        Health {
            next_check: now,
            starved_since: None,
            next_starved_warning: now,
            next_stalled_warning: now,
        }
    }
}

struct JobEntry {
    shared: Arc<JobShared>,
    observer: Option<ResultObserver>,
    /// Tasks in the job, given back to admission when it ends.
    tasks: usize,
}

/// The driver on its loop (see the module docs).
pub(crate) struct DriverEndpoint {
    config: DriverConfig,
    scheduler: Scheduler,
    listener: TcpListener,
    listener_token: Option<Token>,
    peers: FxHashMap<Token, Peer>,
    /// Registered remote executors' connections.
    tokens: FxHashMap<ExecutorId, Token>,
    /// Executor ids on the wire, for refusing duplicates (peer-chosen strings: SipHash).
    names: std::collections::HashMap<String, ExecutorId>,
    links: FxHashMap<ExecutorId, Link>,
    next_executor: u64,
    local: Option<(flint_engine::pool::PoolHandle, Registry)>,
    runner: Option<TaskRunner>,
    jobs: FxHashMap<JobId, JobEntry>,
    epoch: Instant,
    outputs: Vec<Output>,
    dirty: Vec<Token>,
    counters: Arc<Counters>,
    stopping: bool,
    /// The periodic tick and its period (see [`DriverEndpoint::arm_tick`]).
    tick: Option<(TimerId, Duration)>,
    /// Executors being stopped or removed for a known reason: the reason their removal gets,
    /// and whether it counts as a loss (a cluster manager's report does, a stop does not).
    retiring: FxHashMap<ExecutorId, (RemovalReason, bool)>,
    /// The local runner completed attempts on this thread while launching: drain it (no kick
    /// comes for those).
    local_spilled: bool,
    health: Health,
    admission: Arc<Admission>,
    stats: Arc<PublishedStats>,
    /// Jobs' deadlines (micros on the loop's clock), earliest first.
    deadlines: std::collections::BinaryHeap<std::cmp::Reverse<(u64, JobId)>>,
    /// Callers waiting for a number of executors.
    executor_waiters: Vec<(usize, Reply<()>)>,
    /// Executors removed lately (newest last, at most [`GONE_NAMES_MAX`]) by their id on the
    /// wire, so a cluster manager's later exit reason still reaches the scheduler
    /// ([`Driver::remove_executor`]; issue 14 item 7).
    gone: std::collections::VecDeque<(String, ExecutorId)>,
    /// What the driver shows ([`crate::observe`]): plain values only this loop touches.
    telemetry: Box<LoopTelemetry>,
}

/// Removed executors whose names the driver keeps for late exit reasons.
const GONE_NAMES_MAX: usize = 1024;

/// Connections still in the handshake (unauthenticated) held at once; the oldest goes when
/// another arrives.
const HANDSHAKES_MAX: usize = 256;
/// Client connections (`Role::Client`) held at once; the oldest goes when another arrives.
const CLIENTS_MAX: usize = 64;
/// A client connection silent this long is closed.
const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The local executor's id.
const LOCAL_EXECUTOR: ExecutorId = ExecutorId(0);

/// Callers waiting for executors at once, at most.
const EXECUTOR_WAITERS_MAX: usize = 4096;

/// The tick while jobs are active.
const BUSY_TICK: Duration = Duration::from_millis(10);

impl DriverEndpoint {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn accept(&mut self, ctx: &mut Ctx<'_, Self>) {
        let inbound = Inbound {
            role: Role::Driver,
            accepted_roles: &[Role::Executor, Role::Client],
            secret: self.config.secret.clone(),
            frame_size_max: self.config.frame_size_max,
            outbound_max: self.config.outbound_max,
        };
        while let Some((stream, addr)) = accept_next(&self.listener) {
            // Unauthenticated connections and status clients have small tables of their own
            // (the oldest goes), so executors always find room in the rest.
            if self.count_phase(|p| matches!(p, Phase::Handshake(_))) >= HANDSHAKES_MAX {
                self.evict_oldest(|p| matches!(p, Phase::Handshake(_)));
            }
            if self.peers.len() >= self.config.connections_max
                && !self.evict_oldest(|p| matches!(p, Phase::Handshake(_) | Phase::Client))
            {
                tracing::warn!(%addr, "refused a connection: {} connections open (connections_max)", self.peers.len());
                self.telemetry.refused(Refusal::TableFull);
                refuse(
                    stream,
                    &format!(
                        "{TABLE_FULL}: the driver holds {} connections",
                        self.peers.len()
                    ),
                );
                continue;
            }
            match inbound.open(stream, ctx) {
                Ok((token, conn, handshake)) => {
                    let now = Instant::now();
                    let phase = Phase::Handshake(Box::new(handshake));
                    self.peers.insert(
                        token,
                        Peer {
                            conn,
                            phase,
                            opened: now,
                            last_heard: now,
                            write_stuck_since: None,
                        },
                    );
                    self.dirty.push(token);
                }
                Err(error) => tracing::warn!(%addr, "could not set up a connection: {error}"),
            }
        }
    }

    /// Connections whose phase matches.
    fn count_phase(&self, matching: impl Fn(&Phase) -> bool) -> usize {
        self.peers.values().filter(|p| matching(&p.phase)).count()
    }

    /// Closes the oldest connection whose phase matches, telling it the table is full;
    /// whether there was one.
    fn evict_oldest(&mut self, matching: impl Fn(&Phase) -> bool) -> bool {
        let oldest = self
            .peers
            .iter()
            .filter(|(_, p)| matching(&p.phase))
            .min_by_key(|(_, p)| p.opened)
            .map(|(t, _)| *t);
        let Some(token) = oldest else {
            return false;
        };
        if let Some(mut peer) = self.peers.remove(&token) {
            peer.conn.evict_for_full_table(None);
        }
        true
    }

    fn on_peer_event(&mut self, token: Token, event: &Event) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let mut result = Ok(());
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            let (phase, last_heard) = (&mut peer.phase, &mut peer.last_heard);
            result = peer.conn.read_frames(|conn, frame| {
                *last_heard = Instant::now();
                self.on_frame(token, phase, conn, frame)
            });
        }
        self.peers.insert(token, peer);
        match result {
            Ok(()) => self.dirty.push(token),
            Err(error) => self.close(token, &error),
        }
    }

    /// One frame from a peer, by the phase its connection is in.
    fn on_frame(
        &mut self,
        token: Token,
        phase: &mut Phase,
        conn: &mut Connection,
        frame: wire::Frame,
    ) -> Result<(), ConnError> {
        if let Phase::Handshake(handshake) = phase {
            return match handshake.on_frame(frame.kind(), frame.body(), conn.outbound()) {
                Ok(None) => Ok(()),
                Ok(Some(Role::Client)) => {
                    if self.count_phase(|p| matches!(p, Phase::Client)) >= CLIENTS_MAX {
                        self.evict_oldest(|p| matches!(p, Phase::Client));
                    }
                    *phase = Phase::Client;
                    Ok(())
                }
                Ok(Some(_)) => {
                    *phase = Phase::Registering;
                    Ok(())
                }
                Err(error) => {
                    self.telemetry.refused(Refusal::Handshake);
                    Err(ConnError::Protocol(format!("handshake failed: {error}")))
                }
            };
        }
        let message = frame.message()?;
        match (&*phase, message) {
            (
                Phase::Registering,
                Message::RegisterExecutor {
                    executor_id,
                    host,
                    cores,
                    attributes,
                },
            ) => {
                let id = self
                    .register(token, executor_id, host, cores, attributes, conn)
                    .inspect_err(|_| self.telemetry.refused(Refusal::Registration))?;
                *phase = Phase::Executor(id);
                Ok(())
            }
            (Phase::Executor(id), Message::StatusUpdates { updates }) => {
                let now = self.now_us();
                for update in updates {
                    self.telemetry.status_update(
                        now,
                        *id,
                        TaskId(update.task_id),
                        update.attempt,
                        update.state,
                        update.data,
                    );
                    self.scheduler.status_update(
                        now,
                        scheduler::StatusUpdate {
                            executor: *id,
                            task: TaskId(update.task_id),
                            attempt: update.attempt,
                            state: task_state(update.state),
                            // A result outlives its frame: a small one is copied out so it does
                            // not keep the whole frame alive.
                            data: frame.retain(update.data),
                        },
                    );
                }
                Ok(())
            }
            (Phase::Executor(_), Message::Heartbeat { .. }) => {
                encode(
                    &Message::HeartbeatAck {},
                    conn.outbound(),
                    self.config.frame_size_max,
                );
                Ok(())
            }
            (Phase::Executor(_) | Phase::Client, Message::Shutdown {}) => Err(ConnError::Closed),
            (_, other) => Err(ConnError::Protocol(format!(
                "unexpected {} from this peer",
                other.kind().name()
            ))),
        }
    }

    fn register(
        &mut self,
        token: Token,
        name: &str,
        host: &str,
        cores: u32,
        attributes: List<'_, KeyValue<'_>>,
        conn: &mut Connection,
    ) -> Result<ExecutorId, ConnError> {
        let refuse = |reason: String, conn: &mut Connection| {
            tracing::warn!(executor = name, "registration refused: {reason}");
            encode(
                &Message::RegisterExecutorFailed { reason: &reason },
                conn.outbound(),
                FRAME_SIZE_MAX_DEFAULT,
            );
            Err(ConnError::Protocol(format!(
                "registration refused: {reason}"
            )))
        };
        if self.stopping {
            return refuse("the driver is stopping".into(), conn);
        }
        if cores > EXECUTOR_CORES_MAX {
            return refuse(
                format!("executor claims {cores} cores; at most {EXECUTOR_CORES_MAX} are accepted"),
                conn,
            );
        }
        if self.names.contains_key(name) {
            return refuse(format!("duplicate executor id {name:?}"), conn);
        }
        let id = ExecutorId(self.next_executor);
        let info = ExecutorInfo {
            id,
            host: host.to_owned(),
            cores: cores.saturating_mul(self.config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX)),
            attributes: attributes
                .iter()
                .map(|kv| (kv.key.to_owned(), kv.value.to_owned()))
                .collect(),
        };
        if let Err(refusal) = self.scheduler.register_executor(self.now_us(), info) {
            return refuse(refusal.to_string(), conn);
        }
        self.next_executor += 1;
        self.names.insert(name.to_owned(), id);
        self.tokens.insert(id, token);
        self.links.insert(id, Link::Remote(token));
        self.counters.executors.fetch_add(1, Ordering::SeqCst);
        self.answer_executor_waiters();
        self.counters
            .executors_registered
            .fetch_add(1, Ordering::SeqCst);
        let interval_ms = self.config.heartbeat_interval.as_millis().to_string();
        let settings = [KeyValue {
            key: "heartbeat_interval_ms",
            value: &interval_ms,
        }];
        encode(
            &Message::RegisteredExecutor {
                settings: List::from_items(&settings),
            },
            conn.outbound(),
            self.config.frame_size_max,
        );
        tracing::info!(executor = name, host, cores, "executor registered");
        self.telemetry.executor_registered(id, name, host, cores);
        Ok(id)
    }

    /// Closes a connection (after trying to send what it has queued, such as a refusal) and,
    /// if it was an executor, removes the executor from the scheduler.
    fn close(&mut self, token: Token, why: &ConnError) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let _ = peer.conn.flush();
        if let Phase::Executor(id) = peer.phase {
            self.remove_executor(id, why);
        } else if !matches!(why, ConnError::Closed) {
            tracing::warn!(peer = ?peer.conn.peer(), "dropped a connection: {why}");
        }
    }

    fn remove_executor(&mut self, id: ExecutorId, why: &ConnError) {
        self.tokens.remove(&id);
        self.links.remove(&id);
        let gone = &mut self.gone;
        self.names.retain(|name, named| {
            if *named == id {
                if gone.len() >= GONE_NAMES_MAX {
                    gone.pop_front();
                }
                gone.push_back((name.clone(), id));
            }
            *named != id
        });
        self.counters.executors.fetch_sub(1, Ordering::SeqCst);
        if let Some((reason, lost)) = self.retiring.remove(&id) {
            tracing::info!(executor = id.0, "executor removed: {reason}");
            self.telemetry
                .executor_removed(id, &reason.to_string(), lost);
            if lost {
                self.counters.executors_lost.fetch_add(1, Ordering::SeqCst);
            }
            self.scheduler.remove_executor(self.now_us(), id, reason);
        } else if self.stopping {
            tracing::info!(executor = id.0, "executor stopped");
            self.telemetry.executor_removed(id, "stopped", false);
            self.scheduler
                .remove_executor(self.now_us(), id, RemovalReason::Killed);
        } else {
            tracing::warn!(executor = id.0, "executor lost: {why}");
            self.telemetry.executor_removed(id, &why.to_string(), true);
            self.counters.executors_lost.fetch_add(1, Ordering::SeqCst);
            self.scheduler
                .remove_executor(self.now_us(), id, RemovalReason::Lost(why.to_string()));
        }
    }

    /// Carries out everything the scheduler decided, then flushes touched connections; repeats
    /// while closing a connection makes the scheduler decide more.
    fn pump(&mut self) {
        loop {
            self.scheduler.drain_outputs(&mut self.outputs);
            // Before the outputs reach anyone: a caller that sees a job end sees its counts.
            self.stats.publish(self.scheduler.stats());
            let mut outputs = std::mem::take(&mut self.outputs);
            for output in outputs.drain(..) {
                self.carry_out(output);
            }
            self.outputs = outputs;
            if std::mem::take(&mut self.local_spilled) {
                self.drain_local();
                continue;
            }
            let mut failed = Vec::new();
            for token in std::mem::take(&mut self.dirty) {
                if let Some(peer) = self.peers.get_mut(&token) {
                    let before = peer.conn.outbound_len();
                    let flushed = peer.conn.flush();
                    let after = peer.conn.outbound_len();
                    if after == 0 {
                        peer.write_stuck_since = None;
                    } else if after < before || peer.write_stuck_since.is_none() {
                        peer.write_stuck_since = Some(Instant::now());
                    }
                    if let Err(error) = flushed {
                        failed.push((token, error));
                    }
                }
            }
            if failed.is_empty() {
                return;
            }
            for (token, error) in failed {
                self.close(token, &error);
            }
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Launch { executor, tasks } => match self.links.get(&executor).copied() {
                Some(Link::Remote(token)) => {
                    let Some(peer) = self.peers.get_mut(&token) else {
                        return;
                    };
                    let telemetry = &mut self.telemetry;
                    let batch: Vec<wire::TaskLaunch> = tasks
                        .iter()
                        .inspect(|task| telemetry.launched(task.task, task.attempt))
                        .map(|task| wire::TaskLaunch {
                            task_id: task.task.0,
                            attempt: task.attempt,
                            cores: task.cores,
                            function: &task.function,
                            payload: &task.payload,
                        })
                        .collect();
                    // Payloads are bounded below a frame (`Driver::start`), so this fits.
                    if let Err(error) = batch::encode_launches(
                        &batch,
                        peer.conn.outbound(),
                        self.config.frame_size_max,
                    ) {
                        tracing::error!(executor = executor.0, "launch not sent: {error}");
                    }
                    self.dirty.push(token);
                }
                Some(Link::Local) => {
                    if let Some(runner) = self.runner.as_mut() {
                        for task in tasks {
                            self.telemetry.launched(task.task, task.attempt);
                            // An attempt that fails at once comes with no kick: drained in pump.
                            self.local_spilled |= runner.launch(
                                task.task.0,
                                task.attempt,
                                &task.function,
                                task.payload,
                            );
                        }
                    }
                }
                None => tracing::error!(
                    executor = executor.0,
                    "launch for an unknown executor dropped"
                ),
            },
            Output::Kill {
                executor,
                task,
                attempt,
                reason,
            } => match self.links.get(&executor).copied() {
                Some(Link::Remote(token)) => {
                    self.telemetry.kill_sent();
                    if let Some(peer) = self.peers.get_mut(&token) {
                        let kill = Message::KillTask {
                            task_id: task.0,
                            attempt,
                            reason: &reason,
                        };
                        encode(&kill, peer.conn.outbound(), self.config.frame_size_max);
                        self.dirty.push(token);
                    }
                }
                Some(Link::Local) => {
                    if let Some(runner) = self.runner.as_mut() {
                        runner.kill(task.0, attempt);
                    }
                }
                None => {}
            },
            Output::TaskResult { task, result } => {
                if let Some(entry) = self.jobs.get_mut(&task.job()) {
                    let result = result.as_ref().map_err(String::as_str);
                    entry.shared.task_done(task.index(), result);
                    if let Some(observer) = entry.observer.as_mut() {
                        observer(task.index(), result);
                    }
                }
                // After the job heard: recording never delays a result.
                self.telemetry.task_done(task.job());
            }
            Output::JobOutcome { job, outcome } => {
                let ended = Ended::of(&outcome);
                if let Some(entry) = self.jobs.remove(&job) {
                    self.admission.release(entry.tasks);
                    entry.shared.finish(outcome);
                }
                self.telemetry.job_over(self.now_us(), job, ended);
            }
        }
    }

    /// A job the caller admitted: into the scheduler, with its deadline armed.
    fn submit(&mut self, id: JobId, job: Job, shared: Arc<JobShared>, ctx: &mut Ctx<'_, Self>) {
        let Job {
            function,
            payloads,
            cores,
            observer,
            keep_results,
            result_bytes_max,
            deadline,
            stream: _,
            scheduling,
        } = job;
        let n = payloads.len();
        let names = &self.names;
        let spec = crate::job::job_spec(
            function,
            payloads,
            cores,
            keep_results,
            result_bytes_max,
            *scheduling,
            |name| names.get(name).copied(),
        );
        let spec = match spec {
            Ok(spec) => spec,
            Err(error) => {
                self.admission.release(n);
                shared.finish(scheduler::JobOutcome::Failed(vec![format!(
                    "job refused: {error}"
                )]));
                return;
            }
        };
        let now_us = self.now_us();
        if shared.is_cancelled() {
            self.admission.release(n);
            shared.finish(scheduler::JobOutcome::Cancelled);
            return;
        }
        // The function's name, shared with the job's tasks (a job of no tasks has none to show).
        let function: Arc<str> = match spec.tasks.first() {
            Some(task) => task.function.clone(),
            None => Arc::from(""),
        };
        self.telemetry.job_submitted(now_us, id, &function, n);
        // The entry goes in first: the scheduler may end a job (no tasks, a payload over the
        // limit) within the call.
        self.jobs.insert(
            id,
            JobEntry {
                shared: shared.clone(),
                observer,
                tasks: n,
            },
        );
        if let Err(error) = self.scheduler.submit_job_with_id(now_us, id, spec) {
            self.jobs.remove(&id);
            self.admission.release(n);
            shared.finish(scheduler::JobOutcome::Failed(vec![format!(
                "job refused: {error}"
            )]));
            return;
        }
        if let Some(deadline) = deadline {
            let at_us =
                now_us.saturating_add(deadline.as_micros().min(u128::from(u64::MAX)) as u64);
            self.deadlines.push(std::cmp::Reverse((at_us, id)));
            if let Err(error) = ctx.timer_once(deadline) {
                tracing::warn!(
                    job = id.0,
                    "no timer for the deadline ({error}); the tick checks it"
                );
            }
        }
    }

    /// Keeps the periodic tick at the period the driver's state needs, so an idle driver does
    /// not wake up: every 10 ms while jobs are active (locality waits, speculation, health),
    /// a quarter of the shorter of the heartbeat and handshake timeouts while only connections
    /// need watching, none when there is neither. O(1): called after every event.
    fn arm_tick(&mut self, ctx: &mut Ctx<'_, Self>) {
        let period = if !self.jobs.is_empty() {
            Some(BUSY_TICK)
        } else if !self.peers.is_empty() {
            let shorter = self
                .config
                .heartbeat_timeout
                .min(self.config.handshake_timeout);
            Some((shorter / 4).max(BUSY_TICK))
        } else {
            None
        };
        if self.tick.map(|(_, p)| p) == period {
            return;
        }
        if let Some((timer, _)) = self.tick.take() {
            ctx.cancel_timer(timer);
        }
        if let Some(period) = period {
            match ctx.timer_periodic(period) {
                Ok(timer) => self.tick = Some((timer, period)),
                Err(error) => tracing::error!("no tick timer: {error}"),
            }
        }
    }

    /// Answers the callers waiting for as many executors as are registered now.
    fn answer_executor_waiters(&mut self) {
        let registered = self.counters.executors.load(Ordering::SeqCst);
        if self
            .executor_waiters
            .iter()
            .all(|(count, _)| *count > registered)
        {
            return;
        }
        for (count, reply) in std::mem::take(&mut self.executor_waiters) {
            if count <= registered {
                let _ = reply.send(());
            } else {
                self.executor_waiters.push((count, reply));
            }
        }
    }

    /// Fails jobs whose deadline passed, and cancels jobs whose handles cancelled them while
    /// the inbox was full.
    fn check_jobs(&mut self) {
        let now_us = self.now_us();
        while let Some(&std::cmp::Reverse((at_us, id))) = self.deadlines.peek() {
            if at_us > now_us {
                break;
            }
            self.deadlines.pop();
            let reason = format!("job {} failed: its deadline passed", id.0);
            self.scheduler.fail_job(now_us, id, &reason);
        }
        if self.admission.cancels_pending.swap(false, Ordering::AcqRel) {
            let cancelled: Vec<JobId> = (self.jobs.iter())
                .filter(|(_, entry)| entry.shared.is_cancelled())
                .map(|(id, _)| *id)
                .collect();
            for id in cancelled {
                self.scheduler.cancel_job(now_us, id);
            }
        }
    }

    fn on_tick(&mut self) {
        let now = Instant::now();
        self.scheduler.tick(self.now_us());
        self.check_jobs();
        let mut expired = Vec::new();
        for (token, peer) in &self.peers {
            match peer.phase {
                Phase::Executor(_)
                    if peer.write_stuck_since.is_some_and(|since| {
                        now.duration_since(since) > self.config.heartbeat_timeout
                    }) =>
                {
                    expired.push((
                        *token,
                        format!(
                            "not reading: {} bytes queued for it and none written for {} ms",
                            peer.conn.outbound_len(),
                            self.config.heartbeat_timeout.as_millis()
                        ),
                    ));
                }
                Phase::Executor(_)
                    if now.duration_since(peer.last_heard) > self.config.heartbeat_timeout =>
                {
                    expired.push((
                        *token,
                        format!(
                            "no heartbeat for {} ms",
                            self.config.heartbeat_timeout.as_millis()
                        ),
                    ));
                }
                Phase::Client if now.duration_since(peer.last_heard) > CLIENT_IDLE_TIMEOUT => {
                    expired.push((
                        *token,
                        format!(
                            "a client connection silent for {} ms",
                            CLIENT_IDLE_TIMEOUT.as_millis()
                        ),
                    ));
                }
                Phase::Handshake(_) | Phase::Registering
                    if now.duration_since(peer.opened) > self.config.handshake_timeout =>
                {
                    expired.push((
                        *token,
                        format!(
                            "no handshake and registration within {} ms",
                            self.config.handshake_timeout.as_millis()
                        ),
                    ));
                }
                _ => {}
            }
        }
        for (token, why) in expired {
            self.close(token, &ConnError::Protocol(why));
        }
        if now >= self.health.next_check {
            self.health.next_check = now + HEALTH_INTERVAL;
            self.check_health(now);
        }
    }

    /// The view [`DriverObserver::view`] answers with.
    fn observe(&self) -> DriverView {
        let scheduler = &self.scheduler;
        let mut view = self.telemetry.view(
            |id| {
                scheduler
                    .executor_cores(id)
                    .map_or(0, |(slots, free)| slots.saturating_sub(free))
            },
            self.now_us(),
        );
        view.stats = scheduler.stats().clone();
        view.pending_tasks = scheduler.pending_tasks() as u64;
        view.running_tasks = scheduler
            .unfinished_tasks()
            .saturating_sub(scheduler.pending_tasks()) as u64;
        view.executors_registered = self.counters.executors_registered.load(Ordering::Relaxed);
        view.executors_lost = self.counters.executors_lost.load(Ordering::Relaxed);
        view
    }

    /// An executor's id on the wire (`local` for the in-process one). O(executors).
    fn executor_name(&self, id: ExecutorId) -> String {
        self.names
            .iter()
            .find(|(_, named)| **named == id)
            .map_or_else(|| "local".to_owned(), |(name, _)| name.clone())
    }

    /// Warns about stalled executors and about tasks no executor can run (see the module docs),
    /// and publishes the latter for [`Driver::no_executor_for`].
    fn check_health(&mut self, now: Instant) {
        let now_us = self.now_us();
        if self.scheduler.starved(now_us) {
            let since = match self.health.starved_since {
                Some(since) => since,
                None => {
                    let since_us = now.saturating_duration_since(self.epoch).as_micros() as u64;
                    self.counters
                        .starved_since_us
                        .store(since_us.saturating_add(1), Ordering::SeqCst);
                    // The first warning after one interval: executors starting or coming back
                    // (dynamic allocation from zero, a replaced executor) are not worth one.
                    self.health.next_starved_warning = now + WARN_INTERVAL;
                    self.health.starved_since = Some(now);
                    now
                }
            };
            if now >= self.health.next_starved_warning {
                self.health.next_starved_warning = now + WARN_INTERVAL;
                tracing::warn!(
                    pending_tasks = self.scheduler.pending_tasks(),
                    executors = self.scheduler.executors(),
                    waited_s = now.duration_since(since).as_secs(),
                    "tasks are waiting and no executor can run them (none registered, or all \
                     excluded)"
                );
            }
        } else if self.health.starved_since.take().is_some() {
            self.counters.starved_since_us.store(0, Ordering::SeqCst);
        }
        if now >= self.health.next_stalled_warning {
            let stalled = self.scheduler.stalled_executors();
            if !stalled.is_empty() {
                self.health.next_stalled_warning = now + WARN_INTERVAL;
                for (id, attempts) in stalled {
                    let name = self.executor_name(id);
                    tracing::warn!(
                        executor = name.as_str(),
                        attempts,
                        "executor is stalled: it holds a straggler and has finished nothing \
                         since it was launched; its stragglers are copied elsewhere and it gets \
                         no new work until it reports a task"
                    );
                }
            }
        }
    }

    fn drain_local(&mut self) {
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        let now = self.epoch.elapsed().as_micros() as u64;
        let scheduler = &mut self.scheduler;
        let telemetry = &mut self.telemetry;
        runner.drain(
            |Completion {
                 task_id,
                 attempt,
                 state,
                 data,
             }| {
                telemetry.status_update(
                    now,
                    LOCAL_EXECUTOR,
                    TaskId(task_id),
                    attempt,
                    state,
                    &data,
                );
                scheduler.status_update(
                    now,
                    scheduler::StatusUpdate {
                        executor: LOCAL_EXECUTOR,
                        task: TaskId(task_id),
                        attempt,
                        state: task_state(state),
                        data,
                    },
                );
            },
        );
    }
}

impl Endpoint for DriverEndpoint {
    type Msg = DriverMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match ctx.register(&mut self.listener, Interest::READABLE) {
            Ok(token) => self.listener_token = Some(token),
            Err(error) => tracing::error!("cannot watch the listener: {error}"),
        }
        if let Some((pool, registry)) = self.local.take() {
            let cores = self.config.local_cores.unwrap_or(1);
            let slots =
                cores.saturating_mul(self.config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX));
            let me = ctx.myself();
            let kick = Arc::new(move || send_retrying(&me, || DriverMsg::LocalKick));
            self.runner = Some(TaskRunner::new(pool, registry, slots as usize, kick));
            let info = ExecutorInfo {
                id: LOCAL_EXECUTOR,
                host: "localhost".into(),
                cores: slots,
                attributes: Vec::new(),
            };
            match self.scheduler.register_executor(self.now_us(), info) {
                Ok(()) => {
                    self.links.insert(LOCAL_EXECUTOR, Link::Local);
                    self.telemetry
                        .executor_registered(LOCAL_EXECUTOR, "local", "localhost", cores);
                    self.counters.executors.fetch_add(1, Ordering::SeqCst);
                    self.answer_executor_waiters();
                }
                Err(refusal) => tracing::error!("local executor refused: {refusal}"),
            }
        }
    }

    fn on_message(&mut self, msg: DriverMsg, ctx: &mut Ctx<'_, Self>) {
        self.admission.room_made();
        match msg {
            DriverMsg::Submit { id, job, shared } => self.submit(id, job, shared, ctx),
            DriverMsg::Cancel(job) => {
                self.scheduler.cancel_job(self.now_us(), job);
            }
            DriverMsg::WhenExecutors { count, reply } => {
                if self.counters.executors.load(Ordering::SeqCst) >= count {
                    let _ = reply.send(());
                } else {
                    // Askers that gave up (timed out, dropped the future) are forgotten, and
                    // the table is bounded: past it the asker hears `Stopped` at once.
                    self.executor_waiters.retain(|(_, r)| !r.is_abandoned());
                    if self.executor_waiters.len() < EXECUTOR_WAITERS_MAX {
                        self.executor_waiters.push((count, reply));
                    }
                }
            }
            DriverMsg::StopExecutors(reply) => {
                self.stopping = true;
                let tokens: Vec<Token> = self.tokens.values().copied().collect();
                for token in &tokens {
                    if let Some(peer) = self.peers.get_mut(token) {
                        encode(
                            &Message::StopExecutor {},
                            peer.conn.outbound(),
                            self.config.frame_size_max,
                        );
                        self.dirty.push(*token);
                    }
                }
                let _ = reply.send(tokens.len());
            }
            DriverMsg::LocalKick => self.drain_local(),
            DriverMsg::Executors(reply) => {
                let pending_tasks = self.scheduler.pending_tasks();
                let running_tasks = self
                    .scheduler
                    .unfinished_tasks()
                    .saturating_sub(pending_tasks);
                let executors = self
                    .names
                    .iter()
                    .map(|(name, id)| {
                        let running = self
                            .scheduler
                            .executor_cores(*id)
                            .map_or(0, |(slots, free)| slots.saturating_sub(free));
                        (name.clone(), running)
                    })
                    .collect();
                let _ = reply.send(ExecutorsView {
                    pending_tasks,
                    running_tasks,
                    executors,
                });
            }
            DriverMsg::Observe(reply) => {
                let _ = reply.send(Box::new(self.observe()));
            }
            DriverMsg::Stalled(reply) => {
                let names = self
                    .scheduler
                    .stalled_executors()
                    .into_iter()
                    .map(|(id, _)| self.executor_name(id))
                    .collect();
                let _ = reply.send(names);
            }
            DriverMsg::StopExecutor { name, reply } => {
                let token = self
                    .names
                    .get(&name)
                    .and_then(|id| self.tokens.get(id).map(|token| (*id, *token)));
                if let Some((id, token)) = token {
                    self.retiring.insert(id, (RemovalReason::Killed, false));
                    if let Some(peer) = self.peers.get_mut(&token) {
                        encode(
                            &Message::StopExecutor {},
                            peer.conn.outbound(),
                            self.config.frame_size_max,
                        );
                        self.dirty.push(token);
                    }
                }
                let _ = reply.send(token.is_some());
            }
            DriverMsg::RemoveExecutor { name, reason } => {
                let token = self
                    .names
                    .get(&name)
                    .and_then(|id| self.tokens.get(id).map(|token| (*id, *token)));
                if let Some((id, token)) = token {
                    self.retiring.insert(id, (reason, true));
                    self.close(token, &ConnError::Closed);
                } else if let Some(&(_, id)) = self.gone.iter().rev().find(|(n, _)| *n == name) {
                    // Already removed (its connection closed first): the scheduler charges a
                    // reason that blames the application to the attempts it held then.
                    tracing::info!(executor = %name, "late exit reason: {reason}");
                    self.scheduler.remove_executor(self.now_us(), id, reason);
                }
            }
        }
        self.pump();
        self.arm_tick(ctx);
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if Some(token) == self.listener_token {
            self.accept(ctx);
        } else {
            self.on_peer_event(token, event);
        }
        self.pump();
        self.arm_tick(ctx);
    }

    fn on_timer(&mut self, _timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        self.on_tick();
        self.pump();
        self.arm_tick(ctx);
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        for peer in self.peers.values_mut() {
            encode(
                &Message::Shutdown {},
                peer.conn.outbound(),
                self.config.frame_size_max,
            );
            let _ = peer.conn.flush();
        }
        for (_, entry) in self.jobs.drain() {
            self.admission.release(entry.tasks);
            entry.shared.finish(scheduler::JobOutcome::Failed(vec![
                "the driver stopped".into()
            ]));
        }
    }
}

/// Sends a message that must not be lost, waiting while the inbox is full; gives up only when
/// the endpoint is gone.
pub(crate) fn send_retrying<E: Endpoint>(to: &EndpointRef<E>, make: impl Fn() -> E::Msg) {
    loop {
        match to.send(make()) {
            Ok(()) => return,
            Err(SendError::Full(_)) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

/// Appends a frame; a frame that cannot be encoded (over the maximum) is logged and skipped,
/// which the scheduler's payload limit prevents for launches.
pub(crate) fn encode(message: &Message<'_>, out: &mut BytesMut, frame_size_max: usize) {
    if let Err(error) = message.encode(out, frame_size_max) {
        tracing::error!("{} not sent: {error}", message.kind().name());
    }
}

/// The wire's task state as the scheduler's.
pub(crate) fn task_state(state: wire::TaskState) -> scheduler::TaskState {
    match state {
        wire::TaskState::Running => scheduler::TaskState::Running,
        wire::TaskState::Finished => scheduler::TaskState::Finished,
        wire::TaskState::Failed => scheduler::TaskState::Failed,
        wire::TaskState::Killed => scheduler::TaskState::Killed,
        wire::TaskState::Lost => scheduler::TaskState::Lost,
    }
}
