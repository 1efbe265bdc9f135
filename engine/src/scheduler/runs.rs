//! One executor's running attempts, from launch to the executor's final report: a slab whose
//! index the attempt's task record ([`Placed::run`](super::job::Placed)) and hedging watch keep,
//! so a report finds its run without hashing (an FxHashMap insert and removal cost about 60
//! instructions a task, the lookup through the task record about 25). The few runs no task
//! record points at any more (the scheduler killed them, or their job ended: the executor
//! holds them until it reports) are also kept by key, so a report of one is found in O(1) as
//! well, and a report of an attempt the executor does not hold (stale, duplicate or made up)
//! costs the job's lookup and one hash lookup.
//!
//! Bounded by the executor's slots: an entry lives from its launch to its report or the
//! executor's removal, and freed indices are reused.

use super::book::Run;
use super::types::Attempt;
use crate::hash::FxHashMap;

/// One run in the slab.
#[derive(Debug)]
struct Entry {
    key: Attempt,
    run: Run,
    /// In `orphans` (no task record points at it).
    orphan: bool,
}

/// An executor's running attempts (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Runs {
    slots: Vec<Option<Entry>>,
    /// Indices of empty slots, the next insert's last.
    free: Vec<u32>,
    len: usize,
    /// Where each orphaned run is.
    orphans: FxHashMap<Attempt, u32>,
}

impl Runs {
    /// The index the next [`insert`](Self::insert) takes.
    pub fn vacant(&self) -> u32 {
        match self.free.last() {
            Some(&i) => i,
            None => self.slots.len() as u32,
        }
    }

    /// Books `key`'s run at [`vacant`](Self::vacant); returns that index.
    pub fn insert(&mut self, key: Attempt, run: Run) -> u32 {
        let entry = Some(Entry {
            key,
            run,
            orphan: false,
        });
        let index = match self.free.pop() {
            Some(i) => {
                let Some(slot) = self.slots.get_mut(i as usize) else {
                    unreachable!("free run slot {i} beyond the slab");
                };
                debug_assert!(slot.is_none(), "free run slot {i} taken");
                *slot = entry;
                i
            }
            None => {
                self.slots.push(entry);
                self.slots.len() as u32 - 1
            }
        };
        self.len += 1;
        index
    }

    /// The run at `index`, if it is `key`'s.
    pub fn get(&self, index: u32, key: Attempt) -> Option<&Run> {
        match self.slots.get(index as usize) {
            Some(Some(e)) if e.key == key => Some(&e.run),
            _ => None,
        }
    }

    /// The run at `index`, if it is `key`'s, to change.
    pub fn get_mut(&mut self, index: u32, key: Attempt) -> Option<&mut Run> {
        match self.slots.get_mut(index as usize) {
            Some(Some(e)) if e.key == key => Some(&mut e.run),
            _ => None,
        }
    }

    /// Where `key`'s run is if it is orphaned (see [`orphan`](Self::orphan)).
    pub fn orphan_index(&self, key: Attempt) -> Option<u32> {
        self.orphans.get(&key).copied()
    }

    /// No task record points at the run at `index` (`key`'s) from now on: it is found by key
    /// until it is removed.
    pub fn orphan(&mut self, index: u32, key: Attempt) {
        let Some(Some(e)) = self.slots.get_mut(index as usize) else {
            unreachable!("orphaned run slot {index} is empty");
        };
        assert_eq!(e.key, key, "run slot {index} holds another attempt");
        if !std::mem::replace(&mut e.orphan, true) {
            self.orphans.insert(key, index);
        }
    }

    /// Takes the run at `index` out, if it is `key`'s.
    pub fn remove(&mut self, index: u32, key: Attempt) -> Option<Run> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.as_ref().is_none_or(|e| e.key != key) {
            return None;
        }
        let entry = slot.take()?;
        if entry.orphan {
            self.orphans.remove(&key);
        }
        self.free.push(index);
        self.len -= 1;
        Some(entry.run)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every run with its attempt, in slab order.
    pub fn iter(&self) -> impl Iterator<Item = (&Attempt, &Run)> {
        self.slots.iter().flatten().map(|e| (&e.key, &e.run))
    }

    pub fn values(&self) -> impl Iterator<Item = &Run> {
        self.slots.iter().flatten().map(|e| &e.run)
    }

