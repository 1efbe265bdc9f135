//! The telemetry's job records, from a job's submission until it leaves the recent jobs. Each
//! record stays in one slot of a slab for all that time: the active jobs map an id to its slot,
//! the recent jobs are slot numbers in a ring, newest last. A job's end moves a slot number (4
//! bytes), not its record (about 200); a slot freed by the oldest recent job takes the next
//! job's record, written in place over the old one, whose vectors keep their room.

use std::sync::Arc;

use flint_engine::ids::IdMap;
use flint_engine::scheduler::JobId;

use super::{JobTrack, NewJob, RECENT_JOBS_MAX};

/// A job that ended, as the recent jobs keep it.
#[derive(Clone, Copy)]
struct Ended {
    job: JobId,
    slot: u32,
    /// Its final state.
    state: &'static str,
    /// When it ended (micros).
    ended_us: u64,
}

/// Active and recent jobs' records (see the module docs).
#[derive(Default)]
pub(super) struct Tracks {
    /// Every record, in use or free.
    slots: Vec<JobTrack>,
    /// Slots whose record may be replaced.
    free: Vec<u32>,
    /// Active jobs: id to slot.
    active: IdMap<u32>,
    /// Jobs that ended, at most [`RECENT_JOBS_MAX`], a ring in the order they ended: the next
    /// to end goes at `next` (pushed while the ring is not full, over the oldest once it is),
    /// so the newest is just before `next`. A full ring's end costs one write and no shifting.
    recent: Vec<Ended>,
    next: usize,
}

