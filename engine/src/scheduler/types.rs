//! The scheduler's vocabulary: identifiers, inputs (executors, jobs, status updates), outputs,
//! configuration and errors. Everything here is plain data that the driver can build from (or put
//! on) the wire.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;

use super::payloads::Payloads;

/// An executor's identity, chosen by whoever starts executors (the driver or a cluster manager).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecutorId(pub u64);

/// A job's identity, assigned by [`super::Scheduler::handle_submit`]; never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(pub u64);

/// A caller's own number for a job ([`JobSpec::token`]), handed back with each of its events
/// ([`super::Scheduler::poll_event_with_token`]), as mio hands a source's `Token` back with its
/// readiness: a driver that keeps its per-job state in a slab finds a job's entry at that index
/// instead of looking its id up. The scheduler never reads it, and it is the caller's to keep
/// unique among the jobs whose events it has not yet taken (0 for a caller that keeps none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct JobToken(pub u32);

/// A task's identity, unique in one scheduler: the job in the high 32 bits, the task's index in
/// its job in the low 32 bits. Together with an attempt number it names one run of the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub u64);

impl TaskId {
    /// The task id of task `index` of `job`.
    pub fn new(job: JobId, index: u32) -> TaskId {
        TaskId((job.0 << 32) | u64::from(index))
    }
    /// The job this task belongs to.
    pub fn job(self) -> JobId {
        JobId(self.0 >> 32)
    }
    /// The task's index in its job (the order of [`JobSpec::tasks`]).
    pub fn index(self) -> u32 {
        // The low 32 bits, by construction.
        (self.0 & u64::from(u32::MAX)) as u32
    }
}

/// One run of a task: the task and its attempt number (0 for the first run, then one more
/// for each retry or copy). The one key of an attempt, wherever attempts are kept: the
/// scheduler's books, hedging, the executor's runner, the driver's timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Attempt {
    /// The task.
    pub task: TaskId,
    /// Which run of it, from 0.
    pub attempt: u32,
}

impl Attempt {
    /// Run `attempt` of `task`.
    pub fn new(task: TaskId, attempt: u32) -> Attempt {
        Attempt { task, attempt }
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} attempt {}", self.task, self.attempt)
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job {} task {}", self.0 >> 32, self.index())
    }
}

/// An executor asking to join: what it offers.
#[derive(Clone, Debug)]
pub struct ExecutorInfo {
    /// Its identity; must not be registered already.
    pub id: ExecutorId,
    /// The host it runs on (locality and host exclusion use it).
    pub host: String,
    /// Cores it runs tasks on; must be at least 1.
    pub cores: u32,
    /// Free-form attributes (kept for the driver's use, not interpreted).
    pub attributes: Vec<(String, String)>,
}

/// Why an executor goes away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RemovalReason {
    /// It stopped answering (heartbeat timeout, connection lost). Not the tasks' fault.
    Lost(String),
    /// The driver or the cluster manager killed it. Not the tasks' fault.
    Killed,
    /// The process exited with `code`. When `caused_by_app` is true (e.g. out of memory in a
    /// task), its running tasks count that attempt as a failure.
    Exited {
        /// The process exit code.
        code: i32,
        /// Whether the application (a task) caused the exit.
        caused_by_app: bool,
    },
}

impl RemovalReason {
    /// Whether the tasks running on the executor are to blame (their attempt counts as failed).
    pub fn caused_by_app(&self) -> bool {
        matches!(
            self,
            RemovalReason::Exited {
                caused_by_app: true,
                ..
            }
        )
    }
}

impl fmt::Display for RemovalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RemovalReason::Lost(why) => write!(f, "executor lost: {why}"),
            RemovalReason::Killed => write!(f, "executor killed"),
            RemovalReason::Exited {
                code,
                caused_by_app,
            } => write!(
                f,
                "executor exited with code {code} (caused by app: {caused_by_app})"
            ),
        }
    }
}

