//! Runs launched tasks and collects their completions for the event loop, batched. Executors
//! use it for tasks from the wire (one runner per lane); local mode uses it in the driver's own
//! process.
//!
//! Run to completion: a launch of a function whose runs are known to be short (an average under
//! the runner's threshold, [`TaskRunner::set_inline_max`], over at least [`INLINE_RUNS_MIN`]
//! runs) waits in the runner for the loop's own thread, which runs it at its next
//! [`TaskRunner::drain`]: no hand-off to a pool thread and back, no allocation, no atomic
//! read-modify-write. A drain runs such work for at
//! most its round ([`TaskRunner::set_inline_round`]), then returns; what is left waits for the
//! next round ([`TaskRunner::has_waiting`]: the caller comes back after one turn of its loop),
//! so reads, heartbeats and kills are held up at most a round. Whether a function runs inline
//! is decided by what its runs took, never by how busy the loop is, so the same launches take
//! the same path on a fast machine, a loaded one, or under valgrind (`ci/cost` counts on it).
//! Preemption is not the function's fault, and a loaded machine preempts often: an inline run
//! adds at most twice the threshold to its function's average (a stretched run cannot make a
//! short function look long by itself; one that became slow crosses it within a few runs), and
//! a run over [`INLINE_RUN_GIVE_UP`] sends its function to the pool only when the one before it
//! was long too (a preempted run is rarely followed by another: the thread just got a fresh
//! slice). Then the function sits out [`SIT_OUT_RUNS`] runs on the pool, twice as many each
//! time again, so a function that blocks ends up on the pool and holds the loop up at most
//! twice per sit-out.
//!
//! Where the loop must not run such work itself (local mode: the driver's loop), a function
//! whose runs average under [`TaskRunner::set_pool_batches`]'s limit goes to the pool in
//! batches, a few runs to a pool task, each batch reporting its runs together (`batch.rs`).
//!
//! Everything else runs on the pinned task pool. Completion protocol there: a pool worker pushes
//! its [`TaskReport`] into a bounded lock-free queue with the kick protocol
//! ([`crate::runtime::Kicked`]): only the worker whose push finds no kick pending calls the
//! `kick` callback (which wakes the loop once), and none is stranded; while the loop is busy,
//! completions pile up and leave in one batch (one `StatusUpdates` frame, one write). The queue holds two reports for every attempt the runner may hold, so a
//! worker never waits for room in practice; if it must, it yields (backpressure), since only
//! the loop drains. The loop never pushes into that queue: what it completes itself (inline
//! runs, an unknown function, a launch the pool refused) goes to a list it owns.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::clock;
use crate::functions::{Registry, Resolved, TaskContext, TaskError, TaskFn};
use crate::hash::FxHashMap;
use crate::pool::{PoolHandle, Task, TaskOutcome};
use crate::runtime::Kicked;
use crate::scheduler::{Attempt, ExecutorId, StatusUpdate, TaskId, TaskLaunch, TaskState};

/// An attempt's report: what an executor tells the driver about one run of a task. The
/// scheduler's [`StatusUpdate`] is this report with the executor that sent it.
#[derive(Debug, Clone)]
pub struct TaskReport {
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// `Running` when it starts (on the pool); then `Finished`, `Failed` or `Killed`.
    pub state: TaskState,
    /// The result, or the error text.
    pub data: Bytes,
}

impl TaskReport {
    /// The report as the scheduler takes it, from `executor`.
    pub fn into_update(self, executor: ExecutorId) -> StatusUpdate {
        StatusUpdate {
            executor,
            task: self.task,
            attempt: self.attempt,
            state: self.state,
            data: self.data,
        }
    }

    fn failed(launch: &TaskLaunch, why: String) -> TaskReport {
        TaskReport {
            task: launch.task,
            attempt: launch.attempt,
            state: TaskState::Failed,
            data: Bytes::from(why),
        }
    }
}

/// Called (from a pool worker) when completions are waiting and the loop was not yet told.
pub type Kick = Arc<dyn Fn() + Send + Sync>;

