//! The driver's scheduling brain as a sans-IO state machine (Spark's `DriverEndpoint`,
//! `TaskSchedulerImpl` and `TaskSetManager` in one deterministic value).
//!
//! # Model
//!
//! A [`Scheduler`] has no IO, no threads and no clock. The driver feeds it events, each with the
//! current time `now_us` (microseconds on any monotonic clock the driver likes):
//!
//! - [`Scheduler::register_executor`] / [`Scheduler::remove_executor`]: executors come and go;
//! - [`Scheduler::submit_job`] / [`Scheduler::cancel_job`] / [`Scheduler::kill_task`]: work;
//! - [`Scheduler::status_update`]: what executors report about task attempts;
//! - [`Scheduler::tick`]: time passed (call it at [`Scheduler::poll_timeout`] at the latest).
//!
//! and drains what it must do with [`Scheduler::poll_output`]: [`Output::Launch`] batches (one
//! per executor per call), [`Output::Kill`] requests, one [`Output::TaskResult`] per submitted
//! task and one [`Output::JobOutcome`] per accepted job, each exactly once.
//!
//! # Scheduling
//!
//! After every event the scheduler makes offers: it walks the executors that have free cores
//! round-robin (a rotating cursor over an indexable set, so tasks spread over executors as
//! Spark's shuffled offers do) and gives each one task at a time. For an executor, jobs are asked
//! in sharing order (FIFO: priority, then submission; FAIR: pools by running cores over pool
//! weight, then jobs by running cores over job weight), and a job answers from its queues in
//! locality order: tasks preferring this executor, then (once its locality wait allows) this
//! host, then tasks without preferences, then (after the waits) any task, then a straggler to
//! copy. An executor for which nothing fits is set aside ("blocked") until new work appears (a
//! submission, a retry, a wider locality level, a straggler, an exclusion ending) or its own
//! cores come back, so offers never rescan idle executors. Only jobs with something to launch
//! are asked ("runnable" jobs), and a job keeps one set of queues per task size so a task too big
//! for an executor never hides smaller ones. Everything a launch or a completion touches is O(1)
//! amortized (hash maps and queues with lazy deletion); the one loop is over runnable jobs for
//! the sharing order (FIFO: usually the first answers; FAIR picks the neediest in O(R) for R
//! runnable jobs, and sorts the rest only when that job has nothing for the executor).
//!
//! Delay scheduling (Spark's `locality.wait`, one wait per level): a job starts at its best
//! level and widens after each wait; a launch at a local level restarts the wait, except that
//! once an executor has been turned away for locality the wait keeps running until the job has
//! nothing queued, so a free core never idles longer than the sum of the waits while a job has
//! work for it (Spark's legacy rule could idle it for as long as local launches kept coming).
//! The driver calls [`Scheduler::tick`] at [`Scheduler::poll_timeout`].
//!
//! # Failures
//!
//! Each executor indexes its own running attempts, so removing it costs time proportional to its
//! own tasks. A failed attempt is retried until a task has failed `max_failures` times; then the
//! job fails with the reasons, its other tasks are killed or dropped, each reported once. A loss
//! that is not the task's fault (executor lost, killed, or exited not because of the app) does not
//! count. Counted failures feed exclusion: per job (executor and host, for the job's lifetime)
//! and globally (executor, then host once enough of its executors are excluded, both expiring
//! after a timeout). A job that has queued tasks, nothing running, has launched nothing for
//! `unschedulable_timeout_us` while cores are free, and that no registered executor could ever
//! serve (all excluded for it, or all smaller than its smallest queued task) fails instead of
//! hanging; a job merely starved by others keeps waiting.
//!
//! # Speculation
//!
//! With [`SpeculationConfig`] (on by default), `tick` looks for stragglers: once `quantile` of a
//! job's tasks succeeded, a task running longer than `multiplier` times their median run gets one
//! copy on another executor. Before that, a task that has run longer than `timeout_us` on an
//! executor that has finished nothing since launching it, while other executors finish theirs
//! or sit idle, is a straggler too. The first attempt to finish wins; the other is killed; the result is
//! reported once.
//!
//! # Stuck executors and slow start
//!
//! An executor may heartbeat and never finish anything (wedged, or not reading its socket). One
//! that holds a straggler and has finished nothing since that attempt was launched is *stalled*:
//! it gets no new work until it reports a final state ([`Scheduler::stalled_executors`] names
//! them, for a warning), and its stragglers are copied elsewhere.
//!
//! A new executor earns its slots (slow start, [`Config::slow_start_slots`]): it may fill a few
//! at first, one more per attempt it finishes successfully, up to its cores. So an executor that
//! claims many cores and never finishes holds a few tasks, not the job.
//!
//! [`Scheduler::starved`] says when work is waiting that no registered executor can take (none
//! registered, or all excluded), so the driver can warn and give up.
//!
//! # Defaults that differ from Spark
//!
//! - Speculation is on (Spark: `spark.speculation=false`), with Spark's thresholds (1.5 times the
//!   median once 75% succeeded, at least 100 ms, checked every 100 ms) plus the 30 s timeout
//!   above (Spark has no default for `spark.speculation.task.duration.threshold`): without it an
//!   executor that heartbeats but never finishes stalls a job forever, silently. The cost is
//!   one extra attempt per straggler and the successful run times kept per job (8 bytes a task).
//! - Slow start (16 slots at first) has no Spark equivalent: Spark trusts the cores an executor
//!   registers with; a peer here is not trusted.
//!
//! # Peers are not trusted
//!
//! Status updates are matched against the reporting executor's own running attempts; anything
//! stale, duplicate, or unknown is ignored and counted ([`Stats::ignored_updates`]). Cores come
//! back only with a final update for an attempt the executor actually holds, or with the executor.

