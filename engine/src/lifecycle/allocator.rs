//! The executor allocator: keeps an application's executor count at a target by creating and
//! deleting executors, and (optionally) moves the target with the backlog.
//!
//! # The protocol
//!
//! The allocator is a state machine driven by its owner with the time in micros:
//!
//! - [`Allocator::handle_snapshot`]: executor states from the snapshot store (a source says an
//!   executor is pending, running, or gone);
//! - [`Allocator::handle_load`]: what the driver sees: tasks pending and running, and each
//!   registered executor's running tasks (none: idle);
//! - [`Allocator::set_target`]: a fixed target (without dynamic allocation);
//! - [`Allocator::handle_timeout`]: decides; then [`Allocator::poll_output`] yields
//!   [`AllocatorOutput::Create`] (start these executors, named by the allocator),
//!   [`AllocatorOutput::Delete`] (stop these executors) and, once, [`AllocatorOutput::Stop`].
//!
//! # Rules
//!
//! - *Live* executors are those the allocator created (or saw running) that are neither gone
//!   nor being deleted. When live < target, it creates at most `batch_size` executors per
//!   `batch_delay_us`.
//! - An executor created but not running (registered) within `pending_timeout_us` is deleted;
//!   the next ticks replace it since it no longer counts as live.
//! - When live > target, excess pending executors are deleted first (newest first), then idle
//!   running ones (idle the longest first). With dynamic allocation an executor running tasks
//!   is never deleted (Spark's rule: the backlog that keeps it busy is why it exists); a fixed
//!   target lowered below the busy executors deletes the least busy ones too, which the
//!   lifecycle drains first (no new work; deleted once their running tasks end).
//! - Dynamic allocation: target = ceil((pending + running tasks) / `tasks_per_executor`),
//!   clamped to `[min, max]`; only executors idle for at least `idle_timeout_us` are released.
//! - An executor that fails (or succeeds, or is deleted) without the allocator having asked is
//!   a failure; more than `failures_max` failures emit [`AllocatorOutput::Stop`] and the
//!   allocator does nothing more.
//! - A cluster manager that names and starts executors itself (the standalone master):
//!   [`Allocator::requesting_total`] asks it for the dynamic target
//!   ([`AllocatorOutput::RequestTotal`], on every change, before any deletion of the same
//!   round, so the manager does not replace what is deleted), adopts every executor the
//!   snapshots show, and when over the target deletes idle ones only; the manager's own launch
//!   timeout and retry limit replace the pending timeout and `failures_max`.
//!
//! Outputs are queued until polled; a tick queues at most one `Create` and one `Delete`, so
//! an owner that polls after each tick holds at most three outputs.

use std::collections::{BTreeMap, VecDeque};

use super::snapshot::{ExecutorState, Snapshot};

/// Dynamic allocation settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicConfig {
    /// Never fewer executors than this.
    pub min: u32,
    /// Never more executors than this.
    pub max: u32,
    /// Tasks one executor runs at once (its cores times its task slots per core).
    pub tasks_per_executor: u32,
    /// An executor idle this long is released (down to `min`).
    pub idle_timeout_us: u64,
}

/// The dynamic allocation target for a backlog: ceil((pending + running) / tasks per
/// executor), within `[min, max]`.
pub fn dynamic_target(d: &DynamicConfig, pending_tasks: usize, running_tasks: usize) -> u32 {
    let tasks = pending_tasks.saturating_add(running_tasks) as u64;
    let needed = tasks.div_ceil(u64::from(d.tasks_per_executor.max(1)));
    needed.clamp(u64::from(d.min), u64::from(d.max.max(d.min))) as u32
}

/// Allocator settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocatorConfig {
    /// Executors created at most per round.
    pub batch_size: u32,
    /// Time between creation rounds.
    pub batch_delay_us: u64,
    /// An executor not running this long after its creation is deleted and replaced.
    pub pending_timeout_us: u64,
    /// Executor failures tolerated; one more stops the application.
    pub failures_max: u32,
    /// The target before any [`Allocator::set_target`] (with dynamic allocation: `min`).
    pub initial_target: u32,
    /// Dynamic allocation, if on.
    pub dynamic: Option<DynamicConfig>,
    /// Created executors are named `{name_prefix}{n}`, n counting from 0.
    pub name_prefix: String,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            batch_size: 5,
            batch_delay_us: 1_000_000,
            pending_timeout_us: 60_000_000,
            failures_max: 10,
            initial_target: 2,
            dynamic: None,
            name_prefix: "exec-".into(),
        }
    }
}

