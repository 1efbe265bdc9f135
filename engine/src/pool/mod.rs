//! The task pool: N pinned worker threads for CPU work (Spark's executor thread pool), with a
//! bounded inbox per core, work stealing, panic isolation and poison-pill shutdown.
//!
//! # Queues
//!
//! Each worker owns a bounded [`Inbox`] (the lock-free queue of the runtime, see
//! [`crate::runtime::inbox`]) that any thread submits into, and a local crossbeam-deque
//! `Worker` (FIFO) whose `Stealer` every other worker holds. A worker pops from its inbox; when
//! it pops a task and more are queued behind it, it moves up to `local_batch_max` of them into
//! its local deque, where idle workers can steal them in batches. Because the inbox is safe
//! with several consumers, an idle worker that finds every deque empty also pops directly from
//! another worker's inbox, so work queued on a busy worker is never stuck behind a long task.
//! Capacity per worker is `inbox_capacity + local_batch_max`: every queue is bounded and a full
//! inbox rejects (`try_submit`) or blocks (`submit`).
//!
//! # Parking
//!
//! An idle worker first spins (polling its inbox and stealing) for as long as its
//! [`AdaptiveSpin`](crate::spin::AdaptiveSpin) says, at most `spin_before_park` and only under
//! the process's budget of spinning threads, which keeps the spawn-to-start latency in the
//! sub-microsecond range under load where a core is free for it; then it parks with the inbox's
//! handshake:
//!
//! ```text
//! worker                                      submitter
//!   inbox.park_prepare():                       inbox.push(task):
//!     parked = true; fence(SeqCst)                enqueue; fence(SeqCst)
//!     if inbox not empty: parked = false, retry   if parked.swap(false): thread.unpark()
//!   if pill_taken: retry
//!   thread::park()  (spurious returns are fine: the loop re-checks everything)
//!   inbox.park_done()
//! ```
//!
//! The SeqCst fences make a lost wake-up impossible (see the inbox docs), and `unpark` before
//! `park` is remembered by the thread's park token. A submitter only pays for `unpark` when
//! the worker is actually parked. When the target worker is running and another is parked, the
//! submitter also wakes that one (best effort) so it can come and steal; an idle worker takes
//! a last look at the others' queues before it parks. A parked
//! worker uses no CPU: no timed wake-ups.
//!
//! # Shutdown
//!
//! [`TaskPool::shutdown`] closes submission, then pushes a poison pill into every inbox (waiting
//! for room if needed). A worker that pops its pill (or learns that a stealer popped it, via
//! `pill_taken`) handles its local deque and exits. In [`ShutdownMode::Drain`] queued tasks
//! run; in [`ShutdownMode::Cancel`] every task not yet started is reported
//! [`TaskOutcome::Cancelled`]. After joining, tasks that raced into an inbox after its pill
//! are cancelled too, so every accepted task is reported exactly once.

mod task;
mod worker;

pub use task::{Task, TaskOutcome};

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crossbeam_deque::Stealer;
use crossbeam_utils::CachePadded;

use crate::affinity::Pinning;
use crate::runtime::Inbox;
use task::Runnable;

/// How to build a [`TaskPool`].
#[derive(Debug, Clone)]
pub struct TaskPoolConfig {
    /// Number of workers; 0 means one per available core.
    pub workers: usize,
    /// Capacity of each worker's inbox (rounded up to a power of two).
    pub inbox_capacity: usize,
    /// Most tasks a worker moves from its inbox to its stealable deque at once.
    pub local_batch_max: usize,
    /// Where workers run: worker `i` on the `i`-th listed CPU (a failure to pin is a logged
    /// warning). Default: not pinned.
    pub pin: Pinning,
    /// Thread name prefix; worker `i` is named `{thread_name}-{i}`.
    pub thread_name: String,
    /// The longest an idle worker spins before parking (the spin adapts below it:
    /// [`crate::spin::AdaptiveSpin`]).
    pub spin_before_park: Duration,
}

