//! What a service holds for a submitted job: a [`JobHandle`] to wait on (blocking with a
//! timeout, or as a `Future`), to take results from as they come (an iterator and a `Stream`,
//! for jobs that [stream](Job::stream_results)), to watch and to cancel. Dropping a handle
//! cancels its job unless it was [detached](JobHandle::detach); a job may carry a
//! [deadline](Job::deadline).

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::num::NonZeroU64;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;

pub use flint_engine::scheduler::{
    ExclusionConfig, HedgeConfig, JobOutcome, JobSetting, Payloads, SpeculationConfig,
};
use flint_engine::scheduler::{ExecutorId, JobId, JobSpec, TaskSpec, Tasks};

/// Called on the driver's loop with each task's index and result, as results arrive.
pub type ResultObserver = Box<dyn FnMut(u32, Result<&Bytes, &str>) + Send>;

/// Called on the driver's loop with a job's tag, then each task's index and result, as results
/// arrive: one observer that many jobs share ([`Job::on_result_shared`]).
pub type SharedResultObserver = Arc<dyn Fn(u64, u32, Result<&Bytes, &str>) + Send + Sync>;

/// A job's result observer, as the driver's loop holds it.
pub(crate) enum Observer {
    /// The job's own ([`Job::on_result`]).
    Own(ResultObserver),
    /// One that many jobs share, and this job's tag ([`Job::on_result_shared`]).
    Shared(SharedResultObserver, u64),
}

impl Observer {
    /// Task `index`'s result.
    #[inline]
    pub(crate) fn see(&mut self, index: u32, result: Result<&Bytes, &str>) {
        match self {
            Observer::Own(observer) => observer(index, result),
            Observer::Shared(observer, tag) => observer(*tag, index, result),
        }
    }
}

/// Where one task would rather run (Spark's `preferredLocations`): executors by their id on
/// the wire, then hosts. An executor not registered when the job is submitted is ignored (its
/// host, if listed, still counts); a preference only delays a task by the driver's locality
/// waits, never blocks it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TaskLocality {
    /// Preferred executors (best locality).
    pub executors: Vec<String>,
    /// Preferred hosts (second best). Give a job's tasks clones of one `Arc<str>` per host
    /// name: the driver's loop then looks each name up once per job (a chunk of a big one),
    /// not once per task.
    pub hosts: Vec<Arc<str>>,
}

/// A job to submit: one function over many payloads.
pub struct Job {
    /// Shared: a caller that submits many jobs of one function hands each the same name.
    pub(crate) function: Arc<str>,
    pub(crate) payloads: Payloads,
    pub(crate) cores: u32,
    pub(crate) observer: Option<Observer>,
    pub(crate) keep_results: bool,
    /// In microseconds (at least 1): 8 bytes, not an `Option<Duration>`'s 16, so that a
    /// plain `Job` in its submission moves without a `memcpy` call.
    pub(crate) deadline_us: Option<NonZeroU64>,
    pub(crate) stream: bool,
    /// `None` while every setting is the default (most jobs: no allocation); boxed once one
    /// is set, since a `Job` travels in the driver's messages.
    pub(crate) scheduling: Option<Box<JobScheduling>>,
}

/// A job with locality's task specs, made where it was submitted ([`Job::prepare`]): the
/// executors its tasks prefer wait, by name, for the registry on the driver's loop
/// ([`Prepared::resolve`]).
#[derive(Debug)]
pub(crate) struct Prepared {
    tasks: Vec<TaskSpec>,
    /// (task, the executors it prefers by their ids on the wire), in task order.
    executors: Vec<(u32, Vec<String>)>,
}

impl Prepared {
    /// Its tasks.
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// One task per payload, the first `locality.len()` with their preferences (hosts moved
    /// into the specs, executor names kept for [`Prepared::resolve`]).
    fn of(
        function: &Arc<str>,
        cores: u32,
        payloads: Payloads,
        locality: Vec<TaskLocality>,
    ) -> Prepared {
        let mut executors = Vec::new();
        let mut locality = locality.into_iter();
        let tasks = (0u32..)
            .zip(payloads)
            .map(|(i, payload)| {
                let mut task = TaskSpec {
                    cores,
                    ..TaskSpec::new(function.clone(), payload)
                };
                if let Some(l) = locality.next() {
                    if !l.executors.is_empty() {
                        executors.push((i, l.executors));
                    }
                    task.preferred_hosts = l.hosts;
                }
                task
            })
            .collect();
        Prepared { tasks, executors }
    }

    /// The task specs, each preferred executor mapped by `executor_id` (one not registered is
    /// left out). O(tasks that prefer executors).
    fn resolve(self, executor_id: impl Fn(&str) -> Option<ExecutorId>) -> Vec<TaskSpec> {
        let Prepared {
            mut tasks,
            executors,
        } = self;
        for (i, names) in executors {
            let Some(task) = tasks.get_mut(i as usize) else {
                unreachable!("task {i} of a prepared job beyond its specs");
            };
            task.preferred_executors = (names.iter())
                .filter_map(|name| {
                    let id = executor_id(name);
                    if id.is_none() {
                        tracing::debug!(executor = %name, "preferred executor not registered");
                    }
                    id
                })
                .collect();
        }
        tasks
    }
}