/// A function runs inline when its average run is under this, unless set otherwise
/// ([`TaskRunner::set_inline_max`]).
pub const INLINE_RUN_MAX_DEFAULT: Duration = Duration::from_micros(20);
/// Runs a function needs on record before it may run inline.
pub const INLINE_RUNS_MIN: u64 = 8;
/// How long one drain runs inline work at most, unless set otherwise
/// ([`TaskRunner::set_inline_round`]).
pub const INLINE_ROUND_DEFAULT: Duration = Duration::from_micros(100);
/// An inline run longer than this counts as long (see the module docs).
pub const INLINE_RUN_GIVE_UP: Duration = Duration::from_millis(2);
/// Pool runs a function sits out after two long inline runs in a row; each time again doubles
/// it, up to 2^`STRIKES_MAX` times, until `STRIKES_FORGOTTEN` short inline runs in a row.
pub const SIT_OUT_RUNS: u64 = 16;
/// Doublings of [`SIT_OUT_RUNS`] at most.
const STRIKES_MAX: u32 = 12;
/// Short inline runs in a row after which a function's strikes are forgotten.
const STRIKES_FORGOTTEN: u32 = 4096;
/// Function names a runner keeps resolved and timed; another name replaces the oldest.
pub const FUNCTIONS_MAX: usize = 64;

/// How long a function's runs take: an average weighted toward recent runs (1/8 per run).
/// Pool workers and the loop both record into it.
#[derive(Debug, Default)]
struct Timing {
    average_ns: AtomicU64,
    runs: AtomicU64,
}

impl Timing {
    fn record(&self, ns: u64) {
        let runs = self.runs.fetch_add(1, Ordering::Relaxed);
        let average = self.average_ns.load(Ordering::Relaxed);
        let next = if runs == 0 {
            ns
        } else {
            average - average / 8 + ns / 8
        };
        self.average_ns.store(next, Ordering::Relaxed);
    }
}

/// What a function's inline runs have shown: the loop's own record (only the loop's thread
/// runs them, so no atomics).
#[derive(Debug, Default)]
struct InlineRecord {
    /// No inline run before the function's runs reach this (it sits out two long runs).
    after_runs: u64,
    /// The last inline run was long.
    long_before: bool,
    /// Times it was sent to sit out since it last ran short [`STRIKES_FORGOTTEN`] times.
    strikes: u32,
    /// Short inline runs in a row.
    short_streak: u32,
}

/// A function name resolved once, with its timing.
struct Function {
    name: Arc<str>,
    resolved: Resolved,
    timing: Arc<Timing>,
    inline: InlineRecord,
}

impl Function {
    /// Its average run, in nanoseconds.
    fn average_ns(&self) -> u64 {
        self.timing.average_ns.load(Ordering::Relaxed)
    }

    /// Whether a launch of it runs inline: its runs are known, under `max_ns` on average, and
    /// it is not sitting out.
    fn is_short(&self, max_ns: u64) -> bool {
        let runs = self.timing.runs.load(Ordering::Relaxed);
        runs >= INLINE_RUNS_MIN
            && runs >= self.inline.after_runs
            && self.timing.average_ns.load(Ordering::Relaxed) < max_ns
    }

    /// An inline run that took `took_ns`. A long one is not averaged in: a run preempted midway
    /// looks the same, and the run after it rarely is, so only the second long run in a row
    /// sends the function to the pool for a while; returns the runs it sits out then. A short
    /// run adds at most `counted_max_ns` to the average: twice the threshold, so a run that a
    /// preemption stretched cannot make a short function look long by itself, while a function
    /// that became slow crosses the threshold within a few runs.
    #[inline(always)]
    fn ran_inline(&mut self, took_ns: u64, counted_max_ns: u64) -> Option<u64> {
        let record = &mut self.inline;
        if took_ns <= nanos(INLINE_RUN_GIVE_UP) {
            record.long_before = false;
            record.short_streak = record.short_streak.saturating_add(1);
            if record.short_streak >= STRIKES_FORGOTTEN {
                record.strikes = 0;
            }
            self.timing.record(took_ns.min(counted_max_ns));
            return None;
        }
        self.ran_long()
    }

