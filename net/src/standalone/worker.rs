//! The standalone worker role: connects to the master on a `transport::client::Link`
//! (reconnecting with backoff and registering again whenever the connection ends), heartbeats,
//! and runs executors as child processes (Spark's `Worker` and `ExecutorRunner`). What it says
//! to the master is decided sans IO in `session.rs`; this file does the IO and supervises the
//! children.
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

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::runtime::{Ctx, Endpoint, EndpointRef, Runtime, RuntimeConfig, TimerId};
use mio::event::Event;
use mio::Token;

use crate::conn::{ConnError, Inbound};
use crate::handshake::{Secret, SECRET_ENV};
use crate::transport::client::{Link, LinkConfig, Silence, Step, CONNECT_TIMEOUT};
use crate::transport::server::{Handler, Limits, Server, Standing};
use crate::transport::{encode, send_retrying, unexpected, Exit};
use crate::wire::{self, ExecutorState, Frame, Message, Role, FRAME_SIZE_MAX_DEFAULT};

mod session;

use session::{FromMaster, Identity, Report, Session};

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
    /// Without a secret: let the status listener bind a non-loopback address.
    pub allow_insecure_bind: bool,
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
            allow_insecure_bind: false,
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
    let status = match config.listen {
        None => None,
        Some(addr) => Some(bind_status(addr, &mut config)?),
    };
    reap_stale_executors(&config.work_dir, &config.id);
    let mut runtime = Runtime::new(RuntimeConfig {
        threads: 1,
        thread_name: "flint-worker".into(),
        ..RuntimeConfig::default()
    })
    .map_err(|e| WorkerError::Start(format!("runtime: {e}")))?;
    let exit = Arc::new(Exit::default());
    let link = Link::new(LinkConfig {
        addr: config.master,
        role: Role::Worker,
        peer_roles: &[Role::Master],
        secret: config.secret.clone(),
        label: format!("worker {}", config.id),
        peer_name: "the master",
        connect_timeout: CONNECT_TIMEOUT,
        reconnect_max: config.reconnect_max,
        frame_size_max: FRAME_SIZE_MAX_DEFAULT,
        outbound_max: 64 << 20,
    });
    let endpoint = WorkerEndpoint {
        session: Session::new(config.reports_max),
        config,
        link,
        heartbeat: None,
        executors: HashMap::new(),
        finished_apps: HashSet::new(),
        kill_timers: HashMap::new(),
        exit: exit.clone(),
        status,
        status_tick: None,
    };
    runtime
        .handle()
        .spawn("worker", endpoint)
        .map_err(|e| WorkerError::Start(format!("worker endpoint: {e}")))?;
    let reason = exit.wait();
    runtime.shutdown();
    reason
}

