//! Global exclusion: counting task failures per executor, excluding executors (and hosts with
//! too many excluded executors) for `ExclusionConfig::timeout_us`, and ending exclusions.
//! Per-job exclusion lives with the job (`job.rs`), since it ends with the job.

use super::{ExecutorId, Scheduler};

impl Scheduler {
    /// Counts a failure on an executor globally; excludes it (and its host) past the limits.
    pub(super) fn record_global_failure(&mut self, now_us: u64, exec: ExecutorId) {
        let Some(x) = &self.config.exclusion else {
            return;
        };
        let (exec_max, host_max, timeout) = (
            x.executor_failures_max,
            x.host_excluded_executors_max,
            x.timeout_us,
        );
        // A failure charged late (its executor already gone) excludes nothing globally.
        let Some(slot) = self.book.slot_of(exec) else {
            return;
        };
        let Some(e) = self.book.get_mut(slot) else {
            unreachable!("slot {slot} of registered executor {exec:?} is empty");
        };
        e.failures += 1;
        if e.failures < exec_max || e.excluded_until_us > now_us {
            return;
        }
        let until = now_us.saturating_add(timeout);
        e.excluded_until_us = until;
        let host = e.host;
        self.stats.executors_excluded += 1;
        let excluding = self.next_expiry_us != u64::MAX;
        self.next_expiry_us = self.next_expiry_us.min(until);
        if let Some(h) = self.book.hosts.get_mut(host as usize) {
            h.excluded_executors += 1;
            if h.excluded_executors >= host_max {
                h.excluded_until_us = until;
            }
        }
        if !excluding {
            // Any job may be stuck now.
            self.start_clocks(now_us);
        }
    }

    /// Ends global exclusions whose time is up.
    pub(super) fn expire_exclusions(&mut self, now_us: u64) {
        let mut next = u64::MAX;
        let mut ended_hosts = Vec::new();
        for e in self.book.iter_mut() {
            if e.excluded_until_us == 0 {
                continue;
            }
            if e.excluded_until_us <= now_us {
                e.excluded_until_us = 0;
                e.failures = 0;
                ended_hosts.push(e.host);
            } else {
                next = next.min(e.excluded_until_us);
            }
        }
        for h in ended_hosts {
            if let Some(h) = self.book.hosts.get_mut(h as usize) {
                h.excluded_executors = h.excluded_executors.saturating_sub(1);
            }
        }
        for h in &mut self.book.hosts {
            if h.excluded_until_us == 0 {
                continue;
            }
            if h.excluded_until_us <= now_us {
                h.excluded_until_us = 0;
            } else {
                next = next.min(h.excluded_until_us);
            }
        }
        self.next_expiry_us = next;
    }
}