mod book;
mod exclusion;
mod job;
mod speculation;
mod types;

use std::collections::VecDeque;

use bytes::Bytes;

pub use types::{
    Config, ExclusionConfig, ExecutorId, ExecutorInfo, JobId, JobOutcome, JobSpec, Output, Refusal,
    RemovalReason, Sharing, SpeculationConfig, Stats, StatusUpdate, SubmitError, TaskId,
    TaskLaunch, TaskSpec, TaskState,
};

use crate::hash::FxHashMap;
use book::{Book, Run};
use job::{Attempt, Found, Job, JobExclusion, Level, Prefs, Status, TaskRec};

/// Longest failure message kept from a peer, in bytes.
const REASON_MAX_BYTES: usize = 4096;
/// Tasks per job whose failure reasons are kept (the rest are counted, not stored).
const REASON_TASKS_MAX: usize = 1024;

/// A FAIR pool.
#[derive(Debug)]
struct Pool {
    weight: u32,
    running_cores: u64,
}

/// How an attempt ended.
enum End {
    Succeeded(Bytes),
    Failed { reason: String, counts: bool },
}

/// The scheduler state machine. See the [module documentation](self).
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    book: Book,
    jobs: Vec<Option<Job>>,
    job_free_slots: Vec<u32>,
    /// Job id → slot.
    job_slots: FxHashMap<u64, u32>,
    /// Active job slots, in FIFO order (priority, then id).
    active: VecDeque<u32>,
    /// The active jobs that have something to launch, in FIFO order: offers look only at these.
    runnable: VecDeque<u32>,
    /// Scratch for the FAIR order.
    order: Vec<u32>,
    /// Scratch: jobs whose straggler queue changed during an offer.
    touched: Vec<u32>,
    pools: Vec<Pool>,
    pool_ids: FxHashMap<String, u32>,
    next_job: u64,
    /// Tasks pending over all jobs.
    pending_total: usize,
    /// Speculation queue entries over all jobs (may include stale ones).
    speculatable_total: usize,
    /// Tasks accepted and not final.
    unfinished_total: usize,
    outputs: VecDeque<Output>,
    /// Executors with launches batched in this call.
    batched: Vec<u32>,
    stats: Stats,
    next_speculation_us: u64,
    /// Earliest global exclusion expiry (u64::MAX: none).
    next_expiry_us: u64,
    /// When any executor last reported an attempt as final.
    last_finish_us: u64,
}

