//! Where a driver's executors come from and where they go: the one IO loop around the engine's
//! lifecycle core ([`flint_engine::lifecycle::Lifecycle`]) and the [`ExecutorBackend`] trait
//! each cluster manager implements: [`local`] (`flint executor` child processes), [`master`]
//! (the standalone master's executors, through the application client), and Kubernetes pods in
//! the `flint-k8s` crate.
//!
//! [`LifecycleThread`] runs the loop on a thread of its own, every round: what the backend
//! observed (its watch source's changes and the listings it was asked for) goes into the core,
//! then the caller's wishes (freeze, a new target), then the driver's load
//! ([`Driver::executors_view`]; a slow answer skips the round, a stopped driver ends the loop),
//! then the core's timeout; its outputs become backend calls (`create`, `request_total`,
//! `delete`, `list`) and driver calls (`drain_executor` when the allocator wants a registered
//! executor gone: it gets no new work, and is deleted once a load shows it running nothing;
//! the same for one deleted as unregistered that the driver has registered since the last load;
//! `stop_executor` before a registered executor is deleted; `remove_executor` with the exit
//! reason), and event lines.

pub mod local;
pub mod master;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flint_engine::lifecycle::{
    Allocation, ExecutorState, Lifecycle, LifecycleConfig, LifecycleOutput, LifecycleStats,
};

use crate::driver::{Driver, DriverError};
use crate::observe::EventSink;

/// What a backend observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    /// The watch source: one executor's new state.
    Update(String, ExecutorState),
    /// The list source: every executor the cluster manager knows now.
    Listing(Vec<(String, ExecutorState)>),
    /// An executor asked for was started (a process spawned, a pod created).
    Created(String),
    /// The backend cannot go on (the API server gone, a pod refused): why the application
    /// must stop.
    Failed(String),
}

/// A cluster manager as the lifecycle sees it: it creates, deletes and lists executors and
/// watches their states. No call may block for long: what takes time (an API call) runs
/// elsewhere and comes back through [`ExecutorBackend::poll`].
pub trait ExecutorBackend: Send + 'static {
    /// Starts executor `name`.
    fn create(&mut self, name: &str);
    /// Asks for `total` executors in all (a cluster manager that names them itself).
    fn request_total(&mut self, total: u32) {
        tracing::warn!(total, "this cluster manager takes no totals");
    }
    /// Deletes executor `name`; `stopped`: the driver has already told it to stop.
    fn delete(&mut self, name: &str, stopped: bool);
    /// Starts a full listing; it comes back through [`ExecutorBackend::poll`].
    fn list(&mut self);
    /// Appends what was observed since the last call, in order.
    fn poll(&mut self, out: &mut Vec<Observed>);
    /// The event line for an executor's new state.
    fn describe(&self, name: &str, state: &ExecutorState) -> String {
        format!("executor {name} {state}")
    }
}

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// The core's settings (allocation, tick, listings, grace, drain timeout).
    pub lifecycle: LifecycleConfig,
    /// Where event lines go (executor created, state changes, removals, deletions); none: no
    /// lines.
    pub events: Option<EventSink>,
    /// The thread's name.
    pub thread_name: String,
}

impl RunnerConfig {
    /// The loop for `allocation` with these timings (see [`LifecycleConfig`]; the drain
    /// timeout its default), its events to `events`, on a thread named `thread_name`.
    pub fn new(
        allocation: Allocation,
        [tick, sync_interval, sync_grace]: [Duration; 3],
        events: Option<EventSink>,
        thread_name: &str,
    ) -> RunnerConfig {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        RunnerConfig {
            lifecycle: LifecycleConfig {
                tick_us: us(tick),
                sync_interval_us: us(sync_interval),
                sync_grace_us: us(sync_grace),
                ..LifecycleConfig::new(allocation)
            },
            events,
            thread_name: thread_name.to_owned(),
        }
    }
}

