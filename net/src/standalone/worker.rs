//! The standalone worker role: connects to the master on a `transport::client::Link`
//! (reconnecting with backoff and registering again whenever the connection ends), heartbeats,
//! and runs executors as child processes (Spark's `Worker` and `ExecutorRunner`). What it says
//! to the master is decided sans IO in `session.rs`; `endpoint.rs` does the IO on the
//! worker's loop, `process.rs` supervises the children and `status.rs` answers `flint status`.
//! This file holds the configuration and `run`.
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
//! worker that started it dies, as it sees `FLINT_WORKER_PID` is no longer its parent). With a
//! listen address, it answers `flint status` (`Role::Client`) about itself and its executors.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flint_engine::runtime::{Runtime, RuntimeConfig};

use crate::handshake::Secret;
use crate::transport::client::{Link, LinkConfig, CONNECT_TIMEOUT};
use crate::transport::{send_retrying, Exit};
use crate::wire::{Role, FRAME_SIZE_MAX_DEFAULT};

mod endpoint;
mod process;
mod session;
mod status;

use endpoint::WorkerEndpoint;
use process::{reap_stale_executors, safe_component};
use session::Session;

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
    /// Stop on SIGTERM or SIGINT: kill the executors (as [`WorkerConfig::kill_timeout`]
    /// says), report their ends, and return `Ok`. A process setting (it installs the
    /// handlers, see [`crate::signals`]); `flint worker` sets it.
    pub stop_on_signal: bool,
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
            stop_on_signal: false,
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

/// Runs a worker until it must stop (its first registration refused, or a signal with
/// [`WorkerConfig::stop_on_signal`]). Executors it started are killed before it returns.
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
        Some(addr) => Some(status::bind(addr, &mut config)?),
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
    let stop_on_signal = config.stop_on_signal;
    let endpoint = WorkerEndpoint {
        session: Session::new(config.reports_max),
        config,
        link,
        supervisor: process::Supervisor::default(),
        heartbeat: None,
        exit: exit.clone(),
        status,
        status_tick: None,
        stopping: None,
    };
    let worker = runtime
        .handle()
        .spawn("worker", endpoint)
        .map_err(|e| WorkerError::Start(format!("worker endpoint: {e}")))?;
    if stop_on_signal {
        let stop = move |signal| {
            let why = crate::signals::signal_name(signal).to_owned();
            send_retrying(&worker, || WorkerMsg::Stop(why.clone()));
        };
        if let Err(error) = crate::signals::on_stop_signal("worker", stop) {
            runtime.shutdown();
            return Err(WorkerError::Start(format!("stop on SIGTERM: {error}")));
        }
    }
    let reason = exit.wait();
    runtime.shutdown();
    reason
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
    /// Stop (a signal, named): kill the executors, report their ends, leave.
    Stop(String),
}

/// The longest worker id.
pub const ID_LEN_MAX: usize = 64;

/// Whether `id` can be a worker's id: 1 to [`ID_LEN_MAX`] letters, digits, `-`, `_` or `.`,
/// not `.` or `..` (it names the default work directory, and the master shows it).
pub fn valid_id(id: &str) -> bool {
    id.len() <= ID_LEN_MAX && safe_component(id)
}