impl Scheduler {
    /// A scheduler with no executors and no jobs.
    pub fn new(config: Config) -> Scheduler {
        let mut pools = Vec::new();
        let mut pool_ids = FxHashMap::default();
        for (name, weight) in &config.pool_weights {
            if !pool_ids.contains_key(name) {
                pool_ids.insert(name.clone(), pools.len() as u32);
                pools.push(Pool {
                    weight: (*weight).max(1),
                    running_cores: 0,
                });
            }
        }
        Scheduler {
            book: Book::new(config.seed),
            config,
            jobs: Vec::new(),
            job_free_slots: Vec::new(),
            job_slots: FxHashMap::default(),
            active: VecDeque::new(),
            runnable: VecDeque::new(),
            order: Vec::new(),
            touched: Vec::new(),
            pools,
            pool_ids,
            next_job: 1,
            pending_total: 0,
            speculatable_total: 0,
            unfinished_total: 0,
            outputs: VecDeque::new(),
            batched: Vec::new(),
            stats: Stats::default(),
            next_speculation_us: 0,
            next_expiry_us: u64::MAX,
            last_finish_us: 0,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next output, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Moves every pending output into `out`.
    pub fn drain_outputs(&mut self, out: &mut Vec<Output>) {
        out.extend(self.outputs.drain(..));
    }

    /// Tasks accepted and not yet reported (the quantity `pending_tasks_max` bounds).
    pub fn unfinished_tasks(&self) -> usize {
        self.unfinished_total
    }

    /// Tasks waiting for a core.
    pub fn pending_tasks(&self) -> usize {
        self.pending_total
    }

    /// Jobs accepted and without an outcome yet.
    pub fn active_jobs(&self) -> usize {
        self.active.len()
    }

    /// Tasks of `job` waiting for a core (`None` if the job is unknown or ended).
    pub fn job_pending_tasks(&self, job: JobId) -> Option<usize> {
        self.job(job).map(|j| j.pending)
    }

    /// Registered executors.
    pub fn executors(&self) -> usize {
        self.book.len()
    }

    /// `(cores, free cores)` of a registered executor.
    pub fn executor_cores(&self, id: ExecutorId) -> Option<(u32, u32)> {
        let e = self.book.get(self.book.slot_of(id)?)?;
        Some((e.cores, e.free))
    }

    /// Slots a registered executor may be given now: its free slots within its slow-start
    /// window, none while it is stalled.
    pub fn executor_usable(&self, id: ExecutorId) -> Option<u32> {
        Some(self.book.get(self.book.slot_of(id)?)?.usable())
    }

    /// Stalled executors (holding a straggler, nothing finished since it was launched; they get
    /// no new work until they report a final state), each with the attempts it holds.
    pub fn stalled_executors(&self) -> Vec<(ExecutorId, usize)> {
        self.book
            .iter()
            .filter(|e| e.stalled)
            .map(|e| (e.id, e.running.len()))
            .collect()
    }

    /// Whether work is waiting (tasks pending, or copies of stragglers queued) that no
    /// registered executor can take at `now_us`: none is registered, or every one is excluded
    /// globally. Stalled executors count as able (they may recover; their stragglers are copied).
    /// O(executors) in the worst case; the driver asks now and then, not per event.
    pub fn starved(&self, now_us: u64) -> bool {
        if self.unfinished_total == 0 || (self.pending_total == 0 && self.speculatable_total == 0) {
            return false;
        }
        !self
            .book
            .iter()
            .any(|e| !self.globally_excluded(now_us, e.excluded_until_us, e.host))
    }

    /// Whether an executor is excluded at `now_us`: globally, or for `job` if given.
    pub fn is_excluded(&self, now_us: u64, id: ExecutorId, job: Option<JobId>) -> bool {
        let Some(e) = self.book.slot_of(id).and_then(|s| self.book.get(s)) else {
            return false;
        };
        if self.globally_excluded(now_us, e.excluded_until_us, e.host) {
            return true;
        }
        job.and_then(|j| self.job(j))
            .is_some_and(|j| j.excludes(id, e.host))
    }

    fn globally_excluded(&self, now_us: u64, exec_until_us: u64, host: u32) -> bool {
        exec_until_us > now_us
            || self
                .book
                .host(host)
                .is_some_and(|h| h.excluded_until_us > now_us)
    }

    fn job(&self, id: JobId) -> Option<&Job> {
        let slot = *self.job_slots.get(&id.0)?;
        self.jobs.get(slot as usize)?.as_ref()
    }

    /// The earliest time `tick` has work to do (a locality wait ending, a speculation check, an
    /// exclusion expiring, an unschedulable job timing out), if any.
    pub fn poll_timeout(&self) -> Option<u64> {
        let waits = self.waits();
        let mut t = u64::MAX;
        let free = self.book.has_free_cores();
        for job in self
            .active
            .iter()
            .filter_map(|&s| self.jobs.get(s as usize)?.as_ref())
        {
            if let Some(d) = job.level_deadline(waits) {
                t = t.min(d);
            }
            if free && job.pending > 0 && job.running == 0 {
                t = t.min(
                    job.last_progress_us
                        .saturating_add(self.config.unschedulable_timeout_us),
                );
            }
        }
        if self.config.speculation.is_some() && !self.active.is_empty() {
            t = t.min(self.next_speculation_us);
        }
        t = t.min(self.next_expiry_us);
        (t != u64::MAX).then_some(t)
    }

    fn waits(&self) -> [u64; 2] {
        [
            self.config.locality_wait_executor_us,
            self.config.locality_wait_host_us,
        ]
    }

    // ----- inputs -----

    /// Registers an executor, or refuses it (duplicate id, excluded host, zero cores, full).
    pub fn register_executor(&mut self, now_us: u64, info: ExecutorInfo) -> Result<(), Refusal> {
        if self.book.slot_of(info.id).is_some() {
            return Err(Refusal::DuplicateId(info.id));
        }
        if info.cores == 0 {
            return Err(Refusal::ZeroCores);
        }
        if self.book.len() >= self.config.executors_max {
            return Err(Refusal::TooManyExecutors(self.config.executors_max));
        }
        let host = self.book.host_index(&info.host);
        if let Some(h) = self.book.host(host) {
            if h.excluded_until_us > now_us {
                return Err(Refusal::HostExcluded {
                    host: info.host,
                    until_us: h.excluded_until_us,
                });
            }
        }
        self.book.insert(
            info.id,
            host,
            info.cores,
            self.config.slow_start_slots,
            now_us,
        );
        self.offer(now_us);
        self.flush();
        Ok(())
    }

    /// Removes an executor; its running attempts go back to pending (counted as failures only if
    /// the reason says the app caused it). Returns false if it was not registered.
    pub fn remove_executor(&mut self, now_us: u64, id: ExecutorId, reason: RemovalReason) -> bool {
        if !self.remove_executor_inner(now_us, id, &reason) {
            return false;
        }
        self.offer(now_us);
        self.flush();
        true
    }

    fn remove_executor_inner(
        &mut self,
        now_us: u64,
        id: ExecutorId,
        reason: &RemovalReason,
    ) -> bool {
        let Some((_, exec)) = self.book.remove(id) else {
            return false;
        };
        if exec.excluded_until_us > now_us {
            if let Some(h) = self.book.hosts.get_mut(exec.host as usize) {
                h.excluded_executors = h.excluded_executors.saturating_sub(1);
            }
        }
        let counts = reason.caused_by_app();
        let msg = reason.to_string();
        for ((task, attempt), run) in exec.running {
            self.attempt_ended(
                now_us,
                (exec.id, exec.host),
                (TaskId(task), attempt, run.started_us),
                End::Failed {
                    reason: msg.clone(),
                    counts,
                },
            );
        }
        true
    }

    /// Accepts a job, or refuses it without side effects. A job with a task payload over
    /// `payload_max_bytes` is accepted and fails at once (its outcome names the limit).
    pub fn submit_job(&mut self, now_us: u64, spec: JobSpec) -> Result<JobId, SubmitError> {
        let id = JobId(self.next_job);
        self.submit_job_with_id(now_us, id, spec)?;
        Ok(id)
    }

    /// [`submit_job`](Self::submit_job) with an id the caller chose (a driver whose callers
    /// allocate ids so that submitting never waits for the scheduler). The id must be below
    /// 2^32 (it is the high half of its tasks' [`TaskId`]s) and not belong to an active job;
    /// later [`submit_job`](Self::submit_job) calls pick ids above it. FIFO order is id order.
    pub fn submit_job_with_id(
        &mut self,
        now_us: u64,
        id: JobId,
        spec: JobSpec,
    ) -> Result<(), SubmitError> {
        if id.0 > u64::from(u32::MAX) || self.job_slots.contains_key(&id.0) {
            return Err(SubmitError::DuplicateJob(id));
        }
        let n = spec.tasks.len();
        if u32::try_from(n).is_err() {
            return Err(SubmitError::TooManyTasks);
        }
        if self.active.len() >= self.config.jobs_max {
            return Err(SubmitError::TooManyJobs(self.config.jobs_max));
        }
        if self.unfinished_total.saturating_add(n) > self.config.pending_tasks_max {
            return Err(SubmitError::TooManyPending {
                active: self.unfinished_total,
                submitted: n,
                limit: self.config.pending_tasks_max,
            });
        }
        if let Some(i) = spec.tasks.iter().position(|t| t.cores == 0) {
            return Err(SubmitError::ZeroCores(i as u32));
        }
        self.next_job = self.next_job.max(id.0 + 1);
        if n == 0 {
            self.outputs.push_back(Output::JobOutcome {
                job: id,
                outcome: JobOutcome::Succeeded(Vec::new()),
            });
            return Ok(());
        }
        let pool = match self.pool_ids.get(&spec.pool) {
            Some(&p) => p,
            None => {
                let p = self.pools.len() as u32;
                self.pool_ids.insert(spec.pool.clone(), p);
                self.pools.push(Pool {
                    weight: 1,
                    running_cores: 0,
                });
                p
            }
        };
        let oversized = spec
            .tasks
            .iter()
            .position(|t| t.payload.len() > self.config.payload_max_bytes)
            .map(|i| (i, spec.tasks.get(i).map_or(0, |t| t.payload.len())));
        let mut has_exec_prefs = false;
        let mut has_host_prefs = false;
        let mut tasks = Vec::with_capacity(n);
        for t in spec.tasks {
            let prefs = if t.preferred_executors.is_empty() && t.preferred_hosts.is_empty() {
                None
            } else {
                has_exec_prefs |= !t.preferred_executors.is_empty();
                has_host_prefs = true;
                let hosts = t
                    .preferred_hosts
                    .iter()
                    .map(|h| self.book.host_index(h))
                    .collect();
                Some(Box::new(Prefs {
                    executors: t.preferred_executors,
                    hosts,
                }))
            };
            tasks.push(TaskRec {
                function: t.function,
                payload: t.payload,
                prefs,
                cores: t.cores,
                status: Status::Pending,
                next_attempt: 0,
                failures: 0,
                attempts: [None, None],
                speculated: false,
            });
        }
        let mut job = Job {
            id,
            pool,
            weight: spec.weight.max(1),
            priority: spec.priority,
            tasks,
            keep_results: spec.keep_results,
            result_bytes_max: spec
                .result_bytes_max
                .unwrap_or(self.config.result_bytes_max),
            result_bytes: 0,
            pending: n,
            running: 0,
            running_cores: 0,
            final_count: 0,
            classes: Vec::new(),
            has_exec_prefs,
            has_host_prefs,
            level: Level::Any,
            level_since_us: now_us,
            last_progress_us: now_us,
            exclusion: JobExclusion::default(),
            durations_us: Vec::new(),
            median_cache: (0, 0),
            speculatable: VecDeque::new(),
            reasons: FxHashMap::default(),
            doomed: false,
            delay_rejected: false,
            widened: false,
            in_runnable: false,
        };
        job.level = job.start_level();
        let book = &self.book;
        let host_of = |e: ExecutorId| book.slot_of(e).and_then(|s| book.get(s)).map(|x| x.host);
        for i in 0..n as u32 {
            job.enqueue(i, host_of);
        }
        let slot = match self.job_free_slots.pop() {
            Some(s) => {
                if let Some(entry) = self.jobs.get_mut(s as usize) {
                    *entry = Some(job);
                }
                s
            }
            None => {
                self.jobs.push(Some(job));
                (self.jobs.len() - 1) as u32
            }
        };
        self.job_slots.insert(id.0, slot);
        let key = (-(i64::from(spec.priority)), id.0);
        let pos = self.active.partition_point(|&s| {
            self.jobs
                .get(s as usize)
                .and_then(Option::as_ref)
                .is_some_and(|j| (-(i64::from(j.priority)), j.id.0) < key)
        });
        self.active.insert(pos, slot);
        self.sync_runnable(slot);
        self.pending_total += n;
        self.unfinished_total += n;
        if let Some((i, len)) = oversized {
            let reason = format!(
                "task {i} payload is {len} bytes, over payload_max_bytes = {}",
                self.config.payload_max_bytes
            );
            self.abort_job(slot, JobOutcome::Failed(vec![reason.clone()]), &reason);
        } else {
            self.book.unblock_all();
            self.offer(now_us);
        }
        self.flush();
        Ok(())
    }

    /// Cancels a job: its running attempts are killed, its pending tasks dropped, each task and
    /// the job reported (cancelled) once. Returns false if the job is unknown or already ended.
    pub fn cancel_job(&mut self, now_us: u64, job: JobId) -> bool {
        let Some(&slot) = self.job_slots.get(&job.0) else {
            return false;
        };
        self.abort_job(slot, JobOutcome::Cancelled, "job cancelled");
        self.offer(now_us);
        self.flush();
        true
    }

    /// Fails a job now for `reason` (its deadline passed, say): like
    /// [`cancel_job`](Self::cancel_job), but the outcome is `Failed([reason])`. Returns false if
    /// the job is unknown or already ended.
    pub fn fail_job(&mut self, now_us: u64, job: JobId, reason: &str) -> bool {
        let Some(&slot) = self.job_slots.get(&job.0) else {
            return false;
        };
        self.abort_job(slot, JobOutcome::Failed(vec![reason.to_owned()]), reason);
        self.offer(now_us);
        self.flush();
        true
    }

    /// Kills a task for good: its running attempts are killed, it is reported failed ("killed:
    /// reason") and its job will fail. Returns false if the task is unknown or already final.
    pub fn kill_task(&mut self, now_us: u64, task: TaskId, reason: &str) -> bool {
        let Some(&slot) = self.job_slots.get(&task.job().0) else {
            return false;
        };
        let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) else {
            return false;
        };
        let index = task.index();
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return false;
        };
        match t.status {
            Status::Succeeded | Status::Failed => return false,
            Status::Pending => {
                job.pending -= 1;
                self.pending_total -= 1;
            }
            Status::Running => job.running -= 1,
        }
        t.status = Status::Failed;
        let msg = format!("killed: {reason}");
        let attempts = std::mem::take(&mut t.attempts);
        if job.reasons.len() < REASON_TASKS_MAX {
            job.reasons
                .entry(index)
                .or_default()
                .push(format!("task {index} {msg}"));
        }
        job.doomed = true;
        job.final_count += 1;
        self.unfinished_total -= 1;
        self.sync_runnable(slot);
        for a in attempts.into_iter().flatten() {
            self.kill_attempt(slot, task, a, &msg);
        }
        self.outputs.push_back(Output::TaskResult {
            task,
            result: Err(msg),
        });
        self.maybe_finish_job(slot);
        self.offer(now_us);
        self.flush();
        true
    }