/// The settings few jobs set (how a job shares the cluster, handles failures, bounds its kept
/// results), boxed so a plain `Job` stays small; every field has the scheduler's
/// default until a [`Job`] builder method sets it.
#[derive(Debug)]
pub(crate) struct JobScheduling {
    pub pool: Cow<'static, str>,
    pub weight: u32,
    pub priority: i32,
    pub locality: Vec<TaskLocality>,
    /// Its task specs, made on the submitting thread ([`Job::prepare`]): the payloads and
    /// `locality` moved into them. Here, not in [`Job`], so that a plain `Job` stays small
    /// enough to move without a `memcpy` call (8 bytes more cost five of them per job).
    pub prepared: Option<Prepared>,
    pub max_failures: Option<u32>,
    pub result_bytes_max: Option<u64>,
    pub speculation: JobSetting<SpeculationConfig>,
    pub exclusion: JobSetting<ExclusionConfig>,
    pub hedging: JobSetting<HedgeConfig>,
}

impl Default for JobScheduling {
    fn default() -> Self {
        JobScheduling {
            pool: Cow::Borrowed("default"),
            weight: 1,
            priority: 0,
            locality: Vec::new(),
            prepared: None,
            max_failures: None,
            result_bytes_max: None,
            speculation: JobSetting::Inherit,
            exclusion: JobSetting::Inherit,
            hedging: JobSetting::Inherit,
        }
    }
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("function", &self.function)
            .field("tasks", &self.len())
            .finish()
    }
}

impl Job {
    /// A job of `payloads.len()` tasks, each running `function` on its payload. A caller
    /// that submits many jobs of one function can keep it as an `Arc<str>` and hand each a
    /// clone.
    pub fn new(function: impl Into<Arc<str>>, payloads: Vec<Bytes>) -> Self {
        Job::with_payloads(function, payloads)
    }

    /// [`Job::new`] over payloads held another way ([`Payloads`]): one `Bytes` for a one-task
    /// job (no vector to allocate, or for the driver to free), or an `Arc<[Bytes]>` that many
    /// jobs share (a service submitting the same inputs with every request). A job that keeps
    /// its results (the default) puts them in its payloads' places, so it takes its own copy
    /// of a shared list's handles when submitted, on the submitting thread; with
    /// [`keep_results(false)`](Self::keep_results) the list stays shared.
    pub fn with_payloads(function: impl Into<Arc<str>>, payloads: impl Into<Payloads>) -> Self {
        Job {
            function: function.into(),
            payloads: payloads.into(),
            cores: 1,
            observer: None,
            keep_results: true,
            deadline_us: None,
            stream: false,
            scheduling: None,
        }
    }

    /// Its tasks: one per payload.
    pub(crate) fn len(&self) -> usize {
        match self.scheduling.as_deref().and_then(|s| s.prepared.as_ref()) {
            Some(prepared) => prepared.len(),
            None => self.payloads.len(),
        }
    }

    /// Makes a job with locality its task specs here, on the submitting thread, so that the
    /// driver's loop does not (about 50 ns a task, most of it the specs' memory: 52 ms for a
    /// job of 1,000,000 tasks): its payloads and its tasks' preferences move into them. A
    /// job without locality, one prepared already, or one with more locality entries than
    /// tasks (which the loop refuses) stays as it is.
    pub(crate) fn prepare(&mut self) {
        let Some(scheduling) = self.scheduling.as_mut() else {
            return;
        };
        let entries = scheduling.locality.len();
        if entries == 0 || entries > self.payloads.len() || scheduling.prepared.is_some() {
            return;
        }
        let payloads = std::mem::take(&mut self.payloads);
        let locality = std::mem::take(&mut scheduling.locality);
        let prepared = Prepared::of(&self.function, self.cores, payloads, locality);
        scheduling.prepared = Some(prepared);
    }

    /// Undoes [`Job::prepare`]: a job `try_submit` handed back, changed before it goes again.
    fn unprepare(&mut self) {
        let Some(prepared) = self.scheduling.as_mut().and_then(|s| s.prepared.take()) else {
            return;
        };
        let Prepared { tasks, executors } = prepared;
        let mut executors = executors.into_iter().peekable();
        let mut payloads = Vec::with_capacity(tasks.len());
        let mut locality = Vec::with_capacity(tasks.len());
        for (i, task) in (0u32..).zip(tasks) {
            let named = executors
                .next_if(|(at, _)| *at == i)
                .map(|(_, names)| names);
            payloads.push(task.payload);
            locality.push(TaskLocality {
                executors: named.unwrap_or_default(),
                hosts: task.preferred_hosts,
            });
        }
        self.payloads = payloads.into();
        self.scheduling().locality = locality;
    }

    /// The job's scheduling settings, made (with the defaults) when the first is set.
    fn scheduling(&mut self) -> &mut JobScheduling {
        self.scheduling.get_or_insert_with(Box::default)
    }

    /// The FAIR pool the job runs in (default `"default"`; ignored under FIFO sharing). Pools
    /// come from the driver's configuration (`flint ... --pools FILE`); an unknown name makes a
    /// pool with the defaults (FAIR inside, weight 1, no minimum share).
    pub fn pool(mut self, name: impl Into<String>) -> Self {
        self.scheduling().pool = Cow::Owned(name.into());
        self
    }

