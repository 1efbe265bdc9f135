//! The executor role: connects to the driver (retrying with backoff for a bounded time),
//! registers, runs launched tasks on its pinned task pool, reports their states in batches, and
//! heartbeats from its event loop, which tasks never block (they run on the pool's threads).
//!
//! It exits cleanly on `StopExecutor`; it exits with an error when registration is refused or
//! the driver goes away (Spark's fate-sharing): [`run`] returns why.

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_engine::affinity::Pinning;
use flint_engine::pool::{PoolConfig, ShutdownMode, TaskPool};
use flint_engine::runtime::{Ctx, Endpoint, Runtime, RuntimeConfig, TimerId};
use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Token};

use crate::conn::{ConnError, Connection};
use crate::driver::{encode, send_retrying};
use crate::functions::Registry;
use crate::handshake::{random_nonce, Handshake, Secret};
use crate::runner::{Completion, TaskRunner};
use crate::wire::{self, batch, List, Message, Metric, Role, FRAME_SIZE_MAX_DEFAULT};

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
    /// Attempts it holds at once per core, running and queued. The driver sends at most
    /// `tasks_per_core` per core, which it caps at [`crate::driver::TASKS_PER_CORE_MAX`].
    pub in_flight_per_core: usize,
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
            in_flight_per_core: crate::driver::TASKS_PER_CORE_MAX as usize,
            pin: Pinning::None,
        }
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
#[derive(Default)]
struct Exit {
    reason: Mutex<Option<Result<ExecutorSummary, ExecutorError>>>,
    set: Condvar,
}

