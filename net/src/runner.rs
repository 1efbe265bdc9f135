//! Runs launched tasks on the pinned task pool and collects their completions for the event
//! loop, batched. Executors use it for tasks from the wire; local mode uses it in the driver's
//! own process.
//!
//! Completion protocol: a pool worker pushes its [`Completion`] into a bounded lock-free queue,
//! then sets the `kick_pending` flag; only the worker that flips it from false to true calls the
//! `kick` callback (which sends one message to the loop). The loop clears the flag *before* it
//! drains the queue, so a completion pushed during the drain either is drained or flips the flag
//! and kicks again: none is stranded, and while the loop is busy, completions pile up and leave
//! in one batch (one `StatusUpdates` frame, one write).
//!
//! No thread waits on a queue only it drains. Pool workers wait (backpressure) while the queue is
//! full, since the loop drains it. The loop itself completes attempts too: an unknown function,
//! or a task the pool refused (its completion runs as the loop drops it). Those completions go to
//! a separate list the loop owns (`spill`), never into the bounded queue and never with a kick
//! (the loop's own inbox may be full): [`TaskRunner::launch`] returns true when it left one
//! there, and the caller drains after its batch of launches.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use flint_engine::hash::{FxHashMap, FxHashSet};
use flint_engine::pool::{PoolHandle, Task, TaskOutcome};
use flint_engine::runtime::Inbox;

use crate::functions::{Registry, Resolved, TaskContext};
use crate::wire::TaskState;

/// A finished task attempt, ready to report.
#[derive(Debug, Clone)]
pub struct Completion {
    /// The task.
    pub task_id: u64,
    /// The attempt.
    pub attempt: u32,
    /// `Running` when it starts; then `Finished`, `Failed` or `Killed`.
    pub state: TaskState,
    /// The result, or the error text.
    pub data: Bytes,
}

/// Called (from a pool worker) when completions are waiting and the loop was not yet told.
pub type Kick = Arc<dyn Fn() + Send + Sync>;

thread_local! {
    /// Set while [`TaskRunner::launch`] runs on this thread: completions made here (by the loop
    /// that drains the queue) must not wait for the queue or kick the loop.
    static IN_LAUNCH: Cell<bool> = const { Cell::new(false) };
}

struct Shared {
    done: Inbox<Completion>,
    /// Completions made on the draining thread itself, during `launch` (see the module docs).
    /// Only the loop pushes here, and it drains after each batch of launches, so it holds at
    /// most one batch.
    spill: Mutex<Vec<Completion>>,
    kick_pending: AtomicBool,
    kick: Kick,
}

impl Shared {
    fn complete(&self, mut completion: Completion) {
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
    resolved: FxHashMap<Box<str>, Resolved>,
    running: FxHashMap<(u64, u32), TaskContext>,
    shared: Arc<Shared>,
    report_running: bool,
    batch: Vec<Completion>,
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
        let resolved = match self.resolved.get(function) {
            Some(resolved) => Ok(resolved.clone()),
            None => self.registry.resolve(function).inspect(|resolved| {
                self.resolved.insert(function.into(), resolved.clone());
            }),
        };
        let key = (task_id, attempt);
        let Ok(resolved) = resolved.map_err(|error| {
            self.shared.complete(Completion {
                task_id,
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
        self.running.insert(key, ctx.clone());

        let report_running = self.report_running;
        let run_shared = self.shared.clone();
        let done_shared = self.shared.clone();
        let function = resolved.function;
        let executor = self.executor.clone();
        let task = Task::with_completion(
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
                    run_shared.complete(Completion {
                        task_id,
                        attempt,
                        state: TaskState::Running,
                        data: Bytes::new(),
                    });
                }
                let (state, data) = if ctx.is_killed() {
                    (
                        TaskState::Killed,
                        Bytes::from_static(b"killed before it started"),
                    )
                } else {
                    match function(&ctx, payload) {
                        Ok(result) => (TaskState::Finished, result),
                        Err(_) if ctx.is_killed() => {
                            (TaskState::Killed, Bytes::from_static(b"killed"))
                        }
                        Err(error) => {
                            tracing::debug!(reason = %error.0, "task attempt failed");
                            (TaskState::Failed, Bytes::from(error.0))
                        }
                    }
                };
                run_shared.complete(Completion {
                    task_id,
                    attempt,
                    state,
                    data,
                });
            },
            move |outcome| {
                let text = match outcome {
                    TaskOutcome::Finished => return,
                    TaskOutcome::Failed(panic) => format!("task panicked: {panic}"),
                    TaskOutcome::Cancelled => {
                        "not run: the task pool refused or dropped it (full or shutting down)"
                            .to_owned()
                    }
                };
                done_shared.complete(Completion {
                    task_id,
                    attempt,
                    state: TaskState::Failed,
                    data: Bytes::from(text),
                });
            },
        );
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
    pub fn drain(&mut self, mut each: impl FnMut(Completion)) {
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
            if completion.state.is_final() {
                self.finals.insert((completion.task_id, completion.attempt));
                self.completed += 1;
                self.running
                    .remove(&(completion.task_id, completion.attempt));
            }
        }
        for completion in self.batch.drain(..) {
            let key = (completion.task_id, completion.attempt);
            if completion.state.is_final() || !self.finals.contains(&key) {
                each(completion);
            }
        }
    }
}
