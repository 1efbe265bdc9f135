//! The callers' side of the driver's loop: each active job's shared state (what its
//! [`crate::job::JobHandle`] reads) and result observer, the room each job holds under the
//! admission limits, and the callers waiting for executors. The endpoint (and the cluster
//! simulator) hands every [`Event`] the core polls out to [`Handles::deliver_all`]; this is where
//! user code (a result observer) runs, never inside the core.

use std::sync::Arc;

use flint_engine::ids::IdMap;
use flint_engine::runtime::Reply;
use flint_engine::scheduler::{JobId, JobOutcome};

use super::core::Event;
use crate::admission::Admission;
use crate::job::{JobShared, Observer, SpareStates};

/// Callers waiting for executors at once, at most.
const EXECUTOR_WAITERS_MAX: usize = 4096;

/// One active job, as its caller sees it.
struct Entry {
    shared: Arc<JobShared>,
    observer: Option<Observer>,
    /// Tasks in the job, given back to admission when it ends.
    tasks: usize,
    /// Whether its handle takes its results as they come ([`crate::Job::stream_results`]).
    stream: bool,
}

/// The callers' side (see the module docs).
pub(crate) struct Handles {
    jobs: IdMap<Entry>,
    /// Callers waiting for a number of executors.
    waiters: Vec<(usize, Reply<()>)>,
    admission: Arc<Admission>,
    /// Where an ended job's state goes if its handle is gone already.
    spare: Arc<SpareStates>,
}

impl Handles {
    pub(crate) fn new(admission: Arc<Admission>, spare: Arc<SpareStates>) -> Handles {
        Handles {
            jobs: IdMap::new(),
            waiters: Vec::new(),
            admission,
            spare,
        }
    }

    /// A job on its way to the core, admitted under `id` with `tasks` tasks (streaming its
    /// results to the handle if `stream`): whether it goes there. One its handle cancelled
    /// already ends here as cancelled. Always inline (the hint alone was not taken), with the
    /// endpoint's `open` around it: one call per job saved.
    #[inline(always)]
    pub(crate) fn open(
        &mut self,
        id: JobId,
        shared: Arc<JobShared>,
        observer: Option<Observer>,
        tasks: usize,
        stream: bool,
    ) -> bool {
        if shared.is_cancelled() {
            self.admission.release(tasks);
            shared.finish(JobOutcome::Cancelled);
            return false;
        }
        let entry = Entry {
            shared,
            observer,
            tasks,
            stream,
        };
        let before = self.jobs.insert(id.0, entry);
        assert!(before.is_none(), "job {} opened twice", id.0);
        true
    }

    /// Hands the core's events (from `next`, until it has none) to their jobs: a result to
    /// the handle and the observer, an outcome to the handle (giving its room back). A run of
    /// results of one job looks the job up once.
    pub(crate) fn deliver_all(&mut self, mut next: impl FnMut() -> Option<Event>) {
        let mut current: Option<(JobId, &mut Entry)> = None;
        while let Some(event) = next() {
            match event {
                Event::TaskResult { task, result } => {
                    let job = task.job();
                    if current.as_ref().is_none_or(|(id, _)| *id != job) {
                        current = self.jobs.get_mut(job.0).map(|entry| (job, entry));
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
                    if let Some(entry) = self.jobs.remove(job.0) {
                        self.end(entry, outcome);
                    }
                }
                Event::OneTaskJobSucceeded { task, result } => {
                    current = None;
                    if let Some(mut entry) = self.jobs.remove(task.job().0) {
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
        (self.jobs.iter())
            .filter(|(_, entry)| entry.shared.is_cancelled())
            .map(|(id, _)| JobId(id))
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