/// Binds the status listener (`--listen`); the advertised host and port become the bound ones.
fn bind_status(addr: SocketAddr, config: &mut WorkerConfig) -> Result<Server<()>, WorkerError> {
    if !addr.ip().is_loopback() && config.secret.is_none() && !config.allow_insecure_bind {
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
    Ok(status_server(listener, config))
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

struct Running {
    pgid: u32,
    killing: bool,
    cores: u32,
    memory_mb: u64,
}

/// Time a status connection has to finish its handshake.
const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A status connection silent this long is closed.
const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Status connections held at once; the oldest goes when another arrives.
const CLIENTS_MAX: usize = 64;

/// Heartbeat intervals without a word from the master after which the worker drops the
/// connection and reconnects (15 s at the default 1 s interval): a master behind a cut link
/// sends no reset, so silence is the only sign.
const MASTER_SILENCE: Silence = Silence { intervals: 15 };

struct WorkerEndpoint {
    config: WorkerConfig,
    /// The link to the master.
    link: Link,
    /// The protocol with the master, sans IO.
    session: Session,
    heartbeat: Option<TimerId>,
    executors: HashMap<(String, String), Running>,
    finished_apps: HashSet<String>,
    kill_timers: HashMap<TimerId, (String, String)>,
    exit: Arc<Exit<Result<(), WorkerError>>>,
    /// `flint status` connections, with `--listen`.
    status: Option<Server<()>>,
    /// Expires status connections.
    status_tick: Option<TimerId>,
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

/// A thread that waits for an executor's exit and tells the endpoint; the process group's id,
/// or why there is no such thread (the child is then killed).
fn watch(
    mut child: std::process::Child,
    (app, executor): (String, String),
    me: EndpointRef<WorkerEndpoint>,
) -> Result<u32, String> {
    let pgid = child.id();
    let waiter = std::thread::Builder::new()
        .name(format!("flint-wait-{executor}"))
        .spawn(move || {
            let (code, signal) = match child.wait() {
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
    match waiter {
        Ok(_) => Ok(pgid),
        Err(error) => {
            signal_group(pgid, "-KILL");
            Err(format!("no thread to watch the executor: {error}"))
        }
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
    /// A readiness event on the master link, if it is the link's.
    fn on_link_event(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) -> bool {
        let Some(step) = self.link.read(token, event) else {
            return false;
        };
        let outcome = self.on_step(step, ctx);
        if self.exit.is_set() {
            ctx.stop();
            return true;
        }
        self.link.settle(outcome, ctx);
        true
    }

    /// The registration after a handshake, the master's frames, then the reports.
    fn on_step(&mut self, step: Step, ctx: &mut Ctx<'_, Self>) -> Result<(), String> {
        if step.opened {
            self.register();
        }
        for frame in &step.frames {
            self.on_frame(frame, ctx)?;
        }
        if let Some(ended) = &step.ended {
            if self.session.handshake_failure_stops(ended.refused) {
                // A wrong secret or protocol version does not fix itself: stop.
                self.stop(WorkerError::Refused(ended.why.clone()));
            }
        }
        self.send_reports();
        step.outcome()
    }

    fn stop(&mut self, why: WorkerError) {
        tracing::warn!("worker {}: {why}", self.config.id);
        self.kill_all();
        self.exit.set(Err(why));
    }

    fn on_frame(&mut self, frame: &Frame, ctx: &mut Ctx<'_, Self>) -> Result<(), String> {
        let message = frame
            .message()
            .map_err(|e| format!("malformed frame from the master: {e}"))?;
        match self.session.on_message(message) {
            FromMaster::Registered(interval) => self.registered(interval, ctx),
            FromMaster::Launch {
                app_id,
                executor_id,
                app,
                cores,
                memory_mb,
            } => self.launch(app_id, executor_id, &app, cores, memory_mb, ctx),
            FromMaster::Kill {
                app_id,
                executor_id,
            } => self.kill(app_id, executor_id, ctx),
            FromMaster::AppFinished(app_id) => self.app_finished(app_id, ctx),
            FromMaster::Nothing => {}
            FromMaster::End { why, stop } => {
                if stop {
                    self.stop(WorkerError::Refused(why.clone()));
                }
                return Err(why);
            }
        }
        Ok(())
    }

    fn registered(&mut self, interval: Duration, ctx: &mut Ctx<'_, Self>) {
        if let Some(timer) = self.heartbeat.take() {
            ctx.cancel_timer(timer);
        }
        self.heartbeat = ctx.timer_periodic(interval).ok();
        self.link.established();
        tracing::info!(
            "worker {}: registered with the master at {}",
            self.config.id,
            self.config.master
        );
    }

    fn app_finished(&mut self, app_id: &str, ctx: &mut Ctx<'_, Self>) {
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
    }

    /// Appends the registration, the executors still running and the reports kept while away.
    fn register(&mut self) {
        let host = if self.config.host.is_empty() {
            self.link
                .local_addr()
                .map_or_else(|| "127.0.0.1".to_owned(), |a| a.ip().to_string())
        } else {
            self.config.host.clone()
        };
        let me = Identity {
            id: &self.config.id,
            host: &host,
            port: self.config.port,
            cores: self.config.cores,
            memory_mb: self.config.memory_mb,
        };
        let Some(out) = self.link.outbound() else {
            return;
        };
        let running = self.executors.keys().map(|(a, e)| (a.as_str(), e.as_str()));
        self.session.registration(&me, running, out);
    }

    /// Appends the queued reports while registered.
    fn send_reports(&mut self) {
        if self.link.is_established() {
            if let Some(out) = self.link.outbound() {
                self.session.drain_reports(out);
            }
        }
    }

    /// A heartbeat, unless the master has been silent too long (then the link is dropped).
    fn on_heartbeat(&mut self, ctx: &mut Ctx<'_, Self>) {
        if !self.link.is_established() {
            if let Some(timer) = self.heartbeat.take() {
                ctx.cancel_timer(timer);
            }
            return;
        }
        let interval = self.session.heartbeat_interval();
        if MASTER_SILENCE.exceeded(interval, self.link.silent_for(Instant::now())) {
            let limit = MASTER_SILENCE.limit(interval);
            let why = format!("no answer from the master for {} ms", limit.as_millis());
            return self.link.drop_connection(&why, ctx);
        }
        if let Some(out) = self.link.outbound() {
            self.session.heartbeat(&self.config.id, out);
        }
        self.flush(ctx);
    }

    /// Queues a state report; it goes out with the next flush while registered, or after the
    /// next registration.
    fn report(&mut self, report: Report) {
        self.session.report(report);
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
            this.launch_failed(app_id, executor_id, message);
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
        let spawned = self
            .spawn_executor(&dir, app_id, executor_id, app, cores, memory_mb)
            .and_then(|child| watch(child, key.clone(), ctx.myself()));
        let pgid = match spawned {
            Ok(pgid) => pgid,
            Err(message) => return fail(self, message),
        };
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

    /// An executor that could not start: logged, and reported failed with the reason.
    fn launch_failed(&mut self, app_id: &str, executor_id: &str, message: String) {
        tracing::warn!(
            "worker {}: executor {app_id}/{executor_id} not started: {message}",
            self.config.id
        );
        self.report(Report {
            app: app_id.to_owned(),
            executor: executor_id.to_owned(),
            state: ExecutorState::Failed,
            message,
            exit_code: None,
        });
    }

    /// Starts an executor's process in `dir` (its stdout, stderr and pid files there).
    fn spawn_executor(
        &self,
        dir: &Path,
        app_id: &str,
        executor_id: &str,
        app: &wire::AppDescription<'_>,
        cores: u32,
        memory_mb: u64,
    ) -> Result<std::process::Child, String> {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let stdout = std::fs::File::create(dir.join("stdout"))
            .map_err(|e| format!("cannot create stdout: {e}"))?;
        let stderr = std::fs::File::create(dir.join("stderr"))
            .map_err(|e| format!("cannot create stderr: {e}"))?;
        let mut command = self.executor_command(app, executor_id, cores)?;
        command
            .args(app.args.iter())
            .current_dir(dir)
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
        // The worker hands its own secret (the cluster's) to its executors: it never travels
        // in the application's description, which the master journals.
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
    }

    /// The program an application's executor runs: `flint executor` (no extra arguments), or
    /// one of the allowed commands.
    fn executor_command(
        &self,
        app: &wire::AppDescription<'_>,
        executor_id: &str,
        cores: u32,
    ) -> Result<Command, String> {
        if !app.command.is_empty() {
            if self.command_allowed(app.command) {
                return Ok(Command::new(app.command));
            }
            return Err(format!(
                "command {:?} is not allowed on this worker: it runs `flint executor` and \
                 the programs given with --allow-command",
                app.command
            ));
        }
        if !app.args.is_empty() {
            return Err(
                "arguments for the default executor (flint executor) are not accepted".into(),
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
        Ok(command)
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

    /// A readiness event for the status server.
    fn on_status_event(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        self.with_status(|server, peers| {
            server.on_readiness(token, event, peers, ctx);
            server.flush(peers);
        });
    }

    /// Calls `f` with the status server (with `--listen`) and what it answers from.
    fn with_status(&mut self, f: impl FnOnce(&mut Server<()>, &mut StatusPeers<'_>)) {
        let Some(server) = self.status.as_mut() else {
            return;
        };
        let mut peers = StatusPeers {
            config: &self.config,
            executors: &self.executors,
            registered: self.link.is_established(),
        };
        f(server, &mut peers);
    }

    fn flush(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.send_reports();
        self.link.flush(ctx);
    }
}

/// The worker's status listener: at most [`CLIENTS_MAX`] `flint status` connections, the
/// oldest going when another arrives.
fn status_server(listener: mio::net::TcpListener, config: &WorkerConfig) -> Server<()> {
    let inbound = Inbound {
        role: Role::Worker,
        accepted_roles: &[Role::Client],
        secret: config.secret.clone(),
        frame_size_max: FRAME_SIZE_MAX_DEFAULT,
        outbound_max: 16 << 20,
    };
    let limits = Limits {
        connections_max: CLIENTS_MAX,
        handshakes_max: CLIENTS_MAX,
        clients_max: CLIENTS_MAX,
        handshake_timeout: CLIENT_HANDSHAKE_TIMEOUT,
        client_idle_timeout: CLIENT_IDLE_TIMEOUT,
        member_timeout: None,
    };
    Server::new(listener, inbound, limits, "the worker")
}

/// What a status connection is answered from: this worker and its executors.
struct StatusPeers<'a> {
    config: &'a WorkerConfig,
    executors: &'a HashMap<(String, String), Running>,
    registered: bool,
}

impl Handler<()> for StatusPeers<'_> {
    fn on_open(&mut self, _peer: Token, _role: Role) -> Result<(), String> {
        Ok(())
    }

    fn on_frame(
        &mut self,
        _peer: Token,
        _state: &mut (),
        frame: Frame,
        out: &mut BytesMut,
    ) -> Result<(), ConnError> {
        match frame.message()? {
            Message::StatusRequest {} => {
                self.status(out);
                Ok(())
            }
            Message::Shutdown {} => Err(ConnError::Closed),
            other => Err(ConnError::Protocol(unexpected(&other, "a status client"))),
        }
    }

    fn on_closed(&mut self, _peer: Token, _state: (), _why: &ConnError) {}

    fn standing(&self, _peer: Token, _state: &()) -> Standing {
        Standing::Client
    }
}

impl StatusPeers<'_> {
    fn status(&self, out: &mut BytesMut) {
        let cores_used: u32 = self.executors.values().map(|r| r.cores).sum();
        let memory_used_mb: u64 = self.executors.values().map(|r| r.memory_mb).sum();
        let workers = [wire::WorkerStatus {
            worker_id: &self.config.id,
            host: &self.config.host,
            port: self.config.port,
            state: if self.registered {
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
        let response = Message::StatusResponse {
            workers: wire::List::from_items(&workers),
            applications: wire::List::empty(),
            executors: wire::List::from_items(&executors),
        };
        encode(&response, out, FRAME_SIZE_MAX_DEFAULT);
    }
}

impl Endpoint for WorkerEndpoint {
    type Msg = WorkerMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Some(server) = self.status.as_mut() {
            if let Err(error) = server.start(ctx) {
                tracing::error!("{error}");
            }
            self.status_tick = ctx.timer_periodic(Duration::from_secs(1)).ok();
        }
        self.link.start(ctx);
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
        if !self.on_link_event(token, event, ctx) {
            self.on_status_event(token, event, ctx);
        }
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if self.link.on_timer(timer, ctx) {
            return;
        }
        if Some(timer) == self.heartbeat {
            return self.on_heartbeat(ctx);
        }
        if Some(timer) == self.status_tick {
            return self.with_status(|server, peers| server.expire(Instant::now(), peers));
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