/// Why a registration was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An executor with this id is registered already.
    #[error("duplicate executor id {0:?}")]
    DuplicateId(ExecutorId),
    /// The host is excluded (too many failures) until the given time.
    #[error("host {host} is excluded until {until_us} us")]
    HostExcluded {
        /// The host.
        host: String,
        /// When the exclusion ends (micros, the scheduler's clock).
        until_us: u64,
    },
    /// The executor offers no cores.
    #[error("executor offers zero cores")]
    ZeroCores,
    /// The executor table is full (`Config::executors_max`).
    #[error("too many executors (executors_max = {0})")]
    TooManyExecutors(usize),
}

/// One task of a job.
#[derive(Clone, Debug)]
pub struct TaskSpec {
    /// The registered function the executor runs.
    pub function: Arc<str>,
    /// The function's input, handed to the wire as is.
    pub payload: Bytes,
    /// Cores the task occupies while it runs (at least 1).
    pub cores: u32,
    /// Executors it would rather run on (best locality).
    pub preferred_executors: Vec<ExecutorId>,
    /// Hosts it would rather run on (second best). Give the tasks of a job clones of one
    /// `Arc<str>` per host name: the scheduler then looks each name up once per build (by the
    /// address of its text), not once per task.
    pub preferred_hosts: Vec<Arc<str>>,
}

impl TaskSpec {
    /// A one-core task without locality preferences.
    pub fn new(function: impl Into<Arc<str>>, payload: Bytes) -> TaskSpec {
        TaskSpec {
            function: function.into(),
            payload,
            cores: 1,
            preferred_executors: Vec::new(),
            preferred_hosts: Vec::new(),
        }
    }
}

/// A job's tasks: each described on its own, or many of one function and core count that
/// differ only in their payloads. The second form is what a driver's job is, and it costs no
/// memory beyond the payloads themselves (a million `TaskSpec`s are about 100 MB to fault in
/// before the scheduler copies them into its own records).
#[derive(Clone, Debug)]
pub enum Tasks {
    /// Each task on its own.
    Each(Vec<TaskSpec>),
    /// One task per payload, each running `function` on `cores` cores, without locality
    /// preferences.
    Same {
        /// The registered function every task runs.
        function: Arc<str>,
        /// Cores each task occupies while it runs (at least 1).
        cores: u32,
        /// The tasks' inputs, in task order.
        payloads: Payloads,
    },
}