    /// [`Function::ran_inline`] for a long run.
    #[cold]
    #[inline(never)]
    fn ran_long(&mut self) -> Option<u64> {
        let record = &mut self.inline;
        record.short_streak = 0;
        if !std::mem::replace(&mut record.long_before, true) {
            return None;
        }
        record.long_before = false;
        let sit_out = SIT_OUT_RUNS << record.strikes.min(STRIKES_MAX);
        record.strikes = record.strikes.saturating_add(1);
        let runs = self.timing.runs.load(Ordering::Relaxed);
        record.after_runs = runs.saturating_add(sit_out);
        Some(sit_out)
    }
}

/// The functions a runner has resolved: at most [`FUNCTIONS_MAX`], the one found last checked
/// first (a batch's launches usually share one, often the very same `Arc`).
#[derive(Default)]
struct Functions {
    entries: Vec<Function>,
    last: usize,
    /// The entry the next new name replaces once full (the oldest).
    next_out: usize,
    /// Counts the entries replaced: an index taken before is still good while it is the same.
    generation: u32,
}

impl Functions {
    /// The index of `name`'s entry, resolved in `registry` if new.
    #[inline]
    fn find(&mut self, registry: &Registry, name: &Arc<str>) -> Result<usize, TaskError> {
        // Launches mostly share the name of the one before (the same job's, or jobs of one
        // function naming it with one `Arc`): a pointer comparison, inline, for those.
        if (self.entries.get(self.last)).is_some_and(|f| Arc::ptr_eq(&f.name, name)) {
            return Ok(self.last);
        }
        self.find_by_name(registry, name)
    }

    /// [`Functions::find`] past its check of the last entry's name by pointer.
    #[inline(never)]
    fn find_by_name(&mut self, registry: &Registry, name: &Arc<str>) -> Result<usize, TaskError> {
        let same = |f: &Function| Arc::ptr_eq(&f.name, name) || *f.name == **name;
        if self.entries.get(self.last).is_some_and(same) {
            return Ok(self.last);
        }
        if let Some(i) = self.entries.iter().position(same) {
            self.last = i;
            return Ok(i);
        }
        let function = Function {
            name: name.clone(),
            resolved: registry.resolve(name)?,
            timing: Arc::new(Timing::default()),
            inline: InlineRecord::default(),
        };
        let i = if self.entries.len() < FUNCTIONS_MAX {
            self.entries.push(function);
            self.entries.len() - 1
        } else {
            let i = self.next_out;
            self.next_out = (i + 1) % FUNCTIONS_MAX;
            self.entries[i] = function;
            self.generation = self.generation.wrapping_add(1);
            i
        };
        self.last = i;
        Ok(i)
    }
}

/// An attempt on the pool: a task of its own, or a run of a batch (`batch.rs`).
enum OnPool {
    Alone(Arc<PoolAttempt>),
    Batched(Arc<batch::Cells>, u32),
}

impl OnPool {
    /// Asks the attempt to stop (or not to start).
    fn kill(&self) {
        match self {
            OnPool::Alone(cell) => cell.killed.store(true, Ordering::Relaxed),
            OnPool::Batched(cells, index) => cells.kill(*index),
        }
    }
}

/// An attempt on the pool, shared with its pool task.
#[derive(Default)]
struct PoolAttempt {
    killed: AtomicBool,
    /// The runner reported it itself (the pool refused it): its completion says nothing.
    disarmed: AtomicBool,
}

struct Shared {
    done: Kicked<TaskReport>,
    kick: Kick,
}

impl Shared {
    /// A pool worker's completion (never the loop's: see the module docs).
    fn complete(&self, mut completion: TaskReport) {
        loop {
            match self.done.push(completion) {
                Ok(kick) => {
                    if kick {
                        (self.kick)();
                    }
                    return;
                }
                Err(back) => {
                    completion = back;
                    std::thread::yield_now();
                }
            }
        }
    }

    /// A pool worker's completions of one batch, with one kick at most.
    fn complete_all(&self, completions: impl IntoIterator<Item = TaskReport>) {
        let mut kick = false;
        for mut completion in completions {
            loop {
                match self.done.push(completion) {
                    Ok(asked) => {
                        kick |= asked;
                        break;
                    }
                    Err(back) => {
                        completion = back;
                        std::thread::yield_now();
                    }
                }
            }
        }
        if kick {
            (self.kick)();
        }
    }
}

