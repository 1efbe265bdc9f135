//! The standalone worker role: connects to the master (reconnecting with backoff and registering
//! again whenever the connection ends), heartbeats, and runs executors as child processes
//! (Spark's `Worker` and `ExecutorRunner`).
//!
//! Each executor runs in `WORK_DIR/APP_ID/EXECUTOR_ID/` with its stdout and stderr in files
//! there and its pid in `pid`, in a process group of its own so that killing it (`KillExecutor`,
//! or the application ending) reaches its whole tree: `SIGTERM` to the group, then `SIGKILL`
//! after `kill_timeout`. A thread per child waits for its exit and tells the worker's endpoint,
//! which reports `ExecutorStateChanged` (LAUNCHING, RUNNING, then EXITED, FAILED or KILLED with
//! the exit code). Reports made while the master is away are kept (bounded) and sent once the
//! worker has registered again, together with the executors still running, which the master
//! adopts. The master acks heartbeats; a worker that hears nothing for 15 heartbeat intervals
//! drops the connection and reconnects (a master behind a cut link sends no reset). A worker
//! that starts kills the executors its previous run left behind in its work directory (the
//! master has declared them lost when that run died; `flint executor` itself exits when the
//! worker that started it dies, as it sees `FLINT_WORKER_PID` is no longer its parent). With a listen address, it answers
//! `flint status` (`Role::Client`) about itself and its executors.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flint_engine::runtime::{Ctx, Endpoint, EndpointRef, Runtime, RuntimeConfig, TimerId};
use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Token};

use crate::conn::{accept_next, ConnError, Connection, Inbound};

/// How long one attempt to connect to the master and finish the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
use crate::driver::{encode, send_retrying};
use crate::handshake::{random_nonce, Handshake, Secret, SECRET_ENV};
use crate::standalone::REATTACH_MESSAGE;
use crate::wire::{self, ExecutorState, Message, Role, FRAME_SIZE_MAX_DEFAULT};

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The master's address.
    pub master: SocketAddr,
    /// This worker's id.
    pub id: String,
    /// The host it advertises (its executors' host); empty: the address it reaches the
    /// master from.
    pub host: String,
    /// The port it advertises.
    pub port: u16,
    /// Where to listen for `flint status` (the advertised host and port become the bound ones).
    pub listen: Option<SocketAddr>,
    /// Cores it offers.
    pub cores: u32,
    /// Memory it offers, in MiB.
    pub memory_mb: u64,
    /// Where executors get their directories.
    pub work_dir: PathBuf,
    /// The shared secret for the master.
    pub secret: Option<Secret>,
    /// The program for executors of applications that name none (`flint executor`).
    pub executor_program: PathBuf,
    /// Other programs applications may name as their executor command (compared as given and
    /// as canonical paths); an application naming any other is refused.
    pub allowed_commands: Vec<PathBuf>,
    /// Time between `SIGTERM` and `SIGKILL` when killing an executor.
    pub kill_timeout: Duration,
    /// Longest wait between two connection attempts.
    pub reconnect_max: Duration,
    /// Executors run at once; launches beyond are reported failed.
    pub executors_max: usize,
    /// State reports kept while the master is away.
    pub reports_max: usize,
}

impl WorkerConfig {
    /// Defaults for a worker of `master`.
    pub fn new(master: SocketAddr, id: impl Into<String>, cores: u32, memory_mb: u64) -> Self {
        let id = id.into();
        WorkerConfig {
            master,
            work_dir: std::env::temp_dir().join(format!("flint-worker-{id}")),
            id,
            host: String::new(),
            port: 0,
            listen: None,
            cores,
            memory_mb,
            secret: None,
            executor_program: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("flint")),
            allowed_commands: Vec::new(),
            kill_timeout: Duration::from_secs(5),
            reconnect_max: Duration::from_secs(2),
            executors_max: 1024,
            reports_max: 4096,
        }
    }
}

/// Why a worker stopped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// The master refused its first registration.
    #[error("registration refused: {0}")]
    Refused(String),
    /// Local failure.
    #[error("cannot start: {0}")]
    Start(String),
}

#[derive(Default)]
struct Exit {
    reason: Mutex<Option<Result<(), WorkerError>>>,
    set: Condvar,
}