impl Tasks {
    /// How many tasks.
    pub fn len(&self) -> usize {
        match self {
            Tasks::Each(tasks) => tasks.len(),
            Tasks::Same { payloads, .. } => payloads.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The function of the first task, if any.
    pub fn first_function(&self) -> Option<&Arc<str>> {
        match self {
            Tasks::Each(tasks) => tasks.first().map(|t| &t.function),
            Tasks::Same {
                function, payloads, ..
            } => payloads.first().map(|_| function),
        }
    }

    /// The first task asking for zero cores among the first `within`, if any.
    pub(crate) fn first_without_cores(&self, within: usize) -> Option<usize> {
        match self {
            Tasks::Each(tasks) => tasks.iter().take(within).position(|t| t.cores == 0),
            Tasks::Same {
                cores: 0, payloads, ..
            } if !payloads.is_empty() => Some(0),
            Tasks::Same { .. } => None,
        }
    }

    /// The first task whose payload is over `bytes_max`, with its payload's size (none, and
    /// nothing looked at, when `bytes_max` is `usize::MAX`); of task specs, among the first
    /// `within`.
    pub(crate) fn first_payload_over(
        &self,
        bytes_max: usize,
        within: usize,
    ) -> Option<(usize, usize)> {
        if bytes_max == usize::MAX {
            return None;
        }
        match self {
            Tasks::Each(tasks) => {
                first_over(tasks.iter().take(within).map(|t| &t.payload), bytes_max)
            }
            Tasks::Same { payloads, .. } => payloads.first_over(bytes_max),
        }
    }
}

/// The first of `payloads` over `bytes_max`, with its index and size.
pub(crate) fn first_over<'a>(
    payloads: impl Iterator<Item = &'a Bytes>,
    bytes_max: usize,
) -> Option<(usize, usize)> {
    let over =
        |(i, payload): (usize, &Bytes)| (payload.len() > bytes_max).then_some((i, payload.len()));
    payloads.enumerate().find_map(over)
}

impl From<Vec<TaskSpec>> for Tasks {
    fn from(tasks: Vec<TaskSpec>) -> Tasks {
        Tasks::Each(tasks)
    }
}

/// A job: a set of tasks and how it shares the cluster with other jobs.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The tasks; a task's index here is its [`TaskId::index`].
    pub tasks: Tasks,
    /// The FAIR pool it belongs to (ignored under FIFO); the default pool's name is static,
    /// so a job in it costs no allocation for it.
    pub pool: Cow<'static, str>,
    /// Its weight inside its pool under FAIR (at least 1).
    pub weight: u32,
    /// Higher runs first: under FIFO before submission order, under FAIR as a tie-break.
    pub priority: i32,
    /// Keep each task's result for [`JobOutcome::Succeeded`] (default). When false, results are
    /// only reported ([`Event::TaskResult`]) and the outcome's list is empty, so memory does not
    /// grow with the job.
    pub keep_results: bool,
    /// The most result bytes the job keeps for its outcome; the task whose result goes over it
    /// fails the job (Spark's `spark.driver.maxResultSize`). `None`: the scheduler's
    /// [`Config::result_bytes_max`].
    pub result_bytes_max: Option<u64>,
    /// Counted failures a task may have before the job fails. `None`: the scheduler's
    /// [`Config::max_failures`]; `Some(0)` counts as 1.
    pub max_failures: Option<u32>,
    /// Speculation for this job: the scheduler's ([`Config::speculation`]), off, or its own
    /// thresholds. The check interval stays the scheduler's (or the default's when the
    /// scheduler has speculation off).
    pub speculation: JobSetting<SpeculationConfig>,
    /// Exclusion for this job: the scheduler's ([`Config::exclusion`]), off, or its own limits.
    /// The job uses the per-job and per-task limits of the setting; global exclusion (executors
    /// and hosts for every job) is the scheduler's alone, and counts this job's failures
    /// unless the job turned exclusion off.
    pub exclusion: JobSetting<ExclusionConfig>,
    /// Hedging for this job: the scheduler's ([`Config::hedging`]), off, or its own (a floor of
    /// its own, say: `flint_net`'s `Job::hedge_after`).
    pub hedging: JobSetting<HedgeConfig>,
    /// The caller's number for the job, handed back with its events (see [`JobToken`]).
    pub token: JobToken,
}

/// A per-job setting: inherit the scheduler's, turn it off for this job, or use this value.
/// A value of its own is shared ([`JobSetting::custom`] makes one): the scheduler keeps it as
/// it is, and a job spec stays small to move (most jobs inherit every setting).
#[derive(Clone, Debug, Default, PartialEq)]
pub enum JobSetting<T> {
    /// The scheduler's setting.
    #[default]
    Inherit,
    /// Off for this job.
    Off,
    /// This job's own.
    Custom(Arc<T>),
}

impl<T> JobSetting<T> {
    /// This job's own setting `value`.
    pub fn custom(value: T) -> Self {
        JobSetting::Custom(Arc::new(value))
    }

    /// Writes the setting in effect given the scheduler's into `to`, shared with the
    /// scheduler when inherited (a job that keeps the defaults allocates nothing for them).
    /// What `to` holds already is kept when it is that same shared setting: a job record
    /// built over the last one's finds the defaults there, with no count to move.
    #[inline]
    pub fn apply_shared(self, to: &mut Option<Arc<T>>, scheduler: Option<&Arc<T>>) {
        match self {
            JobSetting::Inherit => match (&*to, scheduler) {
                (Some(held), Some(shared)) if Arc::ptr_eq(held, shared) => {}
                _ => *to = scheduler.cloned(),
            },
            JobSetting::Off => *to = None,
            JobSetting::Custom(t) => *to = Some(t),
        }
    }
}

impl<T: Clone> JobSetting<T> {
    /// The setting in effect given the scheduler's.
    pub fn resolve(&self, scheduler: Option<&T>) -> Option<T> {
        match self {
            JobSetting::Inherit => scheduler.cloned(),
            JobSetting::Off => None,
            JobSetting::Custom(t) => Some(T::clone(t)),
        }
    }
}

