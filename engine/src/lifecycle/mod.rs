//! Executor lifecycle: where executors come from and where they go.
//!
//! - [`core`]: [`Lifecycle`], the one state machine that holds the parts below together; every
//!   cluster manager's IO side (local processes, Kubernetes, the standalone master) and the
//!   simulator drive it;
//! - [`snapshot`]: the store that merges executor states from sources (incremental updates and
//!   full re-syncs) and delivers them to subscribers in batches;
//! - [`allocator`]: keeps the executor count at a target (fixed, or following the backlog);
//! - [`Removals`] (here): turns snapshots into "remove this executor from the scheduler, for
//!   this reason", exactly once per executor.
//!
//! Like the scheduler, they are sans-IO state machines: time comes in as `now_us`, commands
//! come out; the IO layer (processes, a cluster manager's connection) drives [`Lifecycle`].

pub mod allocator;
pub mod core;
pub mod snapshot;

use std::collections::BTreeSet;

use crate::scheduler::RemovalReason;

pub use allocator::{
    dynamic_target, Allocator, AllocatorConfig, AllocatorOutput, AllocatorStats, DynamicConfig,
};
pub use core::{Allocation, Lifecycle, LifecycleConfig, LifecycleOutput, LifecycleStats};
pub use snapshot::{Delivery, ExecutorState, Snapshot, SnapshotStore, SubscriberId};

/// Why the scheduler should remove an executor in `state`, if it should: failed executors
/// exit with their code (blaming their tasks when the application caused the exit), succeeded
/// ones exited by themselves (code 0), deleted ones were killed.
pub fn removal_reason(state: &ExecutorState) -> Option<RemovalReason> {
    match state {
        ExecutorState::Failed {
            code,
            caused_by_app,
        } => Some(RemovalReason::Exited {
            code: *code,
            caused_by_app: *caused_by_app,
        }),
        ExecutorState::Succeeded => Some(RemovalReason::Exited {
            code: 0,
            caused_by_app: false,
        }),
        ExecutorState::Deleted => Some(RemovalReason::Killed),
        ExecutorState::Pending | ExecutorState::Running | ExecutorState::Unknown => None,
    }
}

/// The lifecycle handler's state machine: feed it every snapshot a subscriber receives; it
/// says which executors to remove from the scheduler and why, once each.
///
/// An executor it saw alive that is missing from a later snapshot (a buffer dropped the
/// snapshot that had its terminal state, then a full re-sync pruned it) is removed as killed.
/// It remembers only executors present in the last snapshot, so it is as big as a snapshot.
#[derive(Debug, Default)]
pub struct Removals {
    alive: BTreeSet<String>,
    removed: BTreeSet<String>,
}

impl Removals {
    /// A handler that has seen nothing.
    pub fn new() -> Removals {
        Removals::default()
    }

    /// The removals `snapshot` calls for, in name order.
    pub fn handle_snapshot(&mut self, snapshot: &Snapshot) -> Vec<(String, RemovalReason)> {
        let mut out = Vec::new();
        for (name, state) in snapshot.executors.iter() {
            match removal_reason(state) {
                Some(reason) => {
                    self.alive.remove(name);
                    if self.removed.insert(name.clone()) {
                        out.push((name.clone(), reason));
                    }
                }
                None => {
                    self.alive.insert(name.clone());
                }
            }
        }
        let vanished: Vec<String> = self
            .alive
            .iter()
            .filter(|name| !snapshot.executors.contains_key(*name))
            .cloned()
            .collect();
        for name in vanished {
            self.alive.remove(&name);
            out.push((name, RemovalReason::Killed));
        }
        self.removed
            .retain(|name| snapshot.executors.contains_key(name));
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gone_executor_is_removed_once_with_its_reason() {
        let mut store = SnapshotStore::new(0);
        let mut removals = Removals::new();
        store.update(0, "a", ExecutorState::Running);
        store.update(0, "b", ExecutorState::Running);
        store.update(0, "c", ExecutorState::Running);
        assert!(removals.handle_snapshot(store.current()).is_empty());
        store.update(
            1,
            "a",
            ExecutorState::Failed {
                code: 134,
                caused_by_app: true,
            },
        );
        store.update(1, "b", ExecutorState::Deleted);
        assert_eq!(
            removals.handle_snapshot(store.current()),
            vec![
                (
                    "a".to_string(),
                    RemovalReason::Exited {
                        code: 134,
                        caused_by_app: true
                    }
                ),
                ("b".to_string(), RemovalReason::Killed),
            ]
        );
        assert!(removals.handle_snapshot(store.current()).is_empty(), "once");
        // A full sync prunes a and b and loses c without a trace.
        store.replace_all(2, Vec::new());
        store.replace_all(3, Vec::new());
        assert_eq!(
            removals.handle_snapshot(store.current()),
            vec![("c".to_string(), RemovalReason::Killed)]
        );
    }

    #[test]
    fn succeeded_is_an_exit_not_caused_by_the_app() {
        assert_eq!(
            removal_reason(&ExecutorState::Succeeded),
            Some(RemovalReason::Exited {
                code: 0,
                caused_by_app: false
            })
        );
        assert_eq!(removal_reason(&ExecutorState::Unknown), None);
    }
}