    /// The job's weight inside its pool when the pool is FAIR (default 1, at least 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.scheduling().weight = weight.max(1);
        self
    }

    /// Higher runs first: under FIFO before submission order, under FAIR as a tie-break
    /// (default 0).
    pub fn priority(mut self, priority: i32) -> Self {
        self.scheduling().priority = priority;
        self
    }

    /// Per-task locality preferences, in task order: entry `i` is task `i`'s (tasks beyond
    /// the list have none). More entries than tasks is a submission error.
    pub fn locality(mut self, per_task: Vec<TaskLocality>) -> Self {
        self.unprepare();
        self.scheduling().locality = per_task;
        self
    }

    /// Counted failures a task may have before the job fails (default: the driver's
    /// `scheduler.max_failures`, 4; at least 1).
    pub fn max_failures(mut self, max_failures: u32) -> Self {
        self.scheduling().max_failures = Some(max_failures.max(1));
        self
    }

    /// Speculation for this job: inherit the driver's (default), off, or its own thresholds.
    pub fn speculation(mut self, setting: JobSetting<SpeculationConfig>) -> Self {
        self.scheduling().speculation = setting;
        self
    }

    /// Exclusion for this job (its per-job and per-task limits; global exclusion stays the
    /// driver's): inherit (default), off, or its own limits.
    pub fn exclusion(mut self, setting: JobSetting<ExclusionConfig>) -> Self {
        self.scheduling().exclusion = setting;
        self
    }

    /// Hedged attempts for this job: an attempt still running past `after` (or past its
    /// function's recent 99th percentile run time times 2, if longer) gets one copy on another
    /// executor; the first result wins and the other attempt is killed. The driver's default
    /// floor is 1 ms ([`HedgeConfig`], `DriverConfig::scheduler.hedging`).
    pub fn hedge_after(mut self, after: Duration) -> Self {
        let floor_us = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
        self.scheduling().hedging = JobSetting::custom(HedgeConfig {
            floor_us,
            ..HedgeConfig::default()
        });
        self
    }

    /// Hedging for this job: inherit the driver's (default, on), off, or its own settings.
    pub fn hedging(mut self, setting: JobSetting<HedgeConfig>) -> Self {
        self.scheduling().hedging = setting;
        self
    }

    /// Fails the job with a reason naming the deadline if it has not ended `deadline` after it
    /// reached the driver: running tasks are killed, pending ones dropped.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        let us = u64::try_from(deadline.as_micros()).unwrap_or(u64::MAX);
        self.deadline_us = NonZeroU64::new(us.max(1));
        self
    }

    /// Hands each task's result to the handle as it arrives ([`JobHandle::results`],
    /// [`JobHandle::next_result`], [`JobHandle::results_stream`]), in completion order. Results
    /// wait in the handle until taken, so a streaming job that also keeps its results for the
    /// outcome holds each twice (shared bytes, not copies): stream with `keep_results(false)`.
    pub fn stream_results(mut self) -> Self {
        self.stream = true;
        self
    }

    /// Whether the outcome keeps every task's result (default true). A job that takes its
    /// results through [`Job::on_result`] can say false: the driver then holds no result after
    /// reporting it, and `JobOutcome::Succeeded` comes with an empty list.
    pub fn keep_results(mut self, keep: bool) -> Self {
        self.keep_results = keep;
        self
    }

    /// The most result bytes the job keeps for its outcome (default: the driver's
    /// `scheduler.result_bytes_max`, 1 GiB). The result that goes over it fails the job with a
    /// reason naming the limit, as Spark's `spark.driver.maxResultSize` does.
    pub fn result_bytes_max(mut self, bytes: u64) -> Self {
        self.scheduling().result_bytes_max = Some(bytes);
        self
    }

    /// Cores each task needs (default 1).
    pub fn cores(mut self, cores: u32) -> Self {
        self.unprepare();
        self.cores = cores;
        self
    }

    /// Sees each task's result as it arrives (on the driver's loop: keep it short). Every task
    /// has one before a success; a job that fails or is cancelled gives none for the tasks it
    /// had not finished (but the one whose failures failed it): its outcome says why.
    pub fn on_result(
        mut self,
        observer: impl FnMut(u32, Result<&Bytes, &str>) + Send + 'static,
    ) -> Self {
        self.observer = Some(Observer::Own(Box::new(observer)));
        self
    }

    /// Sees every task's result as it arrives, as [`Job::on_result`] does, through an observer
    /// that many jobs share: it is called with `tag` first, so it can tell them apart (a
    /// submission time, an index into the caller's table). A job submitted this way allocates
    /// nothing for its observer, where [`Job::on_result`] boxes one per job. Replaces an
    /// observer set before, as `on_result` does.
    // Always inline (the hint alone was not taken): out of line, the call moved the whole
    // `Job` in and out again and dropped an observer the caller's `Job` was known not to hold.
    #[inline(always)]
    pub fn on_result_shared(mut self, observer: &SharedResultObserver, tag: u64) -> Self {
        self.observer = Some(Observer::Shared(observer.clone(), tag));
        self
    }
}