impl Exit {
    fn set(&self, reason: Result<(), WorkerError>) {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(reason);
            self.set.notify_all();
        }
    }

    fn wait(&self) -> Result<(), WorkerError> {
        let mut slot = self.reason.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(reason) = slot.take() {
                return reason;
            }
            slot = self.set.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Runs a worker until it must stop (its first registration refused). Executors it started
/// are killed before it returns.
pub fn run(config: WorkerConfig) -> Result<(), WorkerError> {
    if !valid_id(&config.id) {
        return Err(WorkerError::Start(format!(
            "{:?} is not a worker id: use 1 to {ID_LEN_MAX} letters, digits, '-', '_' or '.'",
            config.id
        )));
    }
    std::fs::create_dir_all(&config.work_dir).map_err(|e| {
        WorkerError::Start(format!(
            "cannot create work dir {}: {e}",
            config.work_dir.display()
        ))
    })?;
    let mut config = config;
    let listener = match config.listen {
        None => None,
        Some(addr) => {
            if !addr.ip().is_loopback() && config.secret.is_none() {
                return Err(WorkerError::Start(format!(
                    "refusing to listen on non-loopback {addr} without a shared secret"
                )));
            }
            let listener = mio::net::TcpListener::bind(addr)
                .map_err(|e| WorkerError::Start(format!("cannot listen on {addr}: {e}")))?;
            let bound = listener.local_addr().unwrap_or(addr);
            if !bound.ip().is_unspecified() {
                config.host = bound.ip().to_string();
            }
            config.port = bound.port();
            Some(listener)
        }
    };
    reap_stale_executors(&config.work_dir, &config.id);
    let mut runtime = Runtime::new(RuntimeConfig {
        threads: 1,
        thread_name: "flint-worker".into(),
        ..RuntimeConfig::default()
    })
    .map_err(|e| WorkerError::Start(format!("runtime: {e}")))?;
    let exit = Arc::new(Exit::default());
    let endpoint = WorkerEndpoint {
        config,
        link: None,
        heartbeat_interval: Duration::from_secs(1),
        registered_once: false,
        backoff: Duration::from_millis(50),
        failed_attempts: 0,
        heartbeat: None,
        reconnect: None,
        connect_deadline: None,
        executors: HashMap::new(),
        finished_apps: HashSet::new(),
        kill_timers: HashMap::new(),
        reports: VecDeque::new(),
        exit: exit.clone(),
        listener,
        listener_token: None,
        clients: HashMap::new(),
    };
    runtime
        .handle()
        .spawn("worker", endpoint)
        .map_err(|e| WorkerError::Start(format!("worker endpoint: {e}")))?;
    let reason = exit.wait();
    runtime.shutdown();
    reason
}

/// Kills executors a previous run of this worker left behind (it was killed and they kept
/// running: the master has declared them lost) and removes their directories. A `pid` file is
/// trusted only if that process's environment names this worker, so a reused pid is left alone.
fn reap_stale_executors(work_dir: &Path, worker_id: &str) {
    let marker = format!("FLINT_WORKER_ID={worker_id}");
    let Ok(apps) = std::fs::read_dir(work_dir) else {
        return;
    };
    for app in apps.flatten() {
        let Ok(executors) = std::fs::read_dir(app.path()) else {
            continue;
        };
        for executor in executors.flatten() {
            let Ok(text) = std::fs::read_to_string(executor.path().join("pid")) else {
                continue;
            };
            let Ok(pid) = text.trim().parse::<u32>() else {
                continue;
            };
            let ours = std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|entry| entry == marker.as_bytes())
            });
            if ours {
                tracing::warn!(
                    "worker {worker_id}: killing executor {} (pid {pid}) left from a previous run",
                    executor.path().display()
                );
                signal_group(pid, "-KILL");
            }
        }
        if let Err(error) = std::fs::remove_dir_all(app.path()) {
            tracing::warn!("cannot remove {}: {error}", app.path().display());
        }
    }
}

/// Messages to the worker's endpoint.
#[derive(Debug)]
pub enum WorkerMsg {
    /// An executor process ended.
    Exited {
        /// Its application.
        app: String,
        /// Its id.
        executor: String,
        /// Its exit code, if it exited.
        code: Option<i32>,
        /// The signal that ended it, if one did.
        signal: Option<i32>,
    },
}

enum Phase {
    Connecting(Box<Handshake>),
    Handshake(Box<Handshake>),
    Registering,
    Registered,
}

struct Link {
    conn: Connection,
    token: Token,
    phase: Phase,
    /// When the master last sent anything (heartbeats are acked).
    last_heard: Instant,
}

struct Running {
    pgid: u32,
    killing: bool,
    cores: u32,
    memory_mb: u64,
}

/// A `flint status` connection to the worker's listener.
struct Client {
    conn: Connection,
    handshake: Option<Box<Handshake>>,
    opened: Instant,
    last_heard: Instant,
}

