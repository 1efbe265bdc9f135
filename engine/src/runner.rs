//! Runs launched tasks on the pinned task pool and collects their completions for the event
//! loop, batched. Executors use it for tasks from the wire; local mode uses it in the driver's
//! own process.
//!
//! Completion protocol: a pool worker pushes its [`TaskReport`] into a bounded lock-free queue,
//! then sets the `kick_pending` flag; only the worker that flips it from false to true calls the
//! `kick` callback (which sends one message to the loop). The loop clears the flag *before* it
//! drains the queue, so a completion pushed during the drain either is drained or flips the flag
//! and kicks again: none is stranded, and while the loop is busy, completions pile up and leave
//! in one batch (one `StatusUpdates` frame, one write).
//!
//! Run to completion: a launch of a function whose runs are known to be short (an average under
//! [`INLINE_RUN_MAX`] over at least [`INLINE_RUNS_MIN`] runs) runs on the loop's own thread when
//! the pool has nothing in flight, at most [`INLINE_BATCH_MAX`] of such work per drain, so a lone
//! short task costs no hand-off to a pool thread and back. Its completion goes to the `spill`
//! list below, as if it had failed at once. A run that turns out long (over
//! [`INLINE_RUN_GIVE_UP`]) stops that function from running inline again, so heartbeats and
//! kill requests are held up at most that once. Panics are caught as on the pool.
//!
//! No thread waits on a queue only it drains. Pool workers wait (backpressure) while the queue is
//! full, since the loop drains it. The loop itself completes attempts too: an unknown function,
//! or a task the pool refused (its completion runs as the loop drops it). Those completions go to
//! a separate list the loop owns (`spill`), never into the bounded queue and never with a kick
//! (the loop's own inbox may be full): [`TaskRunner::launch`] returns true when it left one
//! there, and the caller drains after its batch of launches.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::functions::{Registry, Resolved, TaskContext, TaskError, TaskFn};
use crate::hash::{FxHashMap, FxHashSet};
use crate::pool::{PoolHandle, Task, TaskOutcome};
use crate::runtime::Inbox;
use crate::scheduler::{ExecutorId, StatusUpdate, TaskId, TaskState};

/// An attempt's report: what an executor tells the driver about one run of a task. The
/// scheduler's [`StatusUpdate`] is this report with the executor that sent it.
#[derive(Debug, Clone)]
pub struct TaskReport {
    /// The task.
    pub task: TaskId,
    /// The attempt.
    pub attempt: u32,
    /// `Running` when it starts; then `Finished`, `Failed` or `Killed`.
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
}

/// Called (from a pool worker) when completions are waiting and the loop was not yet told.
pub type Kick = Arc<dyn Fn() + Send + Sync>;

/// A function runs inline when its average run is under this.
pub const INLINE_RUN_MAX: Duration = Duration::from_micros(20);
/// Runs a function needs on record before it may run inline.
pub const INLINE_RUNS_MIN: u64 = 8;
/// Inline work the loop does between two drains, at most (judged by the averages).
pub const INLINE_BATCH_MAX: Duration = Duration::from_micros(100);
/// An inline run longer than this stops its function from running inline again.
pub const INLINE_RUN_GIVE_UP: Duration = Duration::from_millis(2);

/// How long a function's runs take: an average weighted toward recent runs (1/8 per run).
#[derive(Debug, Default)]
struct Timing {
    average_ns: AtomicU64,
    runs: AtomicU64,
    /// Never inline again (a run was much longer than its average).
    long: AtomicBool,
}

impl Timing {
    fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let runs = self.runs.fetch_add(1, Ordering::Relaxed);
        let average = self.average_ns.load(Ordering::Relaxed);
        let next = if runs == 0 {
            ns
        } else {
            average - average / 8 + ns / 8
        };
        self.average_ns.store(next, Ordering::Relaxed);
    }

    fn is_short(&self) -> bool {
        !self.long.load(Ordering::Relaxed)
            && self.runs.load(Ordering::Relaxed) >= INLINE_RUNS_MIN
            && self.average_ns.load(Ordering::Relaxed) < INLINE_RUN_MAX.as_nanos() as u64
    }

    fn average(&self) -> Duration {
        Duration::from_nanos(self.average_ns.load(Ordering::Relaxed))
    }
}

thread_local! {
    /// Set while [`TaskRunner::launch`] runs on this thread: completions made here (by the loop
    /// that drains the queue) must not wait for the queue or kick the loop.
    static IN_LAUNCH: Cell<bool> = const { Cell::new(false) };
}

struct Shared {
    done: Inbox<TaskReport>,
    /// Completions made on the draining thread itself, during `launch` (see the module docs).
    /// Only the loop pushes here, and it drains after each batch of launches, so it holds at
    /// most one batch.
    spill: Mutex<Vec<TaskReport>>,
    kick_pending: AtomicBool,
    kick: Kick,
}

