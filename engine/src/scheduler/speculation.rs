//! Speculation: finding stragglers and queueing one copy of each, and setting aside executors
//! that have stopped finishing anything. The copy is launched like any task; the first attempt to
//! finish wins and the other is killed (see `attempt_ended`).
//!
//! A running attempt is a straggler when
//!
//! - its job has `quantile` of its tasks succeeded and the attempt has run longer than
//!   `multiplier` times their median (and at least `min_runtime_us`), or
//! - it has run longer than `timeout_us` (and than `multiplier` times the job's median so far,
//!   if any task succeeded), its executor has finished nothing since launching it, and some
//!   other executor has finished something since, or sits idle: evidence that the cluster works
//!   and this executor does not. (A full cluster of long tasks gets no copies from this rule.)
//!
//! An executor holding a straggler and having finished nothing since that attempt was launched
//! is *stalled*: set aside (no new work) until it reports a final state.

use std::collections::BTreeMap;

use super::job::{Job, Status};
use super::slots::JobSlots;
use super::{Attempt, ExecutorId, Scheduler, TaskId};
use crate::hash::FxHashMap;
use crate::ids::IdMap;

/// Speculation timeouts kept at zero jobs, at most (see [`SpecTimeouts`]).
const SPEC_TIMEOUTS_KEPT: usize = 8;

/// The speculation timeouts of the active jobs with speculation on, with how many jobs have
/// each: the least one with jobs decides which executors the straggler check looks at. The
/// scheduler's own timeout (most jobs') is a counter, no map entry; a timeout of jobs' own
/// whose jobs all ended stays, at zero, while there are at most [`SPEC_TIMEOUTS_KEPT`], so the
/// next job with it costs no insertion.
#[derive(Debug)]
pub(super) struct SpecTimeouts {
    /// The scheduler's timeout, and its jobs.
    common: (u64, u32),
    others: BTreeMap<u64, u32>,
}

impl SpecTimeouts {
    /// Counts for a scheduler whose jobs mostly have `common_us`.
    pub(super) fn new(common_us: u64) -> SpecTimeouts {
        SpecTimeouts {
            common: (common_us, 0),
            others: BTreeMap::new(),
        }
    }

    /// A job with `timeout_us` began. The common timeout's count inlined where jobs begin
    /// (every job of a scheduler with speculation on passes here), the map apart.
    #[inline]
    pub(super) fn add(&mut self, timeout_us: u64) {
        match timeout_us == self.common.0 {
            true => self.common.1 += 1,
            false => self.add_other(timeout_us),
        }
    }

    /// [`add`](Self::add) of a timeout of a job's own.
    #[cold]
    fn add_other(&mut self, timeout_us: u64) {
        *self.others.entry(timeout_us).or_insert(0) += 1;
    }

    /// A job with `timeout_us` ended. As [`add`](Self::add), the common timeout's count
    /// inlined, the map apart.
    #[inline]
    pub(super) fn remove(&mut self, timeout_us: u64) {
        if timeout_us == self.common.0 {
            assert!(self.common.1 > 0, "a job's speculation timeout is counted");
            self.common.1 -= 1;
            return;
        }
        self.remove_other(timeout_us);
    }

    /// [`remove`](Self::remove) of a timeout of a job's own.
    #[cold]
    fn remove_other(&mut self, timeout_us: u64) {
        let kept = self.others.len() <= SPEC_TIMEOUTS_KEPT;
        match self.others.get_mut(&timeout_us) {
            Some(1) if !kept => {
                self.others.remove(&timeout_us);
            }
            Some(n) => *n -= 1,
            None => unreachable!("a job's speculation timeout is counted"),
        }
    }

    /// Timeouts of jobs' own kept, with jobs or at zero.
    #[cfg(test)]
    pub(super) fn others_len(&self) -> usize {
        self.others.len()
    }

    /// The least timeout some active job has.
    pub(super) fn least(&self) -> Option<u64> {
        let common = (self.common.1 > 0).then_some(self.common.0);
        // Timeouts left at zero jobs are skipped: at most `SPEC_TIMEOUTS_KEPT` of them.
        let other = (self.others.iter())
            .find(|&(_, &jobs)| jobs > 0)
            .map(|(&t, _)| t);
        common.into_iter().chain(other).min()
    }
}

