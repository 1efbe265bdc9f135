//! The line: new one-task jobs waiting their turn under FIFO (a service's requests queued
//! behind busy executors), kept in a plain queue as the tail of the runnable order rather than
//! in it.
//!
//! A job waiting in the runnable order is listed when it arrives (`list_job`), its timers set,
//! and when an executor frees a core an offer asks the order for its first job, launches its
//! task, then unlists the job and settles its timers: about 300 instructions more than a job
//! launched at once (`ci/cost`'s job.scheduler). A job in the line has none of that: it goes
//! on the back when it arrives and off the front when an executor takes its task.
//!
//! The line gives out exactly what a walk of the runnable order would, with its jobs listed
//! after every listed job, in its order (`--against-walk` in the simulator and a differential
//! test hold it to that). A job joins it only when
//!
//! - sharing is FIFO and no job has preferences (no locality pass);
//! - it has one task, not built yet, at the widest locality level, and nothing may leave it
//!   stuck (`StuckRisk`: it has no timers to keep);
//! - its FIFO key (priority, then id) sorts after every listed job's and every key in the line.
//!
//! Its jobs are asked only once no job is listed before them: then the front job's task goes to
//! the executor offered if it fits there, as the walk would give it. Anything else lists them
//! all first ([`Line::take`], the scheduler's `flush_line`), as they would have been listed on
//! arrival: a walk (the first listed job has nothing for the executor, or it resumes a capped
//! walk, or the front job's task does not fit), a job listed with a key after the line's front
//! (another kind of job arriving), a risk of being stuck beginning. A job listed with a key
//! before the line's (a task requeued, a straggler to copy) leaves the line as it is.
//!
//! A job that ends while in the line (cancelled, failed) leaves its entry behind: an entry is
//! live while its job slot holds a job in the line under the entry's key, and dead entries are
//! skipped at the front and dropped when they outnumber the live ones (and
//! [`COMPACT_MIN`]), so the line holds at most twice its live jobs plus that.

use super::order::FifoKey;

/// Dead entries the line may hold before it is compacted, whatever its length.
pub(super) const COMPACT_MIN: usize = 64;

/// The line (see the module docs).
///
/// A vector read from `head` on rather than a `VecDeque`: entries only go on the back and come
/// off the front, so taking one off is moving `head` on, and neither end needs the ring's
/// wrapping index arithmetic (about 40 instructions of a one-task job's, `ci/cost`'s
/// job.scheduler). The entries before `head` are dropped when the line empties, or when the
/// vector is full and they are at least half of it ([`Line::push`]): what is moved then is at
/// most what was taken off since, and the vector grows only while the entries from `head` on
/// are more than half of it, so it stays within four times as many.
#[derive(Debug, Default)]
pub(super) struct Line {
    /// (FIFO key, job slot), in key order from `head` on: live entries and the dead ones not
    /// yet dropped. Before `head`, entries taken off the front, not dropped yet.
    queue: Vec<(FifoKey, u32)>,
    /// Where the front entry is (`queue.len()` when there is none).
    head: usize,
    /// Jobs in the line.
    live: usize,
}