/// [`Config::build_chunk_tasks`]'s default.
pub const BUILD_CHUNK_TASKS: usize = 16_384;

/// The pool a job names unless it names another.
pub const DEFAULT_POOL: &str = "default";

impl JobSpec {
    /// A job in the default pool with weight 1 and priority 0 that keeps its results.
    pub fn new(tasks: impl Into<Tasks>) -> JobSpec {
        JobSpec {
            tasks: tasks.into(),
            pool: Cow::Borrowed(DEFAULT_POOL),
            weight: 1,
            priority: 0,
            keep_results: true,
            result_bytes_max: None,
            max_failures: None,
            speculation: JobSetting::Inherit,
            exclusion: JobSetting::Inherit,
            hedging: JobSetting::Inherit,
            token: JobToken(0),
        }
    }
}

/// Why a submission was refused (nothing was accepted).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Accepting the job would exceed `Config::pending_tasks_max` unfinished tasks: back off.
    #[error(
        "{active} tasks unfinished + {submitted} submitted exceeds pending_tasks_max = {limit}"
    )]
    TooManyPending {
        /// Tasks accepted and not yet final.
        active: usize,
        /// Tasks in the refused job.
        submitted: usize,
        /// The limit.
        limit: usize,
    },
    /// More than `Config::jobs_max` jobs would be active.
    #[error("too many active jobs (jobs_max = {0})")]
    TooManyJobs(usize),
    /// A job holds at most `u32::MAX` tasks.
    #[error("a job holds at most {} tasks", u32::MAX)]
    TooManyTasks,
    /// A task asks for zero cores.
    #[error("task {0} asks for zero cores")]
    ZeroCores(u32),
    /// A job with this id is active already (ids chosen by the caller,
    /// [`super::Scheduler::handle_submit_with_id`]).
    #[error("job id {0:?} is in use")]
    DuplicateJob(JobId),
}

/// A task attempt's state as an executor reports it (Spark's `TaskState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskState {
    /// Started; informational.
    Running,
    /// Done; the data is the result.
    Finished,
    /// The task failed; the data is the error message (UTF-8, lossy).
    Failed,
    /// The attempt was killed.
    Killed,
    /// The executor lost the task; the executor is treated as lost.
    Lost,
}

/// A status report from an executor. Anything may arrive: stale, duplicate or unknown updates
/// are ignored and counted in [`Stats::ignored_updates`].
#[derive(Clone, Debug)]
pub struct StatusUpdate {
    /// The executor reporting.
    pub executor: ExecutorId,
    /// The task.
    pub task: TaskId,
    /// Which attempt.
    pub attempt: u32,
    /// The new state.
    pub state: TaskState,
    /// The result (Finished) or the error message (Failed, Killed).
    pub data: Bytes,
}

/// One task handed to an executor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLaunch {
    /// The task.
    pub task: TaskId,
    /// The attempt number (0 first; retries and speculative copies count up).
    pub attempt: u32,
    /// The function to run.
    pub function: Arc<str>,
    /// Its input.
    pub payload: Bytes,
    /// Cores reserved for it.
    pub cores: u32,
    /// Whether it is a copy of an attempt still running (speculative).
    pub speculative: bool,
}

/// How a job ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobOutcome {
    /// Every task succeeded; the results in task index order (empty for a job that does not
    /// keep its results, [`JobSpec::keep_results`]).
    Succeeded(Vec<Bytes>),
    /// At least one task failed for good (or was killed); the reasons.
    Failed(Vec<String>),
    /// Cancelled by [`super::Scheduler::handle_cancel`].
    Cancelled,
}

/// What the scheduler asks the driver to do (a launch, a kill) or tell its callers (an
/// [`Event`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Send these tasks to this executor (one batch per executor per call).
    Launch {
        /// The executor.
        executor: ExecutorId,
        /// The tasks, in launch order.
        tasks: Vec<TaskLaunch>,
    },
    /// Ask an executor to kill a task attempt; its cores come back with its KILLED (or any final)
    /// status update or with the executor's removal.
    Kill {
        /// The executor.
        executor: ExecutorId,
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
        /// Why.
        reason: String,
    },
    /// Tell the callers.
    Event(Event),
}

