//! Admission: what a caller's own thread checks and reserves before its job goes into the
//! driver loop's inbox, so that submitting never waits for the loop. The caller allocates the
//! job's id, checks the job's shape and reserves room under the driver's limits (jobs and
//! unfinished tasks) with atomic counters; the loop gives the room back when the job ends.
//! A caller that found the inbox full can wait for room ([`Admission::wait_for_room`]): the
//! loop wakes such waiters whenever it takes a message off its inbox.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::task::Waker;

use flint_engine::scheduler::{JobId, SubmitError};

use crate::job::Job;

/// Longest function name a job may name, in bytes (it travels in a `DefineFunction`; an
/// executor refuses a longer one).
pub const FUNCTION_NAME_MAX_BYTES: usize = 1024;

/// The caller side of the driver's limits.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The next job id; ids wrap below 2^32 (a task id holds its job's id in 32 bits), skipping
    /// 0. A wrapped id still in use fails that job at the loop (`SubmitError::DuplicateJob`).
    next_job: AtomicU64,
    /// Tasks of jobs admitted and not yet ended.
    tasks: AtomicUsize,
    /// Jobs admitted and not yet ended.
    jobs: AtomicUsize,
    tasks_max: usize,
    jobs_max: usize,
    /// Tasks waiting to be woken when the loop frees inbox room.
    room: Mutex<Vec<Waker>>,
    room_waiters: AtomicUsize,
    /// Some job was cancelled while the inbox was full: the loop looks for cancelled jobs.
    pub(crate) cancels_pending: AtomicBool,
}

impl Admission {
    pub(crate) fn new(tasks_max: usize, jobs_max: usize) -> Admission {
        Admission {
            next_job: AtomicU64::new(0),
            tasks: AtomicUsize::new(0),
            jobs: AtomicUsize::new(0),
            tasks_max,
            jobs_max,
            room: Mutex::new(Vec::new()),
            room_waiters: AtomicUsize::new(0),
            cancels_pending: AtomicBool::new(false),
        }
    }

    /// Checks `job` of `tasks` tasks (its [`Job::len`], which the caller counted) and reserves
    /// room for it; the id it will have. Nothing is reserved on error.
    pub(crate) fn admit(&self, job: &Job, tasks: usize) -> Result<JobId, SubmitError> {
        debug_assert_eq!(tasks, job.len());
        if u32::try_from(tasks).is_err() {
            return Err(SubmitError::TooManyTasks);
        }
        if job.cores == 0 && tasks > 0 {
            return Err(SubmitError::ZeroCores(0));
        }
        let active = self.tasks.fetch_add(tasks, Ordering::AcqRel);
        if active.saturating_add(tasks) > self.tasks_max {
            self.tasks.fetch_sub(tasks, Ordering::AcqRel);
            return Err(SubmitError::TooManyPending {
                active,
                submitted: tasks,
                limit: self.tasks_max,
            });
        }
        if self.jobs.fetch_add(1, Ordering::AcqRel) >= self.jobs_max {
            self.jobs.fetch_sub(1, Ordering::AcqRel);
            self.tasks.fetch_sub(tasks, Ordering::AcqRel);
            return Err(SubmitError::TooManyJobs(self.jobs_max));
        }
        let n = self.next_job.fetch_add(1, Ordering::Relaxed);
        Ok(JobId(n % u64::from(u32::MAX) + 1))
    }

    /// Gives back what [`admit`](Self::admit) reserved for a job of `tasks` tasks.
    pub(crate) fn release(&self, tasks: usize) {
        let before = self.tasks.fetch_sub(tasks, Ordering::AcqRel);
        debug_assert!(before >= tasks, "released more tasks than admitted");
        let jobs = self.jobs.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(jobs >= 1, "released more jobs than admitted");
    }

    /// Jobs admitted and not ended.
    pub(crate) fn active_jobs(&self) -> usize {
        self.jobs.load(Ordering::Acquire)
    }

    /// Wakes `waker` the next time the loop takes a message off its inbox.
    pub(crate) fn wait_for_room(&self, waker: &Waker) {
        let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
        if !room.iter().any(|w| w.will_wake(waker)) {
            room.push(waker.clone());
            self.room_waiters.fetch_add(1, Ordering::Release);
        }
    }

    /// Called by the loop for each message it takes: wakes whoever waits for room (one atomic
    /// load when nobody does).
    pub(crate) fn room_made(&self) {
        if self.room_waiters.load(Ordering::Acquire) == 0 {
            return;
        }
        let wakers = {
            let mut room = self.room.lock().unwrap_or_else(|p| p.into_inner());
            self.room_waiters.store(0, Ordering::Release);
            std::mem::take(&mut *room)
        };
        wakers.into_iter().for_each(Waker::wake);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn limits_are_reserved_and_given_back() {
        let admission = Admission::new(10, 2);
        let job = |n| Job::new("noop", vec![Bytes::new(); n]);
        let admit = |n| admission.admit(&job(n), n);
        let a = admit(6).expect("fits");
        assert!(matches!(
            admit(5),
            Err(SubmitError::TooManyPending { active: 6, .. })
        ));
        let b = admit(4).expect("fits exactly");
        assert_ne!(a, b);
        assert!(matches!(admit(0), Err(SubmitError::TooManyJobs(2))));
        admission.release(6);
        admit(6).expect("room again");
        assert_eq!(admission.active_jobs(), 2);
    }

    #[test]
    fn ids_wrap_below_two_to_the_32_and_skip_zero() {
        let admission = Admission::new(10, 10);
        admission
            .next_job
            .store(u64::from(u32::MAX) - 1, Ordering::Relaxed);
        let job = Job::new("noop", Vec::new());
        let ids: Vec<u64> = (0..3)
            .map(|_| {
                let id = admission.admit(&job, 0).expect("fits").0;
                admission.release(0);
                id
            })
            .collect();
        assert_eq!(ids, vec![u64::from(u32::MAX), 1, 2]);
    }
}
