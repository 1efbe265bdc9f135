//! Short pool runs handed over in batches ([`TaskRunner::set_pool_batches`]): the runner
//! gathers a round's launches of functions known to be short and gives the pool a few tasks
//! that each run several of them in turn, the way an executor's lane runs what one frame
//! brought. A run then costs its call and its report, not a task of its own (an allocation,
//! the reference counts of what it carries, an inbox push, a `Running` report), and a batch's
//! reports leave together, with one kick at most. A batch is bounded in runs
//! ([`BATCH_RUNS_MAX`]) and in expected time ([`BATCH_NS_MAX`], by its functions' averages),
//! so a report waits for little more than that, and a round's launches are spread over the
//! pool's workers.
//!
//! Kills: each run has its flag in the batch's [`Cells`]; a run killed before it starts
//! reports so without running, one running sees its flag as a pool run does. A run that
//! panics fails alone; a batch the pool drops unrun (shutting down) fails every run.
//!
//! The price: a batch's runs are one pool task, so no idle worker steals them. A run that takes
//! far longer than its function's average holds up the start and the reports of the runs
//! after it in its batch (a few, by [`BATCH_NS_MAX`]), as a long inline run holds up an
//! executor lane's; one that never returns holds them for good (their jobs still end when
//! cancelled or at their deadlines).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::{run_ended, Function, Shared, TaskReport, Timing};
use crate::clock;
use crate::functions::{TaskContext, TaskFn};
use crate::pool::{Task, TaskOutcome};
use crate::scheduler::{TaskId, TaskState};

/// Runs one batch holds at most.
pub(super) const BATCH_RUNS_MAX: usize = 64;
/// What one batch's runs are expected to take at most, by their functions' averages (a
/// batch always takes one run).
pub(super) const BATCH_NS_MAX: u64 = 200_000;

/// What the runner keeps of a batch on the pool: its runs' ids and kill flags.
pub(super) struct Cells {
    ids: Box<[(TaskId, u32)]>,
    killed: Box<[AtomicBool]>,
    /// The runner reported every run itself (the pool refused the batch).
    disarmed: AtomicBool,
}

impl Cells {
    /// Asks run `index` to stop (or not to start).
    pub(super) fn kill(&self, index: u32) {
        if let Some(flag) = self.killed.get(index as usize) {
            flag.store(true, Ordering::Relaxed);
        }
    }

    /// The runner reported the batch's runs itself: its completion says nothing.
    pub(super) fn disarm(&self) {
        self.disarmed.store(true, Ordering::Relaxed);
    }

    /// Each run's id, in the batch's order.
    pub(super) fn ids(&self) -> &[(TaskId, u32)] {
        &self.ids
    }
}

/// One run of a batch: its attempt, payload and function (an index in the batch's list).
struct Run {
    task: TaskId,
    attempt: u32,
    payload: Bytes,
    function: u32,
}

/// A function as a batch carries it: once per batch, not per run.
struct Callable {
    function: TaskFn,
    argument: Option<Arc<str>>,
    timing: Arc<Timing>,
}

/// A batch being put together, then handed to the pool as one task.
pub(super) struct Batch {
    runs: Vec<Run>,
    /// Each function its runs call, once (told apart by their timing records, one per
    /// function entry the runner keeps).
    callables: Vec<Callable>,
    expected_ns: u64,
}

impl Batch {
    pub(super) fn new() -> Batch {
        Batch {
            runs: Vec::new(),
            callables: Vec::new(),
            expected_ns: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.runs.len()
    }

    /// Whether a run expected to take `ns` still fits.
    pub(super) fn fits(&self, ns: u64) -> bool {
        self.runs.is_empty()
            || (self.runs.len() < BATCH_RUNS_MAX
                && self.expected_ns.saturating_add(ns) <= BATCH_NS_MAX)
    }

    /// Adds a run of `function`.
    pub(super) fn push(
        &mut self,
        (task, attempt): (TaskId, u32),
        payload: Bytes,
        function: &Function,
    ) {
        let same = |c: &Callable| Arc::ptr_eq(&c.timing, &function.timing);
        let index = match self.callables.iter().rposition(same) {
            Some(at) => at,
            None => {
                self.callables.push(Callable {
                    function: function.resolved.function.clone(),
                    argument: function.resolved.argument.clone(),
                    timing: function.timing.clone(),
                });
                self.callables.len() - 1
            }
        };
        self.expected_ns = (self.expected_ns).saturating_add(function.average_ns());
        self.runs.push(Run {
            task,
            attempt,
            payload,
            function: index as u32,
        });
    }

    /// The pool task that runs the batch and reports it through `shared`, and its cells.
    pub(super) fn into_task(self, shared: &Arc<Shared>) -> (Task, Arc<Cells>) {
        let ids: Box<[(TaskId, u32)]> = self.runs.iter().map(|r| (r.task, r.attempt)).collect();
        let killed = self.runs.iter().map(|_| AtomicBool::new(false)).collect();
        let cells = Arc::new(Cells {
            ids,
            killed,
            disarmed: AtomicBool::new(false),
        });
        let (run_cells, done_cells) = (cells.clone(), cells.clone());
        let (run_shared, done_shared) = (shared.clone(), shared.clone());
        let task = Task::with_completion(
            move || self.run(&run_cells, &run_shared),
            move |outcome| {
                // The runs report themselves unless the batch never ran.
                let why = match outcome {
                    TaskOutcome::Finished => return,
                    TaskOutcome::Failed(panic) => format!("task panicked: {panic}"),
                    TaskOutcome::Cancelled => {
                        "not run: the task pool dropped it (shutting down)".to_owned()
                    }
                };
                if done_cells.disarmed.load(Ordering::Relaxed) {
                    return;
                }
                done_shared.complete_all(done_cells.ids.iter().map(|&(task, attempt)| {
                    TaskReport {
                        task,
                        attempt,
                        state: TaskState::Failed,
                        data: Bytes::from(why.clone()),
                    }
                }));
            },
        );
        (task, cells)
    }

    /// Runs every run in turn, then reports them together (so a run that takes much longer
    /// than its function's average holds up its batch-mates' reports, as a long inline run
    /// holds up an executor lane's).
    fn run(self, cells: &Cells, shared: &Shared) {
        let mut reports = Vec::with_capacity(self.runs.len());
        for (run, killed) in self.runs.into_iter().zip(cells.killed.iter()) {
            let Some(callable) = self.callables.get(run.function as usize) else {
                unreachable!("function {} beyond the batch's list", run.function);
            };
            let (task, attempt) = (run.task, run.attempt);
            let (state, data) = run_one(callable, run, killed);
            reports.push(TaskReport {
                task,
                attempt,
                state,
                data,
            });
        }
        shared.complete_all(reports);
    }
}

/// Runs `run` (unless killed before it starts), timing it: its state and data. A panic fails
/// it alone.
fn run_one(callable: &Callable, run: Run, killed: &AtomicBool) -> (TaskState, Bytes) {
    let argument = callable.argument.as_deref();
    let ctx = TaskContext::killable(run.task.0, run.attempt, argument, killed);
    if ctx.is_killed() {
        return (
            TaskState::Killed,
            Bytes::from_static(b"killed before it started"),
        );
    }
    let started = clock::now_ns();
    let call = std::panic::AssertUnwindSafe(|| (callable.function)(&ctx, run.payload));
    let result = std::panic::catch_unwind(call);
    callable.timing.record(clock::elapsed_ns(started));
    run_ended(result, || ctx.is_killed())
}