/// Launches tasks inline or on a pool and hands back their completions.
pub struct TaskRunner {
    pool: PoolHandle,
    registry: Registry,
    functions: Functions,
    /// Launches of short functions waiting for the loop's thread, in launch order, each with
    /// its function's entry (and the generation that index belongs to).
    waiting: VecDeque<(TaskLaunch, usize, u32)>,
    /// Attempts on the pool, for kills and to match their reports.
    on_pool: FxHashMap<Attempt, OnPool>,
    /// Launches of functions short enough to go to the pool in batches, gathered until the
    /// next drain ([`TaskRunner::set_pool_batches`]), each with its function's entry (and
    /// the generation that index belongs to).
    gathered: Vec<(TaskLaunch, usize, u32)>,
    /// Functions whose runs average under this (in nanoseconds) go to the pool in batches;
    /// 0: none does.
    pool_batch_max_ns: u64,
    in_flight_max: usize,
    /// Whether short tasks may run on the loop's thread (see the module docs).
    inline: bool,
    inline_round: Duration,
    /// Functions whose runs average under this (in nanoseconds) run inline.
    inline_max_ns: u64,
    /// Completions made on the loop's thread, reported at the next drain.
    done: Vec<TaskReport>,
    shared: Arc<Shared>,
    /// Scratch: the pool's completions of one drain.
    batch: Vec<TaskReport>,
    /// The executor's id, for each pool attempt's span.
    executor: Arc<str>,
}

impl std::fmt::Debug for TaskRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRunner")
            .field("waiting", &self.waiting.len())
            .field("on_pool", &self.on_pool.len())
            .field("gathered", &self.gathered.len())
            .finish_non_exhaustive()
    }
}

impl TaskRunner {
    /// A runner over `pool` for up to `in_flight_max` attempts at once. An attempt on the pool
    /// reports `Running` when it starts, then its final state; one run inline its final state.
    pub fn new(pool: PoolHandle, registry: Registry, in_flight_max: usize, kick: Kick) -> Self {
        let in_flight_max = in_flight_max.max(1);
        let shared = Arc::new(Shared {
            done: Kicked::new(2 * in_flight_max),
            kick,
        });
        TaskRunner {
            pool,
            registry,
            functions: Functions::default(),
            waiting: VecDeque::new(),
            on_pool: FxHashMap::default(),
            gathered: Vec::new(),
            pool_batch_max_ns: 0,
            in_flight_max,
            inline: true,
            inline_round: INLINE_ROUND_DEFAULT,
            inline_max_ns: nanos(INLINE_RUN_MAX_DEFAULT),
            done: Vec::new(),
            shared,
            batch: Vec::new(),
            executor: Arc::from("local"),
        }
    }

    /// Names the executor in each task attempt's span (default `local`).
    pub fn with_executor(mut self, executor: &str) -> Self {
        self.executor = Arc::from(executor);
        self
    }

    /// Whether short tasks may run on the loop's own thread (default true; see the module
    /// docs).
    pub fn set_inline(&mut self, inline: bool) {
        self.inline = inline;
    }

    /// Sends launches of functions whose runs average under `max` to the pool in batches, a
    /// few runs to a pool task, rather than each in a task of its own (default: none; see
    /// `batch.rs`). Such a run reports no `Running`, and its end leaves with its batch's. For
    /// a loop that should not run them itself (local mode's, the driver's own), where a pool
    /// task per run costs about what the run does.
    pub fn set_pool_batches(&mut self, max: Duration) {
        self.pool_batch_max_ns = nanos(max);
    }

    /// How long one drain runs short tasks at most (default [`INLINE_ROUND_DEFAULT`]): what
    /// the loop's other work may wait for them.
    pub fn set_inline_round(&mut self, round: Duration) {
        self.inline_round = round;
    }