impl Shared {
    fn complete(&self, mut completion: TaskReport) {
        if IN_LAUNCH.with(Cell::get) {
            self.spill
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(completion);
            return;
        }
        // The queue holds as many completions as tasks may be in flight; if the loop is behind,
        // the worker waits here (backpressure) rather than dropping a result. Only pool workers
        // get here: the loop never waits on the queue it drains.
        loop {
            match self.done.push(completion) {
                Ok(_) => break,
                Err(back) => {
                    completion = back;
                    std::thread::yield_now();
                }
            }
        }
        if !self.kick_pending.swap(true, Ordering::SeqCst) {
            (self.kick)();
        }
    }
}

/// Launches tasks on a pool and hands back their completions.
pub struct TaskRunner {
    pool: PoolHandle,
    registry: Registry,
    resolved: FxHashMap<Box<str>, (Resolved, Arc<Timing>)>,
    running: FxHashMap<(u64, u32), TaskContext>,
    /// Whether short tasks may run on the loop's thread (see the module docs).
    inline: bool,
    /// Inline work done since the last drain (by the averages).
    inline_spent: Duration,
    shared: Arc<Shared>,
    report_running: bool,
    batch: Vec<TaskReport>,
    finals: FxHashSet<(u64, u32)>,
    completed: u64,
    /// The executor's id, for each attempt's span.
    executor: Arc<str>,
}

impl std::fmt::Debug for TaskRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskRunner")
            .field("running", &self.running.len())
            .finish_non_exhaustive()
    }
}

