//! The driver core's jobs: their deadlines in the order they fall due, and the outcomes of
//! submissions refused before the scheduler took them, queued for
//! [`super::DriverCore::poll_event`] (what the scheduler decides waits in the scheduler). Which jobs are active is the scheduler's to say (its job
//! table is the one the core asks); the jobs' handles and result observers live with the
//! caller's side (`driver/handles.rs`), never here.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use flint_engine::scheduler::{JobId, JobOutcome, JobToken};

/// What the core tells the callers' side (the scheduler's type: each task's result, each
/// job's outcome): the endpoint delivers each to the job's handle and result observer, in order.
pub use flint_engine::scheduler::Event;

/// The jobs' deadlines and the events owed (see the module docs).
#[derive(Default)]
pub(super) struct Jobs {
    /// Jobs' deadlines, earliest first (entries of ended jobs are dropped lazily).
    deadlines: BinaryHeap<Reverse<(u64, JobId)>>,
    events: VecDeque<(Event, JobToken)>,
}

impl Jobs {
    /// Job `id` fails at `at_us`.
    pub(super) fn set_deadline(&mut self, id: JobId, at_us: u64) {
        self.deadlines.push(Reverse((at_us, id)));
    }

    /// Job `job` (its caller's `token`) was refused before the scheduler took it (the
    /// scheduler keeps the results and outcomes of the jobs it took until
    /// [`super::DriverCore::poll_event`] asks).
    pub(super) fn end(&mut self, job: JobId, token: JobToken, outcome: JobOutcome) {
        self.events
            .push_back((Event::JobOutcome { job, outcome }, token));
    }

    /// The driver stops: no deadline is due any more.
    pub(super) fn clear_deadlines(&mut self) {
        self.deadlines.clear();
    }

    /// The earliest deadline of a job `active` says is still active.
    pub(super) fn next_deadline(&mut self, active: impl Fn(JobId) -> bool) -> Option<u64> {
        // Deadlines of jobs that ended are no reason to wake.
        while let Some(&Reverse((_, id))) = self.deadlines.peek() {
            if active(id) {
                break;
            }
            self.deadlines.pop();
        }
        self.deadlines.peek().map(|Reverse((at_us, _))| *at_us)
    }

    /// The next job `active` says is active whose deadline is at or before `now_us`, taken
    /// off the heap.
    pub(super) fn due(&mut self, now_us: u64, active: impl Fn(JobId) -> bool) -> Option<JobId> {
        let at_us = self.next_deadline(active)?;
        if at_us > now_us {
            return None;
        }
        self.deadlines.pop().map(|Reverse((_, id))| id)
    }

    pub(super) fn poll_event(&mut self) -> Option<(Event, JobToken)> {
        self.events.pop_front()
    }
}