    /// Runs inline the functions whose runs average under `max` (default
    /// [`INLINE_RUN_MAX_DEFAULT`]): a loop whose round is long next to it (an executor's lane)
    /// saves the hand-off to a pool thread and back, which costs more than a short run; one that
    /// also schedules (local mode's driver) keeps it low, so its pool runs the work beside it.
    pub fn set_inline_max(&mut self, max: Duration) {
        self.inline_max_ns = nanos(max);
    }

    /// Attempts launched and not yet drained as completions.
    pub fn running(&self) -> usize {
        self.waiting.len() + self.on_pool.len() + self.gathered.len()
    }

    /// Whether short tasks wait for the next drain (the last one's round ran out): the caller
    /// drains again after its loop's next turn.
    pub fn has_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Starts one attempt; its completions come from [`TaskRunner::drain`], which the caller
    /// calls after its batch of launches. The caller never launches an attempt it holds
    /// already (the executor's core drops duplicates, the scheduler makes none). An unknown
    /// function, a launch past the in-flight limit or one the pool refuses fails at once.
    pub fn launch(&mut self, launch: TaskLaunch) {
        self.take(launch);
    }

    /// [`TaskRunner::launch`] for each of `launches`, in order: a batch's moves into the
    /// runner in one loop.
    pub fn launch_all(&mut self, launches: impl IntoIterator<Item = TaskLaunch>) {
        for launch in launches {
            self.take(launch);
        }
    }

    /// [`TaskRunner::launch`]'s work.
    #[inline(always)]
    fn take(&mut self, launch: TaskLaunch) {
        if self.running() >= self.in_flight_max {
            let why = format!(
                "not run: the runner already holds its maximum of {} attempts",
                self.in_flight_max
            );
            return self.refuse(&launch, why);
        }
        let index = match self.functions.find(&self.registry, &launch.function) {
            Ok(index) => index,
            Err(error) => return self.refuse(&launch, error.0),
        };
        let Some(function) = self.functions.entries.get(index) else {
            unreachable!("function {index} was just found");
        };
        if self.inline && function.is_short(self.inline_max_ns) {
            self.waiting
                .push_back((launch, index, self.functions.generation));
        } else if self.pool_batch_max_ns > 0 && function.is_short(self.pool_batch_max_ns) {
            (self.gathered).push((launch, index, self.functions.generation));
        } else {
            self.submit(index, launch);
        }
    }

    /// Fails `launch` at once, for `why` (reported at the next drain).
    #[cold]
    #[inline(never)]
    fn refuse(&mut self, launch: &TaskLaunch, why: String) {
        self.done.push(TaskReport::failed(launch, why));
    }

    /// Hands `launch` of function `index` to the pool.
    #[inline(never)]
    fn submit(&mut self, index: usize, launch: TaskLaunch) {
        let key = Attempt::new(launch.task, launch.attempt);
        let Some(function) = self.functions.entries.get(index) else {
            unreachable!("function {index} was just found");
        };
        let attempt = Arc::new(PoolAttempt::default());
        let task = PoolRun {
            task: launch.task,
            attempt: launch.attempt,
            function: function.resolved.function.clone(),
            argument: function.resolved.argument.clone(),
            timing: function.timing.clone(),
            cell: attempt.clone(),
            shared: self.shared.clone(),
            executor: self.executor.clone(),
        }
        .into_task(launch.payload.clone());
        match self.pool.try_submit(task) {
            Ok(_) => {
                self.on_pool.insert(key, OnPool::Alone(attempt));
            }
            Err(rejected) => {
                attempt.disarmed.store(true, Ordering::Relaxed);
                let why = format!(
                    "not run: the task pool refused it (full or shutting down): {}",
                    rejected.error
                );
                tracing::warn!(task_id = key.task.0, attempt = key.attempt, "{why}");
                drop(rejected);
                self.done.push(TaskReport::failed(&launch, why));
            }
        }
    }

