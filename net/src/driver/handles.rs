//! The callers' side of the driver's loop: each active job's shared state (what its
//! [`crate::job::JobHandle`] reads) and result observer, the room each job holds under the
//! admission limits, and the callers waiting for executors. The endpoint (and the cluster
//! simulator) hands every [`Event`] the core polls out to [`Handles::deliver_all`]; this is where
//! user code (a result observer) runs, never inside the core.
//!
//! The active jobs live in a slab: a job opened here gets a free entry's index as its
//! [`JobToken`], which the core hands the scheduler with the job and the scheduler hands back
//! with each of its events, so an event finds its job's entry by index, not by looking its id
//! up. A token goes back to the free ones only when its job's outcome is delivered, the last
//! event of its job, so no event of a job that ended finds another job's entry; each entry
//! also names its job, and an event whose job it does not name finds none.

use std::sync::Arc;

use flint_engine::runtime::Reply;
use flint_engine::scheduler::{JobId, JobOutcome, JobToken};

use super::core::Event;
use crate::admission::Admission;
use crate::job::{JobShared, Observer, SpareStates};

/// Callers waiting for executors at once, at most.
const EXECUTOR_WAITERS_MAX: usize = 4096;

/// One active job, as its caller sees it.
struct Entry {
    /// The job.
    job: JobId,
    shared: Arc<JobShared>,
    observer: Option<Observer>,
    /// Tasks in the job, given back to admission when it ends.
    tasks: usize,
    /// Whether its handle takes its results as they come ([`crate::Job::stream_results`]).
    stream: bool,
}

/// The callers' side (see the module docs).
pub(crate) struct Handles {
    /// The active jobs, at their tokens' indexes (`None`: a free entry, listed in `free`).
    jobs: Vec<Option<Entry>>,
    /// The free entries' indexes, the last freed last.
    free: Vec<u32>,
    /// Callers waiting for a number of executors.
    waiters: Vec<(usize, Reply<()>)>,
    admission: Arc<Admission>,
    /// Where an ended job's state goes if its handle is gone already.
    spare: Arc<SpareStates>,
}

impl Handles {
    pub(crate) fn new(admission: Arc<Admission>, spare: Arc<SpareStates>) -> Handles {
        Handles {
            jobs: Vec::new(),
            free: Vec::new(),
            waiters: Vec::new(),
            admission,
            spare,
        }
    }

    /// A job on its way to the core, admitted under `id` with `tasks` tasks (streaming its
    /// results to the handle if `stream`): the token its events are to carry, if it goes
    /// there. One its handle cancelled already ends here as cancelled. Always inline (the
    /// hint alone was not taken), with the endpoint's `open` around it: one call per job
    /// saved.
    #[inline(always)]
    pub(crate) fn open(
        &mut self,
        id: JobId,
        shared: Arc<JobShared>,
        observer: Option<Observer>,
        tasks: usize,
        stream: bool,
    ) -> Option<JobToken> {
        if shared.is_cancelled() {
            self.admission.release(tasks);
            shared.finish(JobOutcome::Cancelled);
            return None;
        }
        let entry = Entry {
            job: id,
            shared,
            observer,
            tasks,
            stream,
        };
        let token = match self.free.pop() {
            Some(token) => token,
            None => self.push(),
        };
        let Some(free) = self.jobs.get_mut(token as usize) else {
            unreachable!("free job entry {token} beyond the slab");
        };
        debug_assert!(free.is_none(), "job entry {token} in use and listed free");
        *free = Some(entry);
        Some(JobToken(token))
    }

    /// A new free entry's index (none is free: the first jobs, or more active than ever).
    #[cold]
    #[inline(never)]
    fn push(&mut self) -> u32 {
        self.jobs.push(None);
        u32::try_from(self.jobs.len() - 1).expect("fewer than 2^32 active jobs")
    }

    /// Takes job `job`'s entry at `token` out (its token free again), if it is there.
    #[inline(always)]
    fn take(&mut self, job: JobId, token: JobToken) -> Option<Entry> {
        let slot = self.jobs.get_mut(token.0 as usize)?;
        let entry = slot.take_if(|entry| entry.job == job)?;
        self.free.push(token.0);
        Some(entry)
    }

    /// Hands the core's events (from `next`, until it has none) to their jobs: a result to
    /// the handle and the observer, an outcome to the handle (giving its room back). Each
    /// finds its job's entry at the token it carries; a run of one job's results, once.
    pub(crate) fn deliver_all(&mut self, mut next: impl FnMut() -> Option<(Event, JobToken)>) {
        // The entry of the last result's job: a run of one job's results finds it once.
        let mut current: Option<(JobId, &mut Entry)> = None;
        while let Some((event, token)) = next() {
            match event {
                Event::TaskResult { task, result } => {
                    let job = task.job();
                    if current.as_ref().is_none_or(|(id, _)| *id != job) {
                        current = entry(&mut self.jobs, job, token).map(|entry| (job, entry));
                    }
                    let Some((_, entry)) = current.as_mut() else {
                        continue;
                    };
                    let result = result.as_ref().map_err(String::as_str);
                    entry.shared.task_done();
                    if entry.stream {
                        entry.shared.stream_result(task.index(), result);
                    }
                    if let Some(observer) = entry.observer.as_mut() {
                        observer.see(task.index(), result);
                    }
                }
                Event::JobOutcome { job, outcome } => {
                    current = None;
                    if let Some(entry) = self.take(job, token) {
                        self.end(entry, outcome);
                    }
                }
                Event::OneTaskJobSucceeded { task, result } => {
                    current = None;
                    if let Some(mut entry) = self.take(task.job(), token) {
                        entry.shared.task_done();
                        if entry.stream {
                            entry.shared.stream_result(task.index(), Ok(&result));
                        }
                        if let Some(observer) = entry.observer.as_mut() {
                            observer.see(task.index(), Ok(&result));
                        }
                        self.end(entry, JobOutcome::Succeeded(Vec::new()));
                    }
                }
            }
        }
    }

