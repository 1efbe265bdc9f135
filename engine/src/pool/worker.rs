//! The worker thread body: run local work, refill from the inbox, steal, spin, park, and the
//! exit path after the poison pill.

use std::sync::Arc;

use crossbeam_deque::Steal;

use super::task::{Outcome, Runnable};
use super::{Item, PoolShared};
use crate::loom::sync::atomic::{AtomicBool, Ordering};
use crate::runtime::Inbox;
use crate::spin::AdaptiveSpin;

/// One parking attempt of a worker: announce, re-check the inbox and the handed-over pill,
/// block in `park` (which may return spuriously), withdraw the announcement. Returns whether
/// it blocked. Submitters pair with it through [`Inbox::push`] and an unpark when asked to.
pub(crate) fn park_once<T>(inbox: &Inbox<T>, pill_taken: &AtomicBool, park: impl FnOnce()) -> bool {
    if !inbox.park_prepare() {
        return false;
    }
    if pill_taken.load(Ordering::Acquire) {
        inbox.park_done();
        return false;
    }
    park();
    inbox.park_done();
    true
}

/// An idle worker considers a victim's lone queued item every this many idle rounds.
const LONE_STEAL_EVERY: u32 = 32;
/// An idle worker looks at other workers and at the clock every this many idle rounds
/// (`LONE_STEAL_EVERY` must be a multiple of it).
const SCAN_EVERY: u32 = 8;

pub(crate) struct Worker {
    index: usize,
    local: crossbeam_deque::Worker<Box<dyn Runnable>>,
    shared: Arc<PoolShared>,
    pill: bool,
}

enum Found {
    Job(Box<dyn Runnable>),
    Nothing,
}

impl Worker {
    pub(crate) fn new(
        index: usize,
        local: crossbeam_deque::Worker<Box<dyn Runnable>>,
        shared: Arc<PoolShared>,
    ) -> Self {
        Self {
            index,
            local,
            shared,
            pill: false,
        }
    }

    pub(crate) fn run(mut self) {
        let shared = self.shared.clone();
        let me = &shared.workers[self.index];
        let mut spin = AdaptiveSpin::new(shared.spin_before_park);
        let mut idle_rounds: u32 = 0;
        loop {
            if let Some(job) = self.local.pop() {
                self.execute(job);
                continue;
            }
            if self.pill || me.pill_taken.load(Ordering::Acquire) {
                break;
            }
            if let Found::Job(job) = self.refill() {
                self.execute_after_idle(job, &mut spin);
                continue;
            }
            if self.pill {
                continue;
            }
            idle_rounds = idle_rounds.wrapping_add(1);
            if idle_rounds % SCAN_EVERY != 0 {
                // Cheap rounds: only the own inbox is polled (the loop head), no clock read
                // and no look at other workers' cache lines.
                std::hint::spin_loop();
                continue;
            }
            if let Found::Job(job) = self.steal(idle_rounds % LONE_STEAL_EVERY == 0) {
                self.execute_after_idle(job, &mut spin);
                continue;
            }
            if spin.idle(crate::clock::now_ns()) {
                // Adaptive and within the process's budget of spinners (`crate::spin`).
                std::hint::spin_loop();
                continue;
            }
            // Last look at other workers' lone queued tasks before sleeping.
            if let Found::Job(job) = self.steal(true) {
                self.execute_after_idle(job, &mut spin);
                continue;
            }
            // Park (see the module docs for the handshake).
            spin.parking();
            park_once(&me.inbox, &me.pill_taken, || {
                shared.parked_count.fetch_add(1, Ordering::Relaxed);
                std::thread::park();
                shared.parked_count.fetch_sub(1, Ordering::Relaxed);
            });
        }
        // Poisoned: what is left locally came before the pill.
        while let Some(job) = self.local.pop() {
            self.execute(job);
        }
    }

    /// Runs a task found by looking (not in the local deque), closing an idle period if one
    /// is open: the spin learns the gap (a clock read only then).
    fn execute_after_idle(&mut self, job: Box<dyn Runnable>, spin: &mut AdaptiveSpin) {
        if spin.is_idle() {
            spin.work(crate::clock::now_ns());
        }
        self.execute(job);
    }

    /// Pops from the own inbox: returns the first task, moving a batch of the ones behind it
    /// into the stealable local deque. Notes the pill.
    fn refill(&mut self) -> Found {
        let me = &self.shared.workers[self.index];
        let first = match me.inbox.pop() {
            None => return Found::Nothing,
            Some(Item::Poison) => {
                self.pill = true;
                return Found::Nothing;
            }
            Some(Item::Task(job)) => job,
        };
        let mut moved = 1;
        while moved < self.shared.local_batch_max && !me.inbox.is_empty() {
            match me.inbox.pop() {
                Some(Item::Task(job)) => self.local.push(job),
                Some(Item::Poison) => {
                    self.pill = true;
                    break;
                }
                None => break,
            }
            moved += 1;
        }
        self.shared.notify_space();
        Found::Job(first)
    }

