//! The standalone master's executors for the lifecycle: [`MasterBackend`] is the
//! [`ExecutorBackend`] over the application client ([`AppClient`]): the executor state changes
//! the master sends the application (watch: diffs of the client's executor table between
//! rounds), a status round trip with the master (list), `RequestExecutors` (the master names
//! and starts executors: the lifecycle asks it for totals) and `KillExecutors` (delete).
//! [`MasterExecutors`] runs it: it follows the executors, removes the gone ones from the
//! driver's scheduler with their reason, and with dynamic allocation asks for the backlog's
//! total and releases idle executors (the total lowered first, so the master does not replace
//! them).
//!
//! An executor that ends is reported as its worker saw it (the client keeps the last exits):
//! exited normally, killed (deleted), or failed with its exit code, caused by the application
//! when the code says a task brought the process down (a panic's 101, SIGABRT, SIGSEGV, ...:
//! `failed_with`), so a poison task is charged its crashes and fails its job after
//! `max_failures`. One whose exit the client no longer holds, or that never ran (its launch
//! failed, its worker was lost), failed with an unknown code (-1), not caused by it: its running
//! tasks go back to pending without counting against them. A diff between rounds misses an
//! executor that comes and goes within one round; the driver still drops it when its
//! connection closes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flint_engine::lifecycle::{Allocation, DynamicConfig, ExecutorState, LifecycleConfig};

use super::{ExecutorBackend, ExecutorStats, LifecycleThread, Observed, RunnerConfig};
use crate::driver::Driver;
use crate::lifecycle::local::failed_with;
use crate::observe::EventSink;
use crate::standalone::app_client::{AppClient, ExecutorExit};
use crate::wire;

/// How the master's executors are followed.
#[derive(Debug, Clone)]
pub struct MasterExecutorsConfig {
    /// Dynamic allocation through the master, if on (else the master keeps the count the
    /// application registered with).
    pub dynamic: Option<DynamicConfig>,
    /// How long a status round trip may take.
    pub sync_timeout: Duration,
    /// Where event lines go (state changes, removals, releases); none: no lines.
    pub events: Option<EventSink>,
}

/// The lifecycle of a standalone application's executors (see the module docs).
#[derive(Debug)]
pub struct MasterExecutors {
    thread: LifecycleThread<MasterBackend>,
}

impl MasterExecutors {
    /// Starts following `client`'s executors for `driver`.
    pub fn start(
        config: MasterExecutorsConfig,
        client: Arc<AppClient>,
        driver: Arc<Driver>,
    ) -> std::io::Result<MasterExecutors> {
        let allocation = match config.dynamic {
            Some(dynamic) => Allocation::RequestTotal(dynamic),
            None => Allocation::Follow,
        };
        let runner = RunnerConfig {
            lifecycle: LifecycleConfig::new(allocation),
            events: config.events,
            thread_name: "flint-master-executors".into(),
        };
        let backend = MasterBackend {
            client,
            known: BTreeMap::new(),
            sync_timeout: config.sync_timeout,
            listed: None,
        };
        let thread = LifecycleThread::start(runner, backend, driver)?;
        Ok(MasterExecutors { thread })
    }

    /// The counters so far (`deleted`: executors released for being idle).
    pub fn stats(&self) -> ExecutorStats {
        self.thread.stats()
    }

    /// Stops following.
    pub fn stop(self) -> ExecutorStats {
        self.thread.stop().0
    }
}

/// The master's executors of one application, through its client (see the module docs).
pub struct MasterBackend {
    client: Arc<AppClient>,
    known: BTreeMap<String, ExecutorState>,
    sync_timeout: Duration,
    listed: Option<Vec<(String, ExecutorState)>>,
}

impl MasterBackend {
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
fn state_of(state: wire::ProcessState) -> ExecutorState {
    match state {
        wire::ProcessState::Launching => ExecutorState::Pending,
        wire::ProcessState::Running => ExecutorState::Running,
        wire::ProcessState::Killed => ExecutorState::Deleted,
        wire::ProcessState::Exited => ExecutorState::Succeeded,
        wire::ProcessState::Failed | wire::ProcessState::Lost => ExecutorState::Failed {
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
        (wire::ProcessState::Exited, _) => ExecutorState::Succeeded,
        (wire::ProcessState::Killed, _) => ExecutorState::Deleted,
        (wire::ProcessState::Failed, Some(code)) => failed_with(code),
        _ => unknown,
    }
}

impl ExecutorBackend for MasterBackend {
    fn create(&mut self, name: &str) {
        tracing::warn!(executor = %name, "the master names its executors; nothing created");
    }

    fn request_total(&mut self, total: u32) {
        if let Err(error) = self.client.request_executors(total) {
            tracing::warn!(total, "cannot ask the master for executors: {error}");
        }
    }

    fn delete(&mut self, name: &str, _stopped: bool) {
        if let Err(error) = self.client.kill_executors(vec![name.to_owned()]) {
            tracing::warn!(executor = %name, "cannot ask the master to kill: {error}");
        }
    }

    /// A status round trip (blocking up to the sync timeout), then the client's table.
    fn list(&mut self) {
        let info = self.client.info();
        if !info.connected || info.removed.is_some() {
            return;
        }
        if self.client.sync(self.sync_timeout).is_ok() {
            self.listed = Some(self.current().into_iter().collect());
        }
    }

    fn poll(&mut self, out: &mut Vec<Observed>) {
        let now = self.current();
        for (id, state) in &now {
            if self.known.get(id) != Some(state) {
                out.push(Observed::Update(id.clone(), state.clone()));
            }
        }
        let gone: Vec<&String> = (self.known.keys())
            .filter(|id| !now.contains_key(*id))
            .collect();
        if !gone.is_empty() {
            let exits = self.client.info().exits;
            for id in gone {
                let exit = exits.iter().rev().find(|exit| exit.id == *id);
                out.push(Observed::Update(id.clone(), ended_state(exit)));
            }
        }
        self.known = now;
        if let Some(listing) = self.listed.take() {
            out.push(Observed::Listing(listing));
        }
    }
}
