//! A batch's successes applied as runs: the reports an executor sends in one frame mostly
//! say that tasks succeeded (a busy executor reports hundreds at a time), often tasks of one
//! job one after another. Each such success does its task's own part at once (its run,
//! record, payload, counts and result). What successes share is settled once:
//!
//! - the executor's part (its cores, window and place among the offerable) when a report
//!   comes from another executor;
//! - the job's part (its and its pool's running cores, and its end if they were its last
//!   tasks) when a report is of another job; a one-task job's at once, with its only
//!   success (nothing else of it can follow);
//! - both before a report that is not a plain success (the general path, `apply_update`,
//!   takes it and sees everything the successes changed), and at the end of the batch.
//!
//! A plain success is a `Finished` report of its task's only attempt, running on the executor
//! that reports it, whose result fits the job's limit on kept results. Nothing left unsettled
//! is read before it is settled, so the outcome is that of applying the reports one at a time
//! (a differential test in `tests.rs` holds the two paths to it; the simulators decided the
//! same on the same seeds with runs as without), for about 135 instructions less per task of
//! a big job (`ci/cost`'s task.driver, 1,097 -> 962).

use super::types::{ExecutorId, StatusUpdate, TaskState};
use super::{give_back_cores, hedge, live_job, Attempt, Scheduler, Status};

/// The successes applied in a batch whose shared parts are not settled yet.
#[derive(Debug, Default)]
pub(super) struct Successes {
    /// The reporting executor (its id and slot in the book), while its run is open, and the
    /// successes and cores of that run.
    executor: Option<(ExecutorId, u32)>,
    executor_tasks: u32,
    executor_cores: u32,
    /// The job's slot, while its run is open, and the cores of that run.
    job: Option<u32>,
    job_cores: u32,
}

impl Scheduler {
    /// Applies `update` as the next success of the open runs (settling a run and opening
    /// another for a new executor or job) if it is a plain success (see the module docs);
    /// false, with `update` untouched, for anything else. Always inline, in its one caller
    /// (`handle_statuses`): the driver's build of it (generic, built in `flint_net`) called it
    /// once a report.
    #[inline(always)]
    pub(super) fn add_success(
        &mut self,
        now_us: u64,
        successes: &mut Successes,
        update: &mut StatusUpdate,
    ) -> bool {
        if update.state != TaskState::Finished {
            return false;
        }
        let Some(job_slot) = self.hinted_job_slot(update.task.job().0) else {
            return false;
        };
        let slot = match successes.executor {
            Some((id, slot)) if id == update.executor => slot,
            _ => match self.open_executor_run(now_us, successes, update.executor) {
                Some(slot) => slot,
                None => return false,
            },
        };
        // Another job's run ends here (a one-task job's success opens none).
        if successes.job.is_some_and(|open| open != job_slot) {
            self.settle_job_run(successes);
        }
        let key = Attempt::new(update.task, update.attempt);
        let index = key.task.index();
        let executors = self.book.len();
        let job = live_job(&mut self.jobs, job_slot);
        if !job.may_keep(update.data.len()) {
            return false;
        }
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return false;
        };
        let placed = match t.attempts {
            [Some(p), None] if p.attempt == key.attempt && p.exec == slot => p,
            _ => return false,
        };
        let Some(exec) = self.book.get_mut(slot) else {
            unreachable!("slot {slot} emptied in a run of successes");
        };
        let Some(run) = exec.running.remove(placed.run(), key) else {
            unreachable!("{key:?} placed at run {} of slot {slot}", placed.run());
        };
        debug_assert_eq!(run.cores, t.cores, "a run holds its task's cores");
        assert_eq!(
            t.status,
            Status::Running,
            "a live attempt of a running task"
        );
        t.attempts = [None, None];
        if run.hedged() && hedge::sampled(index) {
            let took_us = now_us.saturating_sub(run.started_us);
            let stats = &mut self.stats;
            (self.hedge).finished(exec, run.record, (now_us, took_us), executors, stats);
        }
        successes.executor_tasks += 1;
        successes.executor_cores += run.cores;
        let one_task = job.task_count == 1;
        let others =
            self.task_succeeded(now_us, job_slot, key.task, run.started_us, &mut update.data);
        debug_assert_eq!(others, [None, None], "a plain success had one attempt");
        if one_task {
            self.settle_one_task_job(job_slot, run.cores);
        } else {
            successes.job = Some(job_slot);
            successes.job_cores += run.cores;
        }
        true
    }

    /// The job in `job_slot`, whose only task just succeeded on `cores`, settled at once
    /// rather than as an open run: no other success of it can follow, and what settling
    /// changes (its and its pool's running cores, its end) is read by nothing before the
    /// next report of another job would settle it, nor by the executor's settling (which
    /// touches only the executor and hedging), so the outcome is the same. It saves a
    /// call and a look-up of the job per one-task job.
    ///
    /// Its cores go back with the job: its end takes what it runs off its pool
    /// (`Scheduler::remove_job`). Under FAIR they go back first, as any job's success gives
    /// them back, so that the order re-sorts the job and its pool as it would.
    #[inline(always)]
    fn settle_one_task_job(&mut self, job_slot: u32, cores: u32) {
        debug_assert!(
            self.jobs.live(job_slot).final_count == 1,
            "a one-task job's only task succeeded"
        );
        if self.runnable.fair() {
            let job = live_job(&mut self.jobs, job_slot);
            let (order, pools) = (&mut self.runnable, &mut self.pools);
            give_back_cores(order, pools, job_slot, job, u64::from(cores));
        }
        self.end_job(job_slot);
    }

    /// Settles the open executor's run and opens one of executor `id`, if registered (its
    /// slot). The executor is heard from, as any report makes it.
    fn open_executor_run(
        &mut self,
        now_us: u64,
        successes: &mut Successes,
        id: ExecutorId,
    ) -> Option<u32> {
        self.settle_executor_run(now_us, successes);
        let slot = self.book.slot_of(id)?;
        let Some(exec) = self.book.get_mut(slot) else {
            unreachable!("slot {slot} of registered executor {id:?} is empty");
        };
        if exec.hedge.heard(now_us) {
            // Trusted again: it reported.
            self.book.make_offerable(slot);
        }
        successes.executor = Some((id, slot));
        Some(slot)
    }

    /// Settles both open runs, if any (see the module docs).
    #[inline]
    pub(super) fn settle_successes(&mut self, now_us: u64, successes: &mut Successes) {
        self.settle_job_run(successes);
        self.settle_executor_run(now_us, successes);
    }

    /// The open executor's run, settled: the executor gets its cores back and is offered
    /// again.
    fn settle_executor_run(&mut self, now_us: u64, successes: &mut Successes) {
        let Some((_, slot)) = successes.executor.take() else {
            return;
        };
        let tasks = std::mem::take(&mut successes.executor_tasks);
        let cores = std::mem::take(&mut successes.executor_cores);
        if tasks > 0 {
            self.executor_freed(now_us, slot, cores, tasks);
        }
    }

    /// The open job's run, settled: the job and its pool give their running cores back, and
    /// the job ends if they were its last tasks.
    fn settle_job_run(&mut self, successes: &mut Successes) {
        let Some(job_slot) = successes.job.take() else {
            return;
        };
        let cores = std::mem::take(&mut successes.job_cores);
        // A task holds at least one core: no cores, no successes.
        if cores > 0 {
            let job = live_job(&mut self.jobs, job_slot);
            let (order, pools) = (&mut self.runnable, &mut self.pools);
            give_back_cores(order, pools, job_slot, job, u64::from(cores));
            self.maybe_finish_job(job_slot);
        }
    }
}
