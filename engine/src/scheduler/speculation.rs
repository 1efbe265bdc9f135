//! Speculation: finding stragglers (tasks running longer than a multiplier times their job's
//! median successful run, once a quantile of the job succeeded) and queueing one copy of each.
//! The copy is launched like any task; the first attempt to finish wins and the other is killed
//! (see `attempt_ended`).

use super::job::Status;
use super::{Scheduler, TaskId};
use crate::hash::FxHashMap;

impl Scheduler {
    /// Queues a copy of each straggler; returns whether it found any.
    pub(super) fn find_stragglers(&mut self, now_us: u64) -> bool {
        let Some(sc) = self.config.speculation.clone() else {
            return false;
        };
        self.next_speculation_us = now_us.saturating_add(sc.interval_us.max(1));
        let mut thresholds: FxHashMap<u64, u64> = FxHashMap::default();
        for &slot in &self.active {
            if let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) {
                if let Some(t) =
                    job.speculation_threshold_us(sc.quantile, sc.multiplier, sc.min_runtime_us)
                {
                    thresholds.insert(job.id.0, t);
                }
            }
        }
        if thresholds.is_empty() {
            return false;
        }
        let mut found = false;
        let mut newly_runnable = Vec::new();
        for e in self.book.iter() {
            for (&(task, _), run) in &e.running {
                let task = TaskId(task);
                let Some(&threshold) = thresholds.get(&task.job().0) else {
                    continue;
                };
                if now_us.saturating_sub(run.started_us) <= threshold {
                    continue;
                }
                let Some(&slot) = self.job_slots.get(&task.job().0) else {
                    continue;
                };
                let Some(job) = self.jobs.get_mut(slot as usize).and_then(Option::as_mut) else {
                    continue;
                };
                let Some(t) = job.tasks.get_mut(task.index() as usize) else {
                    continue;
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
        }
        for slot in newly_runnable {
            self.sync_runnable(slot);
        }
        found
    }
}