impl Default for TaskPoolConfig {
    fn default() -> Self {
        Self {
            workers: 0,
            inbox_capacity: 1024,
            local_batch_max: 32,
            pin: Pinning::None,
            thread_name: "flint-worker".to_string(),
            spin_before_park: crate::runtime::spin_default(Duration::from_micros(100)),
        }
    }
}

/// Where a submitted task went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Submitted {
    /// The worker whose inbox took the task.
    pub core: usize,
}

/// Why a task was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    /// The inbox is full (`core` when the caller asked for one, otherwise every inbox was).
    #[error("task pool inbox full (core {core:?})")]
    Full {
        /// The requested core, if any.
        core: Option<usize>,
    },
    /// The pool is shut down.
    #[error("task pool is shut down")]
    Shutdown,
    /// The requested core does not exist.
    #[error("no worker for core {0}")]
    NoSuchCore(usize),
}

/// A task the pool did not accept, handed back with the reason. Dropping it reports
/// [`TaskOutcome::Cancelled`] to its callback.
#[derive(Debug)]
pub struct RejectedTask {
    /// Why.
    pub error: PoolError,
    /// The task, to retry or drop.
    pub task: Task,
}

impl std::fmt::Display for RejectedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for RejectedTask {}

/// What to do with queued tasks at shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownMode {
    /// Run every task queued before the pill.
    Drain,
    /// Report every task not yet started as cancelled.
    Cancel,
}

/// Counters (sums over workers; snapshots).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Tasks that ran to completion.
    pub finished: u64,
    /// Tasks that panicked.
    pub failed: u64,
    /// Tasks cancelled by shutdown.
    pub cancelled: u64,
}

pub(crate) enum Item {
    Task(Box<dyn Runnable>),
    Poison,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) finished: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) cancelled: AtomicU64,
}

pub(crate) struct WorkerShared {
    pub(crate) inbox: Inbox<Item>,
    pub(crate) stealer: Stealer<Box<dyn Runnable>>,
    pub(crate) thread: OnceLock<Thread>,
    pub(crate) pill_taken: crate::loom::sync::atomic::AtomicBool,
    pub(crate) counters: Counters,
}

impl WorkerShared {
    pub(crate) fn unpark(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

pub(crate) struct PoolShared {
    pub(crate) workers: Vec<CachePadded<WorkerShared>>,
    pub(crate) closed: AtomicBool,
    pub(crate) cancel: AtomicBool,
    pub(crate) parked_count: AtomicUsize,
    next: AtomicUsize,
    pub(crate) waiting_submitters: AtomicUsize,
    space_lock: Mutex<()>,
    space: Condvar,
    pub(crate) local_batch_max: usize,
    pub(crate) spin_before_park: Duration,
}

impl PoolShared {
    /// Called by workers after taking tasks out of an inbox.
    pub(crate) fn notify_space(&self) {
        if self.waiting_submitters.load(Ordering::SeqCst) > 0 {
            let _guard = self.space_lock.lock().unwrap_or_else(|p| p.into_inner());
            self.space.notify_all();
        }
    }

    fn push_to(&self, core: usize, item: Item) -> Result<(), Item> {
        let worker = &self.workers[core];
        if worker.inbox.push(item)? {
            worker.unpark();
        } else if self.parked_count.load(Ordering::Relaxed) > 0 {
            // The target is running (maybe a long task) and others sleep: call one over to
            // steal. At most one wake-up per parked worker, as the wake clears its flag.
            let n = self.workers.len();
            for i in 1..n {
                let other = &self.workers[(core + i) % n];
                if other.inbox.take_parked() {
                    other.unpark();
                    break;
                }
            }
        }
        Ok(())
    }
}

/// A cloneable, `Send` handle for submitting to a [`TaskPool`] from any thread.
#[derive(Clone)]
pub struct PoolHandle {
    shared: Arc<PoolShared>,
}

impl std::fmt::Debug for PoolHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolHandle")
            .field("workers", &self.shared.workers.len())
            .finish()
    }
}

