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
//! come). The protocol is the task runner's
//! (`flint_engine::runner`): the loop clears `kick_pending` before it pops, a caller sets it
//! after it pushed, so a submission pushed during a drain is either popped by it or kicks
//! again: none is stranded. A drain takes a queue's worth at most; the loop comes back for
//! the rest after its round. A full queue sends the job in a message of its own instead (the
//! envelope path), so nothing is refused that the loop's inbox would have taken; the loop
//! takes the queued jobs before that message's, so one caller's jobs reach the core in the
//! order it submitted them.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use flint_engine::runtime::Inbox;
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

/// The queue and its kick flag (see the module docs).
pub(crate) struct Submissions {
    queue: Inbox<Submission>,
    kick_pending: AtomicBool,
}

impl Submissions {
    pub(crate) fn new(capacity: usize) -> Submissions {
        Submissions {
            queue: Inbox::new(capacity),
            kick_pending: AtomicBool::new(false),
        }
    }

    /// A caller's side: queues `submission`. `Ok(true)` when the caller must kick the loop
    /// (no kick was pending); `Err` hands it back when the queue is full.
    pub(crate) fn push(&self, submission: Submission) -> Result<bool, Submission> {
        self.queue.push(submission)?;
        Ok(!self.kick_pending.swap(true, Ordering::SeqCst))
    }

    /// The loop's side: hands queued submissions to `each`, at most a queue's worth (so a
    /// flood cannot starve the loop). Returns whether the loop must kick itself to come back
    /// for more (some are left and no kick is pending).
    pub(crate) fn drain(&self, mut each: impl FnMut(Submission)) -> bool {
        self.kick_pending.store(false, Ordering::SeqCst);
        for _ in 0..self.queue.capacity() {
            let Some(submission) = self.queue.pop() else {
                return false;
            };
            each(submission);
        }
        !self.queue.is_empty() && !self.kick_pending.swap(true, Ordering::SeqCst)
    }

    /// Whether nothing is queued (a snapshot).
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Every queued submission, taken by a caller once no loop will take them (it stopped).
    pub(crate) fn take_stranded(&self, mut each: impl FnMut(Submission)) {
        while let Some(submission) = self.queue.pop() {
            each(submission);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    fn submission(id: u64) -> Submission {
        Submission {
            id: JobId(id),
            job: Job::new("noop", Vec::new()),
            shared: Arc::new(JobShared::new(false)),
        }
    }

    /// Callers on four threads push while a loop thread drains only when kicked: every
    /// submission is taken, and each caller's in the order it pushed them.
    #[test]
    fn kicked_drains_take_every_submission_in_each_callers_order() {
        const CALLERS: u64 = 4;
        const EACH: u64 = 20_000;
        let subs = Arc::new(Submissions::new(64));
        let kicks = Arc::new(Mutex::new(std::collections::VecDeque::<()>::new()));
        let kicked = Arc::new(std::sync::Condvar::new());
        let mut callers = Vec::new();
        for c in 0..CALLERS {
            let (subs, kicks, kicked) = (subs.clone(), kicks.clone(), kicked.clone());
            callers.push(std::thread::spawn(move || {
                let mut next = 0;
                while next < EACH {
                    match subs.push(submission(c << 32 | next)) {
                        Ok(kick) => {
                            next += 1;
                            if kick {
                                kicks.lock().unwrap().push_back(());
                                kicked.notify_one();
                            }
                        }
                        Err(_) => std::thread::yield_now(),
                    }
                }
            }));
        }
        let taken = AtomicUsize::new(0);
        let mut last = [None::<u64>; CALLERS as usize];
        let deadline = Instant::now() + Duration::from_secs(60);
        while taken.load(Ordering::Relaxed) < (CALLERS * EACH) as usize {
            assert!(Instant::now() < deadline, "stranded: {taken:?} taken");
            let mut queue = kicks.lock().unwrap();
            if queue.pop_front().is_none() {
                let (q, _) = kicked
                    .wait_timeout(queue, Duration::from_millis(100))
                    .unwrap();
                queue = q;
                if queue.pop_front().is_none() {
                    // No kick yet: a stranded submission shows as the deadline passing.
                    continue;
                }
            }
            drop(queue);
            let again = subs.drain(|s| {
                let (caller, index) = ((s.id.0 >> 32) as usize, s.id.0 & 0xffff_ffff);
                assert!(
                    last[caller].is_none_or(|l| l < index),
                    "caller {caller} out of order"
                );
                last[caller] = Some(index);
                taken.fetch_add(1, Ordering::Relaxed);
            });
            if again {
                kicks.lock().unwrap().push_back(());
            }
        }
        callers.into_iter().for_each(|c| c.join().unwrap());
        assert!(subs.queue.is_empty());
        assert_eq!(last, [Some(EACH - 1); CALLERS as usize]);
    }

    #[test]
    fn a_full_queue_hands_the_submission_back_and_stranded_ones_are_taken() {
        let subs = Submissions::new(2);
        assert!(
            matches!(subs.push(submission(1)), Ok(true)),
            "the first push kicks"
        );
        assert!(
            matches!(subs.push(submission(2)), Ok(false)),
            "a kick is pending"
        );
        let Err(back) = subs.push(submission(3)) else {
            panic!("a full queue takes nothing");
        };
        assert_eq!(back.id, JobId(3));
        let mut stranded = Vec::new();
        subs.take_stranded(|s| stranded.push(s.id.0));
        assert_eq!(stranded, [1, 2]);
    }
}