impl Line {
    /// Whether no job is in the line.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Jobs in the line (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.live
    }

    /// Whether every job in the line sorts after a job under `key` (so that job may be listed
    /// while they wait here: the line stays the order's tail).
    #[inline]
    pub fn comes_after(&self, key: FifoKey) -> bool {
        self.live == 0 || (self.queue.get(self.head)).is_none_or(|&(front, _)| key < front)
    }

    /// Whether a job under `key` may go on the back: its key sorts after every entry's. (A
    /// line with entries taken off the front still has one after them: it is emptied when its
    /// last job leaves.)
    #[inline]
    pub fn takes(&self, key: FifoKey) -> bool {
        debug_assert!(self.head < self.queue.len() || self.queue.is_empty());
        self.queue.last().is_none_or(|&(back, _)| key > back)
    }

    /// Puts the job in `slot` under `key` on the back ([`Line::takes`] said it may).
    #[inline]
    pub fn push(&mut self, key: FifoKey, slot: u32) {
        debug_assert!(self.takes(key), "{key:?} after {:?}", self.queue.last());
        if self.queue.len() == self.queue.capacity() {
            self.drop_taken();
        }
        self.queue.push((key, slot));
        self.live += 1;
    }

    /// Drops the entries taken off the front if they are at least half of the vector, which
    /// is full: room for the next entry without growing it.
    #[cold]
    fn drop_taken(&mut self) {
        if self.head > 0 && self.head * 2 >= self.queue.len() {
            self.queue.drain(..self.head);
            self.head = 0;
        }
    }

    /// Empties the line's vector (its allocation kept): no job is in it.
    #[inline]
    fn clear(&mut self) {
        debug_assert_eq!(self.live, 0);
        self.queue.clear();
        self.head = 0;
    }

    /// A job in the line ended there: its entry is dead from now on.
    pub fn left(&mut self) {
        assert!(self.live > 0, "a job left an empty line");
        self.live -= 1;
        if self.live == 0 {
            self.clear();
        }
    }

    /// The front entry after dropping dead ones (`live` says whether an entry is): its key
    /// and slot.
    #[inline]
    pub fn front(&mut self, live: impl Fn(FifoKey, u32) -> bool) -> Option<(FifoKey, u32)> {
        if self.live == 0 {
            return None;
        }
        // With no dead entry (no job left the line since it was last empty), the front is live.
        if self.queue.len() - self.head == self.live {
            return self.queue.get(self.head).copied();
        }
        while let Some(&(key, slot)) = self.queue.get(self.head) {
            if live(key, slot) {
                return Some((key, slot));
            }
            self.head += 1;
        }
        unreachable!("{} jobs in a line of dead entries", self.live);
    }

    /// Takes the front entry off, live (its job leaves the line to launch).
    #[inline]
    pub fn pop_front(&mut self) {
        assert!(self.live > 0, "a launch from an empty line");
        self.head += 1;
        self.live -= 1;
        if self.live == 0 {
            self.clear();
        }
    }

    /// Whether dead entries outnumber the live ones and [`COMPACT_MIN`]
    /// ([`Line::compact`] is due).
    #[inline]
    pub fn compact_due(&self) -> bool {
        let dead = self.queue.len() - self.head - self.live;
        dead > COMPACT_MIN && dead > self.live
    }

    /// Drops the dead entries (`live` says which are live) and those taken off the front.
    #[cold]
    pub fn compact(&mut self, live: impl Fn(FifoKey, u32) -> bool) {
        self.queue.drain(..self.head);
        self.head = 0;
        self.queue.retain(|&(key, slot)| live(key, slot));
        debug_assert_eq!(self.queue.len(), self.live);
    }

    /// Empties the line: its entries, live and dead, in key order (the caller tells them
    /// apart).
    pub fn take(&mut self) -> Vec<(FifoKey, u32)> {
        self.queue.drain(..self.head);
        self.head = 0;
        self.live = 0;
        std::mem::take(&mut self.queue)
    }

    /// Gives back the vector [`Line::take`] took, emptied, for its allocation.
    pub fn give_back(&mut self, mut queue: Vec<(FifoKey, u32)>) {
        queue.clear();
        if self.queue.capacity() < queue.capacity() && self.queue.is_empty() {
            self.queue = queue;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dead_entries_are_skipped_at_the_front_and_compacted_away() {
        let mut line = Line::default();
        let mut live = [true; 200];
        for i in 0..200u32 {
            assert!(line.takes((0, u64::from(i))));
            line.push((0, u64::from(i)), i);
        }
        assert!(
            !line.takes((0, 199)),
            "a key before the back waits elsewhere"
        );
        // The first 150 end in the line.
        for l in live.iter_mut().take(150) {
            *l = false;
            line.left();
        }
        assert_eq!(line.len(), 50);
        assert!(line.compact_due());
        let is_live = |_: FifoKey, slot: u32| live[slot as usize];
        line.compact(is_live);
        assert!(!line.compact_due());
        assert_eq!(line.front(is_live), Some(((0, 150), 150)));
        line.pop_front();
        assert_eq!(line.len(), 49);
        // The rest end: the line is empty, whatever entries it held.
        for _ in 0..49 {
            line.left();
        }
        assert!(line.is_empty());
        assert_eq!(line.front(|_, _| true), None);
        assert!(line.takes((0, 0)), "an empty line takes any key");
    }

    #[test]
    fn a_line_that_never_empties_keeps_its_vector_bounded() {
        let mut line = Line::default();
        let mut next = 0u64;
        let mut push = |line: &mut Line| {
            assert!(line.takes((0, next)));
            line.push((0, next), next as u32);
            next += 1;
        };
        for _ in 0..10 {
            push(&mut line);
        }
        // One on, one off, a hundred thousand times: the front moves on, the vector does not
        // grow past four times the ten jobs waiting.
        for i in 0..100_000u64 {
            assert_eq!(line.front(|_, _| true), Some(((0, i), i as u32)));
            line.pop_front();
            push(&mut line);
            assert!(line.queue.capacity() <= 4 * 16, "{}", line.queue.capacity());
        }
        assert_eq!(line.len(), 10);
        assert!(!line.takes((0, 100_009)) && line.takes((0, 100_010)));
        // Taken, the line gives its jobs in order and nothing taken off before.
        let taken: Vec<u64> = line.take().iter().map(|&((_, id), _)| id).collect();
        assert_eq!(taken, (100_000..100_010).collect::<Vec<_>>());
        assert!(line.is_empty() && line.takes((0, 0)));
    }
}
