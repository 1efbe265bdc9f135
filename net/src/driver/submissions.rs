//! Jobs on their way from callers' threads to the driver's loop without a message each: a
//! bounded lock-free queue beside the loop's inbox, and one notice per batch.
//!
//! A message to the loop costs an allocation (the runtime's envelope) made on the caller's
//! thread and freed on the loop's, which glibc serves slowly, plus the copies of a large
//! message; a burst of submissions paid that per job. Here a caller pushes its [`Submission`]
//! into the queue (its slots allocated once) and, only if no kick is pending, wakes the loop
//! with a notice (`EndpointRef::notify`: nothing allocated); the loop takes every queued
//! submission when the notice arrives, and at the end of any round in which it finds some
//! queued (a caller whose notice found the inbox full sends none: a full inbox means rounds to
//! come). The queue and its kick protocol are the runtime's [`Kicked`], as for the task
//! runner's completions: none is stranded. A drain takes a queue's worth at most; the loop
//! comes back for the rest after its round. A full queue sends the job in a message of its own
//! instead (the envelope path), so nothing is refused that the loop's inbox would have taken;
//! the loop takes the queued jobs before that message's, so one caller's jobs reach the core
//! in the order it submitted them.

use std::sync::Arc;

use flint_engine::runtime::Kicked;
use flint_engine::scheduler::JobId;

use crate::job::{Job, JobShared};

/// Submissions the queue holds at most (past them a job travels in its own message).
pub(crate) const QUEUED_MAX: usize = 1024;

/// A job admitted under `id`, with the state its handle reads.
pub(crate) struct Submission {
    pub id: JobId,
    pub job: Job,
    pub shared: Arc<JobShared>,
}

/// The queue of submissions (see the module docs).
pub(crate) type Submissions = Kicked<Submission>;