impl Tracks {
    /// Files the record of `job`, just submitted (its id not active yet), over the record of
    /// a freed slot or a new one, and returns it for its span (left as the slot had it: a
    /// job's end leaves none to close). `new` goes to one place only (a new slot is made
    /// empty first, out of line), so its fields are written straight into the record, not
    /// moved through copies of it on the stack.
    #[inline(always)]
    pub fn open(&mut self, job: JobId, new: NewJob<'_>) -> &mut JobTrack {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => self.push(new.function, new.pool),
        };
        let Some(record) = self.slots.get_mut(slot as usize) else {
            unreachable!("free job record slot {slot} beyond the slab");
        };
        record.refill(new);
        let replaced = self.active.insert(job.0, slot);
        debug_assert!(replaced.is_none(), "job {} opened twice", job.0);
        record
    }

    /// A new slot, its record empty (no slot is free: the first jobs, or more active).
    #[cold]
    #[inline(never)]
    fn push(&mut self, function: &Arc<str>, pool: &Arc<str>) -> u32 {
        self.slots.push(JobTrack::empty(function, pool));
        u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 job records")
    }

    /// The record of active job `job`.
    #[inline]
    pub fn get(&self, job: JobId) -> Option<&JobTrack> {
        let slot = *self.active.get(job.0)?;
        self.slots.get(slot as usize)
    }

    /// The record of active job `job`, to change.
    #[inline]
    pub fn get_mut(&mut self, job: JobId) -> Option<&mut JobTrack> {
        let slot = *self.active.get(job.0)?;
        self.slots.get_mut(slot as usize)
    }

    /// Moves active job `job` to the front of the recent jobs, ended in `state` at `ended_us`,
    /// and returns its record for the last changes; the oldest recent job past
    /// [`RECENT_JOBS_MAX`] gives its slot up. None if `job` is not active. Inlined in both
    /// ends of a job (`job_over`, `one_task_job_succeeded`): a call was a dozen instructions of
    /// saving registers per job.
    #[inline(always)]
    pub fn close(
        &mut self,
        job: JobId,
        state: &'static str,
        ended_us: u64,
    ) -> Option<&mut JobTrack> {
        let slot = self.active.remove(job.0)?;
        let ended = Ended {
            job,
            slot,
            state,
            ended_us,
        };
        match self.recent.get_mut(self.next) {
            Some(oldest) => self.free.push(std::mem::replace(oldest, ended).slot),
            None => self.recent.push(ended),
        }
        self.next += 1;
        if self.next == RECENT_JOBS_MAX {
            self.next = 0;
        }
        self.slots.get_mut(slot as usize)
    }

    /// How many jobs are active.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// The active jobs' ids, in no order.
    pub fn active_ids(&self) -> impl Iterator<Item = JobId> + '_ {
        self.active.keys().map(JobId)
    }

    /// The recent jobs, newest first: id, record, final state, when it ended.
    pub fn recent(&self) -> impl Iterator<Item = (JobId, &JobTrack, &'static str, u64)> + '_ {
        // Those before `next` ended last; those from it on (a full ring's) before them.
        let (newer, older) = self.recent.split_at(self.next.min(self.recent.len()));
        (newer.iter().rev().chain(older.iter().rev())).filter_map(|ended| {
            let record = self.slots.get(ended.slot as usize)?;
            Some((ended.job, record, ended.state, ended.ended_us))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track(tasks: u64) -> NewJob<'static> {
        static F: std::sync::OnceLock<(Arc<str>, Arc<str>)> = std::sync::OnceLock::new();
        let (function, pool) = F.get_or_init(|| ("f".into(), "default".into()));
        NewJob {
            function,
            pool,
            tasks,
            submitted_us: 0,
        }
    }

    #[test]
    fn records_stay_put_until_the_oldest_recent_job_gives_its_slot_up() {
        let mut t = Tracks::default();
        let jobs = RECENT_JOBS_MAX as u64 * 3;
        // Ten jobs active at a time; each ends in submission order.
        for id in 0..jobs {
            t.open(JobId(id), track(id));
            if id >= 10 {
                let ended = JobId(id - 10);
                let closed = t.close(ended, "SUCCEEDED", id).expect("active");
                assert_eq!(closed.tasks, ended.0, "its own record");
                closed.tasks_done = ended.0 * 2;
            }
            assert_eq!(t.active(), (id + 1).min(10) as usize);
            // At most eleven active (one opened before one closes), the recent ones, no more.
            assert!(t.slots.len() <= RECENT_JOBS_MAX + 11, "slots reused");
        }
        assert!(t.close(JobId(0), "SUCCEEDED", 0).is_none(), "ended before");
        assert!(t.get(JobId(jobs)).is_none(), "never opened");
        let recent: Vec<_> = t.recent().collect();
        assert_eq!(recent.len(), RECENT_JOBS_MAX);
        for (i, (job, record, state, ended_us)) in recent.into_iter().enumerate() {
            let expected = jobs - 11 - i as u64;
            assert_eq!(
                (job, state, ended_us),
                (JobId(expected), "SUCCEEDED", expected + 10)
            );
            assert_eq!((record.tasks, record.tasks_done), (expected, expected * 2));
        }
        let mut active: Vec<u64> = t.active_ids().map(|j| j.0).collect();
        active.sort_unstable();
        assert_eq!(active, (jobs - 10..jobs).collect::<Vec<_>>());
        for id in jobs - 10..jobs {
            assert_eq!(t.get(JobId(id)).map(|r| r.tasks), Some(id));
            t.get_mut(JobId(id)).expect("active").copies = 1;
        }
    }

    #[test]
    fn a_reused_slot_keeps_nothing_of_the_job_before() {
        let mut t = Tracks::default();
        let first = JobId(0);
        let (g, p): (Arc<str>, Arc<str>) = ("g".into(), "p".into());
        t.open(
            first,
            NewJob {
                function: &g,
                pool: &p,
                submitted_us: 3,
                ..track(1)
            },
        );
        let closed = t.close(first, "FAILED", 5).expect("active");
        closed.tasks_done = 1;
        closed.attempts_failed = 2;
        closed.copies = 3;
        closed.failures.push("boom".into());
        closed.durations.offer(40, 1);
        closed.delays.offer(7, 1);
        // The first job leaves the recent ones: its slot takes the next job's record.
        for id in 1..=RECENT_JOBS_MAX as u64 {
            t.open(JobId(id), track(1));
            t.close(JobId(id), "SUCCEEDED", id);
        }
        let next = JobId(RECENT_JOBS_MAX as u64 + 1);
        t.open(next, track(9));
        assert_eq!(
            t.slots.len(),
            RECENT_JOBS_MAX + 1,
            "the freed slot was reused"
        );
        let record = t.get(next).expect("active");
        assert_eq!(record.tasks, 9);
        assert_eq!((&*record.function, &*record.pool), ("f", "default"));
        assert_eq!(record.submitted_us, 0);
        let counts = (record.tasks_done, record.attempts_failed, record.copies);
        assert_eq!(counts, (0, 0, 0));
        assert!(record.failures.is_empty());
        assert!(record.durations.is_empty() && record.delays.is_empty());
        assert!(
            record.durations.five().is_none(),
            "no sample of the job before"
        );
    }
}
