//! [`Lifecycle`]: the one executor lifecycle state machine every cluster manager runs (local
//! processes, Kubernetes pods, the standalone master, the simulators): the snapshot store, the
//! allocator, the removals and the draining of executors about to be deleted, in the shape of
//! the other cores (`handle_*(.., now_us)`, `poll_output`, `poll_timeout`).
//!
//! # Inputs
//!
//! - [`Lifecycle::handle_update`] (the *watch* source: one executor's new state) and
//!   [`Lifecycle::handle_listing`] (the *list* source: every executor the cluster manager
//!   knows, asked for with [`LifecycleOutput::List`] every `sync_interval_us`);
//! - [`Lifecycle::handle_load`]: what the driver sees (tasks pending and running, each
//!   registered executor and its running tasks). An executor the driver registered is running,
//!   whatever a slower source says;
//! - [`Lifecycle::handle_timeout`]: time passed; due snapshots go to the allocator and the
//!   removals, the allocator decides.
//!
//! # Outputs ([`Lifecycle::poll_output`])
//!
//! `Create`, `RequestTotal` and `Stop` come from the allocator. Its `Delete` of a registered
//! executor first becomes [`LifecycleOutput::Drain`] (the driver stops giving it work: Spark's
//! decommissioning) and then, once a load shows it running nothing (or it left the driver, or
//! `drain_timeout_us` passed), [`LifecycleOutput::Delete`] with `registered: true` (stop it
//! through the driver, then delete it); an unregistered one is deleted at once.
//! [`LifecycleOutput::Remove`] takes a gone executor out of the driver's scheduler with its
//! reason, once. [`LifecycleOutput::Changed`] reports watched state changes (for event lines).
//!
//! Bounded: everything it holds is per executor, and a round queues outputs for at most the
//! executors it knows plus four.

use std::collections::{BTreeMap, VecDeque};

use super::allocator::{
    Allocator, AllocatorConfig, AllocatorOutput, AllocatorStats, DynamicConfig,
};
use super::snapshot::{ExecutorState, SnapshotStore, SubscriberId};
use super::Removals;
use crate::scheduler::RemovalReason;

/// Who creates the executors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Someone else, on its own (an external launcher): the lifecycle only follows them.
    Follow,
    /// The allocator names and creates them (local processes, Kubernetes pods).
    Create(AllocatorConfig),
    /// The cluster manager, at a total the allocator asks for with dynamic allocation (the
    /// standalone master; see [`Allocator::requesting_total`]).
    RequestTotal(DynamicConfig),
}

/// How the lifecycle runs (micros).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// Who creates the executors.
    pub allocation: Allocation,
    /// How often snapshots are handed on and the allocator decides.
    pub tick_us: u64,
    /// How often a full listing is asked for.
    pub sync_interval_us: u64,
    /// An executor missing from listings this long counts as deleted.
    pub sync_grace_us: u64,
    /// A draining executor still running tasks this long is deleted anyway.
    pub drain_timeout_us: u64,
}

impl LifecycleConfig {
    /// Defaults (a 20 ms tick, a listing every second, 2 s of grace, 30 s to drain) for
    /// `allocation`.
    pub fn new(allocation: Allocation) -> LifecycleConfig {
        LifecycleConfig {
            allocation,
            tick_us: 20_000,
            sync_interval_us: 1_000_000,
            sync_grace_us: 2_000_000,
            drain_timeout_us: 30_000_000,
        }
    }
}

/// What the lifecycle wants done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifecycleOutput {
    /// Start executors with these names.
    Create(Vec<String>),
    /// Ask the cluster manager for this many executors in all.
    RequestTotal(u32),
    /// Stop giving these registered executors work; their running tasks go on.
    Drain(Vec<String>),
    /// Delete this executor; a `registered` one is first stopped through the driver.
    Delete {
        /// The executor.
        name: String,
        /// Whether the driver has it registered.
        registered: bool,
    },
    /// Remove this gone executor from the driver's scheduler, for this reason.
    Remove(String, RemovalReason),
    /// A watched executor's state changed (or the driver registered it: `Running`).
    Changed(String, ExecutorState),
    /// Take a full listing and hand it to [`Lifecycle::handle_listing`].
    List,
    /// Too many executor failures: stop the application.
    Stop(String),
}