impl TaskRunner {
    /// A runner over `pool` for up to `in_flight_max` attempts at once. Each attempt
    /// reports `Running` when it starts, then its final state.
    pub fn new(pool: PoolHandle, registry: Registry, in_flight_max: usize, kick: Kick) -> Self {
        let shared = Arc::new(Shared {
            done: Inbox::new(2 * in_flight_max.max(1)),
            spill: Mutex::new(Vec::new()),
            kick_pending: AtomicBool::new(false),
            kick,
        });
        TaskRunner {
            pool,
            registry,
            resolved: FxHashMap::default(),
            running: FxHashMap::default(),
            inline: true,
            inline_spent: Duration::ZERO,
            shared,
            report_running: true,
            batch: Vec::new(),
            finals: FxHashSet::default(),
            completed: 0,
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

    /// Attempts that have reached a final state so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Attempts launched and not yet drained as completions.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Starts one attempt. An unknown function or a full pool completes it at once as failed;
    /// then it returns true, and the caller must [`TaskRunner::drain`] after its batch of
    /// launches (no kick comes for those completions).
    pub fn launch(&mut self, task_id: u64, attempt: u32, function: &str, payload: Bytes) -> bool {
        /// Marks this thread as launching until dropped (also on a panic).
        struct Launching;
        impl Drop for Launching {
            fn drop(&mut self) {
                IN_LAUNCH.with(|f| f.set(false));
            }
        }
        IN_LAUNCH.with(|f| f.set(true));
        let _launching = Launching;
        self.launch_inner(task_id, attempt, function, payload);
        !self
            .shared
            .spill
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    fn launch_inner(&mut self, task_id: u64, attempt: u32, function: &str, payload: Bytes) {
        let resolved = self.resolve_cached(function);
        let key = (task_id, attempt);
        let Ok((resolved, timing)) = resolved.map_err(|error| {
            self.shared.complete(TaskReport {
                task: TaskId(task_id),
                attempt,
                state: TaskState::Failed,
                data: Bytes::from(error.0),
            })
        }) else {
            return;
        };
        if self.running.contains_key(&key) {
            tracing::warn!(task_id, attempt, "duplicate launch ignored");
            return;
        }
        let ctx = TaskContext::new(task_id, attempt, resolved.argument.clone());
        if self.inline
            && self.running.is_empty()
            && timing.is_short()
            && self.inline_spent + timing.average() <= INLINE_BATCH_MAX
        {
            self.inline_spent += timing.average();
            return self.run_inline(&ctx, &resolved, &timing, payload);
        }
        self.running.insert(key, ctx.clone());
        let task = self.pool_task(ctx, resolved.function, timing, payload);
        if let Err(rejected) = self.pool.try_submit(task) {
            // Dropping the rejected task reports it through its completion as cancelled.
            tracing::warn!(
                task_id,
                attempt,
                "task pool refused a task: {}",
                rejected.error
            );
        }
    }

    /// The pool task running attempt `ctx` of `function` (timed into `timing`) on `payload`:
    /// it reports running (if asked) and its end; its completion reports a panic or a refusal.
    fn pool_task(
        &self,
        ctx: TaskContext,
        function: TaskFn,
        timing: Arc<Timing>,
        payload: Bytes,
    ) -> Task {
        let (task_id, attempt) = (ctx.task_id, ctx.attempt);
        let report_running = self.report_running;
        let run_shared = self.shared.clone();
        let done_shared = self.shared.clone();
        let executor = self.executor.clone();
        Task::with_completion(
            move || {
                // A span per attempt (debug: off unless asked, then it costs nothing).
                let span = tracing::debug_span!(
                    "task_attempt",
                    job = task_id >> 32,
                    task = task_id as u32,
                    attempt,
                    executor = &*executor
                );
                let _entered = span.enter();
                if report_running {
                    run_shared.complete(TaskReport {
                        task: TaskId(task_id),
                        attempt,
                        state: TaskState::Running,
                        data: Bytes::new(),
                    });
                }
                let (state, data) = run_on_pool(&ctx, &function, &timing, payload);
                run_shared.complete(TaskReport {
                    task: TaskId(task_id),
                    attempt,
                    state,
                    data,
                });
            },
            move |outcome| {
                let Some(text) = pool_failure_text(outcome) else {
                    return;
                };
                done_shared.complete(TaskReport {
                    task: TaskId(task_id),
                    attempt,
                    state: TaskState::Failed,
                    data: Bytes::from(text),
                });
            },
        )
    }

    /// The function named `function` with its timing, resolved once and then cached.
    fn resolve_cached(&mut self, function: &str) -> Result<(Resolved, Arc<Timing>), TaskError> {
        match self.resolved.get(function) {
            Some(resolved) => Ok(resolved.clone()),
            None => self.registry.resolve(function).map(|resolved| {
                let entry = (resolved, Arc::new(Timing::default()));
                self.resolved.insert(function.into(), entry.clone());
                entry
            }),
        }
    }

    /// Runs a short attempt here, on the loop's thread; its completion goes to the spill list
    /// (this runs inside `launch`).
    fn run_inline(
        &mut self,
        ctx: &TaskContext,
        resolved: &Resolved,
        timing: &Timing,
        payload: Bytes,
    ) {
        let function = resolved.function.clone();
        let started = Instant::now();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| function(ctx, payload)));
        let took = started.elapsed();
        timing.record(took);
        if took > INLINE_RUN_GIVE_UP {
            timing.long.store(true, Ordering::Relaxed);
            tracing::info!(
                task_id = ctx.task_id,
                took_us = took.as_micros() as u64,
                "a task expected to be short ran long inline; its function now runs on the pool"
            );
        }
        let (state, data) = match result {
            Ok(Ok(result)) => (TaskState::Finished, result),
            Ok(Err(error)) => (TaskState::Failed, Bytes::from(error.0)),
            Err(panic) => (
                TaskState::Failed,
                Bytes::from(format!("task panicked: {}", panic_text(panic.as_ref()))),
            ),
        };
        self.shared.complete(TaskReport {
            task: TaskId(ctx.task_id),
            attempt: ctx.attempt,
            state,
            data,
        });
    }

    /// Asks a running attempt to stop; it completes as killed.
    pub fn kill(&mut self, task_id: u64, attempt: u32) -> bool {
        match self.running.get(&(task_id, attempt)) {
            Some(ctx) => {
                ctx.kill();
                true
            }
            None => false,
        }
    }

    /// Asks every running attempt to stop.
    pub fn kill_all(&mut self) {
        self.running.values().for_each(TaskContext::kill);
    }

    /// Hands every waiting completion to `each`, in completion order. A `Running` report whose
    /// final state is in the same batch is left out: the final state says more. Call it on the
    /// loop when the `kick` callback's message arrives.
    pub fn drain(&mut self, mut each: impl FnMut(TaskReport)) {
        self.inline_spent = Duration::ZERO;
        self.shared.kick_pending.store(false, Ordering::SeqCst);
        self.batch
            .append(&mut self.shared.spill.lock().unwrap_or_else(|p| p.into_inner()));
        // At most one queue's worth per call, so a flood of completions cannot starve the loop;
        // if some are left, the loop is kicked again to come back for them.
        let batch_max = self.shared.done.capacity() + self.batch.len();
        while self.batch.len() < batch_max {
            let Some(completion) = self.shared.done.pop() else {
                break;
            };
            self.batch.push(completion);
        }
        if !self.shared.done.is_empty() && !self.shared.kick_pending.swap(true, Ordering::SeqCst) {
            (self.shared.kick)();
        }
        self.finals.clear();
        for completion in &self.batch {
            if completion.state != TaskState::Running {
                self.finals.insert((completion.task.0, completion.attempt));
                self.completed += 1;
                self.running
                    .remove(&(completion.task.0, completion.attempt));
            }
        }
        for completion in self.batch.drain(..) {
            let key = (completion.task.0, completion.attempt);
            if completion.state != TaskState::Running || !self.finals.contains(&key) {
                each(completion);
            }
        }
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

/// Runs an attempt on the pool (unless killed before it started), timing it; returns the state
/// and data it reports.
fn run_on_pool(
    ctx: &TaskContext,
    function: &TaskFn,
    timing: &Timing,
    payload: Bytes,
) -> (TaskState, Bytes) {
    if ctx.is_killed() {
        return (
            TaskState::Killed,
            Bytes::from_static(b"killed before it started"),
        );
    }
    let started = Instant::now();
    let result = function(ctx, payload);
    timing.record(started.elapsed());
    match result {
        Ok(result) => (TaskState::Finished, result),
        Err(_) if ctx.is_killed() => (TaskState::Killed, Bytes::from_static(b"killed")),
        Err(error) => {
            tracing::debug!(reason = %error.0, "task attempt failed");
            (TaskState::Failed, Bytes::from(error.0))
        }
    }
}

/// Why the pool did not finish an attempt (it panicked, or was refused or dropped), or None
/// if it finished (and reported itself).
fn pool_failure_text(outcome: TaskOutcome) -> Option<String> {
    match outcome {
        TaskOutcome::Finished => None,
        TaskOutcome::Failed(panic) => Some(format!("task panicked: {panic}")),
        TaskOutcome::Cancelled => {
            Some("not run: the task pool refused or dropped it (full or shutting down)".to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{PoolConfig, ShutdownMode, TaskPool};
    use std::sync::atomic::AtomicUsize;

    /// A runner over a one-worker pool, and how many kicks it made.
    fn runner(pool: &TaskPool) -> (TaskRunner, Arc<AtomicUsize>) {
        let kicks = Arc::new(AtomicUsize::new(0));
        let counter = kicks.clone();
        let kick: Kick = Arc::new(move || {
            counter.fetch_add(1, Ordering::SeqCst);
        });
        let mut registry = Registry::with_builtins();
        registry.register("boom", |_, _| panic!("boom"));
        (TaskRunner::new(pool.handle(), registry, 64, kick), kicks)
    }

    /// Drains until `n` final completions came (the pool's finish asynchronously).
    fn finals(runner: &mut TaskRunner, n: usize) -> Vec<TaskReport> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut done = Vec::new();
        while done.len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} completions",
                done.len()
            );
            runner.drain(|c| {
                if c.state != TaskState::Running {
                    done.push(c);
                }
            });
            std::thread::yield_now();
        }
        done
    }

    #[test]
    fn a_known_short_function_runs_inline_and_a_slow_one_on_the_pool() {
        let mut pool = TaskPool::new(PoolConfig {
            workers: 1,
            ..PoolConfig::default()
        })
        .expect("pool");
        let (mut runner, _kicks) = runner(&pool);
        // Unknown timing: the first runs go to the pool.
        for i in 0..INLINE_RUNS_MIN {
            assert!(
                !runner.launch(i, 0, "noop", Bytes::new()),
                "run {i} is not inline"
            );
            finals(&mut runner, 1);
        }
        // Now known to be short: it completes inside `launch`, on this thread.
        assert!(runner.launch(100, 0, "noop", Bytes::new()), "inline");
        let done = finals(&mut runner, 1);
        assert_eq!((done[0].task.0, done[0].state), (100, TaskState::Finished));
        // A slow function never qualifies.
        for i in 0..INLINE_RUNS_MIN + 1 {
            assert!(!runner.launch(200 + i, 0, "sleep:1", Bytes::new()));
            finals(&mut runner, 1);
        }
        pool.shutdown(ShutdownMode::Drain);
    }

    #[test]
    fn an_inline_panic_fails_its_attempt_and_the_loop_goes_on() {
        let mut pool = TaskPool::new(PoolConfig {
            workers: 1,
            ..PoolConfig::default()
        })
        .expect("pool");
        let (mut runner, _kicks) = runner(&pool);
        let timing = Arc::new(Timing::default());
        for _ in 0..INLINE_RUNS_MIN {
            timing.record(Duration::from_micros(1));
        }
        let resolved = runner.registry.resolve("boom").expect("registered");
        runner.resolved.insert("boom".into(), (resolved, timing));
        assert!(runner.launch(7, 1, "boom", Bytes::new()), "inline");
        let done = finals(&mut runner, 1);
        assert_eq!(done[0].state, TaskState::Failed);
        assert_eq!(&done[0].data[..], b"task panicked: boom");
        pool.shutdown(ShutdownMode::Drain);
    }
}