/// What the allocator wants done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocatorOutput {
    /// Start executors with these names.
    Create(Vec<String>),
    /// Ask the cluster manager for this many executors in all (it names and starts them).
    RequestTotal(u32),
    /// Stop (delete) these executors.
    Delete(Vec<String>),
    /// Too many executor failures: stop the application.
    Stop(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending { created_us: u64 },
    Running,
}

/// Who names and starts executors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The allocator: `Create(names)`.
    Create,
    /// The cluster manager: `RequestTotal(n)`; the allocator adopts what it sees.
    RequestTotal,
}

#[derive(Clone, Debug)]
struct Tracked {
    phase: Phase,
    /// When it was last seen running no task (None: busy, or not running yet).
    idle_since_us: Option<u64>,
    /// Tasks it ran at the last load.
    running_tasks: u32,
    deleting: bool,
}

/// Counters the allocator keeps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Executors asked for.
    pub created: u64,
    /// Executors deleted on purpose (excess, idle or pending too long).
    pub deleted: u64,
    /// Of those, deleted because they did not start in time.
    pub pending_timeouts: u64,
    /// Executors gone without being asked (each one is replaced while under the target).
    pub failures: u64,
    /// The most live executors at once.
    pub peak: u64,
}

/// The allocator (see the module docs).
#[derive(Debug)]
pub struct Allocator {
    config: AllocatorConfig,
    mode: Mode,
    /// The last total asked for (`RequestTotal` mode).
    requested: Option<u32>,
    target: u32,
    executors: BTreeMap<String, Tracked>,
    next_name: u64,
    last_batch_us: Option<u64>,
    pending_tasks: usize,
    running_tasks: usize,
    outputs: VecDeque<AllocatorOutput>,
    stats: AllocatorStats,
    stopped: Option<String>,
}

impl Allocator {
    /// A new allocator with nothing created yet.
    pub fn new(config: AllocatorConfig) -> Allocator {
        let target = match &config.dynamic {
            Some(d) => config.initial_target.clamp(d.min, d.max.max(d.min)),
            None => config.initial_target,
        };
        Allocator {
            config,
            mode: Mode::Create,
            requested: None,
            target,
            executors: BTreeMap::new(),
            next_name: 0,
            last_batch_us: None,
            pending_tasks: 0,
            running_tasks: 0,
            outputs: VecDeque::new(),
            stats: AllocatorStats::default(),
            stopped: None,
        }
    }

    /// An allocator for a cluster manager that names and starts executors itself (see the
    /// module docs): dynamic allocation by `dynamic`, asked for as totals.
    pub fn requesting_total(dynamic: DynamicConfig) -> Allocator {
        let mut allocator = Allocator::new(AllocatorConfig {
            pending_timeout_us: u64::MAX,
            failures_max: u32::MAX,
            initial_target: dynamic.min,
            dynamic: Some(dynamic),
            name_prefix: String::new(),
            ..AllocatorConfig::default()
        });
        allocator.mode = Mode::RequestTotal;
        allocator
    }

    /// The current target.
    pub fn target(&self) -> u32 {
        self.target
    }

    /// Live executors: created or running, not gone, not being deleted.
    pub fn live(&self) -> usize {
        self.executors.values().filter(|e| !e.deleting).count()
    }

    /// Live executors that are running (registered).
    pub fn running(&self) -> usize {
        self.executors
            .values()
            .filter(|e| !e.deleting && e.phase == Phase::Running)
            .count()
    }

    /// The counters.
    pub fn stats(&self) -> &AllocatorStats {
        &self.stats
    }

    /// Why the application must stop, once it must.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Sets a fixed target (ignored with dynamic allocation, whose target follows the load).
    pub fn set_target(&mut self, target: u32) {
        if self.config.dynamic.is_none() {
            self.target = target;
        }
    }

