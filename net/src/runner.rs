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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

struct Shared {
    done: Inbox<Completion>,
    kick_pending: AtomicBool,
    kick: Kick,
}

impl Shared {
    fn complete(&self, mut completion: Completion) {
        // The queue holds as many completions as tasks may be in flight; if the loop is behind,
        // the worker waits here (backpressure) rather than dropping a result.
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
        }
    }

    /// Attempts that have reached a final state so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Attempts launched and not yet drained as completions.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Starts one attempt. An unknown function or a full pool completes it at once as failed.
    pub fn launch(&mut self, task_id: u64, attempt: u32, function: &str, payload: Bytes) {
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
        let task = Task::with_completion(
            move || {
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
                        Err(error) => (TaskState::Failed, Bytes::from(error.0)),
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
        // At most one queue's worth per call, so a flood of completions cannot starve the loop;
        // if some are left, the loop is kicked again to come back for them.
        let batch_max = self.shared.done.capacity();
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
