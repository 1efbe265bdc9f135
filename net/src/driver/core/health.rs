//! The driver core's watch for stalls (see the module docs of `driver`): tasks waiting with no
//! executor able to run them (warned about every [`WARN_INTERVAL`], the first after one
//! interval, and published so a caller can give up), and stalled and suspected executors
//! (named in a warning every [`WARN_INTERVAL`] while they stay so). Checked every [`HEALTH_INTERVAL_US`]
//! while jobs are active.

use flint_engine::scheduler::{ExecutorId, Scheduler};

use super::us;
use crate::driver::WARN_INTERVAL;

/// How often the driver looks for stalls while jobs are active (the checks scan executors).
pub(super) const HEALTH_INTERVAL_US: u64 = 100_000;

/// The watch for stalls (see the module docs).
#[derive(Default)]
pub(super) struct Health {
    next_check_us: u64,
    /// Since when tasks have waited with no executor able to run them.
    starved_since_us: Option<u64>,
    next_starved_warning_us: u64,
    next_stalled_warning_us: u64,
}

impl Health {
    /// Work arrived at `now_us` with no job active: the first check one interval later.
    pub(super) fn work_arrived(&mut self, now_us: u64) {
        if self.starved_since_us.is_none() {
            self.next_check_us = now_us.saturating_add(HEALTH_INTERVAL_US);
        }
    }

    /// When the next check is due, if one is (`jobs_active`: whether any job is).
    pub(super) fn poll_timeout(&self, jobs_active: bool) -> Option<u64> {
        (jobs_active || self.starved_since_us.is_some()).then_some(self.next_check_us)
    }

    /// Since when tasks have waited with no executor able to run them, if they do.
    pub(super) fn starved_since_us(&self) -> Option<u64> {
        self.starved_since_us
    }

    /// Checks at `now_us` if a check is due; `name_of` gives an executor's id on the wire.
    pub(super) fn handle_timeout(
        &mut self,
        now_us: u64,
        jobs_active: bool,
        scheduler: &Scheduler,
        name_of: impl Fn(ExecutorId) -> String,
    ) {
        if self.poll_timeout(jobs_active).is_none_or(|at| now_us < at) {
            return;
        }
        self.next_check_us = now_us.saturating_add(HEALTH_INTERVAL_US);
        self.check_starved(now_us, scheduler);
        self.check_stalled(now_us, scheduler, name_of);
        debug_assert!(self.next_check_us > now_us, "a check due in the past");
    }

    /// Warns about tasks no executor can run (see the module docs).
    fn check_starved(&mut self, now_us: u64, scheduler: &Scheduler) {
        let warn_us = us(WARN_INTERVAL);
        if !scheduler.starved(now_us) {
            self.starved_since_us = None;
            return;
        }
        let since = *self.starved_since_us.get_or_insert_with(|| {
            // The first warning after one interval: executors starting or coming back
            // (dynamic allocation from zero, a replaced executor) are not worth one.
            self.next_starved_warning_us = now_us.saturating_add(warn_us);
            now_us
        });
        if now_us >= self.next_starved_warning_us {
            self.next_starved_warning_us = now_us.saturating_add(warn_us);
            tracing::warn!(
                pending_tasks = scheduler.pending_tasks(),
                executors = scheduler.executors(),
                waited_s = now_us.saturating_sub(since) / 1_000_000,
                "tasks are waiting and no executor can run them (none registered, or all \
                 excluded)"
            );
        }
    }

    /// Names the stalled executors in a warning, at most once per [`WARN_INTERVAL`].
    fn check_stalled(
        &mut self,
        now_us: u64,
        scheduler: &Scheduler,
        name_of: impl Fn(ExecutorId) -> String,
    ) {
        if now_us < self.next_stalled_warning_us {
            return;
        }
        let stalled = scheduler.stalled_executors();
        let suspected = scheduler.suspected_executors();
        if stalled.is_empty() && suspected.is_empty() {
            return;
        }
        self.next_stalled_warning_us = now_us.saturating_add(us(WARN_INTERVAL));
        for id in suspected {
            let executor_id = name_of(id);
            tracing::warn!(
                executor_id = executor_id.as_str(),
                "executor is suspected: it holds attempts past their hedging threshold and has \
                 sent nothing for as long; they are copied elsewhere and it gets no new work \
                 until it sends something"
            );
        }
        for (id, attempts) in stalled {
            let executor_id = name_of(id);
            tracing::warn!(
                executor_id = executor_id.as_str(),
                attempts,
                "executor is stalled: it holds a straggler and has finished nothing since it \
                 was launched; its stragglers are copied elsewhere and it gets no new work \
                 until it reports a task"
            );
        }
    }
}