/// The scheduler's view of a job's tasks and settings (its task specs made already if it has
/// locality and was [`Job::prepare`]d): `executor_id` maps an executor's id on the wire to the
/// scheduler's, if it is registered. Errors name what is wrong.
pub(crate) fn job_spec(
    function: Arc<str>,
    payloads: Payloads,
    cores: u32,
    keep_results: bool,
    scheduling: Option<Box<JobScheduling>>,
    executor_id: impl Fn(&str) -> Option<ExecutorId>,
) -> Result<JobSpec, String> {
    let Some(scheduling) = scheduling else {
        // Most jobs: every setting the scheduler's, no preferences.
        let tasks = Tasks::Same {
            function,
            cores,
            payloads,
        };
        return Ok(JobSpec {
            keep_results,
            ..JobSpec::new(tasks)
        });
    };
    let JobScheduling {
        pool,
        weight,
        priority,
        locality,
        prepared,
        max_failures,
        result_bytes_max,
        speculation,
        exclusion,
        hedging,
    } = *scheduling;
    if locality.len() > payloads.len() {
        return Err(format!(
            "{} locality entries for {} tasks",
            locality.len(),
            payloads.len()
        ));
    }
    let tasks = match prepared {
        Some(prepared) => Tasks::Each(prepared.resolve(executor_id)),
        // The common job: one function, no preferences; the payloads go over as they are.
        None if locality.is_empty() => Tasks::Same {
            function,
            cores,
            payloads,
        },
        None => {
            Tasks::Each(Prepared::of(&function, cores, payloads, locality).resolve(executor_id))
        }
    };
    Ok(JobSpec {
        pool,
        weight,
        priority,
        keep_results,
        result_bytes_max,
        max_failures,
        speculation,
        exclusion,
        hedging,
        ..JobSpec::new(tasks)
    })
}

/// One task's result as the handle hands it out: its index in the job, then its bytes or why it
/// did not succeed.
pub type TaskResult = (u32, Result<Bytes, String>);

#[derive(Default)]
struct State {
    /// The outcome until the handle takes it.
    outcome: Option<JobOutcome>,
    /// Whether the outcome was decided (it may have been taken since).
    ended: bool,
    /// Streamed results not yet taken.
    results: VecDeque<TaskResult>,
    /// The task awaiting the outcome or the next result.
    waker: Option<Waker>,
    /// Threads blocked on `changed`: without any, a change wakes nobody (no system call).
    blocked: u32,
}

/// The part of a job shared by its handle and the driver. Nothing in it depends on the job's
/// settings (whether it streams is the driver's record of it), so a spare one serves any job
/// as it is.
pub(crate) struct JobShared {
    state: Mutex<State>,
    changed: Condvar,
    tasks_done: AtomicU64,
    cancelled: AtomicBool,
    /// Set once the outcome is in `state`: a waiter may spin on it without the lock.
    ended: AtomicBool,
}

impl JobShared {
    pub(crate) fn new() -> JobShared {
        JobShared {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            tasks_done: AtomicU64::new(0),
            cancelled: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        }
    }

