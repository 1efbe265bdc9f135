//! The driver role: accepts executors over TCP (or runs an in-process executor in local mode),
//! runs the scheduler state machine on an event loop, and turns its outputs into batched frames.
//!
//! # Four parts
//!
//! - this module: the caller's side ([`Driver`], [`DriverBuilder`], [`DriverConfig`],
//!   [`DriverError`], [`ExecutorsView`], [`DriverObserver`]) and the counters the loop
//!   publishes for it;
//! - `core/`: `DriverCore`, the protocol state without IO (handshake, registration,
//!   heartbeats and expiry, the scheduler and its outputs, jobs, deadlines, stall warnings),
//!   every input carrying the time, results and outcomes polled out as events;
//! - `handles.rs`: the callers' side on the loop (the jobs' handles and observers, the callers
//!   waiting for executors), which the core's events are delivered to;
//! - `endpoint.rs`: `DriverEndpoint`, the IO on a runtime loop: the listener and connections
//!   (read until would-block, feed the core, flush each touched connection once per event),
//!   the local mode's task runner, and one timer armed from the core's `poll_timeout`.
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
//! - one that does not read its socket is lost, like a silent one: when bytes are queued for it
//!   and none written for `heartbeat_timeout`, or, while its launches still fit in the socket
//!   buffers, when two heartbeats in a row report fewer attempts than it must hold (those it
//!   reported running plus those sent over `heartbeat_timeout` ago and never acknowledged);
//! - while tasks wait and no executor can run them (all lost, or all excluded), a warning is
//!   logged every [`WARN_INTERVAL`] (the first after one interval) and [`Driver::no_executor_for`] says for how long, so a
//!   caller can give up (`flint driver --no-executor-timeout-s`).

pub(crate) mod core;
mod endpoint;
pub(crate) mod handles;
mod submissions;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_engine::pool::{ShutdownMode, TaskPool, TaskPoolConfig};
use flint_engine::runtime::{AskError, EndpointRef, Reply, Runtime, RuntimeConfig, SendError};
use flint_engine::scheduler::{
    Config as SchedulerConfig, HedgeConfig, JobId, JobOutcome, RemovalReason, Stats,
};
use mio::net::TcpListener;

use self::core::DriverCore;
use self::endpoint::DriverEndpoint;
use self::submissions::{Submission, Submissions};
use crate::admission::Admission;
pub use crate::admission::FUNCTION_NAME_MAX_BYTES;
use crate::handshake::Secret;
use crate::job::{DriverSide, Job, JobHandle, JobShared, SpareStates};
use crate::observe::{DriverView, LoopTelemetry};
use crate::wire::{batch, FRAME_SIZE_MAX_DEFAULT};
use flint_engine::functions::Registry;

pub use crate::wire::limits::{EXECUTOR_CORES_MAX, LANES_MAX, TASKS_PER_CORE_MAX};

/// How often the driver repeats a warning about a stall (stalled executors, tasks that no
/// executor can run).
pub const WARN_INTERVAL: Duration = Duration::from_secs(5);

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
            // Hedging is on: a service's tail should not wait for a sick executor's heartbeat
            // timeout.
            scheduler: SchedulerConfig {
                exclusion: None,
                hedging: Some(HedgeConfig::default()),
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

/// Counters the driver keeps for whoever embeds it (the core's [`core::Counts`], published
/// by the loop after every round).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    executors: AtomicUsize,
    executors_registered: AtomicU64,
    executors_lost: AtomicU64,
    /// Since when (micros after the driver's start, plus one) tasks have waited with no
    /// executor able to run them; 0 while that is not so.
    starved_since_us: AtomicU64,
}

impl Counters {
    fn publish(&self, counts: &core::Counts) {
        let starved = counts
            .starved_since_us
            .map_or(0, |since| since.saturating_add(1));
        self.executors.store(counts.executors, Ordering::SeqCst);
        (self.executors_registered).store(counts.executors_registered, Ordering::SeqCst);
        (self.executors_lost).store(counts.executors_lost, Ordering::SeqCst);
        self.starved_since_us.store(starved, Ordering::SeqCst);
    }
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
    /// Where every handle's cancel and dropped state go.
    side: Arc<DriverHandles>,
    /// Jobs on their way to the loop.
    submissions: Arc<Submissions>,
    /// The largest task payload, checked on the submitting thread (a job of millions of tasks
    /// scanned on the loop would hold it milliseconds).
    payload_max_bytes: usize,
}

