//! What a service holds for a submitted job: a [`JobHandle`] to wait on (blocking with a
//! timeout, or as a `Future`), watch and cancel.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;

pub use flint_engine::scheduler::JobOutcome;

/// Called on the driver's loop with each task's index and result, as results arrive.
pub type ResultObserver = Box<dyn FnMut(u32, Result<&Bytes, &str>) + Send>;

/// A job to submit: one function over many payloads.
pub struct Job {
    pub(crate) function: String,
    pub(crate) payloads: Vec<Bytes>,
    pub(crate) cores: u32,
    pub(crate) observer: Option<ResultObserver>,
    pub(crate) keep_results: bool,
    pub(crate) result_bytes_max: Option<u64>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("function", &self.function)
            .field("tasks", &self.payloads.len())
            .finish()
    }
}

impl Job {
    /// A job of `payloads.len()` tasks, each running `function` on its payload.
    pub fn new(function: impl Into<String>, payloads: Vec<Bytes>) -> Self {
        Job {
            function: function.into(),
            payloads,
            cores: 1,
            observer: None,
            keep_results: true,
            result_bytes_max: None,
        }
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
        self.result_bytes_max = Some(bytes);
        self
    }

    /// Cores each task needs (default 1).
    pub fn cores(mut self, cores: u32) -> Self {
        self.cores = cores;
        self
    }

    /// Sees every task's result as it arrives (on the driver's loop: keep it short).
    pub fn on_result(
        mut self,
        observer: impl FnMut(u32, Result<&Bytes, &str>) + Send + 'static,
    ) -> Self {
        self.observer = Some(Box::new(observer));
        self
    }
}

#[derive(Default)]
struct State {
    outcome: Option<JobOutcome>,
    waker: Option<Waker>,
}

/// The part of a job shared by its handle and the driver.
#[derive(Default)]
pub(crate) struct JobShared {
    state: Mutex<State>,
    finished: Condvar,
    tasks_done: AtomicU64,
}

impl JobShared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A poisoned lock only means another thread panicked while holding it; the state is a
        // plain value that is always consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn task_done(&self) {
        self.tasks_done.fetch_add(1, Ordering::Relaxed);
    }

    /// Records the outcome (the first one wins) and wakes every waiter.
    pub(crate) fn finish(&self, outcome: JobOutcome) {
        let waker = {
            let mut state = self.lock();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome);
            state.waker.take()
        };
        self.finished.notify_all();
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// A submitted job.
pub struct JobHandle {
    pub(crate) id: u64,
    pub(crate) tasks: u64,
    pub(crate) shared: Arc<JobShared>,
    pub(crate) cancel: Box<dyn Fn() + Send + Sync>,
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
        self.shared.lock().outcome.is_some()
    }

    /// Cancels the job: running tasks are killed, pending ones dropped; the outcome becomes
    /// `Cancelled` unless it was already decided.
    pub fn cancel(&self) {
        (self.cancel)();
    }

    /// Blocks until the job ends.
    pub fn wait(self) -> JobOutcome {
        let mut state = self.shared.lock();
        loop {
            if let Some(outcome) = state.outcome.take() {
                return outcome;
            }
            state = self
                .shared
                .finished
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Blocks until the job ends or `timeout` passes; on timeout the handle comes back.
    pub fn wait_timeout(self, timeout: Duration) -> Result<JobOutcome, JobHandle> {
        let deadline = flint_engine::runtime::deadline_after(timeout);
        {
            let mut state = self.shared.lock();
            loop {
                if let Some(outcome) = state.outcome.take() {
                    return Ok(outcome);
                }
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                state = self
                    .shared
                    .finished
                    .wait_timeout(state, deadline - now)
                    .map(|(guard, _)| guard)
                    .unwrap_or_else(|poisoned| poisoned.into_inner().0);
            }
        }
        Err(self)
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
