//! The runnable jobs by FIFO key (higher priority first, then submission), as the FIFO order
//! and the walks over all runnable jobs need them: an ordered map from key to job slot, made
//! for how keys come and go.
//!
//! Almost every job is listed with a key after every key listed before (jobs of one priority
//! are listed in submission order; a job listed again, its tasks requeued, keeps its old key,
//! and a job of higher priority sorts before the others: those are the exceptions), and most
//! leave from the front (under FIFO the first job runs first). A B-tree costs O(log jobs) node
//! visits with a tuple comparison each for both; here a key after the last one filed goes on
//! the back of a queue (O(1)), and only an earlier one goes into a B-tree (244 instructions
//! less per one-task job with 128 waiting, `ci/cost`). A removed queue entry stays in place as a tombstone (the queue stays sorted,
//! so finding an entry is a binary search, or O(1) at the front); tombstones leave from the
//! front as the queue moves on, and the queue is compacted when they outnumber its live
//! entries (and [`COMPACT_MIN`]), so it holds at most twice the live entries plus that.
//! Walks merge the queue and the B-tree in key order. The same scheme keeps the unschedulable
//! clocks (`clocks.rs`).

use std::collections::{btree_map, vec_deque, BTreeMap, VecDeque};
use std::iter::Peekable;
use std::ops::Bound::{Excluded, Unbounded};

use super::order::FifoKey;

/// Tombstones the queue may hold before it is compacted, whatever its length.
const COMPACT_MIN: usize = 64;

/// The slot of a queue entry whose job was unlisted.
const TOMBSTONE: u32 = u32::MAX;

/// Job slots by FIFO key (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Fifo {
    /// (key, slot) in key order; a slot of [`TOMBSTONE`] is an entry removed.
    queue: VecDeque<(FifoKey, u32)>,
    /// The keys earlier than the queue's back when listed.
    sorted: BTreeMap<FifoKey, u32>,
    /// Tombstones in the queue.
    tombstones: usize,
    /// Live entries, in both.
    len: usize,
}

impl Fifo {
    /// Whether no job is listed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Jobs listed (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Lists `slot` under `key`; false (and nothing changes) if `key` is listed already.
    pub fn insert(&mut self, key: FifoKey, slot: u32) -> bool {
        assert_ne!(slot, TOMBSTONE, "job slot {slot} is the tombstone");
        // The B-tree may hold keys after the queue's back once the entries after them left.
        if self.sorted.contains_key(&key) {
            return false;
        }
        match self.queue.back() {
            Some(&(back, _)) if key <= back => {
                if self.queue_index(key).is_some() {
                    return false;
                }
                self.sorted.insert(key, slot);
            }
            _ => self.queue.push_back((key, slot)),
        }
        self.len += 1;
        true
    }

    /// Unlists the job under `key`: its slot, if one was listed.
    pub fn remove(&mut self, key: FifoKey) -> Option<u32> {
        // Most removals are of the front entry (never a tombstone): it leaves at once.
        if let Some(&(k, slot)) = self.queue.front() {
            if k == key {
                debug_assert_ne!(slot, TOMBSTONE, "the queue's front is live");
                self.queue.pop_front();
                if self.tombstones > 0 {
                    self.tidy();
                }
                self.len -= 1;
                return Some(slot);
            }
        }
        let slot = match self.queue_index(key) {
            Some(i) => {
                let Some(entry) = self.queue.get_mut(i) else {
                    unreachable!("queue entry {i} was just found");
                };
                let slot = std::mem::replace(&mut entry.1, TOMBSTONE);
                self.tombstones += 1;
                self.tidy();
                slot
            }
            None => self.sorted.remove(&key)?,
        };
        self.len -= 1;
        Some(slot)
    }

    /// The index of `key`'s live entry in the queue, if it has one there.
    fn queue_index(&self, key: FifoKey) -> Option<usize> {
        let live = |i: usize| {
            let &(k, slot) = self.queue.get(i)?;
            (k == key && slot != TOMBSTONE).then_some(i)
        };
        // Most removals are of the front entry.
        if let Some(i) = live(0) {
            return Some(i);
        }
        let i = self.queue.partition_point(|&(k, _)| k < key);
        live(i)
    }

    /// Drops tombstones off the queue's front, and compacts it when they are most of it.
    fn tidy(&mut self) {
        while self
            .queue
            .front()
            .is_some_and(|&(_, slot)| slot == TOMBSTONE)
        {
            self.queue.pop_front();
            self.tombstones -= 1;
        }
        if self.tombstones > COMPACT_MIN && self.tombstones * 2 > self.queue.len() {
            self.queue.retain(|&(_, slot)| slot != TOMBSTONE);
            self.tombstones = 0;
        }
        debug_assert!(self.tombstones <= self.queue.len());
    }

    /// A key at or after every listed key (the queue's back may be a tombstone's), if any is
    /// listed or kept.
    pub fn last_key(&self) -> Option<FifoKey> {
        let queued = self.queue.back().map(|&(key, _)| key);
        let sorted = self.sorted.last_key_value().map(|(&key, _)| key);
        queued.max(sorted)
    }

    /// The first listed slot in key order: the queue's front (never a tombstone: they leave
    /// from the front at once) or the B-tree's first, whichever sorts first. O(1) for the
    /// queue, O(log n) for the B-tree, which holds the few jobs listed out of order.
    pub fn first(&self) -> Option<u32> {
        let queued = self.queue.front();
        debug_assert!(queued.is_none_or(|&(_, slot)| slot != TOMBSTONE));
        match (queued, self.sorted.first_key_value()) {
            (Some(&(q, _)), Some((s, &slot))) if *s < q => Some(slot),
            (Some(&(_, slot)), _) => Some(slot),
            (None, sorted) => sorted.map(|(_, &slot)| slot),
        }
    }