    /// Handles a status report from an executor. Unknown, stale and duplicate reports are
    /// ignored (and counted).
    pub fn status_update(&mut self, now_us: u64, update: StatusUpdate) {
        let Some(slot) = self.book.slot_of(update.executor) else {
            self.stats.ignored_updates += 1;
            return;
        };
        let key = (update.task.0, update.attempt);
        let Some(exec) = self.book.get_mut(slot) else {
            self.stats.ignored_updates += 1;
            return;
        };
        match update.state {
            TaskState::Running => {
                if !exec.running.contains_key(&key) {
                    self.stats.ignored_updates += 1;
                }
                return;
            }
            TaskState::Lost => {
                if !exec.running.contains_key(&key) {
                    self.stats.ignored_updates += 1;
                    return;
                }
                let reason = RemovalReason::Lost(format!(
                    "reported task {} attempt {} lost",
                    update.task, update.attempt
                ));
                self.remove_executor_inner(now_us, update.executor, &reason);
            }
            TaskState::Finished | TaskState::Failed | TaskState::Killed => {
                let Some(run) = exec.running.remove(&key) else {
                    self.stats.ignored_updates += 1;
                    return;
                };
                exec.free += run.cores;
                exec.progress_us = now_us;
                exec.stalled = false;
                if update.state == TaskState::Finished {
                    exec.window = exec.window.saturating_add(1).min(exec.cores);
                }
                self.last_finish_us = now_us;
                let (id, host) = (exec.id, exec.host);
                self.book.make_offerable(slot);
                let end = match update.state {
                    TaskState::Finished => End::Succeeded(update.data),
                    TaskState::Killed => End::Failed {
                        reason: format!("killed by executor: {}", lossy(&update.data)),
                        counts: true,
                    },
                    _ => End::Failed {
                        reason: lossy(&update.data),
                        counts: true,
                    },
                };
                let attempt = (update.task, update.attempt, run.started_us);
                self.attempt_ended(now_us, (id, host), attempt, end);
            }
        }
        self.offer(now_us);
        self.flush();
    }

