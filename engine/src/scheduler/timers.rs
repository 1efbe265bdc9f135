//! When each active job next needs the tick's attention, kept sorted as jobs change so that
//! [`Scheduler::poll_timeout`](super::Scheduler::poll_timeout) and the tick look only at the
//! jobs that are due, never at all active jobs:
//!
//! - locality: a job with tasks queued at a level better than "any" widens when its wait
//!   ends (`level_since_us` plus the level's wait), or at the next tick when the level has
//!   nothing left to wait for (no registered executor or host its queues prefer: "skips");
//! - unschedulable: a job with tasks queued that something may leave stuck is checked for
//!   "can run nowhere" once `unschedulable_timeout_us` has passed since its last progress
//!   (launch, retry, check, or the start of that risk); most jobs have no such clock.
//!
//! Each job's keys are stored here per job slot, so an entry is always removed under the key
//! it was inserted with; setting a job's keys costs O(log jobs) (O(1) for the usual
//! unschedulable clock: `clocks.rs`), and only when they change. The scheduler sets them
//! after every change to a job ([`Scheduler::sync_job`](super)).

use std::collections::BTreeSet;

use super::clocks::Clocks;

/// One job's entries: its locality deadline and its last progress (the unschedulable clock),
/// each `None` while it has none, and whether it waits in the skip list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Keys {
    /// When the job's locality level widens (it has tasks queued at a level below "any").
    pub level_us: Option<u64>,
    /// The job's last progress, while it has tasks queued.
    pub progress_us: Option<u64>,
}

/// The jobs' timers. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// (deadline, job slot) of the jobs waiting for a locality level to widen.
    level: BTreeSet<(u64, u32)>,
    /// (last progress, job slot) of the jobs with tasks queued.
    progress: Clocks,
    /// Keys per job slot, as inserted.
    keys: Vec<Keys>,
    /// Per job slot: listed in `skips` since the last drain.
    skip_listed: Vec<bool>,
    /// Job slots whose locality level has nothing left to wait for (may hold slots whose job
    /// ended and was replaced: the tick re-checks; each slot is listed once between drains
    /// unless its job ends, so the list is bounded by the events since the last tick).
    skips: Vec<u32>,
}

impl Timers {
    /// Sets job `slot`'s keys (inserting, moving or removing its entries as they changed). A
    /// progress later than the one filed leaves the entry where it is: progress only moves on
    /// (every launch moves it), so the entry stays put and may come due early, when the tick
    /// finds the job's real progress and files that ([`Timers::refile_progress`]). So a launch
    /// costs no re-sort.
    #[inline(always)]
    pub fn set(&mut self, slot: u32, keys: Keys) {
        // Most calls change nothing (a job with no locality wait and no clock).
        match self.keys.get(slot as usize) {
            Some(old) if old.level_us == keys.level_us && old.progress_us == keys.progress_us => {}
            _ => self.change(slot, keys),
        }
    }

    /// [`Timers::set`] when the keys may have changed.
    fn change(&mut self, slot: u32, keys: Keys) {
        let i = slot as usize;
        if self.keys.len() <= i {
            self.keys.resize(i + 1, Keys::default());
            self.skip_listed.resize(i + 1, false);
        }
        let Some(old) = self.keys.get_mut(i) else {
            unreachable!("keys of slot {slot} were just made");
        };
        let progress_us = match (old.progress_us, keys.progress_us) {
            (Some(filed), Some(new)) if new >= filed => Some(filed),
            (_, new) => new,
        };
        if old.level_us == keys.level_us && old.progress_us == progress_us {
            return;
        }
        rekey(&mut self.level, slot, old.level_us, keys.level_us);
        (self.progress).rekey(slot, old.progress_us, progress_us);
        *old = Keys {
            level_us: keys.level_us,
            progress_us,
        };
    }

    /// Files job `slot`'s progress entry at `progress_us` (its real progress, later than the
    /// one filed, which came due). A job without an entry gets none.
    pub fn refile_progress(&mut self, slot: u32, progress_us: u64) {
        let Some(old) = self.keys.get_mut(slot as usize) else {
            return;
        };
        if old.progress_us.is_some() {
            (self.progress).rekey(slot, old.progress_us, Some(progress_us));
            old.progress_us = Some(progress_us);
        }
    }

    /// The progress job `slot` is filed under (at or before its real progress), if any.
    pub fn filed_progress(&self, slot: u32) -> Option<u64> {
        self.keys.get(slot as usize).and_then(|k| k.progress_us)
    }

    /// Job `slot` ended: its entries go (a stale skip entry stays until the next drain).
    #[inline]
    pub fn remove(&mut self, slot: u32) {
        // Most jobs end with nothing filed (their last launch cleared it): no call then.
        let filed = self.keys.get(slot as usize);
        if filed.is_some_and(|k| *k != Keys::default()) {
            self.set(slot, Keys::default());
        }
        if let Some(listed) = self.skip_listed.get_mut(slot as usize) {
            *listed = false;
        }
    }

    /// Whether job `slot` has no entry (as a slot no job has held, or whose job ended).
    pub fn is_clear(&self, slot: u32) -> bool {
        self.keys
            .get(slot as usize)
            .is_none_or(|k| *k == Keys::default())
    }

    /// Lists job `slot` for the next tick (its locality level has nothing to wait for), once.
    pub fn mark_skip(&mut self, slot: u32) {
        let i = slot as usize;
        if self.skip_listed.len() <= i {
            self.keys.resize(i + 1, Keys::default());
            self.skip_listed.resize(i + 1, false);
        }
        if let Some(listed) = self.skip_listed.get_mut(i) {
            if !*listed {
                *listed = true;
                self.skips.push(slot);
            }
        }
    }