impl PoolHandle {
    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.shared.workers.len()
    }

    /// Queues `task` without blocking: on its requested core, or else on the next core round
    /// robin (trying the others if that one is full).
    pub fn try_submit(&self, task: Task) -> Result<Submitted, RejectedTask> {
        let shared = &*self.shared;
        let n = shared.workers.len();
        let reject = |error, job| {
            Err(RejectedTask {
                error,
                task: Task {
                    job,
                    core: task.core,
                },
            })
        };
        if shared.closed.load(Ordering::Acquire) {
            return reject(PoolError::Shutdown, task.job);
        }
        match task.core {
            Some(core) if core >= n => reject(PoolError::NoSuchCore(core), task.job),
            Some(core) => match shared.push_to(core, Item::Task(task.job)) {
                Ok(()) => Ok(Submitted { core }),
                Err(item) => reject(PoolError::Full { core: Some(core) }, into_job(item)),
            },
            None => {
                let start = shared.next.fetch_add(1, Ordering::Relaxed) % n;
                let mut item = Item::Task(task.job);
                for i in 0..n {
                    let core = (start + i) % n;
                    match shared.push_to(core, item) {
                        Ok(()) => return Ok(Submitted { core }),
                        Err(back) => item = back,
                    }
                }
                reject(PoolError::Full { core: None }, into_job(item))
            }
        }
    }

    /// Queues `task`, blocking while the inbox is full (backpressure). Fails only if the pool
    /// is shut down or the requested core does not exist.
    pub fn submit(&self, task: Task) -> Result<Submitted, RejectedTask> {
        let mut task = task;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self.try_submit(task) {
                Err(RejectedTask {
                    error: PoolError::Full { .. },
                    task: back,
                }) => {
                    task = back;
                    if !backoff.is_completed() {
                        backoff.snooze();
                        continue;
                    }
                    let shared = &*self.shared;
                    shared.waiting_submitters.fetch_add(1, Ordering::SeqCst);
                    let guard = shared.space_lock.lock().unwrap_or_else(|p| p.into_inner());
                    // A short timeout bounds the cost of a notification that raced ahead of
                    // the counter increment; the common case is woken by a worker.
                    let _ = shared
                        .space
                        .wait_timeout(guard, Duration::from_millis(1))
                        .unwrap_or_else(|p| p.into_inner());
                    shared.waiting_submitters.fetch_sub(1, Ordering::SeqCst);
                }
                other => return other,
            }
        }
    }

    /// Convenience: `try_submit(Task::new(f))`.
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) -> Result<Submitted, RejectedTask> {
        self.try_submit(Task::new(f))
    }

    /// Sums of the workers' counters.
    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        for w in &self.shared.workers {
            s.finished += w.counters.finished.load(Ordering::Relaxed);
            s.failed += w.counters.failed.load(Ordering::Relaxed);
            s.cancelled += w.counters.cancelled.load(Ordering::Relaxed);
        }
        s
    }
}

fn into_job(item: Item) -> Box<dyn Runnable> {
    match item {
        Item::Task(job) => job,
        Item::Poison => unreachable!("submitters never push the poison pill"),
    }
}

/// N pinned workers running [`Task`]s. Dropping it shuts it down, draining.
pub struct TaskPool {
    handle: PoolHandle,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for TaskPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskPool")
            .field("workers", &self.handle.workers())
            .finish()
    }
}