/// The driver's side of its handles: a cancel is told to the loop (a message, or, its inbox
/// full, a flag the loop looks at after its next round); a dropped handle's state goes to the
/// spare states new jobs take theirs from.
struct DriverHandles {
    endpoint: EndpointRef<DriverEndpoint>,
    admission: Arc<Admission>,
    spare: Arc<SpareStates>,
}

impl DriverSide for DriverHandles {
    fn give_back(&self, shared: Arc<JobShared>) {
        self.spare.give(shared);
    }

    fn cancel(&self, id: JobId) {
        if self.endpoint.send(DriverMsg::Cancel(id)).is_err() {
            self.admission
                .cancels_pending
                .store(true, Ordering::Release);
        }
    }
}

/// The scheduler's [`Stats`], published by the loop after every event so callers read them
/// without asking it.
#[derive(Debug, Default)]
pub(crate) struct PublishedStats {
    launched: AtomicU64,
    succeeded: AtomicU64,
    attempts_failed: AtomicU64,
    speculative_launched: AtomicU64,
    ignored_updates: AtomicU64,
    executors_excluded: AtomicU64,
    attempts_killed: AtomicU64,
    late_failures: AtomicU64,
    hedges: AtomicU64,
    hedges_withheld: AtomicU64,
    suspicions: AtomicU64,
    probations: AtomicU64,
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
            hedges,
            hedges_withheld,
            suspicions,
            probations,
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
        self.hedges.store(hedges, Ordering::Relaxed);
        (self.hedges_withheld).store(hedges_withheld, Ordering::Relaxed);
        self.suspicions.store(suspicions, Ordering::Relaxed);
        self.probations.store(probations, Ordering::Relaxed);
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
            hedges: self.hedges.load(Ordering::Relaxed),
            hedges_withheld: self.hedges_withheld.load(Ordering::Relaxed),
            suspicions: self.suspicions.load(Ordering::Relaxed),
            probations: self.probations.load(Ordering::Relaxed),
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
        // Checked by `try_submit` on the caller's thread: the scheduler on the loop checks none.
        let payload_max_bytes = config
            .scheduler
            .payload_max_bytes
            .min(batch::item_bytes_max(config.frame_size_max).saturating_sub(4096));
        config.scheduler.payload_max_bytes = usize::MAX;