    /// Every run with its attempt, in slab order, to change.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Attempt, &mut Run)> {
        self.slots
            .iter_mut()
            .flatten()
            .map(|e| (&e.key, &mut e.run))
    }

    /// Every run with its attempt, taken out (the executor leaves).
    pub fn into_runs(self) -> Vec<(Attempt, Run)> {
        self.slots
            .into_iter()
            .flatten()
            .map(|e| (e.key, e.run))
            .collect()
    }

    /// Slots the slab spans: what a walk of its [`entries`](Self::entries) looks at.
    pub fn span(&self) -> usize {
        self.slots.len()
    }

    /// Every run's index, attempt and whether it is orphaned (a job's aborting finds its
    /// running attempts here when they are fewer than its records; the debug check).
    pub fn entries(&self) -> impl Iterator<Item = (u32, Attempt, bool)> + '_ {
        (0u32..)
            .zip(&self.slots)
            .filter_map(|(i, e)| e.as_ref().map(|e| (i, e.key, e.orphan)))
    }

    /// What must hold: `len` counts the full slots, the free list names exactly the empty ones,
    /// and the orphan index names exactly the orphaned runs, each where it is.
    #[cfg(any(test, debug_assertions))]
    pub fn check(&self) {
        let full = self.slots.iter().flatten().count();
        assert_eq!(full, self.len, "run count");
        assert_eq!(self.free.len() + full, self.slots.len(), "free run slots");
        for &i in &self.free {
            assert!(
                matches!(self.slots.get(i as usize), Some(None)),
                "free slot {i}"
            );
        }
        let orphaned = self.slots.iter().flatten().filter(|e| e.orphan).count();
        assert_eq!(orphaned, self.orphans.len(), "orphan count");
        for (key, &i) in &self.orphans {
            assert!(self.get(i, *key).is_some(), "orphan {key:?} at {i}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::types::{JobId, TaskId};

    fn key(task: u32, attempt: u32) -> Attempt {
        Attempt::new(TaskId::new(JobId(1), task), attempt)
    }

    fn run(started_us: u64) -> Run {
        Run::new(1, started_us, None)
    }

    #[test]
    fn runs_are_found_by_index_and_key_and_indices_are_reused() {
        let mut runs = Runs::default();
        assert_eq!(runs.vacant(), 0);
        let a = runs.insert(key(0, 0), run(1));
        let b = runs.insert(key(1, 0), run(2));
        assert_eq!((a, b, runs.len()), (0, 1, 2));
        assert_eq!(runs.get(b, key(1, 0)).map(|r| r.started_us), Some(2));
        assert!(
            runs.get(b, key(1, 1)).is_none(),
            "another attempt at that index"
        );
        assert!(runs.get(7, key(1, 0)).is_none(), "an index beyond the slab");
        assert!(
            runs.remove(a, key(1, 0)).is_none(),
            "the wrong key removes nothing"
        );
        assert_eq!(runs.remove(a, key(0, 0)).map(|r| r.started_us), Some(1));
        assert!(runs.remove(a, key(0, 0)).is_none(), "removed once");
        assert_eq!(runs.vacant(), a, "the freed index is taken next");
        assert_eq!(runs.insert(key(2, 0), run(3)), a);
        runs.check();
        assert_eq!(runs.iter().count(), 2);
    }

    #[test]
    fn an_orphaned_run_is_found_by_key_until_it_is_removed() {
        let mut runs = Runs::default();
        let a = runs.insert(key(0, 0), run(1));
        runs.insert(key(1, 0), run(2));
        assert_eq!(runs.orphan_index(key(0, 0)), None);
        runs.orphan(a, key(0, 0));
        runs.orphan(a, key(0, 0));
        assert_eq!(runs.orphan_index(key(0, 0)), Some(a));
        runs.check();
        assert!(runs.remove(a, key(0, 0)).is_some());
        assert_eq!(runs.orphan_index(key(0, 0)), None, "gone with its run");
        runs.check();
        let rest = runs.into_runs();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].0, key(1, 0));
    }

    #[test]
    fn the_slab_grows_only_to_the_most_runs_held_at_once() {
        let mut runs = Runs::default();
        for i in 0..1000 {
            let a = runs.insert(key(i, 0), run(1));
            let b = runs.insert(key(i, 1), run(1));
            runs.remove(a, key(i, 0));
            runs.remove(b, key(i, 1));
        }
        assert!(runs.is_empty());
        assert!(runs.vacant() < 2, "two slots serve two runs at a time");
        runs.check();
    }
}