/// Time a status connection has to finish its handshake.
const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A status connection silent this long is closed.
const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Status connections held at once; the oldest goes when another arrives.
const CLIENTS_MAX: usize = 64;

struct Report {
    app: String,
    executor: String,
    state: ExecutorState,
    message: String,
    exit_code: Option<i32>,
}

/// Heartbeat intervals without a word from the master after which the worker drops the
/// connection and reconnects (15 s at the default 1 s interval): a master behind a cut link
/// sends no reset, so silence is the only sign.
const MASTER_SILENCE_HEARTBEATS: u32 = 15;

struct WorkerEndpoint {
    config: WorkerConfig,
    heartbeat_interval: Duration,
    link: Option<Link>,
    registered_once: bool,
    backoff: Duration,
    /// Connection attempts that failed since the last registration.
    failed_attempts: u32,
    heartbeat: Option<TimerId>,
    reconnect: Option<TimerId>,
    /// Fires when a connection attempt (connect and handshake) has taken too long.
    connect_deadline: Option<TimerId>,
    executors: HashMap<(String, String), Running>,
    finished_apps: HashSet<String>,
    kill_timers: HashMap<TimerId, (String, String)>,
    reports: VecDeque<Report>,
    exit: Arc<Exit>,
    listener: Option<mio::net::TcpListener>,
    listener_token: Option<Token>,
    clients: HashMap<Token, Client>,
}

/// The longest worker id.
pub const ID_LEN_MAX: usize = 64;

/// Whether `id` can be a worker's id: 1 to [`ID_LEN_MAX`] letters, digits, `-`, `_` or `.`,
/// not `.` or `..` (it names the default work directory, and the master shows it).
pub fn valid_id(id: &str) -> bool {
    id.len() <= ID_LEN_MAX && safe_component(id)
}

