//! The driver core's jobs: which are active, their deadlines in the order they fall due, and
//! the events the callers' side is owed (each task's result, each job's outcome), queued for
//! [`super::DriverCore::poll_event`]. The jobs' handles and result observers live with the
//! caller's side (`driver/handles.rs`), never here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use bytes::Bytes;
use flint_engine::ids::IdMap;
use flint_engine::scheduler::{JobId, JobOutcome, TaskId};

/// What the core tells the callers' side: the endpoint delivers each to the job's handle and
/// result observer, in order.
#[derive(Debug)]
pub enum Event {
    /// A task's final result (exactly once per task of an accepted job, before its outcome).
    TaskResult {
        /// The task (its job is `task.job()`).
        task: TaskId,
        /// The result bytes, or why it did not succeed.
        result: Result<Bytes, String>,
    },
    /// A job ended (exactly once per submitted job, accepted or not).
    JobOutcome {
        /// The job.
        job: JobId,
        /// How it ended.
        outcome: JobOutcome,
    },
}

/// The active jobs, their deadlines and the events owed (see the module docs).
#[derive(Default)]
pub(super) struct Jobs {
    active: IdMap<()>,
    /// Jobs' deadlines, earliest first (entries of ended jobs are dropped lazily).
    deadlines: BinaryHeap<Reverse<(u64, JobId)>>,
    events: VecDeque<Event>,
}

impl Jobs {
    /// Job `id` starts, failing at `deadline_us` if it has one.
    pub(super) fn start(&mut self, id: JobId, deadline_us: Option<u64>) {
        let before = self.active.insert(id.0, ());
        assert!(before.is_none(), "job {} started twice", id.0);
        if let Some(at_us) = deadline_us {
            self.deadlines.push(Reverse((at_us, id)));
        }
    }

    /// A task's result, owed to the callers' side.
    pub(super) fn result(&mut self, task: TaskId, result: Result<Bytes, String>) {
        debug_assert!(
            self.active.contains_key(task.job().0),
            "a result of an ended job"
        );
        self.events.push_back(Event::TaskResult { task, result });
    }

    /// Job `id` ended (active or never started: refused before the scheduler took it).
    pub(super) fn end(&mut self, job: JobId, outcome: JobOutcome) {
        self.active.remove(job.0);
        self.events.push_back(Event::JobOutcome { job, outcome });
    }

    pub(super) fn len(&self) -> usize {
        self.active.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Every active job, removed (the driver stops).
    pub(super) fn drain(&mut self) -> Vec<JobId> {
        self.deadlines.clear();
        (self.active.drain().into_iter())
            .map(|(id, ())| JobId(id))
            .collect()
    }

    /// The earliest deadline of an active job.
    pub(super) fn next_deadline(&mut self) -> Option<u64> {
        // Deadlines of jobs that ended are no reason to wake.
        while let Some(Reverse((_, id))) = self.deadlines.peek() {
            if self.active.contains_key(id.0) {
                break;
            }
            self.deadlines.pop();
        }
        self.deadlines.peek().map(|Reverse((at_us, _))| *at_us)
    }

    /// The next active job whose deadline is at or before `now_us`, taken off the heap.
    pub(super) fn due(&mut self, now_us: u64) -> Option<JobId> {
        let at_us = self.next_deadline()?;
        if at_us > now_us {
            return None;
        }
        self.deadlines.pop().map(|Reverse((_, id))| id)
    }

    pub(super) fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }
}
