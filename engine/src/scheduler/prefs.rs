//! Which active jobs have preference queues for an executor or a host, so that an executor
//! joining or leaving updates the valid locality levels of those jobs only, not of every job
//! with preferences.
//!
//! A job files itself under each executor and host it ever made a preference queue for (its
//! queues report new keys as they are made, see `Job::new_pref_keys`) and leaves all of them
//! when it ends. A queue that emptied since may leave the job filed under a key it no longer
//! has: the job then counts no queue for it, so the index is a superset, never missing a job.

use super::types::ExecutorId;
use crate::hash::{FxHashMap, FxHashSet};

/// A preference queue's key: the executor or the host (index in the book) its tasks prefer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum PrefKey {
    Executor(ExecutorId),
    Host(u32),
}

/// Job slots by the preference keys they have queues for. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct PrefIndex {
    by_exec: FxHashMap<ExecutorId, FxHashSet<u32>>,
    by_host: FxHashMap<u32, FxHashSet<u32>>,
}

impl PrefIndex {
    /// Files job `slot` under `key`; returns whether it was not filed there yet.
    pub fn add(&mut self, slot: u32, key: PrefKey) -> bool {
        match key {
            PrefKey::Executor(e) => self.by_exec.entry(e).or_default().insert(slot),
            PrefKey::Host(h) => self.by_host.entry(h).or_default().insert(slot),
        }
    }

    /// Takes job `slot` out from under `key`.
    pub fn remove(&mut self, slot: u32, key: PrefKey) {
        match key {
            PrefKey::Executor(e) => remove_from(&mut self.by_exec, e, slot),
            PrefKey::Host(h) => remove_from(&mut self.by_host, h, slot),
        }
    }

    /// Whether a job is filed under host `h`.
    pub fn holds_host(&self, h: u32) -> bool {
        self.by_host.contains_key(&h)
    }

    /// Puts into `out` (cleared first) the slots of the jobs filed under executor `exec` or,
    /// if given, under `host`, in slot order, each once.
    pub fn jobs_into(&self, exec: ExecutorId, host: Option<u32>, out: &mut Vec<u32>) {
        out.clear();
        out.extend(self.by_exec.get(&exec).into_iter().flatten().copied());
        if let Some(h) = host {
            out.extend(self.by_host.get(&h).into_iter().flatten().copied());
        }
        out.sort_unstable();
        out.dedup();
    }
}

/// Removes `slot` from `map[key]`, dropping the set once empty (so the index holds only keys
/// of active jobs).
fn remove_from<K: std::hash::Hash + Eq>(map: &mut FxHashMap<K, FxHashSet<u32>>, key: K, slot: u32) {
    if let Some(set) = map.get_mut(&key) {
        set.remove(&slot);
        if set.is_empty() {
            map.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_are_found_under_their_executor_or_host_once_and_leave_cleanly() {
        let mut x = PrefIndex::default();
        let e = ExecutorId(7);
        assert!(x.add(3, PrefKey::Executor(e)));
        assert!(!x.add(3, PrefKey::Executor(e)), "filed once");
        assert!(x.add(3, PrefKey::Host(1)));
        assert!(x.add(1, PrefKey::Host(1)));
        assert!(x.add(2, PrefKey::Host(2)));
        let mut out = vec![99];
        x.jobs_into(e, None, &mut out);
        assert_eq!(out, [3], "the host's jobs only when the host changed");
        x.jobs_into(e, Some(1), &mut out);
        assert_eq!(out, [1, 3], "slot order, each once");
        x.jobs_into(ExecutorId(8), Some(2), &mut out);
        assert_eq!(out, [2]);
        x.remove(3, PrefKey::Executor(e));
        x.remove(3, PrefKey::Host(1));
        x.remove(3, PrefKey::Host(1));
        x.jobs_into(e, Some(1), &mut out);
        assert_eq!(out, [1]);
        x.remove(1, PrefKey::Host(1));
        x.remove(2, PrefKey::Host(2));
        assert!(
            x.by_exec.is_empty() && x.by_host.is_empty(),
            "no empty sets kept"
        );
    }
}
