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

use super::job::Status;
use super::{ExecutorId, Scheduler, TaskId};
use crate::hash::FxHashMap;

impl Scheduler {
    /// Queues a copy of each straggler and marks stalled executors; returns whether it queued
    /// any copy.
    pub(super) fn find_stragglers(&mut self, now_us: u64) -> bool {
        self.next_speculation_us = now_us.saturating_add(self.speculation_interval_us());
        if self.spec_jobs == 0 {
            return false;
        }
        // Per job with speculation on (its own settings): the quantile threshold (once
        // reached) and the timeout threshold.
        let mut thresholds: FxHashMap<u64, (Option<u64>, u64)> = FxHashMap::default();
        let mut any_quantile = false;
        let mut timeout_min_us = u64::MAX;
        for &slot in self.active.values() {
            let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) else {
                unreachable!("active job slot {slot} is empty");
            };
            let Some(sc) = job.speculation.as_deref().cloned() else {
                continue;
            };
            let by_quantile =
                job.speculation_threshold_us(sc.quantile, sc.multiplier, sc.min_runtime_us);
            any_quantile |= by_quantile.is_some();
            let by_timeout = job.median_us().map_or(sc.timeout_us, |m| {
                sc.timeout_us.max((m as f64 * sc.multiplier) as u64)
            });
            timeout_min_us = timeout_min_us.min(sc.timeout_us);
            thresholds.insert(job.id.0, (by_quantile, by_timeout));
        }
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
            for (&(task, _), run) in &e.running {
                let task = TaskId(task);
                let Some(&(by_quantile, by_timeout)) = thresholds.get(&task.job().0) else {
                    continue;
                };
                let age = now_us.saturating_sub(run.started_us);
                let silent_since_launch = e.progress_us <= run.started_us;
                let straggler = by_quantile.is_some_and(|t| age > t)
                    || (age > by_timeout
                        && silent_since_launch
                        && (idle_exists || last_finish_us > run.started_us));
                if !straggler {
                    continue;
                }
                stalls |= silent_since_launch;
                let Some(&slot) = self.job_slots.get(&task.job().0) else {
                    unreachable!("thresholds only for active jobs");
                };
                let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) else {
                    unreachable!("job slot {slot} of an active job is empty");
                };
                let Some(t) = job.tasks.get_mut(task.index() as usize) else {
                    unreachable!("an executor holds {task}, beyond its job");
                };
                if t.status == Status::Running && !t.speculated && t.running_attempts() == 1 {
                    t.speculated = true;
                    job.speculatable.push_back(task.index());
                    self.speculatable_total += 1;
                    found = true;
                    if !job.in_runnable {
                        newly_runnable.push(slot);
                    }
                }
            }
            if stalls && !e.stalled {
                e.stalled = true;
                newly_stalled.push(e.id);
            }
        }
        for id in newly_stalled {
            if let Some(slot) = self.book.slot_of(id) {
                self.book.unlist(slot);
            }
        }
        for slot in newly_runnable {
            self.sync_runnable(slot);
        }
        found
    }
}