    /// Takes work from other workers: a batch from a non-empty deque, else one task from an
    /// inbox with a backlog (more than one item), or, when `lone` is set, from any non-empty
    /// inbox. Leaving a victim's single queued item alone most of the time keeps idle workers
    /// from fighting the owner for the same cache lines on every task; `lone` (every
    /// `LONE_STEAL_EVERY` idle rounds) still guarantees a task queued behind a long one is
    /// picked up.
    fn steal(&mut self, lone: bool) -> Found {
        let workers = &self.shared.workers;
        let n = workers.len();
        for i in 1..n {
            let victim = &workers[(self.index + i) % n];
            if victim.stealer.is_empty() {
                continue;
            }
            loop {
                match victim.stealer.steal_batch_and_pop(&self.local) {
                    Steal::Success(job) => return Found::Job(job),
                    Steal::Retry => continue,
                    Steal::Empty => break,
                }
            }
        }
        for i in 1..n {
            let victim = &workers[(self.index + i) % n];
            let queued = victim.inbox.len();
            if queued == 0 || (queued == 1 && !lone) {
                continue;
            }
            match victim.inbox.pop() {
                Some(Item::Task(job)) => {
                    self.shared.notify_space();
                    return Found::Job(job);
                }
                Some(Item::Poison) => {
                    // The victim's pill (always the last thing in its inbox): hand it over.
                    victim.pill_taken.store(true, Ordering::Release);
                    victim.unpark();
                }
                None => {}
            }
        }
        Found::Nothing
    }

    fn execute(&self, job: Box<dyn Runnable>) {
        let counters = &self.shared.workers[self.index].counters;
        if self.shared.cancel.load(Ordering::Relaxed) {
            counters.cancelled.fetch_add(1, Ordering::Relaxed);
            drop(job); // reports Cancelled
            return;
        }
        match job.run() {
            Outcome::Finished => counters.finished.fetch_add(1, Ordering::Relaxed),
            Outcome::Failed => counters.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::loom::sync::Arc;
    use crate::loom::thread;

    /// Explores every interleaving with up to `LOOM_MAX_PREEMPTIONS` (default 3) preemptions,
    /// as tokio does, to keep the state space tractable.
    fn bounded_model(f: impl Fn() + Sync + Send + 'static) {
        let mut builder = loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(3);
        }
        builder.check(f);
    }

    /// The pool's park/unpark protocol with loom's thread parking: two submitters push a task
    /// each and unpark the worker only when `push` says so; then the pill arrives, either
    /// pushed into the worker's own inbox or popped by a stealer and handed over through
    /// `pill_taken`. The worker must run both tasks and exit; a lost wake-up would be a loom
    /// deadlock.
    fn model(pill_stolen: bool) {
        bounded_model(move || {
            let inbox = Arc::new(Inbox::<Option<usize>>::new(4));
            let pill_taken = Arc::new(AtomicBool::new(false));
            let worker = {
                let inbox = inbox.clone();
                let pill_taken = pill_taken.clone();
                thread::spawn(move || {
                    let mut ran = 0;
                    loop {
                        match inbox.pop() {
                            Some(Some(_)) => ran += 1,
                            Some(None) => return ran,
                            None => {
                                if pill_taken.load(Ordering::Acquire) {
                                    while let Some(Some(_)) = inbox.pop() {
                                        ran += 1;
                                    }
                                    return ran;
                                }
                                park_once(&inbox, &pill_taken, thread::park);
                            }
                        }
                    }
                })
            };
            let worker_thread = worker.thread().clone();
            let submitters: Vec<_> = (0..2)
                .map(|i| {
                    let inbox = inbox.clone();
                    let worker_thread = worker_thread.clone();
                    thread::spawn(move || {
                        if inbox.push(Some(i)).expect("room for both") {
                            worker_thread.unpark();
                        }
                    })
                })
                .collect();
            for s in submitters {
                s.join().unwrap();
            }
            if pill_stolen {
                pill_taken.store(true, Ordering::Release);
                worker_thread.unpark();
            } else if inbox.push(None).expect("room for the pill") {
                worker_thread.unpark();
            }
            let ran = worker.join().unwrap();
            assert_eq!(ran, 2);
        });
    }

    #[test]
    fn loom_pool_park_unpark_pill_in_inbox() {
        model(false);
    }

    #[test]
    fn loom_pool_park_unpark_pill_handed_over() {
        model(true);
    }
}