/// What the scheduler tells the driver's callers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A task's final report (at most once per submitted task: a job that fails or is
    /// cancelled reports none for the tasks it had not finished).
    TaskResult {
        /// The task (its job is `task.job()`).
        task: TaskId,
        /// The result bytes, or why it did not succeed.
        result: Result<Bytes, String>,
    },
    /// A job's outcome (exactly once per accepted job, after its task results; a success after
    /// every task's).
    JobOutcome {
        /// The job.
        job: JobId,
        /// How it ended.
        outcome: JobOutcome,
    },
    /// A job of one task that keeps no results ([`JobSpec::keep_results`] off) succeeded: its
    /// task's result and its outcome in one event, instead of an [`Event::TaskResult`] of
    /// `Ok(result)` followed by an [`Event::JobOutcome`] of `Succeeded` with no results (a
    /// service's jobs: one event to queue, count and deliver, not two). [`Event::split`] gives
    /// those two.
    OneTaskJobSucceeded {
        /// The job's only task (its job is `task.job()`).
        task: TaskId,
        /// The task's result.
        result: Bytes,
    },
}

impl Event {
    /// The event as [`Event::TaskResult`]s and [`Event::JobOutcome`]s only: an
    /// [`Event::OneTaskJobSucceeded`] as its task's result, then its job's success; any other
    /// event as it is.
    pub fn split(self) -> impl Iterator<Item = Event> {
        let (first, second) = match self {
            Event::OneTaskJobSucceeded { task, result } => (
                Event::TaskResult {
                    task,
                    result: Ok(result),
                },
                Some(Event::JobOutcome {
                    job: task.job(),
                    outcome: JobOutcome::Succeeded(Vec::new()),
                }),
            ),
            other => (other, None),
        };
        std::iter::once(first).chain(second)
    }
}

/// How jobs share the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    /// Highest priority first, then submission order.
    Fifo,
    /// Pools get cores in proportion to their weights, jobs in a pool in proportion to theirs.
    Fair,
}

/// A FAIR pool (Spark's `<pool>` in `fairscheduler.xml`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Its name, as jobs give it in [`JobSpec::pool`].
    pub name: String,
    /// How its jobs share its cores: FIFO (priority, then submission) or FAIR (running cores
    /// over job weight).
    pub mode: Sharing,
    /// Its share of the cluster against other pools once every pool has its minimum (at
    /// least 1).
    pub weight: u32,
    /// Cores it gets before pools that already have theirs (Spark's `minShare`): a pool
    /// running fewer cores than this goes first.
    pub min_share: u32,
}

impl PoolConfig {
    /// A pool with Flint's defaults: FAIR inside, weight 1, no minimum share. (Spark's
    /// default pool mode is FIFO; see the module docs.)
    pub fn new(name: impl Into<String>) -> PoolConfig {
        PoolConfig {
            name: name.into(),
            mode: Sharing::Fair,
            weight: 1,
            min_share: 0,
        }
    }
}

/// Speculative execution settings (Spark's `spark.speculation.*`).
#[derive(Clone, Debug, PartialEq)]
pub struct SpeculationConfig {
    /// A task is a straggler when it runs longer than this times the median successful run.
    pub multiplier: f64,
    /// Fraction of a job's tasks that must have succeeded before it speculates.
    pub quantile: f64,
    /// Never speculate tasks that have run less than this.
    pub min_runtime_us: u64,
    /// How often `handle_timeout` looks for stragglers.
    pub interval_us: u64,
    /// A task is also a straggler, whatever the quantile, when it has run longer than this (and
    /// than `multiplier` times its job's median so far, if any task succeeded) while its executor
    /// has finished nothing since launching it and some other executor has finished something
    /// since or sits idle. This covers a job
    /// whose stuck executor holds more than `1 - quantile` of its tasks (a small job), where the
    /// quantile is never reached.
    pub timeout_us: u64,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        SpeculationConfig {
            multiplier: 1.5,
            quantile: 0.75,
            min_runtime_us: 100_000,
            interval_us: 100_000,
            timeout_us: 30_000_000,
        }
    }
}