    /// When [`Allocator::handle_timeout`] next has a decision to make on what it knows now
    /// (a new load or snapshot may bring it closer): at once (0) to ask a new total or delete
    /// over the target, the next batch's time under it, the first pending executor's
    /// timeout, the first idle executor's release with dynamic allocation; `None` when
    /// nothing would change. O(executors).
    pub fn poll_timeout(&self) -> Option<u64> {
        if self.stopped.is_some() {
            return None;
        }
        let target = match &self.config.dynamic {
            Some(d) => dynamic_target(d, self.pending_tasks, self.running_tasks),
            None => self.target,
        };
        if self.mode == Mode::RequestTotal && self.requested != Some(target) {
            return Some(0);
        }
        let live = || self.executors.values().filter(|t| !t.deleting);
        let pending_due = live()
            .filter_map(|t| match t.phase {
                Phase::Pending { created_us } => Some(created_us),
                Phase::Running => None,
            })
            .map(|created| created.saturating_add(self.config.pending_timeout_us))
            .min();
        let resize = match self.live().cmp(&(target as usize)) {
            std::cmp::Ordering::Less if self.mode == Mode::Create => Some(
                (self.last_batch_us).map_or(0, |t| t.saturating_add(self.config.batch_delay_us)),
            ),
            std::cmp::Ordering::Greater => match &self.config.dynamic {
                None => Some(0),
                Some(_) if self.mode == Mode::Create && pending_due.is_some() => Some(0),
                Some(d) => (live().filter(|t| t.phase == Phase::Running))
                    .filter_map(|t| t.idle_since_us)
                    .map(|since| since.saturating_add(d.idle_timeout_us))
                    .min(),
            },
            _ => None,
        };
        [resize, pending_due].into_iter().flatten().min()
    }

    /// The next thing to do.
    pub fn poll_output(&mut self) -> Option<AllocatorOutput> {
        self.outputs.pop_front()
    }

    /// Executor states from the snapshot store.
    pub fn handle_snapshot(&mut self, snapshot: &Snapshot, now_us: u64) {
        if self.mode == Mode::RequestTotal {
            self.adopt(now_us, snapshot);
        }
        let mut gone = Vec::new();
        for (name, tracked) in self.executors.iter_mut() {
            match snapshot.get(name) {
                Some(ExecutorState::Running) => {
                    if tracked.phase != Phase::Running {
                        tracked.phase = Phase::Running;
                        tracked.idle_since_us = Some(now_us);
                    }
                }
                Some(state) if state.is_terminal() => gone.push((name.clone(), true)),
                Some(_) => {}
                // Absent from a snapshot taken after its creation: gone without a trace.
                None => {
                    let created_before = match tracked.phase {
                        Phase::Pending { created_us } => created_us <= snapshot.taken_us,
                        Phase::Running => true,
                    };
                    if created_before && snapshot.full_sync {
                        gone.push((name.clone(), true));
                    }
                }
            }
        }
        for (name, _) in gone {
            if let Some(tracked) = self.executors.remove(&name) {
                if !tracked.deleting {
                    self.stats.failures += 1;
                    tracing::warn!(executor = %name, state = ?snapshot.get(&name), "executor gone");
                }
            }
        }
        self.check_failures();
    }

    /// Tracks the executors the cluster manager started (`RequestTotal` mode): every name the
    /// snapshot has alive that the allocator does not know yet.
    fn adopt(&mut self, now_us: u64, snapshot: &Snapshot) {
        for (name, state) in snapshot.executors.iter() {
            if state.is_terminal() || self.executors.contains_key(name) {
                continue;
            }
            let phase = match state {
                ExecutorState::Running => Phase::Running,
                _ => Phase::Pending { created_us: now_us },
            };
            let idle_since_us = (phase == Phase::Running).then_some(now_us);
            self.executors.insert(
                name.clone(),
                Tracked {
                    phase,
                    idle_since_us,
                    running_tasks: 0,
                    deleting: false,
                },
            );
        }
    }

