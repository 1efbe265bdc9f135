//! What ended work leaves: sent launch batches, kept for new ones, so a launch batch allocates
//! nothing in steady state (bounded in count and in the capacity kept, so a burst of big
//! rounds is given back to the allocator); and a big job's records and payloads, and the specs
//! a big job's records were built from, handed to the caller to free off its loop
//! ([`Remains`]). (An ended job's small vectors stay in its vacant record: `slots.rs`.)

use super::job::{Job, Prefs, TaskRec};
use super::{Payloads, TaskLaunch, TaskSpec};

/// Tasks from which an ended job's records and payloads are [`Remains`] for the caller to
/// free: freeing 65,536 takes about half a millisecond (10,000,000 about 80 ms).
pub(super) const REMAINS_MIN_TASKS: usize = 65_536;
/// Remains kept for the caller at most; past them, the oldest are freed in place.
pub(super) const REMAINS_KEPT: usize = 4;

/// A big ended job's task records, preferences and payloads, or the task specs a big new
/// job's records were built from ([`Scheduler::poll_remains`](super::Scheduler::poll_remains)):
/// dropping it frees them, which takes milliseconds for millions of tasks, so a driver drops
/// it on another thread rather than hold its loop.
pub struct Remains {
    tasks: Vec<TaskRec>,
    payloads: Payloads,
    prefs: Vec<Option<Prefs>>,
    /// A big job's task specs once its records were built from them: what is left in them
    /// (host names) is freed with them.
    specs: Vec<TaskSpec>,
}

impl Remains {
    /// The records, preferences and payloads of `job`, which ended, if it is big enough to
    /// matter (else they stay, to go with it).
    pub(super) fn take_from(job: &mut Job) -> Option<Remains> {
        // A job has a payload per task at most (one built in chunks, fewer until built): a
        // small job is let go without looking at its payloads.
        let records = job.tasks.capacity();
        if records.max(job.task_count) < REMAINS_MIN_TASKS
            || records.max(job.payloads.len()) < REMAINS_MIN_TASKS
        {
            return None;
        }
        Some(Remains {
            tasks: std::mem::take(&mut job.tasks),
            payloads: std::mem::take(&mut job.payloads),
            prefs: std::mem::take(&mut job.prefs),
            specs: Vec::new(),
        })
    }

    /// A new job's task `specs`, spent (its records built from them).
    pub(super) fn of_specs(specs: Vec<TaskSpec>) -> Remains {
        Remains {
            tasks: Vec::new(),
            payloads: Payloads::default(),
            prefs: Vec::new(),
            specs,
        }
    }

    /// How many tasks' records, payloads or specs it holds, at most.
    pub fn tasks(&self) -> usize {
        let records = self.tasks.capacity().max(self.prefs.len());
        records.max(self.payloads.len()).max(self.specs.len())
    }
}

impl std::fmt::Debug for Remains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remains")
            .field("tasks", &self.tasks())
            .finish_non_exhaustive()
    }
}

/// Sent launch batches' vectors, emptied and kept for new batches.
#[derive(Debug, Default)]
pub(super) struct Spare {
    /// Launch batches the driver handed back ([`Scheduler::recycle_launches`]).
    launches: Vec<Vec<TaskLaunch>>,
    /// The capacity of `launches`, summed, in launches.
    launches_capacity: usize,
}

/// Spare launch batches kept at most: one per executor a round launches to (a job spread over
/// a big cluster gives each executor one task, so as many batches come back), within
/// [`SPARE_LAUNCHES_TOTAL`].
const SPARE_LAUNCHES_MAX: usize = 4096;
/// The spare launch batches' capacity, summed, kept at most, in launches (about 5 MB).
const SPARE_LAUNCHES_TOTAL: usize = 65_536;
/// The largest spare launch batch kept, in launches.
const SPARE_LAUNCHES_CAPACITY_MAX: usize = 1024;

impl Spare {
    /// Keeps a sent launch batch's vector (its launches dropped) if there is room for it.
    pub(super) fn keep_launches(&mut self, mut launches: Vec<TaskLaunch>) {
        let capacity = launches.capacity();
        if self.launches.len() < SPARE_LAUNCHES_MAX
            && (1..=SPARE_LAUNCHES_CAPACITY_MAX).contains(&capacity)
            && self.launches_capacity + capacity <= SPARE_LAUNCHES_TOTAL
        {
            launches.clear();
            self.launches.push(launches);
            self.launches_capacity += capacity;
        }
    }

    /// An empty launch batch: a kept one, or a new one for `expected` launches.
    pub(super) fn launches(&mut self, expected: usize) -> Vec<TaskLaunch> {
        match self.launches.pop() {
            Some(kept) => {
                self.launches_capacity -= kept.capacity();
                kept
            }
            None => Vec::with_capacity(expected),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_vectors_come_back_empty_and_big_or_surplus_ones_are_dropped() {
        let mut spare = Spare::default();
        let mut launches = Vec::with_capacity(4);
        launches.push(TaskLaunch {
            task: super::super::TaskId(1),
            attempt: 0,
            function: "f".into(),
            payload: bytes::Bytes::new(),
            cores: 1,
            speculative: false,
        });
        spare.keep_launches(launches);
        let back = spare.launches(0);
        assert!(
            back.is_empty() && back.capacity() >= 4,
            "emptied, allocation kept"
        );
        assert_eq!(spare.launches_capacity, 0, "given out");
        assert!(spare.launches(7).capacity() >= 7, "none kept: a new one");
        spare.keep_launches(Vec::with_capacity(SPARE_LAUNCHES_CAPACITY_MAX + 1));
        spare.keep_launches(Vec::new());
        assert!(spare.launches.is_empty(), "too big, or nothing, to keep");
        for _ in 0..SPARE_LAUNCHES_MAX + 5 {
            spare.keep_launches(Vec::with_capacity(1));
        }
        assert_eq!(spare.launches.len(), SPARE_LAUNCHES_MAX, "bounded in count");
        let mut spare = Spare::default();
        for _ in 0..SPARE_LAUNCHES_TOTAL / SPARE_LAUNCHES_CAPACITY_MAX + 5 {
            spare.keep_launches(Vec::with_capacity(SPARE_LAUNCHES_CAPACITY_MAX));
        }
        assert!(
            spare.launches_capacity <= SPARE_LAUNCHES_TOTAL
                && spare.launches.len() == SPARE_LAUNCHES_TOTAL / SPARE_LAUNCHES_CAPACITY_MAX,
            "bounded in capacity"
        );
    }
}
