//! Local executor processes kept at a target by the engine's allocator: what `flint local`
//! runs its executors with.
//!
//! A control thread, every `watch_interval`:
//!
//! 1. *watch source*: checks each child process with `try_wait` and reports an exit to the
//!    snapshot store as it happens (succeeded, failed with its code, or deleted when the
//!    allocator asked for it);
//! 2. asks the driver for its backlog and registered executors ([`Driver::executors_view`]);
//!    a child whose id the driver has registered is reported running;
//! 3. *poll source*: every `sync_interval`, a full listing of the live children replaces the
//!    store's snapshot ([`SnapshotStore::replace_all`]), correcting anything missed;
//! 4. takes the store's due batch (one subscriber: this thread) and feeds each snapshot to the
//!    allocator and to the lifecycle handler ([`Removals`]), which removes gone executors from
//!    the driver's scheduler with their exit reason ([`Driver::remove_executor`]);
//! 5. gives the allocator the driver's load and ticks it, then carries out its outputs:
//!    `Create` spawns `flint executor --id NAME` children, `Delete` asks the driver to stop a
//!    registered executor (and kills it after `stop_grace` if it is still running) or kills
//!    an unregistered one, `Stop` records the reason for [`LocalExecutors::failed`].
//!
//! Everything the thread holds is bounded by the number of executors.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_engine::lifecycle::{
    Allocator, AllocatorConfig, AllocatorOutput, ExecutorState, Removals, SnapshotStore,
    SubscriberId,
};

use crate::driver::{Driver, ExecutorsView};

/// How the local executors run.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The `flint` binary.
    pub exe: PathBuf,
    /// The driver's address.
    pub driver: SocketAddr,
    /// Cores per executor.
    pub cores: u32,
    /// Environment for the children (e.g. the shared secret).
    pub env: Vec<(String, String)>,
    /// The allocator's settings (name prefix, target, dynamic allocation, limits).
    pub allocator: AllocatorConfig,
    /// How often children are checked and the allocator ticks.
    pub watch_interval: Duration,
    /// How often the full listing re-syncs the snapshot store.
    pub sync_interval: Duration,
    /// Executors missing from a listing this long count as deleted.
    pub sync_grace: Duration,
    /// A deleted executor still running this long after the driver was asked to stop it is
    /// killed.
    pub stop_grace: Duration,
    /// Report one line per executor event (started with its pid, registered, exited) to
    /// `on_event` (or the log at info without one).
    pub events: bool,
    /// Where event lines go (see [`events`](Self::events)).
    pub on_event: Option<crate::observe::EventSink>,
    /// CPUs to pin executors to (`--pin-cores` of each child): each new executor gets `cores`
    /// of them that no live executor holds; when fewer are free it is not pinned. Empty:
    /// executors are not pinned.
    pub pin_cpus: Vec<usize>,
}

impl LocalConfig {
    /// Settings with the defaults for everything but the binary and the driver.
    pub fn new(exe: PathBuf, driver: SocketAddr) -> LocalConfig {
        LocalConfig {
            exe,
            driver,
            cores: 1,
            env: Vec::new(),
            allocator: AllocatorConfig {
                name_prefix: "local-".into(),
                ..AllocatorConfig::default()
            },
            watch_interval: Duration::from_millis(20),
            sync_interval: Duration::from_secs(1),
            sync_grace: Duration::from_secs(2),
            stop_grace: Duration::from_secs(3),
            events: false,
            on_event: None,
            pin_cpus: Vec::new(),
        }
    }
}

/// What happened to the local executors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalStats {
    /// Processes started.
    pub started: u64,
    /// Executors registered with the driver now.
    pub registered: u64,
    /// The most executors registered at once.
    pub peak: u64,
    /// Executors deleted on purpose (idle, excess, not starting in time).
    pub deleted: u64,
    /// Executors that exited without being asked (each replaced while under the target).
    pub failed: u64,
}