impl Exit {
    fn set(&self, reason: Result<ExecutorSummary, ExecutorError>) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
            self.set.notify_all();
        }
    }

    fn wait(&self) -> Result<ExecutorSummary, ExecutorError> {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(reason) = slot.take() {
                return reason;
            }
            slot = self.set.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Runs an executor until the driver stops it (`Ok`, with what it did) or it must exit (`Err`).
/// A driver whose connection table is full refuses the handshake saying so
/// ([`crate::conn::TABLE_FULL`]): the executor tries again with backoff (logged at info) until
/// `connect_timeout` has passed.
pub fn run(config: ExecutorConfig, registry: Registry) -> Result<ExecutorSummary, ExecutorError> {
    let deadline = flint_engine::runtime::deadline_after(config.connect_timeout);
    let mut backoff = Duration::from_millis(100);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match run_once(config.clone(), registry.clone(), remaining) {
            Err(ExecutorError::Refused(reason))
                if reason.contains(crate::conn::TABLE_FULL)
                    && Instant::now() + backoff < deadline =>
            {
                tracing::info!(
                    driver = %config.driver,
                    "the driver refused us: {reason}; retrying in {} ms",
                    backoff.as_millis()
                );
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(2));
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
    let in_flight_max = config
        .in_flight_per_core
        .saturating_mul(config.cores.max(1) as usize);
    // Submissions try every worker's inbox, so together they hold all `in_flight_max`.
    let mut pool = TaskPool::new(PoolConfig {
        workers: config.cores.max(1) as usize,
        inbox_capacity: config.in_flight_per_core.max(1),
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
    let exit = Arc::new(Exit::default());
    let nonce =
        random_nonce().map_err(|e| ExecutorError::Start(format!("no random nonce: {e}")))?;
    let endpoint = ExecutorEndpoint {
        conn: Connection::new(stream, config.frame_size_max, usize::MAX / 2),
        token: None,
        phase: Phase::Connecting(nonce),
        runner: None,
        pool: Some((pool.handle(), registry)),
        heartbeat: None,
        exit: exit.clone(),
        updates: Vec::new(),
        in_flight_max,
        config,
    };
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
    let mut backoff = Duration::from_millis(50);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match std::net::TcpStream::connect_timeout(&addr, remaining.max(Duration::from_millis(1))) {
            Ok(stream) => {
                stream
                    .set_nonblocking(true)
                    .map_err(|e| ExecutorError::Start(format!("set_nonblocking: {e}")))?;
                return Ok(TcpStream::from_std(stream));
            }
            Err(error) if deadline.saturating_duration_since(Instant::now()) <= backoff => {
                return Err(ExecutorError::Connect {
                    addr,
                    timeout_ms: timeout.as_millis(),
                    error: error.to_string(),
                });
            }
            Err(error) => {
                tracing::debug!(%addr, "connect failed ({error}); retrying in {} ms", backoff.as_millis());
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

enum Phase {
    Connecting([u8; 32]),
    Handshake(Box<Handshake>),
    Registering,
    Running,
}

/// What to do after a frame.
enum Flow {
    Continue,
    Stop,
}

/// Messages to the executor's endpoint.
#[derive(Debug)]
pub enum ExecutorMsg {
    /// Task completions are waiting.
    Kick,
}

struct ExecutorEndpoint {
    config: ExecutorConfig,
    conn: Connection,
    token: Option<Token>,
    phase: Phase,
    runner: Option<TaskRunner>,
    pool: Option<(flint_engine::pool::PoolHandle, Registry)>,
    heartbeat: Option<TimerId>,
    exit: Arc<Exit>,
    updates: Vec<Completion>,
    in_flight_max: usize,
}

impl ExecutorEndpoint {
    fn finish(&mut self, reason: Result<(), ExecutorError>, ctx: &mut Ctx<'_, Self>) {
        if let Err(error) = &reason {
            tracing::error!(executor = %self.config.executor_id, "{error}");
        }
        let completed = self.runner.as_ref().map_or(0, TaskRunner::completed);
        tracing::info!(executor = %self.config.executor_id, completed, "ran {completed} task attempts");
        if let Some(runner) = self.runner.as_mut() {
            runner.kill_all();
        }
        let _ = self.conn.flush();
        self.exit.set(reason.map(|()| ExecutorSummary {
            task_attempts: completed,
        }));
        ctx.stop();
    }

    fn on_frame(
        &mut self,
        frame: wire::Frame,
        ctx: &mut Ctx<'_, Self>,
    ) -> Result<Flow, ExecutorError> {
        let frame_size_max = self.config.frame_size_max;
        if let Phase::Handshake(handshake) = &mut self.phase {
            return match handshake.on_frame(frame.kind(), frame.body(), self.conn.outbound()) {
                Ok(None) => Ok(Flow::Continue),
                Ok(Some(_driver)) => {
                    let register = Message::RegisterExecutor {
                        executor_id: &self.config.executor_id,
                        host: &self.config.host,
                        cores: self.config.cores,
                        attributes: List::empty(),
                    };
                    encode(&register, self.conn.outbound(), frame_size_max);
                    self.phase = Phase::Registering;
                    Ok(Flow::Continue)
                }
                Err(error) => Err(ExecutorError::Refused(format!("handshake failed: {error}"))),
            };
        }
        let message = frame.message().map_err(|e| {
            ExecutorError::DriverGone(format!("malformed frame from the driver: {e}"))
        })?;
        match message {
            Message::RegisteredExecutor { settings } => {
                let interval_ms = settings
                    .iter()
                    .find(|kv| kv.key == "heartbeat_interval_ms")
                    .and_then(|kv| kv.value.parse::<u64>().ok())
                    .unwrap_or(500)
                    .clamp(10, 60_000);
                self.heartbeat = ctx.timer_periodic(Duration::from_millis(interval_ms)).ok();
                self.phase = Phase::Running;
                tracing::info!(executor = %self.config.executor_id, "registered with the driver");
                Ok(Flow::Continue)
            }
            Message::RegisterExecutorFailed { reason } => {
                Err(ExecutorError::Refused(reason.to_owned()))
            }
            Message::LaunchTasks { tasks } => {
                let Some(runner) = self.runner.as_mut() else {
                    return Ok(Flow::Continue);
                };
                let mut completed_at_once = false;
                for task in tasks {
                    completed_at_once |= runner.launch(
                        task.task_id,
                        task.attempt,
                        task.function,
                        frame.share(task.payload),
                    );
                }
                // Attempts that failed at once (unknown function, full pool) come with no kick.
                if completed_at_once {
                    self.send_updates();
                }
                Ok(Flow::Continue)
            }
            Message::KillTask {
                task_id, attempt, ..
            } => {
                if let Some(runner) = self.runner.as_mut() {
                    runner.kill(task_id, attempt);
                }
                Ok(Flow::Continue)
            }
            Message::HeartbeatAck {} => Ok(Flow::Continue),
            Message::StopExecutor {} => {
                tracing::info!(executor = %self.config.executor_id, "stopped by the driver");
                Ok(Flow::Stop)
            }
            Message::Shutdown {} => Err(ExecutorError::DriverGone("the driver shut down".into())),
            other => Err(ExecutorError::DriverGone(format!(
                "unexpected {} from the driver",
                other.kind().name()
            ))),
        }
    }

    fn send_updates(&mut self) {
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        let updates = &mut self.updates;
        runner.drain(|completion| updates.push(completion));
        if self.updates.is_empty() {
            return;
        }
        let frame_size_max = self.config.frame_size_max;
        for update in &mut self.updates {
            bound_report(update, frame_size_max);
        }
        let batch: Vec<wire::StatusUpdate> = self
            .updates
            .iter()
            .map(|update| wire::StatusUpdate {
                task_id: update.task_id,
                attempt: update.attempt,
                state: update.state,
                data: &update.data,
            })
            .collect();
        if let Err(error) =
            batch::encode_status_updates(&batch, self.conn.outbound(), frame_size_max)
        {
            // Unreachable: `bound_report` keeps every update within a frame.
            tracing::error!(executor = %self.config.executor_id, "status updates not sent: {error}");
        }
        self.updates.clear();
    }

    fn flush(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(error) = self.conn.flush() {
            self.finish(Err(ExecutorError::DriverGone(error.to_string())), ctx);
        }
    }
}

/// Keeps a report within what one frame carries: a result too large for a frame fails its task
/// with the reason (the driver never sees a wrong success), and a failure's text is cut to
/// [`batch::REASON_BYTES_MAX`].
fn bound_report(update: &mut Completion, frame_size_max: usize) {
    let result_max = batch::item_bytes_max(frame_size_max);
    if update.state == wire::TaskState::Finished && update.data.len() > result_max {
        update.state = wire::TaskState::Failed;
        update.data = Bytes::from(format!(
            "the result of {} bytes is larger than a status frame carries ({result_max} bytes with \
             a maximum frame size of {frame_size_max}): return less from the task",
            update.data.len()
        ));
    } else if update.state != wire::TaskState::Finished {
        update.data = batch::bound_reason(std::mem::take(&mut update.data));
    }
}

impl Endpoint for ExecutorEndpoint {
    type Msg = ExecutorMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match ctx.register(
            self.conn.stream_mut(),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(token) => self.token = Some(token),
            Err(error) => {
                return self.finish(
                    Err(ExecutorError::Start(format!(
                        "cannot watch the socket: {error}"
                    ))),
                    ctx,
                )
            }
        }
        if let Some((pool, registry)) = self.pool.take() {
            let me = ctx.myself();
            let kick = Arc::new(move || send_retrying(&me, || ExecutorMsg::Kick));
            self.runner = Some(
                TaskRunner::new(pool, registry, self.in_flight_max, kick)
                    .with_executor(&self.config.executor_id),
            );
        }
        if let Phase::Connecting(nonce) = self.phase {
            let handshake = Handshake::start(
                Role::Executor,
                self.config.secret.clone(),
                nonce,
                &[Role::Driver],
                self.conn.outbound(),
            );
            self.phase = Phase::Handshake(Box::new(handshake));
        }
        self.flush(ctx);
    }

    fn on_message(&mut self, msg: ExecutorMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            ExecutorMsg::Kick => self.send_updates(),
        }
        self.flush(ctx);
    }

    fn on_readiness(&mut self, _token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            let mut frames = Vec::new();
            let read = self.conn.read_frames(|_, frame| {
                frames.push(frame);
                Ok(())
            });
            for frame in frames {
                match self.on_frame(frame, ctx) {
                    Ok(Flow::Continue) => {}
                    Ok(Flow::Stop) => return self.finish(Ok(()), ctx),
                    Err(error) => return self.finish(Err(error), ctx),
                }
            }
            if let Err(error) = read {
                let why = match error {
                    ConnError::Closed => "the driver closed the connection".to_owned(),
                    other => other.to_string(),
                };
                return self.finish(Err(ExecutorError::DriverGone(why)), ctx);
            }
        }
        self.flush(ctx);
    }

    fn on_timer(&mut self, _timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        let running = self.runner.as_ref().map_or(0, TaskRunner::running);
        let metrics = [Metric {
            name: "tasks_running",
            value: running as u64,
        }];
        let heartbeat = Message::Heartbeat {
            executor_id: &self.config.executor_id,
            running_tasks: running.min(u32::MAX as usize) as u32,
            metrics: List::from_items(&metrics),
        };
        encode(&heartbeat, self.conn.outbound(), self.config.frame_size_max);
        self.flush(ctx);
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.exit.set(Err(ExecutorError::DriverGone(
            "the executor's loop stopped".into(),
        )));
    }
}