    /// Hands the gathered launches to the pool in batches: each bounded (`batch.rs`), and the
    /// round's spread over the workers.
    #[inline(never)]
    fn send_gathered(&mut self) {
        let workers = self.pool.workers().max(1);
        let per_worker = self.gathered.len().div_ceil(workers);
        let mut gathered = std::mem::take(&mut self.gathered);
        let mut batch = batch::Batch::new();
        for (launch, index, generation) in gathered.drain(..) {
            let index = if generation == self.functions.generation {
                index
            } else {
                // Its entry was replaced since (a round of more functions than are kept).
                match self.functions.find(&self.registry, &launch.function) {
                    Ok(index) => index,
                    Err(error) => {
                        self.refuse(&launch, error.0);
                        continue;
                    }
                }
            };
            if per_worker == 1 {
                // A worker each: every run goes alone, its `Running` report waking the loop
                // ahead of its end (a lone run waited on is faster so).
                self.submit(index, launch);
                continue;
            }
            let Some(function) = self.functions.entries.get(index) else {
                unreachable!("function {index} was just found");
            };
            if batch.len() >= per_worker || !batch.fits(function.average_ns()) {
                self.send_batch(std::mem::replace(&mut batch, batch::Batch::new()));
            }
            let Some(function) = self.functions.entries.get(index) else {
                unreachable!("function {index} was just found");
            };
            let id = (launch.task, launch.attempt);
            batch.push(id, launch.payload, function);
        }
        self.send_batch(batch);
        // The vector's room is kept for the next round.
        self.gathered = gathered;
    }

    /// Hands one batch to the pool; if the pool refuses it, each run fails at once.
    fn send_batch(&mut self, batch: batch::Batch) {
        if batch.len() == 0 {
            return;
        }
        let (task, cells) = batch.into_task(&self.shared);
        match self.pool.try_submit(task) {
            Ok(_) => {
                for (i, &(task, attempt)) in cells.ids().iter().enumerate() {
                    let run = OnPool::Batched(cells.clone(), i as u32);
                    self.on_pool.insert(Attempt::new(task, attempt), run);
                }
            }
            Err(rejected) => {
                cells.disarm();
                let why = format!(
                    "not run: the task pool refused it (full or shutting down): {}",
                    rejected.error
                );
                tracing::warn!(runs = cells.ids().len(), "{why}");
                drop(rejected);
                for &(task, attempt) in cells.ids() {
                    self.done.push(TaskReport {
                        task,
                        attempt,
                        state: TaskState::Failed,
                        data: Bytes::from(why.clone()),
                    });
                }
            }
        }
    }

    /// Runs waiting short attempts on this thread until none is left or the round is over;
    /// their completions join the loop's list.
    fn run_waiting(&mut self) {
        if self.waiting.is_empty() {
            return;
        }
        // One clock reading per run: each run is timed from the end of the one before.
        let mut last = clock::now_ns();
        let round_end = last.saturating_add(nanos(self.inline_round));
        let counted_max_ns = self.inline_max_ns.saturating_mul(2);
        while let Some((launch, index, generation)) = self.waiting.pop_front() {
            let found = if generation == self.functions.generation {
                Ok(index)
            } else {
                self.functions.find(&self.registry, &launch.function)
            };
            let report = match found {
                Ok(index) => {
                    let Some(function) = self.functions.entries.get_mut(index) else {
                        unreachable!("function {index} was just found");
                    };
                    let (task, attempt) = (launch.task, launch.attempt);
                    let (state, data) = run_inline(function, task, attempt, launch.payload);
                    let now = clock::now_ns();
                    let took_ns = now.saturating_sub(last);
                    last = now;
                    if let Some(sit_out) = function.ran_inline(took_ns, counted_max_ns) {
                        log_sit_out(task, took_ns, sit_out);
                    }
                    TaskReport {
                        task,
                        attempt,
                        state,
                        data,
                    }
                }
                // Its entry was replaced since, and the registry changed: not expected.
                Err(error) => TaskReport::failed(&launch, error.0),
            };
            self.done.push(report);
            if last >= round_end {
                break;
            }
        }
    }