    /// What the driver sees: tasks pending and running, and each registered executor with the
    /// tasks it runs now (names the allocator does not know are ignored; tracked executors
    /// missing from it count as busy).
    pub fn handle_load<'a>(
        &mut self,
        pending_tasks: usize,
        running_tasks: usize,
        executors: impl IntoIterator<Item = (&'a str, u32)>,
        now_us: u64,
    ) {
        self.pending_tasks = pending_tasks;
        self.running_tasks = running_tasks;
        let running: BTreeMap<&str, u32> = executors.into_iter().collect();
        for (name, tracked) in self.executors.iter_mut() {
            if tracked.phase != Phase::Running {
                continue;
            }
            match running.get(name.as_str()) {
                Some(0) => {
                    tracked.idle_since_us.get_or_insert(now_us);
                    tracked.running_tasks = 0;
                }
                Some(&tasks) => {
                    tracked.idle_since_us = None;
                    tracked.running_tasks = tasks;
                }
                None => {
                    tracked.idle_since_us = None;
                    tracked.running_tasks = u32::MAX;
                }
            }
        }
    }

    /// Decides what to create and delete at `now_us`.
    pub fn handle_timeout(&mut self, now_us: u64) {
        if self.stopped.is_some() {
            return;
        }
        if let Some(d) = &self.config.dynamic {
            self.target = dynamic_target(d, self.pending_tasks, self.running_tasks);
        }
        if self.mode == Mode::RequestTotal && self.requested != Some(self.target) {
            self.requested = Some(self.target);
            self.outputs
                .push_back(AllocatorOutput::RequestTotal(self.target));
        }
        let mut delete = Vec::new();
        self.expire_pending(now_us, &mut delete);
        let live = self.live();
        let target = self.target as usize;
        if live > target {
            self.shrink(now_us, live - target, &mut delete);
        } else if live < target && self.mode == Mode::Create {
            self.grow(now_us, target - live);
        }
        if !delete.is_empty() {
            self.stats.deleted += delete.len() as u64;
            self.outputs.push_back(AllocatorOutput::Delete(delete));
        }
        self.stats.peak = self.stats.peak.max(self.live() as u64);
    }

    /// Marks for deletion (into `delete`) the executors pending too long (`tick` then replaces
    /// them).
    fn expire_pending(&mut self, now_us: u64, delete: &mut Vec<String>) {
        for (name, tracked) in self.executors.iter_mut() {
            if let Phase::Pending { created_us } = tracked.phase {
                if !tracked.deleting
                    && now_us.saturating_sub(created_us) >= self.config.pending_timeout_us
                {
                    tracked.deleting = true;
                    self.stats.pending_timeouts += 1;
                    delete.push(name.clone());
                }
            }
        }
    }

    /// Marks `excess` executors for deletion (into `delete`), in this order: pending ones,
    /// newest first (only those the allocator created); idle ones, idle the longest first
    /// (with dynamic allocation, only past the idle timeout); with a fixed target, busy ones,
    /// the least busy first (the lifecycle drains them before they go).
    fn shrink(&mut self, now_us: u64, mut excess: usize, delete: &mut Vec<String>) {
        let victims = self.victims(now_us);
        for name in victims {
            if excess == 0 {
                break;
            }
            if let Some(tracked) = self.executors.get_mut(&name) {
                debug_assert!(!tracked.deleting, "{name} chosen twice");
                tracked.deleting = true;
                delete.push(name);
                excess -= 1;
            }
        }
    }

    /// The executors [`Allocator::shrink`] may delete, in its order.
    fn victims(&self, now_us: u64) -> Vec<String> {
        let live = || self.executors.iter().filter(|(_, t)| !t.deleting);
        let mut pending: Vec<(u64, &String)> = live()
            .filter_map(|(name, t)| match t.phase {
                Phase::Pending { created_us } => Some((created_us, name)),
                Phase::Running => None,
            })
            .filter(|_| self.mode == Mode::Create)
            .collect();
        pending.sort_by(|a, b| b.cmp(a));
        let idle_min_us = self
            .config
            .dynamic
            .as_ref()
            .map_or(0, |d| d.idle_timeout_us);
        let mut idle: Vec<(u64, &String)> = live()
            .filter(|(_, t)| t.phase == Phase::Running)
            .filter_map(|(name, t)| t.idle_since_us.map(|since| (since, name)))
            .filter(|(since, _)| now_us.saturating_sub(*since) >= idle_min_us)
            .collect();
        idle.sort();
        let mut busy: Vec<(u32, &String)> = live()
            .filter(|(_, t)| t.phase == Phase::Running && t.idle_since_us.is_none())
            .map(|(name, t)| (t.running_tasks, name))
            .filter(|_| self.config.dynamic.is_none())
            .collect();
        busy.sort();
        let pending = pending.into_iter().map(|(_, name)| name);
        let idle = idle.into_iter().map(|(_, name)| name);
        let busy = busy.into_iter().map(|(_, name)| name);
        pending.chain(idle).chain(busy).cloned().collect()
    }

