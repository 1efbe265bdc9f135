//! The attempts in flight on one lane, as a set: what a launch is checked against (a duplicate
//! is ignored), what the in-flight limit counts, what a kill looks up and what a drain's leave
//! reports killed.
//!
//! Every task inserts once and removes once, so the set is built for those two steps: open
//! addressing with linear probing over slots that hold the key itself, a multiplicative hash
//! whose top bits pick the home slot (runs of task ids, the usual keys, spread evenly),
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

    /// The home slot of `key`: the top bits of a multiplicative hash (Fibonacci hashing, Knuth
    /// TAOCP 6.4: times 2^64 over the golden ratio), so a run of consecutive values lands on
    /// homes spread evenly round the table and a run of keys scans next to no slot on its way
    /// in or out. A task id is its job's id over its index, and either part runs in sequence
    /// (a big job's tasks; one-task jobs); alone, a run of job ids would meet only the
    /// multiplier's low half and creep into long runs of slots, so the id is first folded onto
    /// itself (29 bits down: the shift that spread best in a simulation of both, in batches of
    /// 2 to 2,000). The attempt is left out: two attempts of one task are rarely in flight on
    /// one lane together (a retry follows the attempt that ended, a copy goes elsewhere), and
    /// when they are, they only sit side by side.
    #[inline]
    fn home(&self, key: Attempt) -> usize {
        const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
        let task = key.task.0;
        ((task ^ (task >> 29)).wrapping_mul(GOLDEN) >> self.shift) as usize
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

    /// Slots scanned per removal when batches of `batch` keys made by `key_of` go in, then
    /// leave in the order they came (an executor's launches and completions).
    fn scans_per_removal(batch: u64, key_of: impl Fn(u64) -> Attempt) -> f64 {
        let mut set = InFlight::new();
        let mut scans = 0;
        let mut removals = 0;
        for round in 0..200 {
            let keys: Vec<Attempt> = (0..batch).map(|i| key_of(round * batch + i)).collect();
            for &k in &keys {
                assert!(set.insert(k));
            }
            for &k in &keys {
                // The slots from the key's own to the empty one that ends its run.
                let mask = set.slots.len() - 1;
                let mut at = set.find(k).expect("in");
                while set.slots[(at + 1) & mask].full {
                    at = (at + 1) & mask;
                    scans += 1;
                }
                assert!(set.remove(k));
                removals += 1;
            }
        }
        check(&set);
        assert!(set.is_empty());
        scans as f64 / removals as f64
    }

    #[test]
    fn consecutive_tasks_and_consecutive_jobs_both_spread() {
        // A big job's tasks (consecutive indexes), one-task jobs (consecutive job ids), and
        // retries (attempt 1 of the same tasks).
        for batch in [2, 8, 64] {
            let tasks = scans_per_removal(batch, |i| key(7 << 32 | i, 0));
            let jobs = scans_per_removal(batch, |i| key((i + 1) << 32, 0));
            // Retries: attempt 1 of each task (attempt 0 ended before).
            let retries = scans_per_removal(batch, |i| key(7 << 32 | i, 1));
            for (what, scans) in [("tasks", tasks), ("jobs", jobs), ("retries", retries)] {
                assert!(scans < 0.5, "{what}: {scans:.2} slots scanned per removal");
            }
        }
    }
}
