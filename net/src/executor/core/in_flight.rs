//! The attempts in flight on one lane, as a set: what a launch is checked against (a duplicate
//! is ignored), what the in-flight limit counts, what a kill looks up and what a drain's leave
//! reports killed.
//!
//! Every task inserts once and removes once, so the set is built for those two steps: open
//! addressing with linear probing over slots that hold the key itself, a multiplicative hash
//! whose top bits pick the home slot (consecutive task ids, the usual keys, spread evenly),
//! and backward-shift deletion, so no tombstones pile up and a probe ends at the first empty
//! slot. The table is at most half full: it doubles when an insert would pass that (so it
//! has at most four slots for each attempt the lane held at once, which the lane's limit
//! bounds) and is scanned in full only when the lane leaves.
//!
//! A hostile driver can choose keys that share a home slot; that makes its own launches probe
//! longer, never more than the attempts in flight, which the limit bounds.

use flint_engine::scheduler::{Attempt, TaskId};

/// Slots in a table to begin with (a power of two).
const SLOTS_MIN: usize = 16;

/// One slot: a key, or empty.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    task: u64,
    attempt: u32,
    full: bool,
}

impl Slot {
    fn holds(&self, key: Attempt) -> bool {
        self.full && self.task == key.task.0 && self.attempt == key.attempt
    }

    fn key(&self) -> Attempt {
        Attempt::new(TaskId(self.task), self.attempt)
    }
}

/// A set of attempts (see the module docs).
#[derive(Debug)]
pub(super) struct InFlight {
    /// A power of two of them, at most half full.
    slots: Vec<Slot>,
    len: usize,
    /// 64 less the log2 of the slots: a hash shifted right by it is a home slot.
    shift: u32,
}

impl InFlight {
    /// An empty set.
    pub(super) fn new() -> Self {
        InFlight {
            slots: vec![Slot::default(); SLOTS_MIN],
            len: 0,
            shift: 64 - SLOTS_MIN.trailing_zeros(),
        }
    }

    /// How many attempts it holds.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it holds `key`.
    pub(super) fn contains(&self, key: Attempt) -> bool {
        self.find(key).is_ok()
    }

    /// Adds `key`; false if it was there already.
    #[inline]
    pub(super) fn insert(&mut self, key: Attempt) -> bool {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        match self.find(key) {
            Ok(_) => false,
            Err(empty) => {
                self.slots[empty] = Slot {
                    task: key.task.0,
                    attempt: key.attempt,
                    full: true,
                };
                self.len += 1;
                true
            }
        }
    }

    /// Takes `key` out; false if it was not there. The keys after it in its run move back
    /// into the hole when their home slot allows, so every probe still ends at an empty slot.
    #[inline]
    pub(super) fn remove(&mut self, key: Attempt) -> bool {
        let Ok(mut hole) = self.find(key) else {
            return false;
        };
        let mask = self.slots.len() - 1;
        let mut next = hole;
        loop {
            next = (next + 1) & mask;
            let slot = &self.slots[next];
            if !slot.full {
                break;
            }
            // It may fill the hole if its home is not between the hole and it.
            let home = self.home(slot.key());
            if next.wrapping_sub(home) & mask >= next.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[next];
                hole = next;
            }
        }
        self.slots[hole].full = false;
        self.len -= 1;
        true
    }

    /// Empties the set, returning what it held (in no particular order).
    pub(super) fn take_all(&mut self) -> Vec<Attempt> {
        let all: Vec<Attempt> = self
            .slots
            .iter()
            .filter(|s| s.full)
            .map(Slot::key)
            .collect();
        *self = InFlight::new();
        all
    }

    /// Where `key` is (`Ok`), or the empty slot that ends its probe (`Err`).
    #[inline]
    fn find(&self, key: Attempt) -> Result<usize, usize> {
        let mask = self.slots.len() - 1;
        let mut at = self.home(key);
        // Ends: the table is never full.
        loop {
            let slot = &self.slots[at];
            if !slot.full {
                return Err(at);
            }
            if slot.holds(key) {
                return Ok(at);
            }
            at = (at + 1) & mask;
        }
    }

    /// The home slot of `key`: the top bits of a multiplicative (Fibonacci) hash.
    #[inline]
    fn home(&self, key: Attempt) -> usize {
        let mixed = key.task.0 ^ u64::from(key.attempt).rotate_right(24);
        (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize
    }

    /// Doubles the slots and puts every key in again.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let slots = self.slots.len() * 2;
        let old = std::mem::replace(&mut self.slots, vec![Slot::default(); slots]);
        self.shift -= 1;
        self.len = 0;
        for slot in old.iter().filter(|s| s.full) {
            let inserted = self.insert(slot.key());
            debug_assert!(inserted);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn key(task: u64, attempt: u32) -> Attempt {
        Attempt::new(TaskId(task), attempt)
    }

    /// Every probe from a key's home reaches it before an empty slot.
    fn check(set: &InFlight) {
        let full: Vec<Attempt> = set.slots.iter().filter(|s| s.full).map(Slot::key).collect();
        assert_eq!(full.len(), set.len);
        assert!(set.len * 2 <= set.slots.len());
        for k in full {
            assert!(set.contains(k), "{k:?} unreachable from its home");
        }
    }

    #[test]
    fn inserts_and_removes_like_a_hash_set_through_collisions_and_growth() {
        // A small key space and a simple generator: the same keys come and go, runs form
        // and are cut, and the table grows through several sizes.
        let mut set = InFlight::new();
        let mut model = HashSet::new();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for step in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let k = key(state % 300, (state >> 32) as u32 % 3);
            // Mostly inserts early, mostly removes late, so the size sweeps up and down.
            let insert = (state >> 40) % 100 < if step < 100_000 { 60 } else { 40 };
            if insert {
                assert_eq!(set.insert(k), model.insert(k));
            } else {
                assert_eq!(set.remove(k), model.remove(&k));
            }
            assert_eq!(set.len(), model.len());
            if step % 1000 == 0 {
                check(&set);
            }
        }
        for &k in &model {
            assert!(set.contains(k));
        }
        assert!(!set.contains(key(300, 0)));
        let mut all = set.take_all();
        let mut expected: Vec<Attempt> = model.into_iter().collect();
        all.sort();
        expected.sort();
        assert_eq!(all, expected);
        assert!(set.is_empty());
    }

    #[test]
    fn consecutive_tasks_rarely_share_a_home() {
        // The driver's usual launches: consecutive task ids, attempt 0.
        let mut set = InFlight::new();
        for task in 1000..1512 {
            assert!(set.insert(key(task, 0)));
        }
        let displaced = (1000..1512)
            .filter(|&task| set.home(key(task, 0)) != set.find(key(task, 0)).unwrap())
            .count();
        assert!(displaced < 512 / 4, "{displaced} of 512 keys displaced");
        for task in 1000..1512 {
            assert!(set.remove(key(task, 0)));
        }
        assert!(set.is_empty());
        check(&set);
    }
}
