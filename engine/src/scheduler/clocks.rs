//! The jobs' unschedulable clocks, sorted by time: (last progress, job slot) of each job with
//! tasks queued that something may leave stuck ([`Timers`](super::timers::Timers) keeps one
//! per job and says when it moves).
//!
//! Almost every clock is filed at "now" (a job is submitted, a task is requeued, the tick
//! refiles a job's real progress), and most leave soon after (a job's queued tasks launch), in
//! no particular order. A B-tree costs O(log jobs) for both, a few hundred instructions per
//! one-task job; here a clock at or after the last one filed goes on the back of a queue
//! (O(1)), and only one earlier than that goes into a B-tree. Removing a clock from the
//! queue leaves its entry in place, stale, told apart by the slot's generation (bumped on every
//! removal); stale entries leave from the front as the queue moves on, and the queue is
//! compacted when they are more than half of it, so it holds at most twice the live clocks
//! (plus [`COMPACT_MIN`]). The front of the queue is always live, so the earliest clock is
//! O(1).

use std::collections::{BTreeSet, VecDeque};

/// Stale entries the queue may hold before it is compacted, whatever its length.
const COMPACT_MIN: usize = 64;

/// Where a slot's clock is filed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Filed {
    #[default]
    Nowhere,
    Queue,
    Sorted,
}

/// The clocks (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Clocks {
    /// (time, slot, generation), in time order; an entry whose generation is not its slot's
    /// is stale.
    queue: VecDeque<(u64, u32, u32)>,
    /// (time, slot) of the clocks earlier than the queue's back when filed.
    sorted: BTreeSet<(u64, u32)>,
    /// Per slot: its generation and where its clock is.
    slots: Vec<(u32, Filed)>,
    /// Stale entries in the queue.
    stale: usize,
}

impl Clocks {
    /// Moves `slot`'s clock from `old` to `new` (`None`: not filed); `old` is what it was
    /// filed under.
    pub fn rekey(&mut self, slot: u32, old: Option<u64>, new: Option<u64>) {
        if old == new {
            return;
        }
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize(i + 1, (0, Filed::Nowhere));
        }
        let Some(place) = self.slots.get_mut(i) else {
            unreachable!("slot {slot} was just made");
        };
        match (old, place.1) {
            (None, filed) => assert_eq!(filed, Filed::Nowhere, "slot {slot} has no clock"),
            (Some(_), Filed::Queue) => {
                place.0 = place.0.wrapping_add(1);
                self.stale += 1;
            }
            (Some(t), Filed::Sorted) => {
                let removed = self.sorted.remove(&(t, slot));
                assert!(
                    removed,
                    "job slot {slot} is listed under the key it was given"
                );
            }
            (Some(_), Filed::Nowhere) => unreachable!("slot {slot}'s clock is filed nowhere"),
        }
        place.1 = Filed::Nowhere;
        if let Some(t) = new {
            if self.queue.back().is_none_or(|&(back, _, _)| t >= back) {
                self.queue.push_back((t, slot, place.0));
                place.1 = Filed::Queue;
            } else {
                self.sorted.insert((t, slot));
                place.1 = Filed::Sorted;
            }
        }
        self.tidy();
    }

    /// Drops stale entries off the queue's front, and compacts it when they are most of it.
    fn tidy(&mut self) {
        while let Some(&(_, slot, generation)) = self.queue.front() {
            if self.live(slot, generation) {
                break;
            }
            self.queue.pop_front();
            self.stale -= 1;
        }
        if self.stale > COMPACT_MIN && self.stale * 2 > self.queue.len() {
            let slots = &self.slots;
            (self.queue).retain(|&(_, slot, generation)| is_live(slots, slot, generation));
            self.stale = 0;
        }
        debug_assert!(self.stale <= self.queue.len());
    }

    fn live(&self, slot: u32, generation: u32) -> bool {
        is_live(&self.slots, slot, generation)
    }

    /// The earliest clock.
    pub fn first(&self) -> Option<u64> {
        let queued = self.queue.front().map(|&(t, _, _)| t);
        let sorted = self.sorted.first().map(|&(t, _)| t);
        match (queued, sorted) {
            (Some(q), Some(s)) => Some(q.min(s)),
            (q, s) => q.or(s),
        }
    }

    /// The live clocks in time order (equal times in no set order), as (time, slot).
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let queued = (self.queue.iter())
            .filter(|&&(_, slot, generation)| self.live(slot, generation))
            .map(|&(t, slot, _)| (t, slot));
        Merge {
            a: queued.peekable(),
            b: self.sorted.iter().copied().peekable(),
        }
    }

    /// Clocks filed (for tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.queue.len() - self.stale + self.sorted.len()
    }
}

