//! What the standalone master takes and gives: its settings, the specs of workers and
//! applications, their states, its outputs and its views.

/// The master's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// A worker silent this long is dead.
    pub worker_timeout_us: u64,
    /// Spread executors across workers (true) or pack them onto as few as possible.
    pub spread_out: bool,
    /// Abnormal executor exits, with none running after the last, that remove an application.
    pub max_executor_retries: u32,
    /// How long to wait for journaled workers and applications after a restart.
    pub recovery_timeout_us: u64,
    /// Workers known at once (alive or not); more registrations are refused.
    pub workers_max: usize,
    /// Applications registered at once; more are refused.
    pub apps_max: usize,
    /// Dead workers and completed applications kept for status.
    pub history_max: usize,
    /// Executors one application holds at most (whatever the workers claim to offer).
    pub executors_per_app_max: u32,
    /// Cores an application that sets no maximum (`max_cores` 0) gets at most, so one
    /// application cannot take the whole cluster (Spark's `spark.deploy.defaultCores`); 0: no
    /// limit.
    pub default_cores: u32,
    /// An executor still LAUNCHING this long after the master placed it is marked failed, its
    /// worker told to kill it, and a replacement placed on another worker (the application
    /// avoids that worker from then on); 0: no limit.
    pub launch_timeout_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            worker_timeout_us: 15_000_000,
            spread_out: true,
            max_executor_retries: 10,
            recovery_timeout_us: 15_000_000,
            workers_max: 10_000,
            apps_max: 10_000,
            history_max: 64,
            executors_per_app_max: 10_000,
            default_cores: 0,
            launch_timeout_us: 30_000_000,
        }
    }
}

/// A worker as it registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Its id.
    pub id: String,
    /// Its host.
    pub host: String,
    /// Its port.
    pub port: u16,
    /// Cores it offers.
    pub cores: u32,
    /// Memory it offers, in MiB.
    pub memory_mb: u64,
}

/// An application as it registers.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AppSpec {
    /// Its name.
    pub name: String,
    /// The address its executors connect to.
    pub driver_addr: String,
    /// The executor program; empty for the worker's own `flint executor`.
    pub command: String,
    /// Arguments to the executor program.
    pub args: Vec<String>,
    /// Environment for the executors.
    pub env: Vec<(String, String)>,
    /// Cores per executor (at least 1).
    pub cores_per_executor: u32,
    /// Most cores in total (0: no limit).
    pub max_cores: u32,
    /// Memory per executor, in MiB.
    pub memory_mb: u64,
}

/// A worker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    /// Registered and heartbeating.
    Alive,
    /// Timed out or disconnected.
    Dead,
    /// Recovered from the journal, not heard from yet.
    Unknown,
}

/// An application's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppState {
    /// Registered, no executor yet.
    Waiting,
    /// Has executors.
    Running,
    /// Unregistered (or its driver went away).
    Finished,
    /// Removed after too many executor failures.
    Failed,
    /// Removed by the master (did not come back after a restart).
    Killed,
}

/// An executor process's state as its worker reports it and the master keeps it: Spark's
/// standalone `ExecutorState`, six values on the wire. Not the lifecycle's view of an executor
/// ([`crate::lifecycle::ExecutorState`], which any cluster manager feeds, with an exit's code
/// and blame); `flint_net::lifecycle::master` maps this one to that one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessState {
    /// Being started.
    Launching,
    /// Its process runs.
    Running,
    /// Killed on request.
    Killed,
    /// Exited abnormally.
    Failed,
    /// Lost with its worker.
    Lost,
    /// Exited normally.
    Exited,
}

/// The states print as their names (`Running`), as logs and `flint status` show them.
macro_rules! display_as_name {
    ($($name:ident),*) => {$(
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                std::fmt::Debug::fmt(self, f)
            }
        }
    )*};
}
display_as_name!(WorkerState, AppState, ProcessState);

impl ProcessState {
    /// True once the executor is over.
    pub fn is_final(self) -> bool {
        !matches!(self, ProcessState::Launching | ProcessState::Running)
    }
}

/// An application recovered from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoveredApp {
    /// Its id.
    pub id: String,
    /// Its description.
    pub spec: AppSpec,
    /// The executor count it asked for last, if it asked.
    pub executor_limit: Option<u32>,
    /// The next executor number it would have used.
    pub next_executor: u64,
}

/// What the master decided; the IO layer carries it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Tell `worker` to start an executor.
    LaunchExecutor {
        /// The worker.
        worker: String,
        /// The application (see [`super::Master::app_spec`]).
        app: String,
        /// The executor's id.
        executor: String,
        /// Its cores.
        cores: u32,
        /// Its memory, in MiB.
        memory_mb: u64,
    },
    /// Tell `worker` to kill an executor.
    KillExecutor {
        /// The worker.
        worker: String,
        /// The application.
        app: String,
        /// The executor.
        executor: String,
    },
    /// Tell `worker` an application is over.
    ApplicationFinished {
        /// The worker.
        worker: String,
        /// The application.
        app: String,
    },
    /// Tell an application it got an executor.
    ExecutorAdded {
        /// The application.
        app: String,
        /// The executor.
        executor: String,
        /// The worker.
        worker: String,
        /// The worker's host and port.
        host_port: String,
        /// Cores.
        cores: u32,
        /// Memory, in MiB.
        memory_mb: u64,
    },
    /// Tell an application an executor changed state.
    ExecutorUpdated {
        /// The application.
        app: String,
        /// The executor.
        executor: String,
        /// Its state.
        state: ProcessState,
        /// What happened.
        message: String,
        /// The exit code, if it exited.
        exit_code: Option<i32>,
    },
    /// Tell an application it was removed (and forget it).
    ApplicationRemoved {
        /// The application.
        app: String,
        /// Its final state.
        state: AppState,
        /// Why.
        reason: String,
    },
    /// A worker was removed: tell these applications, drop its connection.
    WorkerRemoved {
        /// The worker.
        worker: String,
        /// Its host.
        host: String,
        /// Why.
        reason: String,
        /// Applications to tell.
        apps: Vec<String>,
    },
}

/// A worker in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerView {
    /// What it registered with.
    pub spec: WorkerSpec,
    /// Its state.
    pub state: WorkerState,
    /// Cores in use.
    pub cores_used: u32,
    /// Memory in use, in MiB.
    pub memory_used_mb: u64,
}

/// An application in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppView {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its state.
    pub state: AppState,
    /// Cores its executors hold.
    pub cores_granted: u32,
    /// The executor count it asked for (or the most its cores allow).
    pub executors_requested: u32,
    /// Why it does not have all the executors it asked for (empty when it does, or is over).
    pub waiting: String,
}

/// An executor in a [`Status`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorView {
    /// Its application.
    pub app: String,
    /// Its id.
    pub id: String,
    /// Its worker.
    pub worker: String,
    /// Its cores.
    pub cores: u32,
    /// Its state.
    pub state: ProcessState,
}

/// A snapshot of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    /// Workers, alive first.
    pub workers: Vec<WorkerView>,
    /// Applications, active ones then recently completed ones.
    pub apps: Vec<AppView>,
    /// Executors of active applications.
    pub executors: Vec<ExecutorView>,
}