    /// Time passed: widens locality levels, ends exclusions, looks for stragglers, fails
    /// unschedulable jobs, and makes offers.
    pub fn tick(&mut self, now_us: u64) {
        let waits = self.waits();
        let mut new_work = false;
        for &slot in &self.runnable {
            let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) else {
                continue;
            };
            if job.pending > 0 {
                job.allowed_level(now_us, waits);
            }
            new_work |= std::mem::take(&mut job.widened);
        }
        if now_us >= self.next_expiry_us {
            self.expire_exclusions(now_us);
            new_work = true;
        }
        if self.config.speculation.is_some() && now_us >= self.next_speculation_us {
            new_work |= self.find_stragglers(now_us);
        }
        if new_work {
            self.book.unblock_all();
        }
        self.offer(now_us);
        self.fail_unschedulable(now_us);
        self.flush();
    }

    /// Fails jobs that have queued tasks, nothing running, and no launch for
    /// `unschedulable_timeout_us` although cores are free, when no registered executor could
    /// ever run them (all excluded for the job, or all smaller than its smallest queued task). A job
    /// that is merely starved by others keeps waiting.
    fn fail_unschedulable(&mut self, now_us: u64) {
        if !self.book.has_free_cores() {
            return;
        }
        let timeout = self.config.unschedulable_timeout_us;
        let overdue: Vec<u32> = self
            .runnable
            .iter()
            .copied()
            .filter(|&s| {
                self.jobs
                    .get(s as usize)
                    .and_then(Option::as_ref)
                    .is_some_and(|j| {
                        j.pending > 0
                            && j.running == 0
                            && now_us.saturating_sub(j.last_progress_us) >= timeout
                    })
            })
            .collect();
        for slot in overdue {
            let Some(job) = self.jobs.get(slot as usize).and_then(Option::as_ref) else {
                continue;
            };
            // Rare (once per timeout per stuck job), so a scan of its tasks is fine here.
            let smallest = job
                .tasks
                .iter()
                .filter(|t| t.status == Status::Pending)
                .map(|t| t.cores)
                .min()
                .unwrap_or(1);
            let usable = self.book.iter().any(|e| {
                e.cores >= smallest
                    && !self.globally_excluded(now_us, e.excluded_until_us, e.host)
                    && !job.excludes(e.id, e.host)
            });
            if usable {
                if let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) {
                    job.last_progress_us = now_us;
                }
                continue;
            }
            let reason = format!(
                "no executor could run the job's tasks for {timeout} us (all excluded for it, \
                 or all smaller than its smallest task)"
            );
            self.abort_job(slot, JobOutcome::Failed(vec![reason.clone()]), &reason);
        }
    }

    // ----- internals -----

    /// Makes offers until no offerable executor or no runnable task is left.
    fn offer(&mut self, now_us: u64) {
        while self.pending_total > 0 || self.speculatable_total > 0 {
            let Some(slot) = self.book.next_offerable() else {
                break;
            };
            if self.assign_one(now_us, slot) {
                match self.book.get(slot) {
                    Some(e) if e.usable() > 0 => self.book.advance(),
                    _ => self.book.unlist(slot),
                }
            } else if self.book.get(slot).is_some_and(|e| e.usable() > 0) {
                self.book.block(slot);
            } else {
                // Full within its window, or stalled: back when a final update comes.
                self.book.unlist(slot);
            }
        }
    }

    /// Gives one task to the executor in `slot`, if any job has one for it.
    fn assign_one(&mut self, now_us: u64, slot: u32) -> bool {
        let Some(e) = self.book.get(slot) else {
            return false;
        };
        let (id, host, free) = (e.id, e.host, e.usable());
        if free == 0 || self.globally_excluded(now_us, e.excluded_until_us, host) {
            return false;
        }
        let waits = self.waits();
        let fair = self.config.sharing == Sharing::Fair && self.runnable.len() > 1;
        if fair {
            self.fair_order(0);
        }
        let mut touched = std::mem::take(&mut self.touched);
        let mut launched = None;
        for k in 0..self.runnable.len() {
            if fair && k == 1 {
                self.fair_order(1);
            }
            let job_slot = if fair {
                self.order.get(k)
            } else {
                self.runnable.get(k)
            };
            let Some(&job_slot) = job_slot else {
                break;
            };
            let Some(job) = self
                .jobs
                .get_mut(job_slot as usize)
                .and_then(Option::as_mut)
            else {
                continue;
            };
            if !job.has_work() || job.excludes(id, host) {
                continue;
            }
            let spec_before = job.speculatable.len();
            let found = job.find_task(now_us, waits, id, slot, host, free);
            if std::mem::take(&mut job.widened) {
                self.book.unblock_all();
            }
            let popped = spec_before - job.speculatable.len();
            if popped > 0 {
                self.speculatable_total = self.speculatable_total.saturating_sub(popped);
                touched.push(job_slot);
            }
            if let Some(found) = found {
                launched = Some((job_slot, found));
                break;
            }
        }
        if let Some((job_slot, found)) = launched {
            self.launch(now_us, job_slot, slot, found);
            self.sync_runnable(job_slot);
        }
        for job_slot in touched.drain(..) {
            self.sync_runnable(job_slot);
        }
        self.touched = touched;
        launched.is_some()
    }

    /// Lists or unlists a job as runnable after its pending or straggler queues changed.
    fn sync_runnable(&mut self, job_slot: u32) {
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let want = job.has_work();
        if want == job.in_runnable {
            return;
        }
        job.in_runnable = want;
        let key = job.fifo_key();
        let jobs = &self.jobs;
        let pos = self.runnable.partition_point(|&s| {
            jobs.get(s as usize)
                .and_then(Option::as_ref)
                .is_some_and(|j| j.fifo_key() < key)
        });
        if want {
            self.runnable.insert(pos, job_slot);
        } else if self.runnable.get(pos) == Some(&job_slot) {
            self.runnable.remove(pos);
        }
    }

    /// FAIR order of the runnable jobs in `self.order`, built lazily: `from == 0` refills it and
    /// only brings the neediest job to the front (O(R), usually all an assignment needs);
    /// `from == 1` sorts the rest, for when the neediest job had nothing for the executor.
    fn fair_order(&mut self, from: usize) {
        if from == 0 {
            self.order.clear();
            self.order.extend(self.runnable.iter().copied());
        }
        let jobs = &self.jobs;
        let pools = &self.pools;
        let key = |s: &u32| {
            let j = jobs.get(*s as usize).and_then(Option::as_ref);
            j.map(|j| {
                let pool = pools.get(j.pool as usize);
                let p = pool.map_or(0.0, |p| p.running_cores as f64 / f64::from(p.weight));
                let w = j.running_cores as f64 / f64::from(j.weight);
                (p, w, -i64::from(j.priority), j.id.0)
            })
        };
        let cmp = |a: &u32, b: &u32| {
            key(a)
                .partial_cmp(&key(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        };
        let rest = self.order.get_mut(from..).unwrap_or_default();
        if from == 0 {
            let min = rest.iter().enumerate().min_by(|a, b| cmp(a.1, b.1));
            if let Some((pos, _)) = min {
                rest.swap(0, pos);
            }
        } else {
            rest.sort_by(cmp);
        }
    }

    fn launch(&mut self, now_us: u64, job_slot: u32, exec_slot: u32, found: Found) {
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let (index, speculative) = match found {
            Found::Pending(i, level) => {
                job.launched_at(now_us, level);
                (i, false)
            }
            Found::Speculative(i) => (i, true),
        };
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return;
        };
        let Some(free_attempt) = t.attempts.iter_mut().find(|a| a.is_none()) else {
            return;
        };
        let attempt = t.next_attempt;
        *free_attempt = Some(Attempt {
            attempt,
            exec: exec_slot,
        });
        t.next_attempt += 1;
        if speculative {
            self.stats.speculative_launched += 1;
        } else {
            t.status = Status::Running;
            job.pending -= 1;
            if job.pending == 0 {
                job.delay_rejected = false;
            }
            job.running += 1;
            self.pending_total -= 1;
        }
        let cores = t.cores;
        let task = TaskId::new(job.id, index);
        let launch = TaskLaunch {
            task,
            attempt,
            function: t.function.clone(),
            payload: t.payload.clone(),
            cores,
        };
        job.running_cores += u64::from(cores);
        if let Some(p) = self.pools.get_mut(job.pool as usize) {
            p.running_cores += u64::from(cores);
        }
        if let Some(e) = self.book.get_mut(exec_slot) {
            e.free -= cores;
            e.running.insert(
                (task.0, attempt),
                Run {
                    cores,
                    started_us: now_us,
                },
            );
            if e.batch.is_empty() {
                self.batched.push(exec_slot);
            }
            e.batch.push(launch);
        }
        self.stats.launched += 1;
    }

    /// Emits the batched launches, one `Launch` per executor.
    fn flush(&mut self) {
        for slot in self.batched.drain(..) {
            if let Some(e) = self.book.get_mut(slot) {
                if !e.batch.is_empty() {
                    self.outputs.push_back(Output::Launch {
                        executor: e.id,
                        tasks: std::mem::take(&mut e.batch),
                    });
                }
            }
        }
    }

    /// Asks the executor holding `a` to kill it; the job no longer counts its cores.
    fn kill_attempt(&mut self, job_slot: u32, task: TaskId, a: Attempt, reason: &str) {
        if let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        {
            if let Some(t) = job.tasks.get(task.index() as usize) {
                let cores = u64::from(t.cores);
                job.running_cores = job.running_cores.saturating_sub(cores);
                if let Some(p) = self.pools.get_mut(job.pool as usize) {
                    p.running_cores = p.running_cores.saturating_sub(cores);
                }
            }
        }
        if let Some(e) = self.book.get(a.exec) {
            self.outputs.push_back(Output::Kill {
                executor: e.id,
                task,
                attempt: a.attempt,
                reason: reason.to_string(),
            });
        }
    }

    /// An attempt `(task, attempt, started_us)` that executor `(id, host)` held has ended (its
    /// cores are already back).
    fn attempt_ended(
        &mut self,
        now_us: u64,
        (exec, host): (ExecutorId, u32),
        (task, attempt, started_us): (TaskId, u32, u64),
        end: End,
    ) {
        let Some(&job_slot) = self.job_slots.get(&task.job().0) else {
            return;
        };
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let index = task.index();
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return;
        };
        // Killed attempts were taken off the task already: nothing more to do.
        let Some(slot) = t
            .attempts
            .iter_mut()
            .find(|a| a.is_some_and(|a| a.attempt == attempt))
        else {
            return;
        };
        *slot = None;
        let cores = u64::from(t.cores);
        job.running_cores = job.running_cores.saturating_sub(cores);
        if let Some(p) = self.pools.get_mut(job.pool as usize) {
            p.running_cores = p.running_cores.saturating_sub(cores);
        }
        match end {
            End::Succeeded(data) => {
                let kept = if job.keep_results {
                    data.len() as u64
                } else {
                    0
                };
                if job.result_bytes.saturating_add(kept) > job.result_bytes_max {
                    let reason = format!(
                        "task {index}'s result of {} bytes takes the job's kept results over \
                         result_bytes_max = {} bytes (Spark's spark.driver.maxResultSize): \
                         return less, raise the limit, or do not keep results",
                        data.len(),
                        job.result_bytes_max
                    );
                    let msg = format!("job failed: results over {} bytes", job.result_bytes_max);
                    self.stats.attempts_failed += 1;
                    self.abort_job(job_slot, JobOutcome::Failed(vec![reason]), &msg);
                    return;
                }
                job.result_bytes += kept;
                t.status = Status::Succeeded;
                // The payload is no longer needed; the result replaces it if the job keeps it.
                t.payload = if job.keep_results {
                    data.clone()
                } else {
                    Bytes::new()
                };
                let others = std::mem::take(&mut t.attempts);
                job.running -= 1;
                job.final_count += 1;
                if self.config.speculation.is_some() {
                    job.durations_us.push(now_us.saturating_sub(started_us));
                }
                self.unfinished_total -= 1;
                self.stats.succeeded += 1;
                for other in others.into_iter().flatten() {
                    self.kill_attempt(job_slot, task, other, "another attempt succeeded");
                }
                self.outputs.push_back(Output::TaskResult {
                    task,
                    result: Ok(data),
                });
                self.maybe_finish_job(job_slot);
            }
            End::Failed { reason, counts } => {
                self.stats.attempts_failed += 1;
                if counts {
                    t.failures += 1;
                    let failures = t.failures;
                    if job.reasons.len() < REASON_TASKS_MAX || job.reasons.contains_key(&index) {
                        job.reasons.entry(index).or_default().push(format!(
                            "task {index} attempt {attempt} on executor {}: {reason}",
                            exec.0
                        ));
                    }
                    if let Some(x) = &self.config.exclusion {
                        job.record_exclusion_failure(
                            exec,
                            host,
                            x.job_executor_failures_max,
                            x.job_host_failures_max,
                        );
                    }
                    self.record_global_failure(now_us, exec);
                    let Some(job) = self
                        .jobs
                        .get_mut(job_slot as usize)
                        .and_then(Option::as_mut)
                    else {
                        return;
                    };
                    let Some(t) = job.tasks.get_mut(index as usize) else {
                        return;
                    };
                    if t.running_attempts() > 0 {
                        return;
                    }
                    if failures >= self.config.max_failures {
                        let mut reasons = vec![format!(
                            "task {index} failed {failures} times (max_failures = {})",
                            self.config.max_failures
                        )];
                        reasons.extend(job.reasons.remove(&index).unwrap_or_default());
                        let msg = format!("job failed: task {index} failed {failures} times");
                        self.abort_job(job_slot, JobOutcome::Failed(reasons), &msg);
                        return;
                    }
                    self.requeue(now_us, job_slot, index);
                } else if t.running_attempts() == 0 {
                    self.requeue(now_us, job_slot, index);
                }
            }
        }
    }

    /// Puts a task whose last attempt ended back in its queues.
    fn requeue(&mut self, now_us: u64, job_slot: u32, index: u32) {
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return;
        };
        t.status = Status::Pending;
        t.speculated = false;
        job.running -= 1;
        job.pending += 1;
        job.last_progress_us = now_us;
        self.pending_total += 1;
        let book = &self.book;
        job.enqueue(index, |e| {
            book.slot_of(e).and_then(|s| book.get(s)).map(|x| x.host)
        });
        self.sync_runnable(job_slot);
        self.book.unblock_all();
    }

    /// Reports the job's outcome once all its tasks are final.
    fn maybe_finish_job(&mut self, job_slot: u32) {
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        if job.final_count < job.tasks.len() {
            return;
        }
        let outcome = if job.doomed {
            let mut keys: Vec<u32> = job.reasons.keys().copied().collect();
            keys.sort_unstable();
            let reasons = keys
                .iter()
                .filter_map(|k| job.reasons.get(k))
                .flatten()
                .cloned()
                .collect();
            JobOutcome::Failed(reasons)
        } else if job.keep_results {
            JobOutcome::Succeeded(
                job.tasks
                    .iter_mut()
                    .map(|t| std::mem::take(&mut t.payload))
                    .collect(),
            )
        } else {
            JobOutcome::Succeeded(Vec::new())
        };
        let id = job.id;
        self.remove_job(job_slot);
        self.outputs
            .push_back(Output::JobOutcome { job: id, outcome });
    }

    /// Ends a job now: kills its running attempts, reports every unfinished task with `task_msg`,
    /// then the outcome.
    fn abort_job(&mut self, job_slot: u32, outcome: JobOutcome, task_msg: &str) {
        let Some(job) = self
            .jobs
            .get_mut(job_slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        let id = job.id;
        let mut kills = Vec::new();
        let mut unfinished = 0usize;
        for (i, t) in job.tasks.iter_mut().enumerate() {
            if matches!(t.status, Status::Succeeded | Status::Failed) {
                continue;
            }
            t.status = Status::Failed;
            unfinished += 1;
            let task = TaskId::new(id, i as u32);
            for a in std::mem::take(&mut t.attempts).into_iter().flatten() {
                kills.push((task, a));
            }
            self.outputs.push_back(Output::TaskResult {
                task,
                result: Err(task_msg.to_string()),
            });
        }
        self.pending_total -= job.pending;
        self.speculatable_total = self
            .speculatable_total
            .saturating_sub(job.speculatable.len());
        self.unfinished_total -= unfinished;
        job.pending = 0;
        for (task, a) in kills {
            self.kill_attempt(job_slot, task, a, task_msg);
        }
        self.remove_job(job_slot);
        self.outputs
            .push_back(Output::JobOutcome { job: id, outcome });
    }

    fn remove_job(&mut self, job_slot: u32) {
        let Some(job) = self.jobs.get_mut(job_slot as usize).and_then(Option::take) else {
            return;
        };
        if let Some(p) = self.pools.get_mut(job.pool as usize) {
            p.running_cores = p.running_cores.saturating_sub(job.running_cores);
        }
        self.job_slots.remove(&job.id.0);
        // Both lists are sorted by FIFO key: find the job by binary search (its own slot is
        // empty now, which sorts where its key would) instead of scanning every active job.
        let key = job.fifo_key();
        remove_sorted(&mut self.active, &self.jobs, job_slot, key);
        if job.in_runnable {
            remove_sorted(&mut self.runnable, &self.jobs, job_slot, key);
        }
        self.job_free_slots.push(job_slot);
    }
}

/// Removes `slot` from `list`, a list of job slots sorted by FIFO key, where the job of `slot`
/// (key `key`) is no longer in `jobs`. O(log n) to find it.
fn remove_sorted(list: &mut VecDeque<u32>, jobs: &[Option<Job>], slot: u32, key: (i64, u64)) {
    let pos = list.partition_point(|&s| {
        jobs.get(s as usize)
            .and_then(Option::as_ref)
            .is_some_and(|j| j.fifo_key() < key)
    });
    if list.get(pos) == Some(&slot) {
        list.remove(pos);
    } else {
        debug_assert!(!list.contains(&slot), "slot {slot} out of FIFO order");
        list.retain(|&s| s != slot);
    }
}

/// A peer's message as text, bounded.
fn lossy(data: &Bytes) -> String {
    let end = data.len().min(REASON_MAX_BYTES);
    String::from_utf8_lossy(data.get(..end).unwrap_or_default()).into_owned()
}