    /// Creates up to `missing` executors (a batch of at most `batch_size`), once
    /// `batch_delay_us` passed since the last batch.
    fn grow(&mut self, now_us: u64, missing: usize) {
        let due = match self.last_batch_us {
            None => true,
            Some(last) => now_us.saturating_sub(last) >= self.config.batch_delay_us,
        };
        if !due {
            return;
        }
        let count = missing.min(self.config.batch_size.max(1) as usize);
        let mut names = Vec::with_capacity(count);
        for _ in 0..count {
            let name = format!("{}{}", self.config.name_prefix, self.next_name);
            self.next_name += 1;
            self.executors.insert(
                name.clone(),
                Tracked {
                    phase: Phase::Pending { created_us: now_us },
                    idle_since_us: None,
                    running_tasks: 0,
                    deleting: false,
                },
            );
            names.push(name);
        }
        self.stats.created += count as u64;
        self.last_batch_us = Some(now_us);
        self.outputs.push_back(AllocatorOutput::Create(names));
    }

    fn check_failures(&mut self) {
        if self.stopped.is_none() && self.stats.failures > u64::from(self.config.failures_max) {
            let reason = format!(
                "{} executors failed (more than the {} allowed); stopping the application",
                self.stats.failures, self.config.failures_max
            );
            self.stopped = Some(reason.clone());
            self.outputs.push_back(AllocatorOutput::Stop(reason));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::snapshot::SnapshotStore;

    const MS: u64 = 1_000;

    fn config() -> AllocatorConfig {
        AllocatorConfig {
            batch_size: 2,
            batch_delay_us: 100 * MS,
            pending_timeout_us: 1_000 * MS,
            failures_max: 3,
            initial_target: 5,
            dynamic: None,
            name_prefix: "e".into(),
        }
    }

    fn drain(a: &mut Allocator) -> Vec<AllocatorOutput> {
        std::iter::from_fn(|| a.poll_output()).collect()
    }

    fn created(outputs: &[AllocatorOutput]) -> Vec<String> {
        outputs
            .iter()
            .flat_map(|o| match o {
                AllocatorOutput::Create(names) => names.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn deleted(outputs: &[AllocatorOutput]) -> Vec<String> {
        outputs
            .iter()
            .flat_map(|o| match o {
                AllocatorOutput::Delete(names) => names.clone(),
                _ => Vec::new(),
            })
            .collect()
    }

    /// Marks every named executor with `state` in the store and tells the allocator.
    fn report(
        store: &mut SnapshotStore,
        a: &mut Allocator,
        now: u64,
        names: &[String],
        state: ExecutorState,
    ) {
        for name in names {
            store.update(now, name, state.clone());
        }
        a.handle_snapshot(store.current(), now);
    }

    #[test]
    fn creates_in_batches_per_delay_up_to_the_target() {
        let mut a = Allocator::new(config());
        assert_eq!(a.poll_timeout(), Some(0), "under the target, no batch yet");
        a.handle_timeout(0);
        assert_eq!(created(&drain(&mut a)), vec!["e0", "e1"]);
        assert_eq!(a.poll_timeout(), Some(100 * MS), "the next batch");
        a.handle_timeout(50 * MS);
        assert!(drain(&mut a).is_empty(), "batch delay not passed");
        a.handle_timeout(100 * MS);
        assert_eq!(created(&drain(&mut a)), vec!["e2", "e3"]);
        a.handle_timeout(200 * MS);
        assert_eq!(created(&drain(&mut a)), vec!["e4"]);
        a.handle_timeout(300 * MS);
        assert!(drain(&mut a).is_empty(), "at the target");
        assert_eq!(a.live(), 5);
        assert_eq!(
            a.poll_timeout(),
            Some(1_000 * MS),
            "the first pending timeout"
        );
    }

    #[test]
    fn a_pending_executor_past_the_timeout_is_deleted_and_replaced() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            initial_target: 2,
            ..config()
        });
        a.handle_timeout(0);
        let names = created(&drain(&mut a));
        report(&mut store, &mut a, 10 * MS, &names, ExecutorState::Pending);
        report(
            &mut store,
            &mut a,
            20 * MS,
            &names[..1],
            ExecutorState::Running,
        );
        a.handle_timeout(999 * MS);
        assert!(drain(&mut a).is_empty());
        a.handle_timeout(1_000 * MS);
        let out = drain(&mut a);
        assert_eq!(deleted(&out), vec!["e1"]);
        assert_eq!(created(&out), vec!["e2"], "replaced in the same round");
        assert_eq!(a.stats().pending_timeouts, 1);
        // Its deletion is not a failure.
        report(
            &mut store,
            &mut a,
            1_010 * MS,
            &names[1..],
            ExecutorState::Deleted,
        );
        assert_eq!(a.stats().failures, 0);
    }

    #[test]
    fn a_lower_target_deletes_pending_first_then_idle_then_the_least_busy() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            batch_size: 10,
            initial_target: 6,
            ..config()
        });
        a.handle_timeout(0);
        let names = created(&drain(&mut a));
        // e0..e3 run; e4, e5 pending. e0 runs 2 tasks, e1 idle since 10, e2 idle since 20,
        // e3 runs 1.
        report(
            &mut store,
            &mut a,
            5 * MS,
            &names[..4],
            ExecutorState::Running,
        );
        a.handle_load(0, 3, [("e0", 2), ("e1", 0), ("e2", 1), ("e3", 1)], 10 * MS);
        a.handle_load(0, 3, [("e0", 2), ("e1", 0), ("e2", 0), ("e3", 1)], 20 * MS);
        a.set_target(3);
        a.handle_timeout(30 * MS);
        assert_eq!(deleted(&drain(&mut a)), vec!["e5", "e4", "e1"]);
        a.set_target(1);
        a.handle_timeout(40 * MS);
        assert_eq!(
            deleted(&drain(&mut a)),
            vec!["e2", "e3"],
            "idle first, then the least busy; e0 stays"
        );
        assert_eq!(a.live(), 1);
    }

    #[test]
    fn dynamic_allocation_never_deletes_a_busy_executor() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            initial_target: 2,
            dynamic: Some(DynamicConfig {
                min: 0,
                max: 2,
                tasks_per_executor: 4,
                idle_timeout_us: 0,
            }),
            ..config()
        });
        a.handle_load(8, 0, [], 0);
        a.handle_timeout(0);
        let names = created(&drain(&mut a));
        report(&mut store, &mut a, MS, &names, ExecutorState::Running);
        // One task left on each: the target is 1, but neither is idle.
        a.handle_load(0, 2, [("e0", 1), ("e1", 1)], 2 * MS);
        a.handle_timeout(3 * MS);
        assert_eq!(a.target(), 1);
        assert!(drain(&mut a).is_empty());
        assert_eq!(
            a.poll_timeout(),
            None,
            "over the target, but nothing idle to release"
        );
        a.handle_load(0, 1, [("e0", 0), ("e1", 1)], 4 * MS);
        assert_eq!(
            a.poll_timeout(),
            Some(4 * MS),
            "e0 is idle: released at once"
        );
    }

    #[test]
    fn requesting_totals_adopts_the_managers_executors_and_releases_idle_ones() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::requesting_total(DynamicConfig {
            min: 1,
            max: 3,
            tasks_per_executor: 1,
            idle_timeout_us: 100 * MS,
        });
        a.handle_timeout(0);
        assert_eq!(drain(&mut a), vec![AllocatorOutput::RequestTotal(1)]);
        a.handle_load(5, 0, [], MS);
        a.handle_timeout(MS);
        assert_eq!(drain(&mut a), vec![AllocatorOutput::RequestTotal(3)]);
        let ids: Vec<String> = ["0", "1", "2"].map(String::from).to_vec();
        report(&mut store, &mut a, 2 * MS, &ids, ExecutorState::Running);
        assert_eq!(a.live(), 3, "adopted");
        a.handle_load(0, 0, [("0", 0), ("1", 0), ("2", 0)], 3 * MS);
        a.handle_timeout(50 * MS);
        assert_eq!(drain(&mut a), vec![AllocatorOutput::RequestTotal(1)]);
        a.handle_timeout(103 * MS);
        assert_eq!(
            drain(&mut a),
            vec![AllocatorOutput::Delete(vec!["0".into(), "1".into()])],
            "the total lowered first, then idle ones past the timeout"
        );
        report(
            &mut store,
            &mut a,
            110 * MS,
            &ids[..2],
            ExecutorState::Deleted,
        );
        assert_eq!(a.stats().failures, 0);
        assert_eq!(a.live(), 1);
    }

    #[test]
    fn failures_are_replaced_until_too_many_stop_the_application() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            initial_target: 1,
            ..config()
        });
        let mut now = 0;
        for round in 0..4u64 {
            a.handle_timeout(now);
            let names = created(&drain(&mut a));
            assert_eq!(names, vec![format!("e{round}")], "a replacement each time");
            report(&mut store, &mut a, now + MS, &names, ExecutorState::Running);
            let failed = ExecutorState::Failed {
                code: 137,
                caused_by_app: false,
            };
            report(&mut store, &mut a, now + 2 * MS, &names, failed);
            now += 100 * MS;
        }
        let out = drain(&mut a);
        assert!(
            matches!(out.as_slice(), [AllocatorOutput::Stop(reason)] if reason.contains("4 executors failed")),
            "{out:?}"
        );
        a.handle_timeout(now);
        assert!(drain(&mut a).is_empty(), "nothing after stopping");
    }

    #[test]
    fn a_full_sync_without_an_executor_counts_it_gone() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            initial_target: 1,
            ..config()
        });
        a.handle_timeout(0);
        let names = created(&drain(&mut a));
        report(&mut store, &mut a, MS, &names, ExecutorState::Running);
        store.replace_all(2 * MS, Vec::new());
        a.handle_snapshot(store.current(), 2 * MS);
        assert_eq!(a.live(), 0);
        assert_eq!(a.stats().failures, 1);
        a.handle_timeout(200 * MS);
        assert_eq!(created(&drain(&mut a)), vec!["e1"]);
    }

    #[test]
    fn dynamic_follows_the_backlog_and_releases_idle_executors() {
        let mut store = SnapshotStore::new(0);
        let mut a = Allocator::new(AllocatorConfig {
            batch_size: 10,
            initial_target: 0,
            dynamic: Some(DynamicConfig {
                min: 1,
                max: 4,
                tasks_per_executor: 2,
                idle_timeout_us: 500 * MS,
            }),
            ..config()
        });
        assert_eq!(a.target(), 1);
        a.handle_timeout(0);
        let first = created(&drain(&mut a));
        assert_eq!(first, vec!["e0"]);
        report(&mut store, &mut a, MS, &first, ExecutorState::Running);
        // A backlog of 100 tasks: the target goes to the maximum.
        a.handle_load(98, 2, [], 2 * MS);
        a.handle_timeout(100 * MS);
        assert_eq!(a.target(), 4);
        let more = created(&drain(&mut a));
        assert_eq!(more, vec!["e1", "e2", "e3"]);
        report(&mut store, &mut a, 110 * MS, &more, ExecutorState::Running);
        assert_eq!(a.stats().peak, 4);
        // 5 tasks left: target 3, but nobody is idle yet.
        a.handle_load(1, 4, [], 200 * MS);
        a.handle_timeout(200 * MS);
        assert_eq!(a.target(), 3);
        assert!(drain(&mut a).is_empty());
        // All idle: only after the idle timeout, and never below min.
        a.handle_load(0, 0, [("e0", 0), ("e1", 0), ("e2", 0), ("e3", 0)], 300 * MS);
        a.handle_timeout(700 * MS);
        assert!(drain(&mut a).is_empty(), "not idle long enough");
        a.handle_timeout(800 * MS);
        assert_eq!(deleted(&drain(&mut a)).len(), 3);
        assert_eq!(a.live(), 1);
        report(
            &mut store,
            &mut a,
            810 * MS,
            &["e0".into(), "e1".into(), "e2".into()],
            ExecutorState::Deleted,
        );
        assert_eq!(a.stats().failures, 0, "deleted on purpose");
    }
}