    /// Asks an attempt to stop: one on the pool completes as killed; one waiting to run inline
    /// is killed before it starts. Returns whether the runner held it.
    pub fn kill(&mut self, key: Attempt) -> bool {
        if let Some(run) = self.on_pool.get(&key) {
            run.kill();
            return true;
        }
        let gathered = (self.gathered.iter())
            .position(|(l, _, _)| l.task == key.task && l.attempt == key.attempt);
        if let Some(i) = gathered {
            let (launch, _, _) = self.gathered.remove(i);
            self.done.push(killed_before_start(&launch));
            return true;
        }
        let at = self
            .waiting
            .iter()
            .position(|(l, _, _)| l.task == key.task && l.attempt == key.attempt);
        let Some((launch, _, _)) = at.and_then(|i| self.waiting.remove(i)) else {
            return false;
        };
        self.done.push(killed_before_start(&launch));
        true
    }

    /// Asks every attempt to stop.
    pub fn kill_all(&mut self) {
        for run in self.on_pool.values() {
            run.kill();
        }
        for (launch, _, _) in std::mem::take(&mut self.gathered) {
            self.done.push(killed_before_start(&launch));
        }
        while let Some((launch, _, _)) = self.waiting.pop_front() {
            self.done.push(killed_before_start(&launch));
        }
    }

    /// Runs waiting short attempts (for a round at most), then appends every completion to
    /// `out`: the loop's own first, then the pool's in completion order (an empty `out` takes
    /// over the loop's list, so nothing is copied). A pool attempt's `Running` report whose
    /// final state is in the same batch is left out: the final state says more. Call it after
    /// a batch of launches and when the `kick` callback's message arrives; if
    /// [`TaskRunner::has_waiting`] then, call it again after the loop's next turn.
    pub fn drain(&mut self, out: &mut Vec<TaskReport>) {
        if !self.gathered.is_empty() {
            self.send_gathered();
        }
        self.run_waiting();
        if out.is_empty() {
            std::mem::swap(out, &mut self.done);
        } else {
            out.append(&mut self.done);
        }
        if !self.on_pool.is_empty() {
            self.drain_pool(out);
        }
    }

    /// [`TaskRunner::drain`]'s part for the pool's completions.
    #[inline(never)]
    fn drain_pool(&mut self, out: &mut Vec<TaskReport>) {
        // At most one queue's worth per call, so a flood of completions cannot starve the loop;
        // if some are left, the loop is kicked again to come back for them.
        let batch = &mut self.batch;
        if self.shared.done.drain(|completion| batch.push(completion)) {
            (self.shared.kick)();
        }
        for completion in &self.batch {
            if completion.state != TaskState::Running {
                self.on_pool
                    .remove(&Attempt::new(completion.task, completion.attempt));
            }
        }
        let on_pool = &self.on_pool;
        out.extend(self.batch.drain(..).filter(|completion| {
            let key = Attempt::new(completion.task, completion.attempt);
            completion.state != TaskState::Running || on_pool.contains_key(&key)
        }));
    }
}

/// Says that `task`'s function runs on the pool for `sit_out` runs: its inline run took
/// `took_ns`, long, as the one before it.
#[cold]
#[inline(never)]
fn log_sit_out(task: TaskId, took_ns: u64, sit_out: u64) {
    tracing::info!(
        task_id = task.0,
        took_us = took_ns / 1_000,
        sit_out,
        "a task expected to be short ran long inline twice in a row; its function runs on the \
         pool for a while"
    );
}

/// The report of a waiting attempt killed before it ran.
fn killed_before_start(launch: &TaskLaunch) -> TaskReport {
    TaskReport {
        task: launch.task,
        attempt: launch.attempt,
        state: TaskState::Killed,
        data: Bytes::from_static(b"killed before it started"),
    }
}

/// Runs a short attempt here, on the loop's thread: its state and data (a panic fails it).
fn run_inline(
    function: &Function,
    task: TaskId,
    attempt: u32,
    payload: Bytes,
) -> (TaskState, Bytes) {
    let ctx = TaskContext::new(task.0, attempt, function.resolved.argument.as_deref());
    let run = &function.resolved.function;
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&ctx, payload)));
    run_ended(result, || false)
}