/// Hedged tasks ("The Tail at Scale", Dean and Barroso), see `hedge.rs`: an attempt that has
/// run longer than its function's recent `percentile` run time times `factor` (at least
/// `floor_us`; `cold_us` while the function has fewer than `min_samples` successes) gets one
/// copy on another executor, and an executor that holds such an overdue attempt and has sent
/// nothing for as long is suspected (no new launches until it reports). Copies take tokens
/// from a bucket that `copy_ratio` of each first launch fills, up to `burst`, and are
/// withheld while more than half the executors hold overdue attempts (the whole cluster is
/// slow: copies would only add load).
#[derive(Clone, Debug, PartialEq)]
pub struct HedgeConfig {
    /// The percentile of a function's recent successful run times (launch to result).
    pub percentile: f64,
    /// An attempt is overdue past this times that percentile.
    pub factor: f64,
    /// ... and never before this (micros).
    pub floor_us: u64,
    /// The threshold while a function has fewer than `min_samples` successes (micros).
    pub cold_us: u64,
    /// Successes a function needs before its percentile is used.
    pub min_samples: u32,
    /// Copies allowed per first launch in steady state.
    pub copy_ratio: f64,
    /// Copies allowed at once beyond that (the bucket's size).
    pub burst: u32,
    /// An executor holding an overdue attempt is suspected once silent for the attempt's
    /// threshold, and never before this (micros): a process preempted on a busy machine is
    /// silent for a few milliseconds without being sick.
    pub silence_min_us: u64,
}

impl Default for HedgeConfig {
    fn default() -> Self {
        HedgeConfig {
            percentile: 0.99,
            factor: 2.0,
            floor_us: 1_000,
            cold_us: 200_000,
            min_samples: 20,
            copy_ratio: 0.05,
            burst: 256,
            silence_min_us: 20_000,
        }
    }
}

/// Exclusion settings (Spark's `spark.excludeOnFailure.*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExclusionConfig {
    /// Counted failures of one task on one executor before that task avoids the executor
    /// (Spark's `task.maxTaskAttemptsPerExecutor`, 1).
    pub task_executor_failures_max: u32,
    /// Counted failures of one task on one host before that task avoids the host (Spark's
    /// `task.maxTaskAttemptsPerNode`, 2).
    pub task_host_failures_max: u32,
    /// Failed attempts of one job on one executor before that executor is excluded for the job.
    pub job_executor_failures_max: u32,
    /// Failed attempts of one job on one host before that host is excluded for the job.
    pub job_host_failures_max: u32,
    /// Failed attempts (any job) on one executor before it is excluded for everyone.
    pub executor_failures_max: u32,
    /// Globally excluded executors on one host before the whole host is excluded.
    pub host_excluded_executors_max: u32,
    /// How long a global exclusion lasts.
    pub timeout_us: u64,
}

impl Default for ExclusionConfig {
    fn default() -> Self {
        ExclusionConfig {
            task_executor_failures_max: 1,
            task_host_failures_max: 2,
            job_executor_failures_max: 2,
            job_host_failures_max: 4,
            executor_failures_max: 4,
            host_excluded_executors_max: 2,
            timeout_us: 3_600_000_000,
        }
    }
}