/// What the lifecycle counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LifecycleStats {
    /// The allocator's counters (zeros without one).
    pub allocator: AllocatorStats,
    /// Executors registered with the driver at the last load.
    pub registered: u64,
    /// The most registered at once.
    pub peak: u64,
    /// Executors removed from the driver's scheduler.
    pub removed: u64,
    /// Executors drained before their deletion.
    pub drained: u64,
}

/// The lifecycle state machine (see the module docs).
#[derive(Debug)]
pub struct Lifecycle {
    config: LifecycleConfig,
    store: SnapshotStore,
    subscriber: SubscriberId,
    allocator: Option<Allocator>,
    removals: Removals,
    /// Registered executors and their running tasks, as the last load said.
    registered: BTreeMap<String, u32>,
    /// Executors draining before their deletion, with when they began.
    draining: BTreeMap<String, u64>,
    frozen: bool,
    next_tick_us: u64,
    next_list_us: u64,
    outputs: VecDeque<LifecycleOutput>,
    stats: LifecycleStats,
}

impl Lifecycle {
    /// A lifecycle that has seen nothing; its first tick is due at `now_us`, its first listing
    /// a `sync_interval_us` later.
    pub fn new(config: LifecycleConfig, now_us: u64) -> Lifecycle {
        let mut store = SnapshotStore::new(config.sync_grace_us);
        let subscriber = store.subscribe(0, 64);
        let allocator = match &config.allocation {
            Allocation::Follow => None,
            Allocation::Create(allocator) => Some(Allocator::new(allocator.clone())),
            Allocation::RequestTotal(dynamic) => Some(Allocator::requesting_total(dynamic.clone())),
        };
        Lifecycle {
            next_tick_us: now_us,
            next_list_us: now_us.saturating_add(config.sync_interval_us),
            config,
            store,
            subscriber,
            allocator,
            removals: Removals::new(),
            registered: BTreeMap::new(),
            draining: BTreeMap::new(),
            frozen: false,
            outputs: VecDeque::new(),
            stats: LifecycleStats::default(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> LifecycleStats {
        let mut stats = self.stats.clone();
        if let Some(allocator) = &self.allocator {
            stats.allocator = allocator.stats().clone();
        }
        stats
    }

    /// The allocator's target, if there is an allocator.
    pub fn target(&self) -> Option<u32> {
        self.allocator.as_ref().map(Allocator::target)
    }

    /// A new fixed target (see [`Allocator::set_target`]).
    pub fn set_target(&mut self, target: u32) {
        if let Some(allocator) = self.allocator.as_mut() {
            allocator.set_target(target);
        }
    }

    /// The application is ending: nothing more is created, drained or deleted; exits are still
    /// followed and removed.
    pub fn freeze(&mut self) {
        self.frozen = true;
        self.draining.clear();
    }

    /// The next thing to do.
    pub fn poll_output(&mut self) -> Option<LifecycleOutput> {
        self.outputs.pop_front()
    }

    /// When [`Lifecycle::handle_timeout`] is next due.
    pub fn poll_timeout(&self) -> Option<u64> {
        Some(self.next_tick_us.min(self.next_list_us))
    }

    /// The watch source: `name` is now in `state`.
    pub fn handle_update(&mut self, name: &str, state: ExecutorState, now_us: u64) {
        let state = self.as_registered(name, state);
        if self.store.current().get(name) != Some(&state) {
            self.outputs
                .push_back(LifecycleOutput::Changed(name.to_owned(), state.clone()));
        }
        self.store.update(now_us, name, state);
    }

    /// The list source: every executor the cluster manager knows now.
    pub fn handle_listing(&mut self, listing: Vec<(String, ExecutorState)>, now_us: u64) {
        let listing: Vec<(String, ExecutorState)> = listing
            .into_iter()
            .map(|(name, state)| {
                let state = self.as_registered(&name, state);
                (name, state)
            })
            .collect();
        self.store.replace_all(now_us, listing);
    }

    /// A pending executor the driver has registered is running.
    fn as_registered(&self, name: &str, state: ExecutorState) -> ExecutorState {
        match state {
            ExecutorState::Pending if self.registered.contains_key(name) => ExecutorState::Running,
            state => state,
        }
    }

    /// What the driver sees: tasks pending and running, each registered executor with the
    /// tasks it runs. Drained executors running nothing are deleted.
    pub fn handle_load<'a>(
        &mut self,
        pending_tasks: usize,
        running_tasks: usize,
        executors: impl IntoIterator<Item = (&'a str, u32)>,
        now_us: u64,
    ) {
        self.registered = executors
            .into_iter()
            .map(|(name, running)| (name.to_owned(), running))
            .collect();
        self.stats.registered = self.registered.len() as u64;
        self.stats.peak = self.stats.peak.max(self.stats.registered);
        let newly: Vec<String> = (self.registered.keys())
            .filter(|name| self.store.current().get(name) == Some(&ExecutorState::Pending))
            .cloned()
            .collect();
        for name in newly {
            self.handle_update(&name, ExecutorState::Running, now_us);
        }
        if let Some(allocator) = self.allocator.as_mut() {
            let load = self.registered.iter().map(|(n, r)| (n.as_str(), *r));
            allocator.handle_load(pending_tasks, running_tasks, load, now_us);
        }
        let drained: Vec<String> = (self.draining.keys())
            .filter(|name| {
                self.registered
                    .get(*name)
                    .is_none_or(|running| *running == 0)
            })
            .cloned()
            .collect();
        for name in drained {
            self.delete_drained(&name);
        }
    }

    /// An executor this core deleted as unregistered (its [`LifecycleOutput::Delete`] had
    /// `registered: false`) turned out registered with the driver by then, which drained it
    /// instead: it is deleted, like any drained executor, once a load shows it running
    /// nothing (or at the drain timeout), so no attempt it took meanwhile is lost.
    pub fn handle_drained(&mut self, name: &str, now_us: u64) {
        if self.frozen {
            return;
        }
        let fresh = self.draining.insert(name.to_owned(), now_us).is_none();
        debug_assert!(fresh, "{name} drained twice");
        self.stats.drained += 1;
    }

    /// Time passed: a listing when due; when the tick is due, the store's snapshots go to the
    /// allocator and the removals, and the allocator decides.
    pub fn handle_timeout(&mut self, now_us: u64) {
        if now_us >= self.next_list_us {
            self.next_list_us = now_us.saturating_add(self.config.sync_interval_us.max(1));
            self.outputs.push_back(LifecycleOutput::List);
        }
        if now_us < self.next_tick_us {
            return;
        }
        self.next_tick_us = now_us.saturating_add(self.config.tick_us.max(1));
        self.deliver(now_us);
        self.expire_drains(now_us);
        if self.frozen {
            return;
        }
        let Some(allocator) = self.allocator.as_mut() else {
            return;
        };
        allocator.handle_timeout(now_us);
        let mut decided = Vec::new();
        while let Some(output) = allocator.poll_output() {
            decided.push(output);
        }
        for output in decided {
            self.allocated(output, now_us);
        }
    }

    /// Hands the due snapshots to the allocator (unless frozen) and to the removals.
    fn deliver(&mut self, now_us: u64) {
        for delivery in self.store.poll_deliveries(now_us) {
            debug_assert_eq!(delivery.subscriber, self.subscriber, "one subscriber");
            for snapshot in &delivery.snapshots {
                if let Some(allocator) = self.allocator.as_mut().filter(|_| !self.frozen) {
                    allocator.handle_snapshot(snapshot, now_us);
                }
                for (name, reason) in self.removals.handle_snapshot(snapshot) {
                    self.draining.remove(&name);
                    self.stats.removed += 1;
                    self.outputs
                        .push_back(LifecycleOutput::Remove(name, reason));
                }
            }
            self.store.delivered(self.subscriber);
        }
    }

    /// What the allocator decided, as outputs: its deletions of registered executors drain
    /// first.
    fn allocated(&mut self, output: AllocatorOutput, now_us: u64) {
        match output {
            AllocatorOutput::Create(names) => {
                for name in &names {
                    self.store.update(now_us, name, ExecutorState::Pending);
                }
                self.outputs.push_back(LifecycleOutput::Create(names));
            }
            AllocatorOutput::RequestTotal(total) => {
                self.outputs.push_back(LifecycleOutput::RequestTotal(total));
            }
            AllocatorOutput::Delete(names) => {
                let (registered, unregistered): (Vec<String>, Vec<String>) = names
                    .into_iter()
                    .partition(|name| self.registered.contains_key(name));
                for name in unregistered {
                    self.outputs.push_back(LifecycleOutput::Delete {
                        name,
                        registered: false,
                    });
                }
                if !registered.is_empty() {
                    for name in &registered {
                        let fresh = self.draining.insert(name.clone(), now_us).is_none();
                        debug_assert!(fresh, "{name} drained twice");
                    }
                    self.stats.drained += registered.len() as u64;
                    self.outputs.push_back(LifecycleOutput::Drain(registered));
                }
            }
            AllocatorOutput::Stop(reason) => self.outputs.push_back(LifecycleOutput::Stop(reason)),
        }
    }

    /// Draining executors past the drain timeout are deleted with their tasks still running
    /// (an executor that gets SIGTERM reports them back).
    fn expire_drains(&mut self, now_us: u64) {
        let timeout = self.config.drain_timeout_us;
        let overdue: Vec<String> = (self.draining.iter())
            .filter(|(_, since)| now_us.saturating_sub(**since) >= timeout)
            .map(|(name, _)| name.clone())
            .collect();
        for name in overdue {
            tracing::warn!(executor = %name, "still running tasks after the drain timeout; deleting it");
            self.delete_drained(&name);
        }
    }

    fn delete_drained(&mut self, name: &str) {
        let was_draining = self.draining.remove(name).is_some();
        debug_assert!(was_draining, "{name} was not draining");
        self.outputs.push_back(LifecycleOutput::Delete {
            name: name.to_owned(),
            registered: self.registered.contains_key(name),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    fn drain(l: &mut Lifecycle) -> Vec<LifecycleOutput> {
        std::iter::from_fn(|| l.poll_output()).collect()
    }

    fn creating(target: u32) -> Lifecycle {
        Lifecycle::new(
            LifecycleConfig::new(Allocation::Create(AllocatorConfig {
                initial_target: target,
                batch_delay_us: 0,
                name_prefix: "e".into(),
                ..AllocatorConfig::default()
            })),
            0,
        )
    }

    #[test]
    fn a_deleted_registered_executor_drains_until_it_runs_nothing() {
        let mut l = creating(2);
        l.handle_timeout(0);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Create(vec!["e0".into(), "e1".into()])]
        );
        l.handle_load(0, 3, [("e0", 2), ("e1", 1)], MS);
        assert_eq!(
            drain(&mut l),
            vec![
                LifecycleOutput::Changed("e0".into(), ExecutorState::Running),
                LifecycleOutput::Changed("e1".into(), ExecutorState::Running),
            ],
            "registered means running"
        );
        l.handle_timeout(20 * MS);
        l.handle_load(0, 3, [("e0", 2), ("e1", 1)], 25 * MS);
        l.set_target(1);
        l.handle_timeout(40 * MS);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Drain(vec!["e1".into()])]
        );
        l.handle_load(0, 3, [("e0", 2), ("e1", 1)], 45 * MS);
        assert!(drain(&mut l).is_empty(), "its task still runs");
        l.handle_load(0, 2, [("e0", 2), ("e1", 0)], 50 * MS);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Delete {
                name: "e1".into(),
                registered: true
            }]
        );
        l.handle_update("e1", ExecutorState::Deleted, 60 * MS);
        l.handle_timeout(60 * MS);
        let out = drain(&mut l);
        assert!(
            out.contains(&LifecycleOutput::Remove("e1".into(), RemovalReason::Killed)),
            "{out:?}"
        );
        assert_eq!(l.stats().allocator.failures, 0);
        assert_eq!(l.stats().drained, 1);
    }

