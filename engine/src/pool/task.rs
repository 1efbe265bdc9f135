//! Tasks as the pool carries them: a boxed closure plus an optional completion callback that
//! is called exactly once with the task's outcome.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::runtime::panic_message;

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// It ran to completion.
    Finished,
    /// It panicked; the panic message.
    Failed(String),
    /// It never ran: cancelled by shutdown, or dropped unrun (e.g. a rejected task the caller
    /// dropped).
    Cancelled,
}

pub(crate) trait Runnable: Send {
    /// Runs the task and reports; returns the outcome (for the pool's counters).
    fn run(self: Box<Self>) -> Outcome;
}

/// Outcome without the message, for counters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Outcome {
    Finished,
    Failed,
}

struct Job<F, C: FnOnce(TaskOutcome)> {
    f: Option<F>,
    done: Option<C>,
}

fn report<C: FnOnce(TaskOutcome)>(done: C, outcome: TaskOutcome) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(move || done(outcome))) {
        tracing::error!(
            panic = %panic_message(payload.as_ref()),
            "a task completion callback panicked"
        );
    }
}

impl<F, C> Runnable for Job<F, C>
where
    F: FnOnce() + Send,
    C: FnOnce(TaskOutcome) + Send,
{
    fn run(mut self: Box<Self>) -> Outcome {
        let Some(f) = self.f.take() else {
            return Outcome::Finished;
        };
        let (outcome, counted) = match catch_unwind(AssertUnwindSafe(f)) {
            Ok(()) => (TaskOutcome::Finished, Outcome::Finished),
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                if self.done.is_none() {
                    tracing::error!(panic = %message, "a pool task panicked");
                }
                (TaskOutcome::Failed(message), Outcome::Failed)
            }
        };
        if let Some(done) = self.done.take() {
            report(done, outcome);
        }
        counted
    }
}

impl<F, C: FnOnce(TaskOutcome)> Drop for Job<F, C> {
    fn drop(&mut self) {
        if let Some(done) = self.done.take() {
            report(done, TaskOutcome::Cancelled);
        }
    }
}

/// A unit of work for the [`TaskPool`](super::TaskPool): a closure, an optional completion
/// callback, an optional core. The callback is called exactly once: with `Finished` or
/// `Failed(panic message)` after the task ran, or with `Cancelled` if the task is dropped
/// without running (cancelled at shutdown, or rejected and then dropped by the caller).
pub struct Task {
    pub(crate) job: Box<dyn Runnable>,
    pub(crate) core: Option<usize>,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").field("core", &self.core).finish()
    }
}

impl Task {
    /// A task without completion callback (a panic is logged and counted).
    pub fn new(f: impl FnOnce() + Send + 'static) -> Task {
        Task {
            job: Box::new(Job {
                f: Some(f),
                done: None::<fn(TaskOutcome)>,
            }),
            core: None,
        }
    }

    /// A task whose outcome is passed to `done` (on the worker thread that ran it, or on the
    /// thread that cancelled or dropped it).
    pub fn with_completion(
        f: impl FnOnce() + Send + 'static,
        done: impl FnOnce(TaskOutcome) + Send + 'static,
    ) -> Task {
        Task {
            job: Box::new(Job {
                f: Some(f),
                done: Some(done),
            }),
            core: None,
        }
    }

    /// Asks for the task to be queued on worker `core` (it may still be stolen by an idle
    /// worker).
    pub fn on_core(mut self, core: usize) -> Task {
        self.core = Some(core);
        self
    }

    /// The core requested with [`on_core`](Self::on_core).
    pub fn core(&self) -> Option<usize> {
        self.core
    }
}