/// Scheduler settings. `Config::default()` is a good start.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// FIFO or FAIR sharing between jobs.
    pub sharing: Sharing,
    /// FAIR pools by name (Spark's `fairscheduler.xml`); a job naming an unlisted pool gets
    /// [`PoolConfig::new`]'s (FAIR inside, weight 1, no minimum share). Ignored under FIFO.
    pub pools: Vec<PoolConfig>,
    /// Attempts a task gets before its job fails (Spark's `task.maxFailures`).
    pub max_failures: u32,
    /// How long a job waits for a free core on a preferred executor before accepting its host.
    pub locality_wait_executor_us: u64,
    /// How long a job waits for a free core on a preferred host before accepting any executor.
    pub locality_wait_host_us: u64,
    /// Exclusion; `None` turns it off.
    pub exclusion: Option<ExclusionConfig>,
    /// Speculation; `None` turns it off. On by default (Spark's is off): an executor that
    /// heartbeats but never finishes its tasks would otherwise hold them forever.
    pub speculation: Option<SpeculationConfig>,
    /// Hedged tasks and fast suspicion of sick executors; `None` (the default here, as Spark
    /// has none) turns them off. `flint_net`'s driver turns them on.
    pub hedging: Option<HedgeConfig>,
    /// Slow start: the slots a newly registered executor may fill at first; each attempt it
    /// finishes successfully adds one, up to its cores (like TCP's congestion window), so an
    /// executor that claims many cores and never finishes holds this many tasks, not a job.
    /// An idle executor may always take one task that fits its cores. `u32::MAX` turns it off.
    pub slow_start_slots: u32,
    /// Unfinished tasks (queued or running) over all jobs; submissions beyond are refused.
    pub pending_tasks_max: usize,
    /// The most result bytes one job keeps for its outcome unless it sets its own
    /// ([`JobSpec::result_bytes_max`]): 1 GiB, Spark's `spark.driver.maxResultSize`.
    pub result_bytes_max: u64,
    /// Active jobs; submissions beyond are refused.
    pub jobs_max: usize,
    /// Registered executors; registrations beyond are refused.
    pub executors_max: usize,
    /// Largest task payload; a job with a larger one fails (Spark's `rpc.message.maxSize`).
    /// `usize::MAX` checks none (a driver that checks them on the submitting thread: a job of
    /// millions of tasks scanned here would hold its loop milliseconds).
    pub payload_max_bytes: usize,
    /// A job that has tasks queued, none running, and launched nothing for this long while cores
    /// are free fails (every executor is excluded for it or too small).
    pub unschedulable_timeout_us: u64,
    /// Task records a job of task specs has built at once (at least 1): a bigger job gets the
    /// rest a chunk per tick before it is published, so that no call holds the caller's loop
    /// for long (16,384 tasks, about 2 ms: `building.rs`).
    pub build_chunk_tasks: usize,
    /// Seed for the executor order's initial rotation (determinism in tests).
    pub seed: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            sharing: Sharing::Fifo,
            pools: Vec::new(),
            max_failures: 4,
            locality_wait_executor_us: 10_000,
            locality_wait_host_us: 10_000,
            exclusion: Some(ExclusionConfig::default()),
            speculation: Some(SpeculationConfig::default()),
            hedging: None,
            slow_start_slots: 16,
            pending_tasks_max: 10_000_000,
            result_bytes_max: 1 << 30,
            jobs_max: 10_000,
            executors_max: 100_000,
            payload_max_bytes: 128 << 20,
            unschedulable_timeout_us: 120_000_000,
            build_chunk_tasks: BUILD_CHUNK_TASKS,
            seed: 0,
        }
    }
}

/// Counters for observability.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Task attempts launched (including retries and speculative copies).
    pub launched: u64,
    /// Tasks that succeeded.
    pub succeeded: u64,
    /// Task attempts that failed (counted or not).
    pub attempts_failed: u64,
    /// Speculative attempts launched.
    pub speculative_launched: u64,
    /// Status updates ignored as stale, duplicate or unknown.
    pub ignored_updates: u64,
    /// Executors excluded globally (cumulative).
    pub executors_excluded: u64,
    /// Task attempts that ended killed (asked for or not; never counted as failures).
    pub attempts_killed: u64,
    /// Failures charged to attempts after their executor was already gone, when the reason
    /// it went (an exit the application caused) came later.
    pub late_failures: u64,
    /// Copies queued by hedging (overdue attempts, suspected executors); each is also counted
    /// in `speculative_launched` once it launches.
    pub hedges: u64,
    /// Overdue attempts not copied (no token left, or the whole cluster slow), counted once
    /// per check that passed them over.
    pub hedges_withheld: u64,
    /// Times an executor was suspected (overdue attempts and silent).
    pub suspicions: u64,
    /// Times an executor went on probation (much slower than its peers).
    pub probations: u64,
}