fn is_live(slots: &[(u32, Filed)], slot: u32, generation: u32) -> bool {
    slots
        .get(slot as usize)
        .is_some_and(|&(g, filed)| g == generation && filed == Filed::Queue)
}

/// Two ordered sequences of (time, slot) as one.
struct Merge<A: Iterator<Item = (u64, u32)>, B: Iterator<Item = (u64, u32)>> {
    a: std::iter::Peekable<A>,
    b: std::iter::Peekable<B>,
}

impl<A: Iterator<Item = (u64, u32)>, B: Iterator<Item = (u64, u32)>> Iterator for Merge<A, B> {
    type Item = (u64, u32);

    fn next(&mut self) -> Option<(u64, u32)> {
        match (self.a.peek(), self.b.peek()) {
            (Some(x), Some(y)) if y < x => self.b.next(),
            (Some(_), _) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model: the same clocks in one B-tree. Equal times may come in any order.
    fn check(c: &Clocks, model: &BTreeSet<(u64, u32)>) {
        let listed: Vec<_> = c.iter().collect();
        assert!(
            listed.windows(2).all(|w| w[0].0 <= w[1].0),
            "in time order: {listed:?}"
        );
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, model.iter().copied().collect::<Vec<_>>());
        assert_eq!(c.first(), model.first().map(|&(t, _)| t));
        assert_eq!(c.len(), model.len());
        assert!(c.queue.len() <= 2 * c.len() + COMPACT_MIN + 1, "bounded");
    }

    #[test]
    fn clocks_in_and_out_of_order_come_out_sorted() {
        let mut c = Clocks::default();
        let mut model = BTreeSet::new();
        let mut filed: Vec<Option<u64>> = vec![None; 8];
        // (slot, new clock) steps: in order, out of order, equal, removed from the middle,
        // removed from the front, refiled, a slot filed again at the same time.
        let steps = [
            (0, Some(10)),
            (1, Some(20)),
            (2, Some(20)),
            (3, Some(15)),
            (1, None),
            (4, Some(30)),
            (0, None),
            (1, Some(30)),
            (2, Some(5)),
            (3, None),
            (3, Some(30)),
            (4, None),
            (4, Some(30)),
            (1, None),
            (2, None),
            (3, None),
            (4, None),
        ];
        for (slot, new) in steps {
            let old = filed[slot as usize];
            if let Some(t) = old {
                model.remove(&(t, slot));
            }
            if let Some(t) = new {
                model.insert((t, slot));
            }
            c.rekey(slot, old, new);
            filed[slot as usize] = new;
            check(&c, &model);
        }
        assert!(c.queue.is_empty() && c.sorted.is_empty(), "all gone");
    }

    #[test]
    fn a_long_lived_front_does_not_let_stale_entries_grow() {
        let mut c = Clocks::default();
        let mut model = BTreeSet::new();
        c.rekey(0, None, Some(0));
        model.insert((0, 0));
        // A million short-lived jobs behind one that stays: each filed at "now", then gone.
        for now in 1..1_000_000u64 {
            let slot = 1 + (now % 1000) as u32;
            c.rekey(slot, None, Some(now));
            c.rekey(slot, Some(now), None);
        }
        check(&c, &model);
        assert!(
            c.queue.len() <= 2 * COMPACT_MIN + 2,
            "{} entries",
            c.queue.len()
        );
    }
}