    /// The job of `entry` (no longer listed) ended with `outcome`: its handle hears it, its
    /// room goes back to admission, its state to the spares. Always inline (the hint alone was
    /// not taken): once a job, and out of line its call and saved registers were a fifth of it.
    #[inline(always)]
    fn end(&self, entry: Entry, outcome: JobOutcome) {
        // The observer goes first: a caller that sees the outcome holds the last reference to
        // what the observer held.
        drop(entry.observer);
        self.admission.release(entry.tasks);
        entry.shared.finish(outcome);
        self.spare.give(entry.shared);
    }

    /// The jobs whose handles cancelled them while the driver's inbox was full (so no
    /// message came), once per such round.
    pub(crate) fn cancelled(&self) -> Vec<JobId> {
        if !self
            .admission
            .cancels_pending
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Vec::new();
        }
        (self.jobs.iter().flatten())
            .filter(|entry| entry.shared.is_cancelled())
            .map(|entry| entry.job)
            .collect()
    }

    /// Answers `reply` once at least `count` executors are registered (at once if
    /// `registered` are). Waiters that gave up are forgotten; past [`EXECUTOR_WAITERS_MAX`]
    /// the asker hears `Stopped` at once (its reply is dropped).
    pub(crate) fn when_executors(&mut self, count: usize, reply: Reply<()>, registered: usize) {
        if registered >= count {
            let _ = reply.send(());
            return;
        }
        self.waiters.retain(|(_, r)| !r.is_abandoned());
        if self.waiters.len() < EXECUTOR_WAITERS_MAX {
            self.waiters.push((count, reply));
        }
    }

    /// Answers the callers waiting for no more than `registered` executors.
    pub(crate) fn executors_registered(&mut self, registered: usize) {
        if self.waiters.iter().all(|(count, _)| *count > registered) {
            return;
        }
        for (count, reply) in std::mem::take(&mut self.waiters) {
            if count <= registered {
                let _ = reply.send(());
            } else {
                self.waiters.push((count, reply));
            }
        }
    }
}

/// The entry at `token` in `jobs`, if it is job `job`'s.
#[inline(always)]
fn entry(jobs: &mut [Option<Entry>], job: JobId, token: JobToken) -> Option<&mut Entry> {
    let entry = jobs.get_mut(token.0 as usize)?.as_mut()?;
    (entry.job == job).then_some(entry)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use flint_engine::scheduler::TaskId;

    use super::*;
    use crate::job::Job;

    /// Opens a one-task job admitted under `admission`: its id, state and token.
    fn open(handles: &mut Handles, admission: &Admission) -> (JobId, Arc<JobShared>, JobToken) {
        let job = Job::new("f", vec![Bytes::new()]);
        let id = admission.admit(&job, 1).expect("room");
        let shared = Arc::new(JobShared::new());
        let token = (handles.open(id, shared.clone(), None, 1, false)).expect("not cancelled");
        (id, shared, token)
    }

    fn deliver(handles: &mut Handles, events: Vec<(Event, JobToken)>) {
        let mut events = events.into_iter();
        handles.deliver_all(|| events.next());
    }

    fn result(job: JobId, token: JobToken) -> (Event, JobToken) {
        let task = TaskId::new(job, 0);
        (
            Event::TaskResult {
                task,
                result: Ok(Bytes::new()),
            },
            token,
        )
    }

    #[test]
    fn an_event_reaches_only_the_job_its_token_and_id_both_name() {
        let admission = Arc::new(Admission::new(100, 100));
        let mut handles = Handles::new(admission.clone(), Arc::new(SpareStates::default()));
        let (a, a_shared, a_token) = open(&mut handles, &admission);
        let outcome = JobOutcome::Cancelled;
        deliver(
            &mut handles,
            vec![(Event::JobOutcome { job: a, outcome }, a_token)],
        );
        assert_eq!(a_shared.progress(), (0, true));
        assert_eq!(admission.active_jobs(), 0, "its room went back");
        // The next job gets the freed token: a late result of the first under it, and one of
        // the second under a token it does not hold, reach nobody.
        let (b, b_shared, b_token) = open(&mut handles, &admission);
        assert_eq!(b_token, a_token, "the freed token is reused");
        deliver(
            &mut handles,
            vec![result(a, a_token), result(b, JobToken(7))],
        );
        assert_eq!(b_shared.progress(), (0, false));
        deliver(&mut handles, vec![result(b, b_token)]);
        assert_eq!(b_shared.progress(), (1, false));
        // A job opened while the second is active has a token of its own, and its one-task
        // success ends it alone.
        let (c, c_shared, c_token) = open(&mut handles, &admission);
        assert_ne!(c_token, b_token);
        let task = TaskId::new(c, 0);
        let success = Event::OneTaskJobSucceeded {
            task,
            result: Bytes::new(),
        };
        deliver(&mut handles, vec![(success, c_token)]);
        assert_eq!(c_shared.progress(), (1, true));
        assert_eq!(b_shared.progress(), (1, false));
        assert_eq!(admission.active_jobs(), 1);
    }
}
