//! The standalone master as an [`ExecutorSource`] for the lifecycle handler: the executor state
//! changes the master sends the application (watch) and a status round trip with the master
//! (poll), read through the [`AppClient`]; and [`MasterScaler`], dynamic allocation through
//! the master.
//!
//! An executor that ends is reported as its worker saw it (the client keeps the last exits):
//! exited normally, killed (deleted), or failed with its exit code, caused by the application
//! when the code says a task brought the process down (a panic's 101, SIGABRT, SIGSEGV, ...:
//! [`failed_with`]), so a poison task is charged its crashes and fails its job after
//! `max_failures`. One whose exit the client no longer holds, or that never ran (its launch
//! failed, its worker was lost), failed with an unknown code (-1), not caused by it: its running
//! tasks go back to pending without counting against them.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use flint_engine::lifecycle::{dynamic_target, DynamicConfig, ExecutorState};

use super::Background;
use crate::driver::Driver;
use crate::lifecycle::local::failed_with;
use crate::lifecycle::mirror::ExecutorSource;
use crate::standalone::app_client::{AppClient, ExecutorExit};
use crate::wire;

/// The master's view of one application's executors.
pub struct MasterSource {
    client: Arc<AppClient>,
    known: BTreeMap<String, ExecutorState>,
    sync_timeout: Duration,
}

impl std::fmt::Debug for MasterSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterSource")
            .field("known", &self.known.len())
            .finish_non_exhaustive()
    }
}

impl MasterSource {
    /// A source reading `client`; a status round trip may take up to `sync_timeout`.
    pub fn new(client: Arc<AppClient>, sync_timeout: Duration) -> MasterSource {
        MasterSource {
            client,
            known: BTreeMap::new(),
            sync_timeout,
        }
    }

    fn current(&self) -> BTreeMap<String, ExecutorState> {
        self.client
            .info()
            .executors
            .into_iter()
            .map(|(id, (_, state))| (id, state_of(state)))
            .collect()
    }
}

/// What the master's executor state means for the lifecycle.
fn state_of(state: wire::ExecutorState) -> ExecutorState {
    match state {
        wire::ExecutorState::Launching => ExecutorState::Pending,
        wire::ExecutorState::Running => ExecutorState::Running,
        wire::ExecutorState::Killed => ExecutorState::Deleted,
        wire::ExecutorState::Exited => ExecutorState::Succeeded,
        wire::ExecutorState::Failed | wire::ExecutorState::Lost => ExecutorState::Failed {
            code: -1,
            caused_by_app: false,
        },
    }
}

/// An executor's end as the lifecycle sees it; `None`: not known how it ended.
fn ended_state(exit: Option<&ExecutorExit>) -> ExecutorState {
    let unknown = ExecutorState::Failed {
        code: -1,
        caused_by_app: false,
    };
    let Some(exit) = exit else {
        return unknown;
    };
    match (exit.state, exit.exit_code) {
        (wire::ExecutorState::Exited, _) => ExecutorState::Succeeded,
        (wire::ExecutorState::Killed, _) => ExecutorState::Deleted,
        (wire::ExecutorState::Failed, Some(code)) => failed_with(code),
        _ => unknown,
    }
}

impl ExecutorSource for MasterSource {
    fn changes(&mut self) -> Vec<(String, ExecutorState)> {
        let now = self.current();
        let mut changes = Vec::new();
        for (id, state) in &now {
            if self.known.get(id) != Some(state) {
                changes.push((id.clone(), state.clone()));
            }
        }
        let gone: Vec<&String> = self
            .known
            .keys()
            .filter(|id| !now.contains_key(*id))
            .collect();
        if !gone.is_empty() {
            let exits = self.client.info().exits;
            for id in gone {
                let exit = exits.iter().rev().find(|exit| exit.id == *id);
                changes.push((id.clone(), ended_state(exit)));
            }
        }
        self.known = now;
        changes
    }

    fn full_listing(&mut self) -> Option<Vec<(String, ExecutorState)>> {
        let info = self.client.info();
        if !info.connected || info.removed.is_some() {
            return None;
        }
        self.client.sync(self.sync_timeout).ok()?;
        Some(self.current().into_iter().collect())
    }
}

/// Dynamic allocation through the standalone master: a thread that every `interval` computes
/// the target from the driver's backlog ([`dynamic_target`]), asks the master for that many
/// executors (`RequestExecutors`), and when the master runs more than the target, asks it to
/// kill executors idle for at least `idle_timeout_us` (`KillExecutors`, after lowering the
/// total so they are not replaced). Busy executors are never killed.
pub struct MasterScaler {
    stats: Arc<Mutex<ScalerStats>>,
    background: Background,
}

/// What the scaler did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScalerStats {
    /// The most executors registered with the driver at once.
    pub peak: u64,
    /// Executors it asked the master to kill for being idle.
    pub released: u64,
    /// The last total it asked for.
    pub requested: u32,
}

impl std::fmt::Debug for MasterScaler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterScaler")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl MasterScaler {
    /// Starts scaling `client`'s application by `driver`'s backlog.
    pub fn start(
        dynamic: DynamicConfig,
        client: Arc<AppClient>,
        driver: Arc<Driver>,
        interval: Duration,
    ) -> std::io::Result<MasterScaler> {
        let stats = Arc::new(Mutex::new(ScalerStats::default()));
        let shared = stats.clone();
        let background = Background::spawn("flint-master-scaler", move |stop_flag| {
            let epoch = Instant::now();
            let mut idle_since: BTreeMap<String, u64> = BTreeMap::new();
            let mut requested: Option<u32> = None;
            while !stop_flag.load(Ordering::SeqCst) {
                let Ok(view) = driver.executors_view() else {
                    return;
                };
                let now_us = epoch.elapsed().as_micros() as u64;
                let target = dynamic_target(&dynamic, view.pending_tasks, view.running_tasks);
                for (name, running) in &view.executors {
                    if *running == 0 {
                        idle_since.entry(name.clone()).or_insert(now_us);
                    } else {
                        idle_since.remove(name);
                    }
                }
                idle_since.retain(|name, _| view.executors.iter().any(|(n, _)| n == name));
                if requested != Some(target) && client.request_executors(target).is_ok() {
                    requested = Some(target);
                }
                let live = client.info().executors.len();
                let mut released = 0;
                if live > target as usize {
                    let mut idle: Vec<(u64, String)> = idle_since
                        .iter()
                        .filter(|(_, since)| {
                            now_us.saturating_sub(**since) >= dynamic.idle_timeout_us
                        })
                        .map(|(name, since)| (*since, name.clone()))
                        .collect();
                    idle.sort();
                    let victims: Vec<String> = idle
                        .into_iter()
                        .take(live - target as usize)
                        .map(|(_, name)| name)
                        .collect();
                    if !victims.is_empty() {
                        for name in &victims {
                            idle_since.remove(name);
                        }
                        released = victims.len() as u64;
                        let _ = client.kill_executors(victims);
                    }
                }
                if let Ok(mut stats) = shared.lock() {
                    stats.peak = stats.peak.max(view.executors.len() as u64);
                    stats.released += released;
                    stats.requested = target;
                }
                std::thread::sleep(interval);
            }
        })?;
        Ok(MasterScaler { stats, background })
    }

    /// The counters so far.
    pub fn stats(&self) -> ScalerStats {
        self.stats
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone())
    }

    /// Stops the thread.
    pub fn stop(mut self) {
        self.background.halt();
    }
}
