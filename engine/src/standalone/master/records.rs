//! The master's records of its workers, their executors and the applications: what
//! [`super::Master`] keeps per worker (capacity used, executors placed), per executor (where,
//! how big, its process state) and per application (its executors, limits, retries), and the
//! small arithmetic over them (what fits, what an application still wants).

use std::collections::{BTreeMap, BTreeSet};

use super::{AppSpec, AppState, ProcessState, WorkerSpec, WorkerState};

#[derive(Debug)]
pub(super) struct Worker {
    pub(super) spec: WorkerSpec,
    pub(super) state: WorkerState,
    pub(super) last_heard_us: u64,
    pub(super) cores_used: u32,
    pub(super) memory_used_mb: u64,
    /// (app, executor) pairs placed here.
    pub(super) executors: BTreeSet<(String, String)>,
}

impl Worker {
    pub(super) fn fits(&self, cores: u32, memory_mb: u64) -> bool {
        self.state == WorkerState::Alive
            && self.spec.cores.saturating_sub(self.cores_used) >= cores
            && self.spec.memory_mb.saturating_sub(self.memory_used_mb) >= memory_mb
    }

    pub(super) fn free_cores(&self) -> u32 {
        self.spec.cores.saturating_sub(self.cores_used)
    }
}

#[derive(Debug)]
pub(super) struct Executor {
    pub(super) worker: String,
    pub(super) cores: u32,
    pub(super) memory_mb: u64,
    pub(super) state: ProcessState,
    /// When the master placed it (for the launch timeout).
    pub(super) placed_us: u64,
}

#[derive(Debug)]
pub(super) struct App {
    pub(super) spec: AppSpec,
    pub(super) seq: u64,
    pub(super) state: AppState,
    pub(super) connected: bool,
    pub(super) executors: BTreeMap<String, Executor>,
    pub(super) executor_limit: Option<u32>,
    pub(super) next_executor: u64,
    pub(super) retries: u32,
    pub(super) last_failure: String,
    /// Executors numbered below this may be adopted when a worker reports them (recovery).
    pub(super) adoptable_below: u64,
    /// Executors that ended, so a late report does not bring them back.
    pub(super) ended: BTreeSet<u64>,
    /// Workers that did not launch one of its executors in time: not used for it again.
    pub(super) avoided_workers: BTreeSet<String>,
}

impl App {
    pub(super) fn cores_granted(&self) -> u32 {
        self.executors.values().map(|e| e.cores).sum()
    }

    pub(super) fn cores_per_executor(&self) -> u32 {
        self.spec.cores_per_executor.max(1)
    }

    /// Its maximum total cores: its own, else the master's default; 0: no limit.
    pub(super) fn max_cores(&self, default_cores: u32) -> u32 {
        if self.spec.max_cores == 0 {
            default_cores
        } else {
            self.spec.max_cores
        }
    }

    /// Executors it may still get: by its request, then by its cores.
    pub(super) fn wanted(&self, default_cores: u32) -> u32 {
        let by_limit = self.executor_limit.map_or(u32::MAX, |limit| {
            limit.saturating_sub(self.executors.len() as u32)
        });
        let max_cores = self.max_cores(default_cores);
        let by_cores = if max_cores == 0 {
            u32::MAX
        } else {
            max_cores.saturating_sub(self.cores_granted()) / self.cores_per_executor()
        };
        by_limit.min(by_cores)
    }

    pub(super) fn requested(&self, default_cores: u32) -> u32 {
        let max_cores = self.max_cores(default_cores);
        let by_cores = if max_cores == 0 {
            u32::MAX
        } else {
            max_cores / self.cores_per_executor()
        };
        self.executor_limit.map_or(by_cores, |l| l.min(by_cores))
    }

    pub(super) fn is_active(&self) -> bool {
        matches!(self.state, AppState::Waiting | AppState::Running)
    }
}