/// A directory name from a peer: letters, digits, `-`, `_`, `.`; not `.` or `..`.
fn safe_component(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Appends the queued reports to the link's outbound buffer.
fn drain_reports(reports: &mut VecDeque<Report>, link: &mut Link) {
    for report in reports.drain(..) {
        encode(
            &Message::ExecutorStateChanged {
                app_id: &report.app,
                executor_id: &report.executor,
                state: report.state,
                message: &report.message,
                exit_code: report.exit_code,
            },
            link.conn.outbound(),
            FRAME_SIZE_MAX_DEFAULT,
        );
    }
}

/// Sends a signal to a process group with the `kill` command.
fn signal_group(pgid: u32, signal: &str) {
    let result = Command::new("kill")
        .args([signal, "--", &format!("-{pgid}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if let Err(error) = result {
        tracing::warn!("kill {signal} -{pgid} failed: {error}");
    }
}

impl WorkerEndpoint {
    fn connect(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.reconnect = None;
        let stream = match TcpStream::connect(self.config.master) {
            Ok(stream) => stream,
            Err(error) => {
                return self.schedule_reconnect(Some(&format!("connect failed: {error}")), ctx);
            }
        };
        let mut conn = Connection::new(stream, FRAME_SIZE_MAX_DEFAULT, 64 << 20);
        let token = match ctx.register(conn.stream_mut(), Interest::READABLE | Interest::WRITABLE) {
            Ok(token) => token,
            Err(error) => {
                let why = format!("cannot watch the master connection: {error}");
                return self.schedule_reconnect(Some(&why), ctx);
            }
        };
        let nonce = match random_nonce() {
            Ok(nonce) => nonce,
            Err(error) => {
                self.exit
                    .set(Err(WorkerError::Start(format!("no random nonce: {error}"))));
                return ctx.stop();
            }
        };
        let handshake = Handshake::start(
            Role::Worker,
            self.config.secret.clone(),
            nonce,
            &[Role::Master],
            conn.outbound(),
        );
        self.link = Some(Link {
            conn,
            token,
            phase: Phase::Connecting(Box::new(handshake)),
            last_heard: Instant::now(),
        });
        // A SYN into a cut link is retried for minutes; give up sooner and start again.
        if let Some(old) = self.connect_deadline.take() {
            ctx.cancel_timer(old);
        }
        self.connect_deadline = ctx.timer_once(CONNECT_TIMEOUT).ok();
    }

    /// Arms the next connection attempt after the backoff; `failed` is why the last attempt
    /// failed (logged at info with the backoff: a worker that cannot reach its master says so).
    fn schedule_reconnect(&mut self, failed: Option<&str>, ctx: &mut Ctx<'_, Self>) {
        if self.reconnect.is_some() {
            return;
        }
        if let Some(why) = failed {
            self.failed_attempts += 1;
            tracing::info!(
                "worker {}: cannot reach the master at {} (attempt {}): {why}; retrying in {} ms",
                self.config.id,
                self.config.master,
                self.failed_attempts,
                self.backoff.as_millis()
            );
        }
        self.reconnect = ctx.timer_once(self.backoff).ok();
        self.backoff = (self.backoff * 2).min(self.config.reconnect_max);
    }

    fn disconnect(&mut self, why: &str, ctx: &mut Ctx<'_, Self>) {
        let mut failed = Some(why);
        if let Some(mut link) = self.link.take() {
            if matches!(link.phase, Phase::Registered) {
                tracing::warn!(
                    "worker {}: lost the master ({why}); reconnecting",
                    self.config.id
                );
                failed = None;
            }
            let _ = ctx.deregister(link.conn.stream_mut(), link.token);
        }
        if let Some(timer) = self.heartbeat.take() {
            ctx.cancel_timer(timer);
        }
        self.schedule_reconnect(failed, ctx);
    }

    fn on_link_event(&mut self, event: &Event, ctx: &mut Ctx<'_, Self>) {
        let Some(mut link) = self.link.take() else {
            return;
        };
        if let Phase::Connecting(_) = link.phase {
            if event.is_error() || event.is_read_closed() || event.is_write_closed() {
                self.link = Some(link);
                return self.disconnect("connection refused or failed", ctx);
            }
            if !event.is_writable() {
                self.link = Some(link);
                return;
            }
            match link.conn.stream_mut().peer_addr() {
                Ok(_) => {
                    if let Phase::Connecting(handshake) =
                        std::mem::replace(&mut link.phase, Phase::Registering)
                    {
                        link.phase = Phase::Handshake(handshake);
                    }
                }
                Err(error) => {
                    self.link = Some(link);
                    return self.disconnect(&format!("connect failed: {error}"), ctx);
                }
            }
        }
        let mut frames = Vec::new();
        let read = if event.is_readable() || event.is_read_closed() || event.is_error() {
            link.last_heard = Instant::now();
            link.conn.read_frames(|_, frame| {
                frames.push(frame);
                Ok(())
            })
        } else {
            Ok(())
        };
        for frame in frames {
            if let Err(why) = self.on_frame(&mut link, frame, ctx) {
                let _ = link.conn.flush();
                self.link = Some(link);
                return self.disconnect(&why, ctx);
            }
            if self.exit_requested() {
                return ctx.stop();
            }
        }
        if matches!(link.phase, Phase::Registered) {
            drain_reports(&mut self.reports, &mut link);
        }
        let flushed = link.conn.flush();
        self.link = Some(link);
        if let Err(error) = read.and(flushed) {
            let why = match error {
                ConnError::Closed => "the master closed the connection".to_owned(),
                other => other.to_string(),
            };
            self.disconnect(&why, ctx);
        }
    }

    fn exit_requested(&self) -> bool {
        self.exit
            .reason
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn on_frame(
        &mut self,
        link: &mut Link,
        frame: wire::Frame,
        ctx: &mut Ctx<'_, Self>,
    ) -> Result<(), String> {
        if let Phase::Handshake(handshake) = &mut link.phase {
            return match handshake.on_frame(frame.kind(), frame.body(), link.conn.outbound()) {
                Ok(None) => Ok(()),
                Ok(Some(_)) => {
                    self.register(link);
                    link.phase = Phase::Registering;
                    Ok(())
                }
                Err(error) => {
                    let why = format!("handshake with the master failed: {error}");
                    let table_full = error.to_string().contains(crate::conn::TABLE_FULL);
                    if !self.registered_once && !table_full {
                        // A wrong secret or protocol version does not fix itself: stop.
                        tracing::warn!("worker {}: {why}", self.config.id);
                        self.kill_all();
                        self.exit.set(Err(WorkerError::Refused(why.clone())));
                    }
                    Err(why)
                }
            };
        }
        let message = frame
            .message()
            .map_err(|e| format!("malformed frame from the master: {e}"))?;
        match message {
            Message::RegisteredWorker {
                heartbeat_interval_ms,
            } => {
                let interval =
                    Duration::from_millis(u64::from(heartbeat_interval_ms.clamp(10, 60_000)));
                self.heartbeat_interval = interval;
                if let Some(timer) = self.heartbeat.take() {
                    ctx.cancel_timer(timer);
                }
                self.heartbeat = ctx.timer_periodic(interval).ok();
                link.phase = Phase::Registered;
                self.registered_once = true;
                self.backoff = Duration::from_millis(50);
                self.failed_attempts = 0;
                tracing::info!(
                    "worker {}: registered with the master at {}",
                    self.config.id,
                    self.config.master
                );
                Ok(())
            }
            Message::RegisterWorkerFailed { reason } => {
                tracing::warn!("worker {}: registration refused: {reason}", self.config.id);
                if !self.registered_once {
                    self.kill_all();
                    self.exit.set(Err(WorkerError::Refused(reason.to_owned())));
                }
                Err(format!("registration refused: {reason}"))
            }
            Message::LaunchExecutor {
                app_id,
                executor_id,
                app,
                cores,
                memory_mb,
            } => {
                self.launch(app_id, executor_id, &app, cores, memory_mb, ctx);
                Ok(())
            }
            Message::KillExecutor {
                app_id,
                executor_id,
            } => {
                self.kill(app_id, executor_id, ctx);
                Ok(())
            }
            Message::ApplicationFinished { app_id } => {
                let ids: Vec<(String, String)> = self
                    .executors
                    .keys()
                    .filter(|(app, _)| app == app_id)
                    .cloned()
                    .collect();
                for (app, executor) in ids {
                    self.kill(&app, &executor, ctx);
                }
                if safe_component(app_id) {
                    self.finished_apps.insert(app_id.to_owned());
                    self.clean_up(app_id);
                }
                Ok(())
            }
            Message::HeartbeatAck {} => Ok(()),
            Message::Shutdown {} => Err("the master shut down".into()),
            Message::HandshakeRefused { reason } => {
                Err(format!("the master refused the connection: {reason}"))
            }
            other => Err(format!(
                "unexpected {} from the master",
                other.kind().name()
            )),
        }
    }

    /// Appends the registration, the executors still running and the reports kept while away.
    fn register(&mut self, link: &mut Link) {
        let host = if self.config.host.is_empty() {
            link.conn
                .stream_mut()
                .local_addr()
                .map_or_else(|_| "127.0.0.1".to_owned(), |a| a.ip().to_string())
        } else {
            self.config.host.clone()
        };
        let out = link.conn.outbound();
        encode(
            &Message::RegisterWorker {
                worker_id: &self.config.id,
                host: &host,
                port: self.config.port,
                cores: self.config.cores,
                memory_mb: self.config.memory_mb,
            },
            out,
            FRAME_SIZE_MAX_DEFAULT,
        );
        for (app, executor) in self.executors.keys() {
            encode(
                &Message::ExecutorStateChanged {
                    app_id: app,
                    executor_id: executor,
                    state: ExecutorState::Running,
                    message: REATTACH_MESSAGE,
                    exit_code: None,
                },
                out,
                FRAME_SIZE_MAX_DEFAULT,
            );
        }
        // Running executors were just announced; only how the others ended is news.
        self.reports
            .retain(|r| !matches!(r.state, ExecutorState::Launching | ExecutorState::Running));
        drain_reports(&mut self.reports, link);
    }

    /// Queues a state report; it goes out with the next flush while registered, or after the
    /// next registration.
    fn report(&mut self, report: Report) {
        if self.reports.len() >= self.config.reports_max {
            self.reports.pop_front();
        }
        self.reports.push_back(report);
    }

    fn launch(
        &mut self,
        app_id: &str,
        executor_id: &str,
        app: &wire::AppDescription<'_>,
        cores: u32,
        memory_mb: u64,
        ctx: &mut Ctx<'_, Self>,
    ) {
        let fail = |this: &mut Self, message: String| {
            tracing::warn!(
                "worker {}: executor {app_id}/{executor_id} not started: {message}",
                this.config.id
            );
            this.report(Report {
                app: app_id.to_owned(),
                executor: executor_id.to_owned(),
                state: ExecutorState::Failed,
                message,
                exit_code: None,
            });
        };
        if !safe_component(app_id) || !safe_component(executor_id) {
            return fail(
                self,
                "application or executor id unfit for a directory name".into(),
            );
        }
        let key = (app_id.to_owned(), executor_id.to_owned());
        if self.executors.contains_key(&key) {
            return;
        }
        if self.executors.len() >= self.config.executors_max {
            return fail(
                self,
                format!("{} executors running (executors_max)", self.executors.len()),
            );
        }
        self.report(Report {
            app: app_id.to_owned(),
            executor: executor_id.to_owned(),
            state: ExecutorState::Launching,
            message: String::new(),
            exit_code: None,
        });
        let dir = self.config.work_dir.join(app_id).join(executor_id);
        let spawned = (|| -> Result<std::process::Child, String> {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            let stdout = std::fs::File::create(dir.join("stdout"))
                .map_err(|e| format!("cannot create stdout: {e}"))?;
            let stderr = std::fs::File::create(dir.join("stderr"))
                .map_err(|e| format!("cannot create stderr: {e}"))?;
            let mut command = if app.command.is_empty() {
                if !app.args.is_empty() {
                    return Err(
                        "arguments for the default executor (flint executor) are not accepted"
                            .into(),
                    );
                }
                let mut command = Command::new(&self.config.executor_program);
                command.args([
                    "executor",
                    "--driver",
                    app.driver_addr,
                    "--id",
                    executor_id,
                    "--cores",
                    &cores.max(1).to_string(),
                ]);
                command
            } else if self.command_allowed(app.command) {
                Command::new(app.command)
            } else {
                return Err(format!(
                    "command {:?} is not allowed on this worker: it runs `flint executor` and \
                     the programs given with --allow-command",
                    app.command
                ));
            };
            command
                .args(app.args.iter())
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(stdout)
                .stderr(stderr)
                .envs(
                    app.env
                        .iter()
                        .filter(|kv| kv.key != SECRET_ENV)
                        .map(|kv| (kv.key, kv.value)),
                )
                .env("FLINT_DRIVER_ADDR", app.driver_addr)
                .env("FLINT_APP_ID", app_id)
                .env("FLINT_EXECUTOR_ID", executor_id)
                .env("FLINT_WORKER_ID", &self.config.id)
                .env("FLINT_WORKER_PID", std::process::id().to_string())
                .env("FLINT_EXECUTOR_CORES", cores.to_string())
                .env("FLINT_EXECUTOR_MEMORY_MB", memory_mb.to_string())
                .process_group(0);
            // The worker hands its own secret (the cluster's) to its executors: it never
            // travels in the application's description, which the master journals.
            match &self.config.secret {
                Some(secret) => {
                    use std::os::unix::ffi::OsStrExt;
                    command.env(
                        SECRET_ENV,
                        std::ffi::OsStr::from_bytes(secret.expose_bytes()),
                    );
                }
                None => {
                    command.env_remove(SECRET_ENV);
                }
            }
            let child = command
                .spawn()
                .map_err(|e| format!("cannot start {:?}: {e}", command.get_program()))?;
            let _ = std::fs::write(dir.join("pid"), format!("{}\n", child.id()));
            Ok(child)
        })();
        let mut child = match spawned {
            Ok(child) => child,
            Err(message) => return fail(self, message),
        };
        let pgid = child.id();
        let me: EndpointRef<Self> = ctx.myself();
        let (app, executor) = key.clone();
        let waiter = std::thread::Builder::new()
            .name(format!("flint-wait-{executor}"))
            .spawn(move || {
                let status = child.wait();
                let (code, signal) = match status {
                    Ok(status) => (status.code(), status.signal()),
                    Err(_) => (None, None),
                };
                send_retrying(&me, || WorkerMsg::Exited {
                    app: app.clone(),
                    executor: executor.clone(),
                    code,
                    signal,
                });
            });
        if let Err(error) = waiter {
            signal_group(pgid, "-KILL");
            return fail(self, format!("no thread to watch the executor: {error}"));
        }
        tracing::info!(
            "worker {}: started executor {app_id}/{executor_id} (pid {pgid}) in {}",
            self.config.id,
            dir.display()
        );
        self.executors.insert(
            key,
            Running {
                pgid,
                killing: false,
                cores,
                memory_mb,
            },
        );
        self.report(Report {
            app: app_id.to_owned(),
            executor: executor_id.to_owned(),
            state: ExecutorState::Running,
            message: format!("pid {pgid}"),
            exit_code: None,
        });
    }

    /// Whether an application may run `command` here: it is one of the allowed programs, as
    /// given or as the same file.
    fn command_allowed(&self, command: &str) -> bool {
        let wanted = Path::new(command);
        let canonical = std::fs::canonicalize(wanted).ok();
        self.config.allowed_commands.iter().any(|allowed| {
            allowed == wanted
                || (canonical.is_some() && std::fs::canonicalize(allowed).ok() == canonical)
        })
    }

    fn kill(&mut self, app: &str, executor: &str, ctx: &mut Ctx<'_, Self>) {
        let key = (app.to_owned(), executor.to_owned());
        let Some(running) = self.executors.get_mut(&key) else {
            return;
        };
        if running.killing {
            return;
        }
        running.killing = true;
        signal_group(running.pgid, "-TERM");
        if let Ok(timer) = ctx.timer_once(self.config.kill_timeout) {
            self.kill_timers.insert(timer, key);
        }
    }

    fn kill_all(&mut self) {
        for running in self.executors.values() {
            signal_group(running.pgid, "-KILL");
        }
    }

    fn on_exited(&mut self, app: String, executor: String, code: Option<i32>, signal: Option<i32>) {
        let Some(running) = self.executors.remove(&(app.clone(), executor.clone())) else {
            return;
        };
        let (state, message) = if code == Some(0) {
            (ExecutorState::Exited, "exited normally".to_owned())
        } else if running.killing {
            (ExecutorState::Killed, "killed by the worker".to_owned())
        } else if let Some(signal) = signal {
            (ExecutorState::Failed, format!("killed by signal {signal}"))
        } else {
            (
                ExecutorState::Failed,
                format!("exited with code {}", code.unwrap_or(-1)),
            )
        };
        tracing::info!(
            "worker {}: executor {app}/{executor} {state}: {message}",
            self.config.id
        );
        self.kill_timers
            .retain(|_, key| *key != (app.clone(), executor.clone()));
        self.report(Report {
            app: app.clone(),
            executor,
            state,
            message,
            exit_code: code,
        });
        if self.finished_apps.contains(&app) {
            self.clean_up(&app);
        }
    }

    /// Removes a finished application's directory once none of its executors runs.
    fn clean_up(&mut self, app: &str) {
        if self.executors.keys().any(|(a, _)| a == app) {
            return;
        }
        self.finished_apps.remove(app);
        let dir: &Path = &self.config.work_dir;
        if let Err(error) = std::fs::remove_dir_all(dir.join(app)) {
            if error.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!("cannot remove {}: {error}", dir.join(app).display());
            }
        }
    }

    fn accept(&mut self, ctx: &mut Ctx<'_, Self>) {
        let inbound = Inbound {
            role: Role::Worker,
            accepted_roles: &[Role::Client],
            secret: self.config.secret.clone(),
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 16 << 20,
        };
        loop {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            let Some((stream, _)) = accept_next(listener) else {
                return;
            };
            if self.clients.len() >= CLIENTS_MAX {
                let oldest = self
                    .clients
                    .iter()
                    .min_by_key(|(_, c)| c.opened)
                    .map(|(t, _)| *t);
                if let Some(token) = oldest {
                    self.drop_client(token, ctx);
                }
            }
            let Ok((token, mut conn, handshake)) = inbound.open(stream, ctx) else {
                continue;
            };
            let _ = conn.flush();
            self.clients.insert(
                token,
                Client {
                    conn,
                    handshake: Some(Box::new(handshake)),
                    opened: Instant::now(),
                    last_heard: Instant::now(),
                },
            );
        }
    }

    /// Closes status connections that did not finish the handshake in time or went silent.
    fn expire_clients(&mut self, ctx: &mut Ctx<'_, Self>) {
        let expired: Vec<Token> = self
            .clients
            .iter()
            .filter(|(_, c)| {
                (c.handshake.is_some() && c.opened.elapsed() > CLIENT_HANDSHAKE_TIMEOUT)
                    || c.last_heard.elapsed() > CLIENT_IDLE_TIMEOUT
            })
            .map(|(t, _)| *t)
            .collect();
        for token in expired {
            self.drop_client(token, ctx);
        }
    }

    fn drop_client(&mut self, token: Token, ctx: &mut Ctx<'_, Self>) {
        if let Some(mut client) = self.clients.remove(&token) {
            let _ = client.conn.flush();
            let _ = ctx.deregister(client.conn.stream_mut(), token);
        }
    }

    /// A status client: handshake, then `StatusRequest`s answered with this worker and its
    /// executors.
    fn on_client_event(&mut self, token: Token, ctx: &mut Ctx<'_, Self>) {
        let Some(mut client) = self.clients.remove(&token) else {
            return;
        };
        client.last_heard = Instant::now();
        let mut frames = Vec::new();
        let mut result = client.conn.read_frames(|_, frame| {
            frames.push(frame);
            Ok(())
        });
        for frame in frames {
            if result.is_err() {
                break;
            }
            if let Some(handshake) = client.handshake.as_mut() {
                match handshake.on_frame(frame.kind(), frame.body(), client.conn.outbound()) {
                    Ok(None) => {}
                    Ok(Some(_)) => client.handshake = None,
                    Err(error) => result = Err(ConnError::Protocol(error.to_string())),
                }
                continue;
            }
            match frame.message() {
                Ok(Message::StatusRequest {}) => self.status(&mut client.conn),
                Ok(Message::Shutdown {}) => result = Err(ConnError::Closed),
                Ok(other) => {
                    result = Err(ConnError::Protocol(format!(
                        "unexpected {}",
                        other.kind().name()
                    )))
                }
                Err(error) => result = Err(error.into()),
            }
        }
        let result = result.and_then(|()| client.conn.flush());
        self.clients.insert(token, client);
        if result.is_err() {
            self.drop_client(token, ctx);
        }
    }

    fn status(&self, conn: &mut Connection) {
        let cores_used: u32 = self.executors.values().map(|r| r.cores).sum();
        let memory_used_mb: u64 = self.executors.values().map(|r| r.memory_mb).sum();
        let registered = self
            .link
            .as_ref()
            .is_some_and(|l| matches!(l.phase, Phase::Registered));
        let workers = [wire::WorkerStatus {
            worker_id: &self.config.id,
            host: &self.config.host,
            port: self.config.port,
            state: if registered {
                wire::WorkerState::Alive
            } else {
                wire::WorkerState::Unknown
            },
            cores: self.config.cores,
            cores_used,
            memory_mb: self.config.memory_mb,
            memory_used_mb,
        }];
        let executors: Vec<wire::ExecutorStatus<'_>> = self
            .executors
            .iter()
            .map(|((app, executor), running)| wire::ExecutorStatus {
                app_id: app,
                executor_id: executor,
                worker_id: &self.config.id,
                cores: running.cores,
                state: ExecutorState::Running,
            })
            .collect();
        encode(
            &Message::StatusResponse {
                workers: wire::List::from_items(&workers),
                applications: wire::List::empty(),
                executors: wire::List::from_items(&executors),
            },
            conn.outbound(),
            FRAME_SIZE_MAX_DEFAULT,
        );
    }

    fn flush(&mut self, ctx: &mut Ctx<'_, Self>) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        if matches!(link.phase, Phase::Connecting(_)) {
            return;
        }
        if matches!(link.phase, Phase::Registered) {
            drain_reports(&mut self.reports, link);
        }
        if let Err(error) = link.conn.flush() {
            self.disconnect(&error.to_string(), ctx);
        }
    }
}

impl Endpoint for WorkerEndpoint {
    type Msg = WorkerMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Some(listener) = self.listener.as_mut() {
            match ctx.register(listener, Interest::READABLE) {
                Ok(token) => self.listener_token = Some(token),
                Err(error) => tracing::error!("cannot watch the listener: {error}"),
            }
        }
        self.connect(ctx);
    }

    fn on_message(&mut self, msg: WorkerMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            WorkerMsg::Exited {
                app,
                executor,
                code,
                signal,
            } => self.on_exited(app, executor, code, signal),
        }
        self.flush(ctx);
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if self.link.as_ref().is_some_and(|l| l.token == token) {
            self.on_link_event(event, ctx);
        } else if Some(token) == self.listener_token {
            self.accept(ctx);
        } else {
            self.on_client_event(token, ctx);
        }
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if Some(timer) == self.connect_deadline {
            self.connect_deadline = None;
            let stuck = self
                .link
                .as_ref()
                .is_some_and(|link| !matches!(link.phase, Phase::Registered));
            if stuck {
                let why = format!(
                    "no connection to the master within {} ms",
                    CONNECT_TIMEOUT.as_millis()
                );
                self.disconnect(&why, ctx);
            }
            return;
        }
        if Some(timer) == self.reconnect {
            self.reconnect = None;
            if self.link.is_none() {
                self.connect(ctx);
            }
            return;
        }
        if Some(timer) == self.heartbeat {
            self.expire_clients(ctx);
            let silence = self.heartbeat_interval * MASTER_SILENCE_HEARTBEATS;
            if self
                .link
                .as_ref()
                .is_some_and(|link| link.last_heard.elapsed() > silence)
            {
                let why = format!("no answer from the master for {} ms", silence.as_millis());
                return self.disconnect(&why, ctx);
            }
            if let Some(link) = self.link.as_mut() {
                encode(
                    &Message::WorkerHeartbeat {
                        worker_id: &self.config.id,
                    },
                    link.conn.outbound(),
                    FRAME_SIZE_MAX_DEFAULT,
                );
            }
            return self.flush(ctx);
        }
        if let Some((app, executor)) = self.kill_timers.remove(&timer) {
            if let Some(running) = self.executors.get(&(app, executor)) {
                signal_group(running.pgid, "-KILL");
            }
        }
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.kill_all();
        self.exit.set(Ok(()));
    }
}