/// A locality level (Spark's `TaskLocality`, without rack).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LocalityLevel {
    /// On a preferred executor (Spark's `PROCESS_LOCAL`).
    Executor,
    /// On a preferred host (Spark's `NODE_LOCAL`).
    Host,
    /// Anywhere (Spark's `ANY`).
    Any,
}

/// A task's state as the scheduler holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskStatus {
    /// Waiting for a core.
    Pending,
    /// At least one attempt runs.
    Running,
    /// Succeeded (reported).
    Succeeded,
    /// Failed for good, killed, or its job ended (reported).
    Failed,
}

/// One running attempt of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttemptInfo {
    /// The attempt number.
    pub attempt: u32,
    /// Where it runs.
    pub executor: ExecutorId,
    /// When it was launched (the scheduler's clock).
    pub started_us: u64,
    /// Whether its executor reported it running (else it is still launching).
    pub reported_running: bool,
}

/// What [`super::Scheduler::task_info`] tells about a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskInfo {
    /// Its state.
    pub status: TaskStatus,
    /// Counted failures so far (kills and losses that were not its fault do not count).
    pub failures: u32,
    /// Attempts launched so far (original, retries and copies).
    pub attempts_launched: u32,
    /// Attempts running now (two while a speculative copy runs).
    pub running: Vec<AttemptInfo>,
    /// Executors this task avoids after failing there (per-task exclusion).
    pub excluded_executors: Vec<ExecutorId>,
}

/// What [`super::Scheduler::job_info`] tells about an active job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    /// Its pool (as submitted).
    pub pool: String,
    /// Its current locality level (delay scheduling).
    pub locality_level: LocalityLevel,
    /// The levels it may use given the executors registered now, best first.
    pub valid_levels: Vec<LocalityLevel>,
    /// Tasks in the job.
    pub tasks: usize,
    /// Tasks waiting for a core.
    pub pending: usize,
    /// Tasks with an attempt running.
    pub running: usize,
    /// Tasks succeeded.
    pub succeeded: usize,
    /// Tasks final (succeeded or failed).
    pub finished: usize,
    /// Cores its attempts hold.
    pub running_cores: u64,
    /// Attempts launched (including retries and copies).
    pub launched: u64,
    /// Speculative copies launched.
    pub speculative_launched: u64,
    /// Attempts that failed and counted.
    pub failures: u64,
    /// Attempts that ended without counting (killed, executor lost not by the app's fault).
    pub uncounted_ends: u64,
    /// The attempts a task may fail before the job fails.
    pub max_failures: u32,
    /// Whether speculation is on for it.
    pub speculation: bool,
    /// Executors excluded for the whole job.
    pub excluded_executors: Vec<ExecutorId>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_applied_over_a_kept_one_is_the_jobs_own() {
        let shared = Arc::new(7u32);
        let custom = Arc::new(9u32);
        // Inherited over the same shared setting: kept as it is, no count moved.
        let mut held = Some(shared.clone());
        JobSetting::Inherit.apply_shared(&mut held, Some(&shared));
        assert!(held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &shared)));
        assert_eq!(Arc::strong_count(&shared), 2);
        // Inherited over another job's own: the scheduler's, the other let go.
        let mut held = Some(custom.clone());
        JobSetting::Inherit.apply_shared(&mut held, Some(&shared));
        assert!(held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &shared)));
        assert_eq!(Arc::strong_count(&custom), 1);
        // Inherited with no scheduler setting, off, or the job's own.
        JobSetting::Inherit.apply_shared(&mut held, None);
        assert_eq!(held, None);
        let mut held = Some(shared.clone());
        JobSetting::Off.apply_shared(&mut held, Some(&shared));
        assert_eq!(held, None);
        JobSetting::Custom(custom.clone()).apply_shared(&mut held, Some(&shared));
        assert!(held.as_ref().is_some_and(|h| Arc::ptr_eq(h, &custom)));
    }
}