impl TaskPool {
    /// Starts the workers.
    pub fn new(config: TaskPoolConfig) -> std::io::Result<TaskPool> {
        let n = if config.workers == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.workers
        };
        let locals: Vec<_> = (0..n)
            .map(|_| crossbeam_deque::Worker::<Box<dyn Runnable>>::new_fifo())
            .collect();
        let shared = Arc::new(PoolShared {
            workers: locals
                .iter()
                .map(|local| {
                    CachePadded::new(WorkerShared {
                        inbox: Inbox::new(config.inbox_capacity),
                        stealer: local.stealer(),
                        thread: OnceLock::new(),
                        pill_taken: crate::loom::sync::atomic::AtomicBool::new(false),
                        counters: Counters::default(),
                    })
                })
                .collect(),
            closed: AtomicBool::new(false),
            cancel: AtomicBool::new(false),
            parked_count: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            waiting_submitters: AtomicUsize::new(0),
            space_lock: Mutex::new(()),
            space: Condvar::new(),
            local_batch_max: config.local_batch_max.max(1),
            spin_before_park: config.spin_before_park,
        });
        let mut pool = TaskPool {
            handle: PoolHandle {
                shared: shared.clone(),
            },
            threads: Vec::with_capacity(n),
        };
        for (index, local) in locals.into_iter().enumerate() {
            let shared = shared.clone();
            let pin = config.pin.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-{index}", config.thread_name))
                .spawn(move || {
                    pin.pin_current(index, "pool worker");
                    worker::Worker::new(index, local, shared).run();
                });
            match spawned {
                Ok(t) => {
                    let _ = pool.handle.shared.workers[index]
                        .thread
                        .set(t.thread().clone());
                    pool.threads.push(t);
                }
                Err(e) => {
                    drop(pool);
                    return Err(e);
                }
            }
        }
        Ok(pool)
    }

    /// A handle for submitting from other threads.
    pub fn handle(&self) -> PoolHandle {
        self.handle.clone()
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.handle.workers()
    }

    /// See [`PoolHandle::try_submit`].
    pub fn try_submit(&self, task: Task) -> Result<Submitted, RejectedTask> {
        self.handle.try_submit(task)
    }

    /// See [`PoolHandle::submit`].
    pub fn submit(&self, task: Task) -> Result<Submitted, RejectedTask> {
        self.handle.submit(task)
    }

    /// See [`PoolHandle::spawn`].
    pub fn spawn(&self, f: impl FnOnce() + Send + 'static) -> Result<Submitted, RejectedTask> {
        self.handle.spawn(f)
    }

    /// See [`PoolHandle::stats`].
    pub fn stats(&self) -> PoolStats {
        self.handle.stats()
    }

    /// Stops the pool with a poison pill per worker and joins the workers. Idempotent (the
    /// first call's mode wins). Submissions after this fail with [`PoolError::Shutdown`].
    pub fn shutdown(&mut self, mode: ShutdownMode) {
        let shared = &*self.handle.shared;
        if mode == ShutdownMode::Cancel && !self.threads.is_empty() {
            shared.cancel.store(true, Ordering::SeqCst);
        }
        shared.closed.store(true, Ordering::SeqCst);
        let started = self.threads.len();
        for worker in shared.workers.iter().take(started) {
            let mut item = Item::Poison;
            let backoff = crossbeam_utils::Backoff::new();
            loop {
                match shared.push_to_worker(worker, item) {
                    Ok(()) => break,
                    Err(back) => {
                        item = back;
                        if backoff.is_completed() {
                            std::thread::sleep(Duration::from_micros(50));
                        } else {
                            backoff.snooze();
                        }
                    }
                }
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("a pool worker thread panicked");
            }
        }
        // Tasks that raced in after a pill: never run, so cancelled (reported by Drop).
        for worker in &shared.workers {
            while let Some(item) = worker.inbox.pop() {
                if let Item::Task(job) = item {
                    worker.counters.cancelled.fetch_add(1, Ordering::Relaxed);
                    drop(job);
                }
            }
        }
    }
}

impl PoolShared {
    fn push_to_worker(&self, worker: &WorkerShared, item: Item) -> Result<(), Item> {
        if worker.inbox.push(item)? {
            worker.unpark();
        }
        Ok(())
    }
}

impl Drop for TaskPool {
    fn drop(&mut self) {
        self.shutdown(ShutdownMode::Drain);
    }
}