struct Shared {
    stop: AtomicBool,
    frozen: AtomicBool,
    stats: Mutex<LocalStats>,
    failure: Mutex<Option<String>>,
}

/// The control thread and its children (see the module docs).
pub struct LocalExecutors {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<Vec<Child>>>,
}

impl std::fmt::Debug for LocalExecutors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalExecutors")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl LocalExecutors {
    /// Starts the control thread; it creates the first executors on its first tick.
    pub fn start(config: LocalConfig, driver: Arc<Driver>) -> std::io::Result<LocalExecutors> {
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            frozen: AtomicBool::new(false),
            stats: Mutex::new(LocalStats::default()),
            failure: Mutex::new(None),
        });
        let control = Control {
            store: SnapshotStore::new(config.sync_grace.as_micros() as u64),
            allocator: Allocator::new(config.allocator.clone()),
            removals: Removals::new(),
            children: BTreeMap::new(),
            pins: BTreeMap::new(),
            deleting: BTreeMap::new(),
            registered: BTreeSet::new(),
            epoch: Instant::now(),
            config,
            driver,
            shared: shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("flint-local-executors".into())
            .spawn(move || control.run())?;
        Ok(LocalExecutors {
            shared,
            thread: Some(thread),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> LocalStats {
        lock(&self.shared.stats).clone()
    }

    /// Why the application must stop (too many executor failures), once it must.
    pub fn failed(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// Stops creating and deleting executors (exits are still watched): call before stopping
    /// the executors at the end.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// Stops the control thread, waits up to `timeout` for the children to exit (stop them
    /// through the driver first), kills the rest.
    pub fn shutdown(mut self, timeout: Duration) {
        self.stop(timeout);
    }

    fn stop(&mut self, timeout: Duration) {
        self.shared.frozen.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::SeqCst);
        let Some(thread) = self.thread.take() else {
            return;
        };
        let mut children = thread.join().unwrap_or_default();
        let deadline = flint_engine::runtime::deadline_after(timeout);
        while !children.is_empty() {
            children.retain_mut(|child| matches!(child.try_wait(), Ok(None)));
            if Instant::now() >= deadline {
                for child in &mut children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for LocalExecutors {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

struct Control {
    config: LocalConfig,
    driver: Arc<Driver>,
    shared: Arc<Shared>,
    store: SnapshotStore,
    allocator: Allocator,
    removals: Removals,
    children: BTreeMap<String, Child>,
    /// The CPUs each live child is pinned to.
    pins: BTreeMap<String, Vec<usize>>,
    /// Executors the allocator deleted, with when: their exit counts as deleted.
    deleting: BTreeMap<String, Instant>,
    registered: BTreeSet<String>,
    epoch: Instant,
}

impl Control {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn event(&self, what: std::fmt::Arguments<'_>) {
        if self.config.events {
            crate::observe::EventSink::emit(self.config.on_event.as_ref(), &what.to_string());
        }
    }

    /// The control loop; returns the children still running when it stops.
    fn run(mut self) -> Vec<Child> {
        let subscriber = self.store.subscribe(0, 64);
        let mut last_sync = Instant::now();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.watch();
            let Ok(view) = self.driver.executors_view() else {
                break;
            };
            let now_us = self.now_us();
            self.mark_registered(now_us, &view);
            if last_sync.elapsed() >= self.config.sync_interval {
                last_sync = Instant::now();
                self.sync(now_us);
            }
            // Once frozen (the application is ending), exits are not the allocator's business.
            let frozen = self.shared.frozen.load(Ordering::SeqCst);
            self.deliver(now_us, subscriber, frozen);
            self.allocate(now_us, &view, frozen);
            self.kill_lingering();
            self.update_stats();
            std::thread::sleep(self.config.watch_interval);
        }
        self.children.into_values().collect()
    }

    /// Reports running each child whose id the driver has registered.
    fn mark_registered(&mut self, now_us: u64, view: &ExecutorsView) {
        self.registered = view
            .executors
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        for name in self.children.keys() {
            if self.registered.contains(name)
                && self.store.current().get(name) != Some(&ExecutorState::Running)
            {
                self.store.update(now_us, name, ExecutorState::Running);
                if self.config.events {
                    crate::observe::EventSink::emit(
                        self.config.on_event.as_ref(),
                        &format!("executor {name} registered"),
                    );
                }
            }
        }
    }

    /// The poll source: the live children, running once registered, replace the snapshot.
    fn sync(&mut self, now_us: u64) {
        let listing: Vec<(String, ExecutorState)> = self
            .children
            .keys()
            .map(|name| {
                let state = if self.registered.contains(name) {
                    ExecutorState::Running
                } else {
                    ExecutorState::Pending
                };
                (name.clone(), state)
            })
            .collect();
        self.store.replace_all(now_us, listing);
    }

    /// Feeds the store's due snapshots to the allocator (unless `frozen`) and to the removals,
    /// removing gone executors from the driver.
    fn deliver(&mut self, now_us: u64, subscriber: SubscriberId, frozen: bool) {
        for delivery in self.store.poll_deliveries(now_us) {
            for snapshot in &delivery.snapshots {
                if !frozen {
                    self.allocator.on_snapshot(now_us, snapshot);
                }
                for (name, reason) in self.removals.on_snapshot(snapshot) {
                    let _ = self.driver.remove_executor(&name, reason);
                }
            }
            self.store.delivered(subscriber);
        }
    }

    /// Gives the allocator the driver's load and (unless `frozen`) ticks it, carrying out its
    /// outputs.
    fn allocate(&mut self, now_us: u64, view: &ExecutorsView, frozen: bool) {
        let idle = view
            .executors
            .iter()
            .filter(|(_, running)| *running == 0)
            .map(|(name, _)| name.as_str());
        self.allocator
            .on_load(now_us, view.pending_tasks, view.running_tasks, idle);
        if !frozen {
            self.allocator.tick(now_us);
            while let Some(output) = self.allocator.poll_output() {
                self.carry_out(output);
            }
        }
    }

    /// The watch source: reports each child's exit.
    fn watch(&mut self) {
        let mut exited = Vec::new();
        for (name, child) in self.children.iter_mut() {
            match child.try_wait() {
                Ok(Some(status)) => exited.push((name.clone(), Some(status))),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(executor_id = %name, "cannot check the process: {error}");
                    exited.push((name.clone(), None));
                }
            }
        }
        let now_us = self.now_us();
        for (name, status) in exited {
            self.children.remove(&name);
            self.pins.remove(&name);
            let deleted = self.deleting.remove(&name).is_some();
            let state = match status {
                _ if deleted => ExecutorState::Deleted,
                Some(status) => exit_state(status),
                None => ExecutorState::Unknown,
            };
            if !deleted && state != ExecutorState::Succeeded {
                lock(&self.shared.stats).failed += 1;
            }
            self.event(format_args!("executor {name} exited: {state}"));
            self.store.update(now_us, &name, state);
        }
    }

    fn carry_out(&mut self, output: AllocatorOutput) {
        match output {
            AllocatorOutput::Create(names) => {
                for name in names {
                    let now_us = self.now_us();
                    let pins = self.pick_cpus();
                    match self.spawn(&name, &pins) {
                        Ok(child) => {
                            self.pins.insert(name.clone(), pins);
                            self.event(format_args!(
                                "executor {name} started (pid {})",
                                child.id()
                            ));
                            lock(&self.shared.stats).started += 1;
                            self.children.insert(name.clone(), child);
                            self.store.update(now_us, &name, ExecutorState::Pending);
                        }
                        Err(error) => {
                            tracing::error!(executor_id = %name, "cannot start an executor: {error}");
                            lock(&self.shared.stats).failed += 1;
                            let failed = ExecutorState::Failed {
                                code: -1,
                                caused_by_app: false,
                            };
                            self.store.update(now_us, &name, failed);
                        }
                    }
                }
            }
            AllocatorOutput::Delete(names) => {
                for name in names {
                    lock(&self.shared.stats).deleted += 1;
                    let Some(child) = self.children.get_mut(&name) else {
                        continue;
                    };
                    self.deleting.insert(name.clone(), Instant::now());
                    let stopped = self.registered.contains(&name)
                        && self.driver.stop_executor(&name).unwrap_or(false);
                    if !stopped {
                        let _ = child.kill();
                    }
                    self.event(format_args!(
                        "executor {name} deleted ({})",
                        if stopped {
                            "stopped by the driver"
                        } else {
                            "killed"
                        }
                    ));
                }
            }
            AllocatorOutput::Stop(reason) => {
                self.event(format_args!("stopping the application: {reason}"));
                *lock(&self.shared.failure) = Some(reason);
            }
        }
    }

    /// `cores` listed CPUs no live child is pinned to (in list order), or none when fewer are
    /// free: an executor beyond what the CPUs hold is left unpinned, so the operating system
    /// can move it to whichever CPU is idle (pinned to a shared CPU it could not move at all).
    fn pick_cpus(&self) -> Vec<usize> {
        let taken = |cpu: &usize| self.pins.values().any(|pins| pins.contains(cpu));
        let free: Vec<usize> = (self.config.pin_cpus.iter())
            .filter(|cpu| !taken(cpu))
            .copied()
            .take(self.config.cores as usize)
            .collect();
        if free.len() < self.config.cores as usize {
            return Vec::new();
        }
        free
    }

    fn spawn(&self, name: &str, pins: &[usize]) -> std::io::Result<Child> {
        let pin = if pins.is_empty() {
            "none".to_owned()
        } else {
            Pinning::Cores(pins.to_vec()).to_string()
        };
        let mut command = Command::new(&self.config.exe);
        command.args([
            "executor",
            "--driver",
            &self.config.driver.to_string(),
            "--cores",
            &self.config.cores.to_string(),
            "--id",
            name,
            "--pin-cores",
            &pin,
        ]);
        for (key, value) in &self.config.env {
            command.env(key, value);
        }
        command.spawn()
    }

    /// Deleted executors that have not exited within the grace period are killed.
    fn kill_lingering(&mut self) {
        for (name, since) in &self.deleting {
            if since.elapsed() >= self.config.stop_grace {
                if let Some(child) = self.children.get_mut(name) {
                    let _ = child.kill();
                }
            }
        }
    }

    fn update_stats(&self) {
        let registered = self
            .children
            .keys()
            .filter(|name| self.registered.contains(*name))
            .count() as u64;
        let mut stats = lock(&self.shared.stats);
        stats.registered = registered;
        stats.peak = stats.peak.max(registered);
    }
}

/// A process's exit as an executor state: code 0 succeeded; anything else failed, caused by
/// the application when it looks like a task brought the process down (a panic's exit code
/// 101, or SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE) and not when it was killed (SIGKILL,
/// SIGTERM) or lost its driver (code 1). A signal shows as code 128 + its number.
pub fn exit_state(status: ExitStatus) -> ExecutorState {
    if status.success() {
        return ExecutorState::Succeeded;
    }
    if let Some(code) = status.code() {
        return failed_with(code);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return failed_with(128 + signal);
        }
    }
    ExecutorState::Unknown
}

/// A failed executor's state from its exit code (128 + the signal for one a signal ended):
/// caused by the application for a panic's 101 and SIGILL, SIGABRT, SIGBUS, SIGFPE, SIGSEGV.
pub fn failed_with(code: i32) -> ExecutorState {
    ExecutorState::Failed {
        code,
        caused_by_app: code == 101 || matches!(code - 128, 4 | 6 | 7 | 8 | 11),
    }
}