    /// Empties this state, which nothing else holds, for a new job: what `new()` makes,
    /// written in place (its outcome, results and waker dropped; a big result queue's room
    /// given back).
    fn reset(&mut self) {
        let state = (self.state.get_mut()).unwrap_or_else(|poisoned| poisoned.into_inner());
        match state.outcome.take() {
            // Most outcomes left here: a success that kept no results. Its empty vector holds
            // no element and no allocation, so it goes without its drop's call (a fifth of
            // keeping a state).
            Some(JobOutcome::Succeeded(results)) if results.capacity() == 0 => {
                std::mem::forget(results);
            }
            other => drop(other),
        }
        state.ended = false;
        if state.results.capacity() > SPARE_RESULTS_MAX {
            state.results = VecDeque::new();
        } else {
            state.results.clear();
        }
        state.waker = None;
        state.blocked = 0;
        *self.tasks_done.get_mut() = 0;
        *self.cancelled.get_mut() = false;
        *self.ended.get_mut() = false;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked while holding it; the state is
        // plain values that are always consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tasks done so far and whether the outcome is in (what a handle reads), for tests.
    #[cfg(test)]
    pub(crate) fn progress(&self) -> (u64, bool) {
        let done = self.tasks_done.load(Ordering::Acquire);
        (done, self.ended.load(Ordering::Acquire))
    }

    /// One task reached its final result.
    #[inline]
    pub(crate) fn task_done(&self) {
        self.tasks_done.fetch_add(1, Ordering::Relaxed);
    }

    /// A streaming job's task result, for the handle to take (after [`JobShared::task_done`]).
    pub(crate) fn stream_result(&self, index: u32, result: Result<&Bytes, &str>) {
        let result = result.cloned().map_err(str::to_owned);
        let mut state = self.lock();
        state.results.push_back((index, result));
        self.wake(state);
    }

    /// Records the outcome (the first one wins) and wakes every waiter. Always inline (the
    /// hint alone was not taken): the driver's loop calls it once per job, and out of line its
    /// call and saved registers were a quarter of its instructions.
    #[inline(always)]
    pub(crate) fn finish(&self, outcome: JobOutcome) {
        let mut state = self.lock();
        if state.ended {
            return;
        }
        state.ended = true;
        state.outcome = Some(outcome);
        self.ended.store(true, Ordering::Release);
        self.wake(state);
    }

    /// Wakes whoever waits for a change just made under `state`: the blocked threads (only if
    /// there are any) and the task awaiting it.
    fn wake(&self, mut state: MutexGuard<'_, State>) {
        let waker = state.waker.take();
        let blocked = state.blocked > 0;
        drop(state);
        if blocked {
            self.changed.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Blocks on `changed` (up to `left`, if given), counted as blocked meanwhile.
    fn block<'a>(
        &self,
        mut state: MutexGuard<'a, State>,
        left: Option<Duration>,
    ) -> MutexGuard<'a, State> {
        state.blocked += 1;
        let mut state = match left {
            None => self
                .changed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            Some(left) => self
                .changed
                .wait_timeout(state, left)
                .map(|(guard, _)| guard)
                .unwrap_or_else(|poisoned| poisoned.into_inner().0),
        };
        state.blocked -= 1;
        state
    }

    /// Marks the job cancelled (the driver's loop also learns it by message, or by looking).
    pub(crate) fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The next streamed result, waiting up to `timeout`; `None` once the job has ended and
    /// every result was taken (or the time ran out: then `Some` may still come later).
    fn next_result_blocking(&self, timeout: Option<Duration>) -> Option<TaskResult> {
        let deadline = timeout.map(flint_engine::runtime::deadline_after);
        let mut state = self.lock();
        loop {
            if let Some(result) = state.results.pop_front() {
                return Some(result);
            }
            if state.ended {
                return None;
            }
            state = match deadline {
                None => self.block(state, None),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return None;
                    }
                    self.block(state, Some(left))
                }
            };
        }
    }

    fn poll_next_result(&self, cx: &mut Context<'_>) -> Poll<Option<TaskResult>> {
        let mut state = self.lock();
        if let Some(result) = state.results.pop_front() {
            return Poll::Ready(Some(result));
        }
        if state.ended {
            return Poll::Ready(None);
        }
        state.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// The longest a waiting caller spins before it blocks on a nearly done job.
pub const WAIT_SPIN_MAX: Duration = Duration::from_micros(20);
/// A waiting caller spins only when at most this many of its job's tasks are left.
pub const WAIT_SPIN_TASKS_LEFT: u64 = 1;

/// Where a handle's cancel and, when it is dropped, its job's state go: the driver's side of
/// its jobs, one per driver and shared by every handle (so a handle costs no allocation for it).
pub(crate) trait DriverSide: Send + Sync {
    /// Job `id` was cancelled by its handle (its shared state says so already).
    fn cancel(&self, id: JobId);
    /// A dropped handle's state, kept for a new job if nothing else holds it.
    fn give_back(&self, shared: Arc<JobShared>);
}

/// Most job states kept for new jobs ([`SpareStates`]): about 150 bytes each.
const SPARE_STATES_MAX: usize = 1024;
/// The most streamed results a kept job state's queue keeps room for.
const SPARE_RESULTS_MAX: usize = 64;

/// Job states kept for new jobs, so that a job's submission allocates none in steady state:
/// a state comes back when its job's handle or the driver's record of it, whichever goes last,
/// lets go of it, emptied at once (it holds no results or wakers while it waits), into that
/// thread's own few ([`NEAR`], no lock) or, past them, here, at most [`SPARE_STATES_MAX`]; a
/// state that anything else still holds is never kept. A new job takes its thread's first.
#[derive(Default)]
pub(crate) struct SpareStates(Mutex<Vec<Arc<JobShared>>>);

impl SpareStates {
    /// A new job's state: a spare one if any (this thread's own first), else a new one. A
    /// spare one is taken as it is: [`SpareStates::give`] kept it from its last holder,
    /// emptied, and nothing takes a clone of it here, so its new job is its only user.
    pub(crate) fn take(&self) -> Arc<JobShared> {
        let spare = take_near().or_else(|| self.lock().pop());
        debug_assert!(spare.as_ref().is_none_or(|s| Arc::strong_count(s) == 1));
        spare.unwrap_or_else(|| Arc::new(JobShared::new()))
    }

    /// Keeps `shared` for a new job if this is its last holder (else it goes with the last).
    #[inline]
    pub(crate) fn give(&self, shared: Arc<JobShared>) {
        // With another holder (the driver's record while the handle lives, or the handle),
        // this one only lets go: a plain load, inline, since that is the rule for whichever of
        // the two lets go first. `keep` checks again with `get_mut`, the check that counts (two
        // holders letting go at once may both see the other: the state is then freed, not
        // kept).
        if Arc::strong_count(&shared) == 1 {
            self.keep(shared);
        }
    }

    /// [`SpareStates::give`] from what looked like the last holder (out of line, so that
    /// `give` is a load and a branch where it is inlined).
    #[inline(never)]
    fn keep(&self, mut shared: Arc<JobShared>) {
        let Some(state) = Arc::get_mut(&mut shared) else {
            return;
        };
        // Its results, outcome and waker go now, not when it is taken again.
        state.reset();
        let Some(shared) = keep_near(shared) else {
            return;
        };
        let mut spare = self.lock();
        if spare.len() < SPARE_STATES_MAX {
            spare.push(shared);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Arc<JobShared>>> {
        // A poisoned lock holds a plain vector of unique states: still consistent.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Most job states a thread keeps for its own next submissions ([`NEAR`]).
const NEAR_STATES_MAX: usize = 64;

thread_local! {
    /// Job states this thread let go of last, emptied, for the jobs it submits next, before
    /// any driver's [`SpareStates`]: a caller that drops its finished jobs' handles and submits
    /// new ones (a service's request thread, the load generator) takes and keeps each job's
    /// state without a lock (two lock and unlock pairs a job, 30 instructions). A job's state
    /// depends on nothing of its driver's, so any driver's job may take one. At most
    /// [`NEAR_STATES_MAX`] a thread (about 10 KB), freed when the thread ends.
    static NEAR: RefCell<Vec<Arc<JobShared>>> = const { RefCell::new(Vec::new()) };
}

/// A state this thread kept ([`NEAR`]), if any (none while its thread-locals are being
/// destroyed).
#[inline]
fn take_near() -> Option<Arc<JobShared>> {
    (NEAR.try_with(|near| near.try_borrow_mut().ok()?.pop()))
        .ok()
        .flatten()
}

/// Keeps `shared`, emptied and unique, in this thread's [`NEAR`] states; hands it back if they
/// are full (or being destroyed).
#[inline]
fn keep_near(shared: Arc<JobShared>) -> Option<Arc<JobShared>> {
    let mut shared = Some(shared);
    let _ = NEAR.try_with(|near| {
        let Ok(mut near) = near.try_borrow_mut() else {
            return;
        };
        if near.len() < NEAR_STATES_MAX {
            if let Some(shared) = shared.take() {
                near.push(shared);
            }
        }
    });
    shared
}

/// A submitted job. Dropping it cancels the job unless it has ended or was
/// [detached](JobHandle::detach).
pub struct JobHandle {
    pub(crate) id: u64,
    pub(crate) tasks: u64,
    /// Taken out only by the handle's drop.
    pub(crate) shared: ManuallyDrop<Arc<JobShared>>,
    pub(crate) driver: Arc<dyn DriverSide>,
    pub(crate) detached: bool,
}

impl std::fmt::Debug for JobHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobHandle")
            .field("id", &self.id)
            .field("tasks", &self.tasks)
            .finish_non_exhaustive()
    }
}

impl JobHandle {
    /// The job's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Tasks in the job.
    pub fn tasks(&self) -> u64 {
        self.tasks
    }

    /// Tasks that have reached their final result so far.
    pub fn tasks_done(&self) -> u64 {
        self.shared.tasks_done.load(Ordering::Relaxed)
    }

    /// True once the outcome is known.
    pub fn is_finished(&self) -> bool {
        self.shared.is_ended()
    }

    /// Cancels the job: running tasks are killed, pending ones dropped; the outcome becomes
    /// `Cancelled` unless it was already decided.
    pub fn cancel(&self) {
        self.shared.cancel();
        self.driver.cancel(JobId(self.id));
    }

    /// Lets the job run to its end without this handle: dropping a handle otherwise cancels
    /// its job. Results still reach the job's [`Job::on_result`] observer.
    pub fn detach(mut self) {
        self.detached = true;
    }

    /// A waiter's brief spin before it blocks, when its job is nearly done: at most
    /// [`WAIT_SPIN_MAX`], under the process's budget of spinning threads
    /// ([`flint_engine::spin`]), and only with at most [`WAIT_SPIN_TASKS_LEFT`] tasks to go.
    fn spin_if_nearly_done(&self, timeout: Duration) {
        let left = self.tasks.saturating_sub(self.tasks_done());
        if left <= WAIT_SPIN_TASKS_LEFT && flint_engine::spin::enabled() {
            flint_engine::spin::spin_until(WAIT_SPIN_MAX.min(timeout), || {
                self.shared.ended.load(Ordering::Acquire)
            });
        }
    }

    /// Blocks until the job ends (after a brief spin when it is nearly done).
    pub fn wait(self) -> JobOutcome {
        self.spin_if_nearly_done(WAIT_SPIN_MAX);
        let mut state = self.shared.lock();
        loop {
            if let Some(outcome) = state.outcome.take() {
                return outcome;
            }
            state = self.shared.block(state, None);
        }
    }

    /// Blocks until the job ends or `timeout` passes; on timeout the handle comes back.
    pub fn wait_timeout(self, timeout: Duration) -> Result<JobOutcome, JobHandle> {
        let deadline = flint_engine::runtime::deadline_after(timeout);
        self.spin_if_nearly_done(timeout);
        {
            let mut state = self.shared.lock();
            loop {
                if let Some(outcome) = state.outcome.take() {
                    return Ok(outcome);
                }
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                state = self.shared.block(state, Some(left));
            }
        }
        Err(self)
    }

    /// The next result of a [streaming](Job::stream_results) job, blocking up to `timeout`
    /// (`None`: until it comes). `None` once every result was taken and the job ended, or when
    /// the time ran out.
    pub fn next_result(&mut self, timeout: Option<Duration>) -> Option<TaskResult> {
        self.shared.next_result_blocking(timeout)
    }

    /// The results of a [streaming](Job::stream_results) job as they come, blocking between
    /// them, until the job ends.
    pub fn results(&mut self) -> impl Iterator<Item = TaskResult> + '_ {
        std::iter::from_fn(move || self.shared.next_result_blocking(None))
    }

    /// The results of a [streaming](Job::stream_results) job as a `Stream`, ending with the
    /// job. Await the handle afterwards for the outcome.
    pub fn results_stream(&mut self) -> ResultStream<'_> {
        ResultStream { handle: self }
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        if !self.detached && !self.shared.is_ended() {
            self.cancel();
        }
        // SAFETY: this is the handle's drop, and `shared` is read nowhere after this line, so
        // taking it out leaves no use of the emptied field (and it is dropped exactly once:
        // `ManuallyDrop` keeps the handle's own drop glue from dropping it again).
        let shared = unsafe { ManuallyDrop::take(&mut self.shared) };
        self.driver.give_back(shared);
    }
}

impl Future for JobHandle {
    type Output = JobOutcome;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<JobOutcome> {
        let mut state = self.shared.lock();
        match state.outcome.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                state.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A streaming job's results as they come ([`JobHandle::results_stream`]).
#[derive(Debug)]
pub struct ResultStream<'a> {
    handle: &'a mut JobHandle,
}

impl Stream for ResultStream<'_> {
    type Item = TaskResult;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TaskResult>> {
        self.handle.shared.poll_next_result(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 14 item 9: what a `Job` sets reaches the scheduler's `JobSpec`.
    #[test]
    fn a_jobs_scheduling_settings_reach_its_spec() {
        let job = Job::new("hash", vec![Bytes::new(), Bytes::new()])
            .pool("prod")
            .weight(3)
            .priority(-2)
            .max_failures(7)
            .result_bytes_max(99)
            .speculation(JobSetting::Off)
            .exclusion(JobSetting::custom(ExclusionConfig::default()))
            .locality(vec![TaskLocality {
                executors: vec!["e1".into(), "unknown".into()],
                hosts: vec!["h1".into()],
            }]);
        let spec = spec_of(job, |name| (name == "e1").then_some(ExecutorId(5))).unwrap();
        assert_eq!((&*spec.pool, spec.weight, spec.priority), ("prod", 3, -2));
        assert_eq!(spec.max_failures, Some(7));
        assert_eq!(spec.result_bytes_max, Some(99));
        assert_eq!(spec.speculation, JobSetting::Off);
        assert_eq!(
            spec.exclusion,
            JobSetting::custom(ExclusionConfig::default())
        );
        let Tasks::Each(tasks) = &spec.tasks else {
            panic!("a job with locality lists its tasks one by one");
        };
        assert_eq!(tasks[0].preferred_executors, vec![ExecutorId(5)]);
        assert_eq!(
            tasks[0].preferred_hosts,
            vec![std::sync::Arc::<str>::from("h1")]
        );
        assert!(tasks[1].preferred_executors.is_empty());
        // Without locality the payloads go over as they are.
        let plain = Job::new("noop", vec![Bytes::from_static(b"a"), Bytes::new()]).cores(2);
        let spec = spec_of(plain, |_| None).unwrap();
        match &spec.tasks {
            Tasks::Same {
                function,
                cores,
                payloads,
            } => {
                assert_eq!((&**function, *cores), ("noop", 2));
                assert_eq!(&payloads[..], [Bytes::from_static(b"a"), Bytes::new()]);
            }
            Tasks::Each(_) => panic!("a plain job's tasks are one function over its payloads"),
        }
        // A job that sets nothing has every setting the scheduler's.
        assert_eq!((&*spec.pool, spec.weight, spec.priority), ("default", 1, 0));
        assert_eq!((spec.keep_results, spec.max_failures), (true, None));
        assert_eq!(spec.speculation, JobSetting::Inherit);
        assert_eq!(spec.exclusion, JobSetting::Inherit);
        assert_eq!(spec.hedging, JobSetting::Inherit);
        let too_many = Job::new("noop", vec![Bytes::new()])
            .locality(vec![TaskLocality::default(), TaskLocality::default()]);
        assert!(spec_of(too_many, |_| None).is_err());
    }

    /// `job`'s spec, as the driver's loop makes it.
    fn spec_of(
        job: Job,
        executor_id: impl Fn(&str) -> Option<ExecutorId>,
    ) -> Result<JobSpec, String> {
        let (function, payloads, cores) = (job.function, job.payloads, job.cores);
        job_spec(
            function,
            payloads,
            cores,
            job.keep_results,
            job.scheduling,
            executor_id,
        )
    }

    /// Whether `job` made its task specs ([`Job::prepare`]).
    fn is_prepared(job: &Job) -> bool {
        job.scheduling
            .as_ref()
            .is_some_and(|s| s.prepared.is_some())
    }

    /// A task spec's payload, cores, preferred executors and preferred hosts.
    type SpecParts = (Bytes, u32, Vec<ExecutorId>, Vec<Arc<str>>);

    /// (payload, cores, preferred executors, preferred hosts) of each of `spec`'s tasks.
    fn tasks_of(spec: &JobSpec) -> Vec<SpecParts> {
        let Tasks::Each(tasks) = &spec.tasks else {
            panic!("a job with locality lists its tasks one by one");
        };
        (tasks.iter())
            .map(|t| {
                (
                    t.payload.clone(),
                    t.cores,
                    t.preferred_executors.clone(),
                    t.preferred_hosts.clone(),
                )
            })
            .collect()
    }

    /// A job with locality makes its task specs on the submitting thread (`Job::prepare`),
    /// the same the loop would make; one handed back and changed goes as changed.
    #[test]
    fn a_job_with_locality_prepared_where_it_is_submitted_gives_the_loop_the_same_spec() {
        let job = || {
            let payloads: Vec<Bytes> = (0..4u8).map(|i| Bytes::from(vec![i])).collect();
            Job::new("f", payloads).cores(2).locality(vec![
                TaskLocality {
                    executors: vec!["e1".into(), "gone".into()],
                    hosts: vec!["h1".into(), "h2".into()],
                },
                TaskLocality::default(),
                TaskLocality {
                    executors: vec!["e1".into()],
                    hosts: Vec::new(),
                },
            ])
        };
        let registry = |name: &str| (name == "e1").then_some(ExecutorId(5));
        let mut prepared = job();
        prepared.prepare();
        assert!(is_prepared(&prepared) && prepared.payloads.is_empty());
        assert_eq!(prepared.len(), 4);
        let expected = tasks_of(&spec_of(job(), registry).unwrap());
        assert_eq!(expected[0].2, vec![ExecutorId(5)]);
        assert_eq!(expected[2].2, vec![ExecutorId(5)]);
        assert_eq!(tasks_of(&spec_of(prepared, registry).unwrap()), expected);
        // Handed back (the loop busy) and changed: the change holds.
        let mut back = job();
        back.prepare();
        let back = back.cores(3);
        assert!(!is_prepared(&back));
        let mut changed = tasks_of(&spec_of(back, registry).unwrap());
        for task in &mut changed {
            assert_eq!(task.1, 3);
            task.1 = 2;
        }
        assert_eq!(changed, expected);
        let mut back = job();
        back.prepare();
        let back = back.locality(Vec::new());
        assert!(matches!(
            spec_of(back, registry).unwrap().tasks,
            Tasks::Same { .. }
        ));
        // More locality entries than tasks: left for the loop to refuse.
        let mut too_many = Job::new("f", vec![Bytes::new()])
            .locality(vec![TaskLocality::default(), TaskLocality::default()]);
        too_many.prepare();
        assert!(!is_prepared(&too_many));
        assert!(spec_of(too_many, registry).is_err());
    }

    /// A kept state lets go of the outcome it held: an empty success (nothing allocated, no
    /// drop called) and one whose results hold memory (freed), a failure's reasons too.
    #[test]
    fn a_kept_state_lets_go_of_its_outcome() {
        clear_near();
        let spare = SpareStates::default();
        let owner = Arc::new([7u8; 4]);
        let outcomes = [
            JobOutcome::Succeeded(Vec::new()),
            JobOutcome::Succeeded(vec![Bytes::from_owner(ArcBytes(owner.clone()))]),
            JobOutcome::Succeeded(Vec::with_capacity(4)),
            JobOutcome::Failed(vec!["why".to_owned()]),
            JobOutcome::Cancelled,
        ];
        for outcome in outcomes {
            let state = spare.take();
            state.finish(outcome);
            spare.give(state);
            let state = spare.take();
            assert!(state.lock().outcome.is_none() && !state.is_ended());
            spare.give(state);
        }
        assert_eq!(Arc::strong_count(&owner), 1, "no result is held");
        assert_eq!(kept(&spare), 1, "one state, kept each time");
    }

    /// Empties this thread's own spare states ([`NEAR`]): a test starts without any.
    fn clear_near() {
        NEAR.with(|near| near.borrow_mut().clear());
    }

    /// This thread's own spare states ([`NEAR`]).
    fn near() -> usize {
        NEAR.with(|near| near.borrow().len())
    }

    /// The spare states kept: this thread's own and `spare`'s.
    fn kept(spare: &SpareStates) -> usize {
        near() + spare.lock().len()
    }

    /// Bytes that hold an `Arc` (to see when they are freed).
    struct ArcBytes(Arc<[u8; 4]>);

    impl AsRef<[u8]> for ArcBytes {
        fn as_ref(&self) -> &[u8] {
            &self.0[..]
        }
    }

    /// A job state comes back for a new job only from its last holder, and comes back as new:
    /// no outcome, results, count, cancel or end of the job it served.
    #[test]
    fn a_spare_state_is_kept_only_from_its_last_holder_and_comes_back_new() {
        clear_near();
        let spare = SpareStates::default();
        let first = spare.take();
        let first_ptr = Arc::as_ptr(&first);
        first.task_done();
        first.stream_result(0, Ok(&Bytes::from_static(b"result")));
        first.cancel();
        first.finish(JobOutcome::Succeeded(vec![Bytes::from_static(b"x")]));
        let other_holder = first.clone();
        spare.give(first);
        assert_eq!(kept(&spare), 0, "a state another holds is not kept");
        spare.give(other_holder);
        assert_eq!(
            near(),
            1,
            "its last holder's gives it back, to its thread's own"
        );

        let second = spare.take();
        assert_eq!(Arc::as_ptr(&second), first_ptr, "the spare state is reused");
        assert_eq!(second.tasks_done.load(Ordering::Relaxed), 0);
        assert!(!second.is_cancelled() && !second.is_ended());
        let state = second.lock();
        assert!(state.outcome.is_none() && !state.ended && state.results.is_empty());
        assert!(state.waker.is_none() && state.blocked == 0);
        drop(state);
        assert_eq!(kept(&spare), 0);
        // A streaming job's big queue of results is not kept with its state.
        let big = spare.take();
        for i in 0..=SPARE_RESULTS_MAX as u32 {
            big.task_done();
            big.stream_result(i, Ok(&Bytes::from_static(b"r")));
        }
        spare.give(big);
        let third = spare.take();
        assert_eq!(third.lock().results.capacity(), 0, "its room given back");

        drop(third);
        clear_near();
        for _ in 0..NEAR_STATES_MAX + SPARE_STATES_MAX + 10 {
            spare.give(Arc::new(JobShared::new()));
        }
        assert_eq!(near(), NEAR_STATES_MAX, "the thread's own first, bounded");
        assert_eq!(
            spare.lock().len(),
            SPARE_STATES_MAX,
            "then the driver's, bounded"
        );
        // Taken back in turn: the thread's own, then the driver's.
        for _ in 0..NEAR_STATES_MAX + 1 {
            drop(spare.take());
        }
        assert_eq!(near(), 0);
        assert_eq!(spare.lock().len(), SPARE_STATES_MAX - 1);
    }
}