    /// The earliest locality deadline.
    pub fn level_first_us(&self) -> Option<u64> {
        self.level.first().map(|&(t, _)| t)
    }

    /// The earliest last progress of a job with tasks queued.
    pub fn progress_first_us(&self) -> Option<u64> {
        self.progress.first()
    }

    /// Moves into `out` the slots of the jobs whose locality deadline is at or before `now_us`,
    /// then those listed as skips (emptying that list); a slot may appear twice.
    pub fn level_due_into(&mut self, now_us: u64, out: &mut Vec<u32>) {
        out.extend(
            self.level
                .iter()
                .take_while(|&&(t, _)| t <= now_us)
                .map(|&(_, s)| s),
        );
        for slot in self.skips.drain(..) {
            if let Some(listed) = self.skip_listed.get_mut(slot as usize) {
                if std::mem::take(listed) {
                    out.push(slot);
                }
            }
        }
    }

    /// Moves into `out` the slots of the jobs with tasks queued whose last progress is
    /// `timeout_us` or more before `now_us`, earliest progress first.
    pub fn overdue_into(&self, now_us: u64, timeout_us: u64, out: &mut Vec<u32>) {
        out.extend(
            self.progress
                .iter()
                .take_while(|&(t, _)| now_us.saturating_sub(t) >= timeout_us)
                .map(|(_, s)| s),
        );
    }

    /// Jobs with a locality deadline and jobs with tasks queued (for tests).
    #[cfg(test)]
    pub fn lens(&self) -> (usize, usize) {
        (self.level.len(), self.progress.len())
    }
}

/// Moves `slot`'s entry in `set` from key `old` to key `new` (`None`: not listed).
fn rekey(set: &mut BTreeSet<(u64, u32)>, slot: u32, old: Option<u64>, new: Option<u64>) {
    if old == new {
        return;
    }
    if let Some(t) = old {
        let removed = set.remove(&(t, slot));
        assert!(
            removed,
            "job slot {slot} is listed under the key it was given"
        );
    }
    if let Some(t) = new {
        set.insert((t, slot));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(level_us: Option<u64>, progress_us: Option<u64>) -> Keys {
        Keys {
            level_us,
            progress_us,
        }
    }

    #[test]
    fn keys_move_and_go_and_the_earliest_is_first() {
        let mut t = Timers::default();
        t.set(3, keys(Some(50), Some(10)));
        t.set(1, keys(Some(20), Some(30)));
        assert_eq!(
            (t.level_first_us(), t.progress_first_us()),
            (Some(20), Some(10))
        );
        t.set(1, keys(None, Some(30)));
        assert_eq!(t.level_first_us(), Some(50), "slot 1 no longer waits");
        t.set(3, keys(Some(50), Some(40)));
        assert_eq!(
            t.progress_first_us(),
            Some(10),
            "a later progress leaves slot 3 filed where it was"
        );
        t.refile_progress(3, 40);
        assert_eq!(
            t.progress_first_us(),
            Some(30),
            "refiled: slot 3 moved behind slot 1"
        );
        t.set(3, keys(Some(50), Some(35)));
        assert_eq!(
            t.filed_progress(3),
            Some(35),
            "an earlier progress moves it"
        );
        t.remove(3);
        t.remove(3);
        assert_eq!(t.lens(), (0, 1));
        t.remove(1);
        assert_eq!((t.level_first_us(), t.progress_first_us()), (None, None));
    }

    #[test]
    fn equal_keys_of_different_jobs_are_kept_apart() {
        let mut t = Timers::default();
        t.set(0, keys(Some(5), Some(5)));
        t.set(1, keys(Some(5), Some(5)));
        assert_eq!(t.lens(), (2, 2));
        t.remove(0);
        assert_eq!(t.lens(), (1, 1));
        let mut due = Vec::new();
        t.level_due_into(5, &mut due);
        assert_eq!(due, [1]);
    }

    #[test]
    fn due_and_overdue_take_only_the_jobs_whose_time_came() {
        let mut t = Timers::default();
        for (slot, at) in [(0, 30), (1, 10), (2, 20)] {
            t.set(slot, keys(Some(at), Some(at)));
        }
        let mut due = Vec::new();
        t.level_due_into(19, &mut due);
        assert_eq!(due, [1]);
        due.clear();
        t.level_due_into(20, &mut due);
        assert_eq!(due, [1, 2], "a deadline at now is due");
        due.clear();
        t.overdue_into(25, 5, &mut due);
        assert_eq!(due, [1, 2], "earliest progress first");
        due.clear();
        t.overdue_into(3, 5, &mut due);
        assert!(due.is_empty(), "now before the timeout: nothing overdue");
        t.overdue_into(3, 0, &mut due);
        assert_eq!(due, [1, 2, 0], "a zero timeout makes every job overdue");
    }

    #[test]
    fn a_skip_is_listed_once_per_drain_and_forgotten_when_its_job_ends() {
        let mut t = Timers::default();
        t.mark_skip(4);
        t.mark_skip(4);
        t.mark_skip(2);
        let mut due = Vec::new();
        t.level_due_into(0, &mut due);
        assert_eq!(due, [4, 2]);
        due.clear();
        t.level_due_into(0, &mut due);
        assert!(due.is_empty(), "drained");
        t.mark_skip(4);
        t.remove(4);
        t.level_due_into(0, &mut due);
        assert!(due.is_empty(), "its job ended");
        t.mark_skip(4);
        t.remove(4);
        t.mark_skip(4);
        t.level_due_into(0, &mut due);
        assert_eq!(due, [4], "the slot's new job, once");
    }
}