        let pool = match config.local_cores {
            None => None,
            Some(cores) => Some(
                TaskPool::new(TaskPoolConfig {
                    workers: cores as usize,
                    // Submissions try every worker's inbox: together they hold every slot.
                    inbox_capacity: config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX) as usize,
                    thread_name: "flint-local".into(),
                    pin: config.pin.from_thread(1),
                    ..TaskPoolConfig::default()
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
        let admission = Arc::new(Admission::new(
            config.scheduler.pending_tasks_max,
            config.scheduler.jobs_max,
        ));
        let epoch = Instant::now();
        let telemetry = Box::new(LoopTelemetry::new(epoch));
        let seed = crate::handshake::random_nonce()
            .map_err(|e| DriverError::Start(format!("no seed for lane keys: {e}")))?;
        let core = DriverCore::new(config.clone(), telemetry, seed);
        let local = pool.as_ref().map(|pool| (pool.handle(), registry));
        let submissions = Arc::new(Submissions::new(submissions::QUEUED_MAX));
        let spare = Arc::new(SpareStates::default());
        let endpoint = DriverEndpoint::new(
            core,
            &config,
            listener,
            epoch,
            (admission.clone(), submissions.clone(), spare.clone()),
            local,
        );
        let (counters, stats) = endpoint.published();
        let endpoint = runtime
            .handle()
            .spawn("driver", endpoint)
            .map_err(|e| DriverError::Start(format!("driver endpoint: {e}")))?;
        let side = Arc::new(DriverHandles {
            endpoint: endpoint.clone(),
            admission: admission.clone(),
            spare,
        });
        Ok(Driver {
            runtime: Some(runtime),
            pool,
            endpoint,
            local_addr,
            counters,
            admission,
            stats,
            epoch,
            side,
            submissions,
            payload_max_bytes,
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
    /// [`submit_async`](Self::submit_async) waits for room instead; a payload over the frame
    /// size with [`DriverError::Submit`]. What the loop decides (more locality entries than
    /// tasks, a job over the scheduler's limits) arrives as the job's outcome.
    pub fn try_submit(&self, mut job: Job) -> Result<JobHandle, Rejected> {
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
        if let Some((i, len)) = job.payloads.first_over(self.payload_max_bytes) {
            let error = DriverError::Submit(format!(
                "task {i} payload is {len} bytes, over the largest a launch frame carries, {}",
                self.payload_max_bytes
            ));
            return Err(Rejected {
                error,
                job: Box::new(job),
            });
        }
        if !self.endpoint.is_alive() {
            // Its loop stopped (a handler panicked): no job goes in.
            return Err(Rejected {
                error: DriverError::Stopped,
                job: Box::new(job),
            });
        }
        // Counted once: a job with locality counts the same once prepared (a task per payload).
        let tasks = job.len();
        let id = match self.admission.admit(&job, tasks) {
            Ok(id) => id,
            Err(error) => {
                let error = DriverError::Submit(error.to_string());
                return Err(Rejected {
                    error,
                    job: Box::new(job),
                });
            }
        };
        if job.keep_results {
            // Its results take its payloads' places: a shared list is copied here, on the
            // caller's thread, not at the first result on the driver's loop.
            job.payloads.own();
        }
        // A job with locality: its task specs made here, not on the loop.
        job.prepare();
        debug_assert_eq!(tasks, job.len());
        let shared = self.side.spare.take();
        // The handle's clone taken first, so the job moves into the queue's slot once.
        let handle_shared = shared.clone();
        match self.submissions.push(Submission { id, job, shared }) {
            Ok(kick) => self.kick(kick),
            Err(submission) => self.send_instead(submission, tasks)?,
        }
        Ok(JobHandle {
            id: id.0,
            tasks: tasks as u64,
            shared: std::mem::ManuallyDrop::new(handle_shared),
            driver: self.side.clone(),
            detached: false,
        })
    }

    /// A submission the queue had no room for goes in a message of its own; a full inbox or
    /// a stopped loop hands its job back (its room under the limits given back).
    #[cold]
    fn send_instead(&self, submission: Submission, tasks: usize) -> Result<(), Rejected> {
        let msg = DriverMsg::Submit(Box::new(submission));
        let Err(error) = self.endpoint.send(msg) else {
            return Ok(());
        };
        self.admission.release(tasks);
        let busy = matches!(error, SendError::Full(_));
        let DriverMsg::Submit(submission) = error.into_inner() else {
            unreachable!("the message sent was a Submit");
        };
        let error = if busy {
            DriverError::Busy
        } else {
            DriverError::Stopped
        };
        Err(Rejected {
            error,
            job: Box::new(submission.job),
        })
    }

    /// After a job was queued: tells the loop if `kick` (no kick was pending). A full inbox
    /// needs no notice (the loop looks at the queue at the end of each round, and a full inbox
    /// means rounds to come); a loop that stopped since `try_submit` looked takes no job, so
    /// the queued ones end here, failed.
    fn kick(&self, kick: bool) {
        let sent = match kick {
            true => self.endpoint.notify(endpoint::SUBMITTED),
            false => Ok(()),
        };
        if matches!(sent, Err(SendError::Stopped(_) | SendError::Shutdown(_)))
            || !self.endpoint.is_alive()
        {
            self.submissions.take_all(|stranded| {
                self.admission.release(stranded.job.len());
                let reason = "the driver stopped".to_owned();
                stranded.shared.finish(JobOutcome::Failed(vec![reason]));
            });
        }
    }

    /// Submits a job from a plain thread: as [`try_submit`](Self::try_submit), but while the
    /// loop's inbox is full it backs off and tries again (for up to a minute) rather than
    /// handing the job back. Async code uses [`submit_async`](Self::submit_async).
    pub fn submit(&self, job: Job) -> Result<JobHandle, DriverError> {
        // Most submissions go through at once: the retries (and the clock) are out of line.
        match self.try_submit(job) {
            Ok(handle) => Ok(handle),
            Err(rejected) => self.submit_again(rejected),
        }
    }

    /// [`submit`](Self::submit) after its first try was `rejected`: while the loop is busy,
    /// backs off and tries again, for up to a minute from now.
    #[cold]
    fn submit_again(&self, rejected: Rejected) -> Result<JobHandle, DriverError> {
        let deadline = flint_engine::runtime::deadline_after(Duration::from_secs(60));
        let mut tries = 0u32;
        let mut rejected = rejected;
        loop {
            let Rejected {
                error: DriverError::Busy,
                job,
            } = rejected
            else {
                return Err(rejected.error);
            };
            if Instant::now() >= deadline {
                return Err(DriverError::Busy);
            }
            tries = tries.saturating_add(1);
            if tries < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            rejected = match self.try_submit(*job) {
                Ok(handle) => return Ok(handle),
                Err(again) => again,
            };
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
        self.executor_health().map(|health| health.stalled)
    }

    /// The executors that get less work or none for now (see [`ExecutorHealth`]).
    pub fn executor_health(&self) -> Result<ExecutorHealth, DriverError> {
        self.endpoint
            .ask(DriverMsg::Health, Duration::from_secs(10))
            .map_err(DriverError::from)
    }

    /// Tells one remote executor (by its id on the wire) to exit; its removal is not counted
    /// as a loss ([`Driver::executors_lost`]). Answers whether it was registered.
    pub fn stop_executor(&self, executor_id: &str) -> Result<bool, DriverError> {
        let executor_id = executor_id.to_owned();
        self.endpoint
            .ask(
                |reply| DriverMsg::StopExecutor { executor_id, reply },
                Duration::from_secs(10),
            )
            .map_err(DriverError::from)
    }

    /// Drains one remote executor (by its id on the wire): it is given no new task from now
    /// on, while the ones it runs go on to their end (Spark's decommissioning; what the
    /// lifecycle does before it deletes a registered executor). Answers whether it was
    /// registered.
    pub fn drain_executor(&self, executor_id: &str) -> Result<bool, DriverError> {
        let executor_id = executor_id.to_owned();
        self.endpoint
            .ask(
                |reply| DriverMsg::DrainExecutor { executor_id, reply },
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
    pub fn remove_executor(
        &self,
        executor_id: &str,
        reason: RemovalReason,
    ) -> Result<(), DriverError> {
        self.endpoint
            .send(DriverMsg::RemoveExecutor {
                executor_id: executor_id.to_owned(),
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

/// The executors that get less work or none for now, by their ids on the wire
/// ([`Driver::executor_health`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutorHealth {
    /// Hold a straggler and have finished nothing since it was launched: no new work until
    /// they report a task (Spark-style speculation's rule).
    pub stalled: Vec<String>,
    /// Hold an attempt past its hedging threshold and have sent nothing for as long: no new
    /// work until they send anything; their overdue attempts are copied elsewhere.
    pub suspected: Vec<String>,
    /// Much slower than their peers lately: one attempt at a time until they are not.
    pub on_probation: Vec<String>,
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

impl crate::observe::DriverViews for DriverObserver {
    fn driver_view(&self, timeout: Duration) -> Result<DriverView, String> {
        self.view(timeout).map_err(|e| e.to_string())
    }
}

/// Messages to the driver's endpoint.
pub(crate) enum DriverMsg {
    /// Submit a job: one the submissions queue had no room for (boxed: the message stays
    /// small for the others).
    Submit(Box<Submission>),
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
    /// The backlog and the executors.
    Executors(Reply<ExecutorsView>),
    /// The executors that get less work or none.
    Health(Reply<ExecutorHealth>),
    /// What the driver shows (metrics, web UI).
    Observe(Reply<Box<DriverView>>),
    /// Send `StopExecutor` to one executor; replies whether it is registered.
    StopExecutor {
        /// Its id on the wire.
        executor_id: String,
        /// Whether it was registered.
        reply: Reply<bool>,
    },
    /// Stop offering one executor work; replies whether it is registered.
    DrainExecutor {
        /// Its id on the wire.
        executor_id: String,
        /// Whether it was registered.
        reply: Reply<bool>,
    },
    /// Remove an executor for a reason a cluster manager gave.
    RemoveExecutor {
        /// Its id on the wire.
        executor_id: String,
        /// Why.
        reason: RemovalReason,
    },
}