impl Scheduler {
    /// Queues a copy of each straggler and marks stalled executors; returns whether it queued
    /// any copy.
    pub(super) fn find_stragglers(&mut self, now_us: u64) -> bool {
        self.next_speculation_us = now_us.saturating_add(self.speculation_interval_us());
        if self.spec_jobs == 0 {
            return false;
        }
        self.count_quantiles();
        // Thresholds are worked out only for the jobs of the attempts looked at (memoized):
        // the check costs O(executors + attempts looked at), not O(active jobs).
        let any_quantile = self.quantile_jobs > 0;
        let timeout_min_us = self.spec_timeouts.least().unwrap_or(u64::MAX);
        let mut thresholds: FxHashMap<u64, Option<(Option<u64>, u64)>> = FxHashMap::default();
        let mut floors: FxHashMap<u64, Option<u64>> = FxHashMap::default();
        let last_finish_us = self.last_finish_us;
        let idle_exists = self
            .book
            .iter()
            .any(|e| e.running.is_empty() && e.usable() > 0);
        let mut found = false;
        let mut newly_runnable = Vec::new();
        let mut newly_stalled: Vec<ExecutorId> = Vec::new();
        for e in self.book.iter_mut() {
            // Without a quantile threshold only the timeout applies, and only to an executor
            // silent that long while another finished something since.
            let silent = now_us.saturating_sub(e.progress_us) > timeout_min_us
                && (idle_exists || last_finish_us > e.progress_us);
            if !any_quantile && !silent {
                continue;
            }
            let mut stalls = false;
            for (&Attempt { task, .. }, run) in e.running.iter() {
                // Younger than both thresholds can be: not a straggler, and no median needed.
                let age = now_us.saturating_sub(run.started_us);
                let floor = *floors.entry(task.job().0).or_insert_with(|| {
                    job_of(&self.job_slots, &mut self.jobs, task)?.straggler_floor_us()
                });
                if floor.is_none_or(|floor| age <= floor) {
                    continue;
                }
                let found_thresholds = *thresholds.entry(task.job().0).or_insert_with(|| {
                    job_of(&self.job_slots, &mut self.jobs, task)?.straggler_thresholds_us()
                });
                let Some((by_quantile, by_timeout)) = found_thresholds else {
                    continue; // an ended job's attempt, or a job without speculation
                };
                let silent_since_launch = e.progress_us <= run.started_us;
                let straggler = by_quantile.is_some_and(|t| age > t)
                    || (age > by_timeout
                        && silent_since_launch
                        && (idle_exists || last_finish_us > run.started_us));
                if !straggler {
                    continue;
                }
                stalls |= silent_since_launch;
                if let Some((slot, listed)) = queue_copy(&self.job_slots, &mut self.jobs, task) {
                    self.speculatable_total += 1;
                    found = true;
                    if !listed {
                        newly_runnable.push(slot);
                    }
                }
            }
            if stalls && !e.stalled {
                e.stalled = true;
                newly_stalled.push(e.id);
            }
        }
        self.after_sweep(newly_stalled, newly_runnable);
        found
    }

    /// Unlists the executors the sweep found stalled and lists the jobs it gave a first copy
    /// to queue.
    fn after_sweep(&mut self, newly_stalled: Vec<ExecutorId>, newly_runnable: Vec<u32>) {
        let slots = (newly_stalled.into_iter()).filter_map(|id| self.book.slot_of(id));
        let slots = slots.collect();
        self.after_sweep_slots(slots, newly_runnable);
    }

    /// Unlists the executors in `set_aside` (slots: they get no new work) and lists the jobs
    /// in `newly_runnable` (given a first copy to queue).
    pub(super) fn after_sweep_slots(&mut self, set_aside: Vec<u32>, newly_runnable: Vec<u32>) {
        for slot in set_aside {
            self.book.unlist(slot);
        }
        for slot in newly_runnable {
            self.sync_job(slot);
        }
    }

    /// Counts the jobs with successes since the last check that reached their quantile. Their
    /// medians are worked out later, only for a job one of whose attempts is old enough to
    /// be a straggler (a median is recomputed once its successes grew by an eighth).
    fn count_quantiles(&mut self) {
        let mut dirty = std::mem::take(&mut self.spec_dirty);
        for slot in dirty.drain(..) {
            // A slot whose job ended (or was replaced: its flag says) since.
            let Some(job) = self.jobs.get_mut(slot as usize) else {
                continue;
            };
            if !std::mem::take(&mut job.durations_dirty) {
                continue;
            }
            // Counted without the median: only the count of successes decides.
            let quantile = job.speculation.as_deref().map(|sc| sc.quantile);
            let reached = quantile.is_some_and(|q| job.quantile_met(q));
            if reached && !job.quantile_reached {
                job.quantile_reached = true;
                self.quantile_jobs += 1;
            }
        }
        self.spec_dirty = dirty;
    }
}

impl Job {
    /// With speculation on, `(quantile threshold once reached, timeout threshold)`: an attempt
    /// running longer than the first is a straggler; one running longer than the second is
    /// one if its executor is silent (see the module documentation).
    fn straggler_thresholds_us(&mut self) -> Option<(Option<u64>, u64)> {
        let sc = self.speculation.as_deref().cloned()?;
        let by_quantile =
            self.speculation_threshold_us(sc.quantile, sc.multiplier, sc.min_runtime_us);
        let by_timeout = self.median_us().map_or(sc.timeout_us, |m| {
            sc.timeout_us.max((m as f64 * sc.multiplier) as u64)
        });
        Some((by_quantile, by_timeout))
    }

    /// With speculation on, the least either threshold of
    /// [`Job::straggler_thresholds_us`] can be (they are at least `min_runtime_us` and
    /// `timeout_us`): an attempt no older is no straggler, whatever the median.
    fn straggler_floor_us(&self) -> Option<u64> {
        let sc = self.speculation.as_deref()?;
        Some(sc.min_runtime_us.min(sc.timeout_us))
    }
}

/// The job of `task`, if active.
#[inline]
fn job_of<'a>(job_slots: &IdMap<u32>, jobs: &'a mut JobSlots, task: TaskId) -> Option<&'a mut Job> {
    let slot = *job_slots.get(task.job().0)?;
    jobs.get_mut(slot as usize)
}

/// Queues a copy of straggler `task` (of an active job) unless it has one or is no longer
/// running a single attempt. Returns its job's slot and whether the job was listed as runnable.
#[inline]
pub(super) fn queue_copy(
    job_slots: &IdMap<u32>,
    jobs: &mut JobSlots,
    task: TaskId,
) -> Option<(u32, bool)> {
    let Some(&slot) = job_slots.get(task.job().0) else {
        unreachable!("thresholds only for active jobs");
    };
    let Some(job) = jobs.get_mut(slot as usize) else {
        unreachable!("job slot {slot} of an active job is empty");
    };
    let Some(t) = job.tasks.get_mut(task.index() as usize) else {
        unreachable!("an executor holds {task}, beyond its job");
    };
    if t.status == Status::Running && !t.speculated && t.running_attempts() == 1 {
        t.speculated = true;
        job.speculatable.push_back(task.index());
        return Some((slot, job.in_runnable));
    }
    None
}