    /// The race the local lifecycle test hit under load: the target drops while the core's
    /// last load predates an executor's registration, so the core deletes it as unregistered;
    /// the driver, which has it registered and running tasks, drains it instead. It then goes
    /// like any drained executor: only once it runs nothing.
    #[test]
    fn an_executor_deleted_as_unregistered_that_the_driver_drained_goes_once_idle() {
        let mut l = creating(2);
        l.handle_timeout(0);
        drain(&mut l);
        l.handle_load(0, 1, [("e0", 1)], MS);
        l.set_target(1);
        l.handle_timeout(30 * MS);
        let out = drain(&mut l);
        let deleted = LifecycleOutput::Delete {
            name: "e1".into(),
            registered: false,
        };
        assert!(out.contains(&deleted), "{out:?}");
        l.handle_drained("e1", 31 * MS);
        assert_eq!(l.stats().drained, 1);
        l.handle_load(0, 3, [("e0", 1), ("e1", 2)], 40 * MS);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Changed(
                "e1".into(),
                ExecutorState::Running
            )],
            "registered now, and not deleted: its tasks still run"
        );
        l.handle_load(0, 1, [("e0", 1), ("e1", 0)], 50 * MS);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Delete {
                name: "e1".into(),
                registered: true
            }]
        );
    }

    #[test]
    fn a_drain_past_its_timeout_deletes_and_an_unregistered_executor_goes_at_once() {
        let mut l = creating(2);
        l.config.drain_timeout_us = 100 * MS;
        l.handle_timeout(0);
        drain(&mut l);
        l.handle_load(0, 1, [("e0", 1)], MS);
        l.set_target(0);
        l.handle_timeout(30 * MS);
        assert_eq!(
            drain(&mut l),
            vec![
                LifecycleOutput::Changed("e0".into(), ExecutorState::Running),
                LifecycleOutput::Delete {
                    name: "e1".into(),
                    registered: false
                },
                LifecycleOutput::Drain(vec!["e0".into()]),
            ]
        );
        l.handle_timeout(129 * MS);
        assert!(drain(&mut l).is_empty());
        l.handle_timeout(149 * MS);
        assert_eq!(
            drain(&mut l),
            vec![LifecycleOutput::Delete {
                name: "e0".into(),
                registered: true
            }]
        );
    }

    #[test]
    fn listings_are_asked_for_and_a_registered_executor_stays_running_in_them() {
        let mut l = Lifecycle::new(LifecycleConfig::new(Allocation::Follow), 0);
        l.handle_update("a", ExecutorState::Pending, 0);
        l.handle_load(0, 0, [("a", 0)], MS);
        l.handle_timeout(999 * MS);
        assert!(!drain(&mut l).contains(&LifecycleOutput::List));
        l.handle_timeout(1_000 * MS);
        assert!(drain(&mut l).contains(&LifecycleOutput::List));
        l.handle_listing(vec![("a".into(), ExecutorState::Pending)], 1_001 * MS);
        l.handle_listing(Vec::new(), 4_000 * MS);
        l.handle_timeout(4_000 * MS);
        assert_eq!(
            drain(&mut l),
            vec![
                LifecycleOutput::List,
                LifecycleOutput::Remove("a".into(), RemovalReason::Killed)
            ],
            "gone from listings past the grace: removed once, never seen pending again"
        );
        assert_eq!(l.poll_timeout(), Some(4_020 * MS));
    }

    #[test]
    fn frozen_it_only_follows_exits() {
        let mut l = creating(1);
        l.handle_timeout(0);
        drain(&mut l);
        l.freeze();
        let failed = ExecutorState::Failed {
            code: 1,
            caused_by_app: false,
        };
        l.handle_update("e0", failed, MS);
        l.handle_timeout(100 * MS);
        let out = drain(&mut l);
        assert!(
            out.iter().all(|o| !matches!(o, LifecycleOutput::Create(_))),
            "no replacement: {out:?}"
        );
        assert!(out.iter().any(|o| matches!(o, LifecycleOutput::Remove(..))));
    }
}