/// A run's state and data from what its call gave back (`Err`: it panicked); `killed` says
/// whether it was asked to stop, and so whether an error it returned is its kill's.
#[inline(always)]
fn run_ended(
    result: std::thread::Result<Result<Bytes, TaskError>>,
    killed: impl FnOnce() -> bool,
) -> (TaskState, Bytes) {
    match result {
        Ok(Ok(result)) => (TaskState::Finished, result),
        Ok(Err(_)) if killed() => (TaskState::Killed, Bytes::from_static(b"killed")),
        Ok(Err(error)) => (TaskState::Failed, Bytes::from(error.0)),
        Err(panic) => (
            TaskState::Failed,
            Bytes::from(format!("task panicked: {}", panic_text(panic.as_ref()))),
        ),
    }
}

/// What a pool task carries to run one attempt and report it.
struct PoolRun {
    task: TaskId,
    attempt: u32,
    function: TaskFn,
    argument: Option<Arc<str>>,
    timing: Arc<Timing>,
    cell: Arc<PoolAttempt>,
    shared: Arc<Shared>,
    executor: Arc<str>,
}

impl PoolRun {
    /// The pool task: it reports running, runs (unless killed first), times the run and
    /// reports its end; its completion reports a panic or a drop unrun, unless disarmed.
    fn into_task(self, payload: Bytes) -> Task {
        let (task, attempt) = (self.task, self.attempt);
        let (shared, cell) = (self.shared.clone(), self.cell.clone());
        Task::with_completion(
            move || self.run(payload),
            move |outcome| {
                let Some(text) = pool_failure_text(outcome) else {
                    return;
                };
                if !cell.disarmed.load(Ordering::Relaxed) {
                    shared.complete(TaskReport {
                        task,
                        attempt,
                        state: TaskState::Failed,
                        data: Bytes::from(text),
                    });
                }
            },
        )
    }

    fn run(self, payload: Bytes) {
        // A span per attempt (debug: off unless asked, then it costs nothing).
        let span = tracing::debug_span!(
            "task_attempt",
            job = self.task.0 >> 32,
            task = self.task.0 as u32,
            attempt = self.attempt,
            executor = &*self.executor
        );
        let _entered = span.enter();
        let report = |state, data| TaskReport {
            task: self.task,
            attempt: self.attempt,
            state,
            data,
        };
        self.shared
            .complete(report(TaskState::Running, Bytes::new()));
        let (state, data) = self.run_attempt(payload);
        self.shared.complete(report(state, data));
    }

    /// Runs the attempt (unless killed before it started), timing it; returns the state and
    /// data it reports.
    fn run_attempt(&self, payload: Bytes) -> (TaskState, Bytes) {
        let ctx = TaskContext::killable(
            self.task.0,
            self.attempt,
            self.argument.as_deref(),
            &self.cell.killed,
        );
        if ctx.is_killed() {
            return (
                TaskState::Killed,
                Bytes::from_static(b"killed before it started"),
            );
        }
        let started = clock::now_ns();
        let result = (self.function)(&ctx, payload);
        self.timing.record(clock::elapsed_ns(started));
        // A panic goes on to the pool, whose completion reports it.
        let (state, data) = run_ended(Ok(result), || ctx.is_killed());
        if state == TaskState::Failed {
            tracing::debug!(reason = %String::from_utf8_lossy(&data), "task attempt failed");
        }
        (state, data)
    }
}

/// `duration` in nanoseconds (saturating; the runner's limits are far below `u64::MAX` ns).
const fn nanos(duration: Duration) -> u64 {
    let ns = duration.as_nanos();
    if ns > u64::MAX as u128 {
        u64::MAX
    } else {
        ns as u64
    }
}

/// A panic's message, as the pool reports it.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "(a panic without a message)".to_owned()
    }
}

/// Why the pool did not finish an attempt (it panicked, or was dropped unrun), or None if it
/// finished (and reported itself).
fn pool_failure_text(outcome: TaskOutcome) -> Option<String> {
    match outcome {
        TaskOutcome::Finished => None,
        TaskOutcome::Failed(panic) => Some(format!("task panicked: {panic}")),
        TaskOutcome::Cancelled => {
            Some("not run: the task pool dropped it (shutting down)".to_owned())
        }
    }
}

mod batch;
#[cfg(test)]
mod tests;
