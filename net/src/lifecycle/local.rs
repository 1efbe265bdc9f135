//! Local executor processes kept at a target by the engine's allocator: what `flint local`
//! runs its executors with. [`LocalBackend`] is the [`ExecutorBackend`] for child processes:
//!
//! - *create*: spawns `flint executor --id NAME` in a process group of its own (pinned to
//!   `cores` CPUs no live child holds, when there are that many);
//! - *watch*: each child is checked with `try_wait` every round and its exit reported as it
//!   happens (succeeded, failed with its code, or deleted when the lifecycle asked for it);
//! - *list*: the live children (pending; the lifecycle knows which the driver registered);
//! - *delete*: kills a child the driver did not stop, and one it stopped that is still running
//!   after `stop_grace`.
//!
//! [`LocalExecutors`] runs it in a [`LifecycleThread`]. Everything it holds is bounded by the
//! number of executors.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;
use flint_engine::lifecycle::{Allocation, AllocatorConfig, ExecutorState};

use super::{ExecutorBackend, ExecutorStats, LifecycleThread, Observed, RunnerConfig};
use crate::driver::Driver;
use crate::observe::EventSink;

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
    /// How often the lifecycle ticks (children are checked every round, at least this often).
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

/// The local executors' lifecycle thread and its children (see the module docs).
#[derive(Debug)]
pub struct LocalExecutors {
    thread: Option<LifecycleThread<LocalBackend>>,
}

impl LocalExecutors {
    /// Starts the lifecycle thread; it creates the first executors on its first tick.
    pub fn start(config: LocalConfig, driver: Arc<Driver>) -> std::io::Result<LocalExecutors> {
        let events = config.events.then(|| {
            (config.on_event.clone()).unwrap_or_else(|| EventSink::new(|l| tracing::info!("{l}")))
        });
        let runner = RunnerConfig::new(
            Allocation::Create(config.allocator.clone()),
            [
                config.watch_interval,
                config.sync_interval,
                config.sync_grace,
            ],
            events.clone(),
            "flint-local-executors",
        );
        let backend = LocalBackend {
            config,
            events,
            children: BTreeMap::new(),
            pins: BTreeMap::new(),
            deleting: BTreeMap::new(),
            observed: Vec::new(),
        };
        let thread = LifecycleThread::start(runner, backend, driver)?;
        Ok(LocalExecutors {
            thread: Some(thread),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> ExecutorStats {
        self.thread
            .as_ref()
            .map(LifecycleThread::stats)
            .unwrap_or_default()
    }

    /// Why the application must stop (too many executor failures), once it must.
    pub fn failed(&self) -> Option<String> {
        self.thread.as_ref().and_then(LifecycleThread::failed)
    }

    /// Stops creating and deleting executors (exits are still watched): call before stopping
    /// the executors at the end.
    pub fn freeze(&self) {
        if let Some(thread) = &self.thread {
            thread.freeze();
        }
    }

    /// A new fixed target: executors beyond it are drained (no new work) and stopped once
    /// their running tasks end, the least busy first.
    pub fn set_target(&self, target: u32) {
        if let Some(thread) = &self.thread {
            thread.set_target(target);
        }
    }

    /// Stops the lifecycle thread, waits up to `timeout` for the children to exit (stop them
    /// through the driver first), kills the rest.
    pub fn shutdown(mut self, timeout: Duration) {
        self.stop(timeout);
    }

    fn stop(&mut self, timeout: Duration) {
        let Some((_, Some(backend))) = self.thread.take().map(LifecycleThread::stop) else {
            return;
        };
        let mut children: Vec<Child> = backend.children.into_values().collect();
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

/// Child processes as executors (see the module docs).
pub struct LocalBackend {
    config: LocalConfig,
    events: Option<EventSink>,
    children: BTreeMap<String, Child>,
    /// The CPUs each live child is pinned to.
    pins: BTreeMap<String, Vec<usize>>,
    /// Executors deleted, with when: their exit counts as deleted.
    deleting: BTreeMap<String, Instant>,
    observed: Vec<Observed>,
}

impl ExecutorBackend for LocalBackend {
    fn create(&mut self, name: &str) {
        let pins = self.pick_cpus();
        match self.spawn(name, &pins) {
            Ok(child) => {
                let pid = child.id();
                self.event(&format!("executor {name} started (pid {pid})"));
                self.pins.insert(name.to_owned(), pins);
                self.children.insert(name.to_owned(), child);
                self.observed.push(Observed::Created(name.to_owned()));
            }
            Err(error) => {
                tracing::error!(executor_id = %name, "cannot start an executor: {error}");
                let failed = ExecutorState::Failed {
                    code: -1,
                    caused_by_app: false,
                };
                self.observed
                    .push(Observed::Update(name.to_owned(), failed));
            }
        }
    }

    fn delete(&mut self, name: &str, stopped: bool) {
        let Some(child) = self.children.get_mut(name) else {
            return;
        };
        self.deleting.insert(name.to_owned(), Instant::now());
        if !stopped {
            let _ = child.kill();
        }
    }

    fn list(&mut self) {
        let listing = (self.children.keys())
            .map(|name| (name.clone(), ExecutorState::Pending))
            .collect();
        self.observed.push(Observed::Listing(listing));
    }

    fn poll(&mut self, out: &mut Vec<Observed>) {
        self.watch();
        self.kill_lingering();
        out.append(&mut self.observed);
    }

    fn describe(&self, name: &str, state: &ExecutorState) -> String {
        match state {
            ExecutorState::Running => format!("executor {name} registered"),
            state if state.is_terminal() => format!("executor {name} exited: {state}"),
            state => format!("executor {name} {state}"),
        }
    }
}

impl LocalBackend {
    fn event(&self, line: &str) {
        if let Some(sink) = &self.events {
            EventSink::emit(Some(sink), line);
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
        for (name, status) in exited {
            self.children.remove(&name);
            self.pins.remove(&name);
            let deleted = self.deleting.remove(&name).is_some();
            let state = match status {
                _ if deleted => ExecutorState::Deleted,
                Some(status) => exit_state(status),
                None => ExecutorState::Unknown,
            };
            self.observed.push(Observed::Update(name, state));
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
        // A group of its own: a terminal's Ctrl-C (SIGINT to the foreground group) reaches
        // the driver alone, which cancels its jobs and stops its executors in order, instead
        // of killing them under it (and having the allocator replace them while it stops).
        command.process_group(0);
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