    /// The listed slots in key order, from the first or after `after`.
    pub fn iter_after(&self, after: Option<FifoKey>) -> Iter<'_> {
        let (queue, sorted) = match after {
            None => (self.queue.range(..), self.sorted.range(..)),
            Some(key) => {
                let from = self.queue.partition_point(|&(k, _)| k <= key);
                (
                    self.queue.range(from..),
                    self.sorted.range((Excluded(key), Unbounded)),
                )
            }
        };
        Iter {
            queue: queue.peekable(),
            sorted: sorted.peekable(),
        }
    }
}

/// The slots of a [`Fifo`] in key order: its queue (tombstones skipped) and its B-tree merged.
pub(crate) struct Iter<'a> {
    queue: Peekable<vec_deque::Iter<'a, (FifoKey, u32)>>,
    sorted: Peekable<btree_map::Range<'a, FifoKey, u32>>,
}

impl Iterator for Iter<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        while self
            .queue
            .next_if(|&&(_, slot)| slot == TOMBSTONE)
            .is_some()
        {}
        match (self.queue.peek(), self.sorted.peek()) {
            (Some(&&(q, _)), Some(&(s, _))) if *s < q => self.sorted.next().map(|(_, slot)| *slot),
            (Some(_), _) => self.queue.next().map(|&(_, slot)| slot),
            (None, _) => self.sorted.next().map(|(_, slot)| *slot),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A model: the same entries in one B-tree.
    fn check(f: &Fifo, model: &BTreeMap<FifoKey, u32>) {
        let listed: Vec<u32> = f.iter_after(None).collect();
        assert_eq!(listed, model.values().copied().collect::<Vec<_>>());
        assert_eq!(
            f.first(),
            listed.first().copied(),
            "the first is the walk's first"
        );
        assert_eq!(f.len(), model.len());
        assert_eq!(f.is_empty(), model.is_empty());
        assert!(f.queue.len() <= 2 * f.len() + COMPACT_MIN + 1, "bounded");
        for &key in model.keys().take(20) {
            let after: Vec<u32> = f.iter_after(Some(key)).collect();
            let want: Vec<u32> = model
                .range((Excluded(key), Unbounded))
                .map(|(_, s)| *s)
                .collect();
            assert_eq!(after, want, "after {key:?}");
        }
    }

    #[test]
    fn keys_in_and_out_of_order_come_out_sorted() {
        let mut f = Fifo::default();
        let mut model = BTreeMap::new();
        // (insert?, key, slot): in order, out of order (a higher priority, an earlier id),
        // removed from the front, the middle and the B-tree, listed again in place.
        let steps = [
            (true, (0, 1), 10),
            (true, (0, 2), 11),
            (true, (0, 3), 12),
            (true, (-1, 9), 13),
            (true, (0, 0), 14),
            (false, (0, 2), 11),
            (false, (0, 1), 10),
            (true, (0, 2), 11),
            (false, (-1, 9), 13),
            (true, (0, 4), 15),
            (false, (0, 0), 14),
            (false, (0, 3), 12),
            (false, (0, 2), 11),
            (false, (0, 4), 15),
        ];
        for (insert, key, slot) in steps {
            if insert {
                assert!(f.insert(key, slot));
                model.insert(key, slot);
            } else {
                assert_eq!(f.remove(key), Some(slot));
                model.remove(&key);
            }
            check(&f, &model);
        }
        assert!(f.is_empty());
        assert_eq!(f.remove((0, 1)), None, "not listed");
    }

    #[test]
    fn a_key_listed_twice_is_refused() {
        let mut f = Fifo::default();
        assert!(f.insert((0, 1), 1));
        assert!(f.insert((0, 2), 2));
        assert!(!f.insert((0, 1), 3), "in the queue");
        assert!(f.insert((0, 0), 4));
        assert!(!f.insert((0, 0), 5), "in the B-tree");
        assert!(!f.insert((0, 2), 6), "the back");
        assert_eq!(f.iter_after(None).collect::<Vec<_>>(), [4, 1, 2]);
    }

    #[test]
    fn many_jobs_through_the_queue_stay_bounded_and_sorted() {
        // A pseudo-random mix: mostly new keys at the back and removals at the front, some
        // from the middle, some keys listed again.
        let mut f = Fifo::default();
        let mut model = BTreeMap::new();
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut id = 0u64;
        for step in 0..20_000u32 {
            let roll = next() % 100;
            if roll < 45 || model.is_empty() {
                id += 1;
                let priority = if roll % 17 == 0 { -1 } else { 0 };
                assert!(f.insert((priority, id), step));
                model.insert((priority, id), step);
            } else if roll < 85 {
                let (&key, &slot) = model.iter().next().unwrap();
                assert_eq!(f.remove(key), Some(slot));
                model.remove(&key);
            } else {
                let nth = (next() as usize) % model.len();
                let (&key, &slot) = model.iter().nth(nth).unwrap();
                assert_eq!(f.remove(key), Some(slot));
                model.remove(&key);
                if roll % 2 == 0 {
                    assert!(f.insert(key, slot), "listed again");
                    model.insert(key, slot);
                }
            }
            if step % 97 == 0 {
                check(&f, &model);
            }
        }
        check(&f, &model);
    }
}