/// What the lifecycle did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecutorStats {
    /// Executors the backend started (processes spawned, pods created).
    pub started: u64,
    /// Executors registered with the driver now.
    pub registered: u64,
    /// The most registered at once.
    pub peak: u64,
    /// Executors deleted on purpose (excess, idle, not starting in time).
    pub deleted: u64,
    /// Of those, the ones that did not start in time.
    pub pending_timeouts: u64,
    /// Executors gone without being asked (each replaced while under the target).
    pub failed: u64,
    /// Executors removed from the driver's scheduler.
    pub removed: u64,
    /// Executors drained (no new work) before their deletion.
    pub drained: u64,
}

impl ExecutorStats {
    fn of(core: &LifecycleStats, started: u64) -> ExecutorStats {
        ExecutorStats {
            started,
            registered: core.registered,
            peak: core.peak,
            deleted: core.allocator.deleted,
            pending_timeouts: core.allocator.pending_timeouts,
            failed: core.allocator.failures,
            removed: core.removed,
            drained: core.drained,
        }
    }
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    frozen: AtomicBool,
    target: Mutex<Option<u32>>,
    stats: Mutex<ExecutorStats>,
    failure: Mutex<Option<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lifecycle loop on its thread (see the module docs); stopped on drop.
pub struct LifecycleThread<B: ExecutorBackend> {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<B>>,
}

impl<B: ExecutorBackend> std::fmt::Debug for LifecycleThread<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LifecycleThread")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<B: ExecutorBackend> LifecycleThread<B> {
    /// Starts the loop over `backend` for `driver`; the first tick is at once.
    pub fn start(
        config: RunnerConfig,
        backend: B,
        driver: Arc<Driver>,
    ) -> std::io::Result<LifecycleThread<B>> {
        let shared = Arc::new(Shared::default());
        let runner = Runner {
            core: Lifecycle::new(config.lifecycle.clone(), 0),
            epoch: Instant::now(),
            frozen: false,
            started: 0,
            config: config.clone(),
            backend,
            driver,
            shared: shared.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(config.thread_name)
            .spawn(move || runner.run())?;
        Ok(LifecycleThread {
            shared,
            thread: Some(thread),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> ExecutorStats {
        lock(&self.shared.stats).clone()
    }

    /// Why the application must stop (too many executor failures, the backend gone), once it
    /// must.
    pub fn failed(&self) -> Option<String> {
        lock(&self.shared.failure).clone()
    }

    /// Stops creating, draining and deleting executors (exits are still followed): call before
    /// stopping the executors at the end.
    pub fn freeze(&self) {
        self.shared.frozen.store(true, Ordering::SeqCst);
    }

    /// A new fixed target: executors beyond it are drained and deleted, the least busy first.
    pub fn set_target(&self, target: u32) {
        *lock(&self.shared.target) = Some(target);
    }

    /// Stops the loop: the final counters, and the backend (`None` if its thread panicked).
    pub fn stop(mut self) -> (ExecutorStats, Option<B>) {
        let backend = self.halt();
        (self.stats(), backend)
    }

    fn halt(&mut self) -> Option<B> {
        self.shared.frozen.store(true, Ordering::SeqCst);
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.take()?.join().ok()
    }
}

impl<B: ExecutorBackend> Drop for LifecycleThread<B> {
    fn drop(&mut self) {
        self.halt();
    }
}

struct Runner<B> {
    config: RunnerConfig,
    core: Lifecycle,
    backend: B,
    driver: Arc<Driver>,
    shared: Arc<Shared>,
    epoch: Instant,
    frozen: bool,
    started: u64,
}

impl<B: ExecutorBackend> Runner<B> {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn event(&self, line: impl FnOnce() -> String) {
        if let Some(sink) = &self.config.events {
            EventSink::emit(Some(sink), &line());
        }
    }

    /// The loop; hands the backend back when it stops.
    fn run(mut self) -> B {
        let mut observed = Vec::new();
        while !self.shared.stop.load(Ordering::SeqCst) {
            self.observe(&mut observed);
            // The caller's wishes before the view: a target set after the caller saw some
            // executors registered meets a view that has them too.
            self.steer();
            let view = match self.driver.executors_view() {
                Ok(view) => view,
                Err(DriverError::Stopped) => break,
                Err(error) => {
                    // Behind, not gone: this round waits, the next one asks again.
                    tracing::warn!("no executors view from the driver: {error}");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let now_us = self.now_us();
            let load = view.executors.iter().map(|(n, r)| (n.as_str(), *r));
            self.core
                .handle_load(view.pending_tasks, view.running_tasks, load, now_us);
            self.core.handle_timeout(now_us);
            while let Some(output) = self.core.poll_output() {
                self.carry_out(output);
            }
            self.publish();
            let next = self.core.poll_timeout().unwrap_or(u64::MAX);
            let wait = next.saturating_sub(self.now_us()).max(1_000);
            std::thread::sleep(Duration::from_micros(wait.min(50_000)));
        }
        // What arrived since the last round still counts.
        self.observe(&mut observed);
        while let Some(output) = self.core.poll_output() {
            self.carry_out(output);
        }
        self.publish();
        self.backend
    }

    /// The backend's observations into the core.
    fn observe(&mut self, observed: &mut Vec<Observed>) {
        self.backend.poll(observed);
        for item in observed.drain(..) {
            let now_us = self.now_us();
            match item {
                Observed::Update(name, state) => self.core.handle_update(&name, state, now_us),
                Observed::Listing(listing) => self.core.handle_listing(listing, now_us),
                Observed::Created(_) => self.started += 1,
                Observed::Failed(reason) => self.fail(reason),
            }
        }
    }

    /// The caller's wishes: freeze, a new target.
    fn steer(&mut self) {
        if !self.frozen && self.shared.frozen.load(Ordering::SeqCst) {
            self.frozen = true;
            self.core.freeze();
        }
        if let Some(target) = lock(&self.shared.target).take() {
            self.core.set_target(target);
        }
    }

    fn carry_out(&mut self, output: LifecycleOutput) {
        match output {
            LifecycleOutput::Create(names) => {
                for name in names {
                    self.backend.create(&name);
                }
            }
            LifecycleOutput::RequestTotal(total) => {
                self.event(|| format!("asking for {total} executors"));
                self.backend.request_total(total);
            }
            LifecycleOutput::Drain(names) => {
                for name in names {
                    self.event(|| format!("executor {name} draining"));
                    if let Err(error) = self.driver.drain_executor(&name) {
                        tracing::warn!(executor = %name, "cannot drain: {error}");
                    }
                }
            }
            LifecycleOutput::Delete { name, registered } => self.delete(&name, registered),
            LifecycleOutput::Remove(name, reason) => {
                self.event(|| format!("executor {name} removed: {reason}"));
                let _ = self.driver.remove_executor(&name, reason);
            }
            LifecycleOutput::Changed(name, state) => {
                self.event(|| self.backend.describe(&name, &state));
            }
            LifecycleOutput::List => self.backend.list(),
            LifecycleOutput::Stop(reason) => {
                self.event(|| format!("stopping the application: {reason}"));
                self.fail(reason);
            }
        }
    }

    /// A registered executor is stopped through the driver first (counted as stopped, not
    /// lost), then the backend deletes it. One the core took for unregistered may have
    /// registered since the last load: the driver drains it instead, and the core deletes it
    /// once it runs nothing.
    fn delete(&mut self, name: &str, registered: bool) {
        if !registered && self.driver.drain_executor(name).unwrap_or(false) {
            self.event(|| format!("executor {name} draining (registered since the last look)"));
            self.core.handle_drained(name, self.now_us());
            return;
        }
        let stopped = registered && self.driver.stop_executor(name).unwrap_or(false);
        let how = if stopped {
            "stopped by the driver"
        } else {
            "not registered"
        };
        self.event(|| format!("executor {name} deleted ({how})"));
        self.backend.delete(name, stopped);
    }

    fn fail(&self, reason: String) {
        let mut failure = lock(&self.shared.failure);
        if failure.is_none() {
            tracing::error!("{reason}");
            *failure = Some(reason);
        }
    }

    fn publish(&self) {
        *lock(&self.shared.stats) = ExecutorStats::of(&self.core.stats(), self.started);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_engine::scheduler::RemovalReason;
    use std::sync::mpsc::{channel, Receiver, Sender};

    /// A backend the test scripts: what it observes comes from a channel; its calls go to
    /// another.
    struct Scripted {
        observed: Receiver<Observed>,
        calls: Sender<String>,
    }

    impl ExecutorBackend for Scripted {
        fn create(&mut self, name: &str) {
            let _ = self.calls.send(format!("create {name}"));
        }
        fn delete(&mut self, name: &str, stopped: bool) {
            let _ = self.calls.send(format!("delete {name} {stopped}"));
        }
        fn list(&mut self) {}
        fn poll(&mut self, out: &mut Vec<Observed>) {
            out.extend(self.observed.try_iter());
        }
    }

    /// The race a target drop can lose: the core decided on a load taken before an executor
    /// registered, so it deletes it as unregistered. The driver has it registered (and may
    /// have given it work): it is drained instead, not deleted, and counted as drained.
    #[test]
    fn an_executor_deleted_as_unregistered_that_registered_since_is_drained_not_deleted() {
        let driver = Arc::new(Driver::builder().start().expect("driver"));
        let addr = driver.local_addr().expect("listening");
        let config = crate::executor::ExecutorConfig::new(addr, "e0");
        let registry = flint_engine::functions::Registry::with_builtins();
        let executor = std::thread::spawn(move || crate::executor::run(config, registry));
        driver
            .wait_for_executors(1, Duration::from_secs(20))
            .expect("e0 registers");
        let (_observe, observed) = channel();
        let (calls, called) = channel();
        let config = RunnerConfig {
            lifecycle: LifecycleConfig::new(Allocation::Follow),
            events: None,
            thread_name: "test-lifecycle".into(),
        };
        let mut runner = Runner {
            core: Lifecycle::new(config.lifecycle.clone(), 0),
            config,
            backend: Scripted { observed, calls },
            driver: driver.clone(),
            shared: Arc::new(Shared::default()),
            epoch: Instant::now(),
            frozen: false,
            started: 0,
        };
        runner.delete("e0", false);
        assert_eq!(
            called.try_recv().ok(),
            None,
            "not deleted while it may run work"
        );
        assert_eq!(runner.core.stats().drained, 1);
        let view = driver.executors_view().expect("view");
        assert_eq!(view.executors.len(), 1, "still registered, drained");
        // Unknown to the driver: deleted at once.
        runner.delete("e1", false);
        assert_eq!(called.try_recv().ok().as_deref(), Some("delete e1 false"));
        driver
            .stop_executors(Duration::from_secs(20))
            .expect("stopped");
        let summary = executor.join().expect("executor thread");
        assert!(summary.is_ok(), "{summary:?}");
    }

    #[test]
    fn observations_become_removals_once_with_their_reasons() {
        let (observe, observed) = channel();
        let (calls, _calls) = channel();
        let (line, lines) = channel();
        let driver = Arc::new(Driver::builder().start().expect("driver"));
        let config = RunnerConfig {
            lifecycle: LifecycleConfig {
                sync_grace_us: 50_000,
                ..LifecycleConfig::new(Allocation::Follow)
            },
            events: Some(EventSink::new(move |l| {
                let _ = line.send(l.to_owned());
            })),
            thread_name: "test-lifecycle".into(),
        };
        let backend = Scripted { observed, calls };
        let thread = LifecycleThread::start(config, backend, driver).expect("starts");
        for name in ["a", "b"] {
            let running = Observed::Update(name.into(), ExecutorState::Running);
            observe.send(running).expect("send");
        }
        let failed = ExecutorState::Failed {
            code: 134,
            caused_by_app: true,
        };
        observe
            .send(Observed::Update("a".into(), failed))
            .expect("send");
        let removal = |lines: &Receiver<String>| loop {
            let line = lines
                .recv_timeout(Duration::from_secs(20))
                .expect("in time");
            if line.contains("removed") {
                return line;
            }
        };
        let a = RemovalReason::Exited {
            code: 134,
            caused_by_app: true,
        };
        assert_eq!(removal(&lines), format!("executor a removed: {a}"));
        // The watch misses b's end; listings without it delete it after the grace period.
        observe.send(Observed::Listing(Vec::new())).expect("send");
        std::thread::sleep(Duration::from_millis(60));
        observe.send(Observed::Listing(Vec::new())).expect("send");
        let b = RemovalReason::Killed;
        assert_eq!(removal(&lines), format!("executor b removed: {b}"));
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(thread.stats().removed, 2, "each executor once");
        assert!(thread.stop().1.is_some());
    }
}
