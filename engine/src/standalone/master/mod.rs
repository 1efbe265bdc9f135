//! The standalone master as a deterministic state machine: workers register and heartbeat,
//! applications register, and the master places their executors on alive workers.
//!
//! # Model
//!
//! A [`Master`] has no IO and no clock. The IO layer feeds it events with the current time
//! `now_us` (any monotonic clock in microseconds):
//!
//! - [`Master::handle_worker_registered`], [`Master::handle_worker_heartbeat`], [`Master::handle_worker_lost`]: workers;
//! - [`Master::handle_app_registered`], [`Master::handle_app_reconnected`], [`Master::handle_app_unregistered`],
//!   [`Master::handle_app_disconnected`], [`Master::handle_request_executors`], [`Master::handle_kill_executors`]:
//!   applications;
//! - [`Master::handle_executor_state`], [`Master::handle_executor_reattached`]: what workers report;
//! - [`Master::handle_timeout`]: time passed (expires silent workers, ends recovery);
//!
//! and drains what it must do with [`Master::poll_output`].
//!
//! # Placement (Spark's `schedule()`)
//!
//! Waiting applications are served first come, first served. For each, the usable workers are the
//! alive ones with enough free cores and memory for one executor, sorted by free cores (most
//! first). Spread out (the default) gives one executor to each usable worker in turn, round after
//! round; packed fills one worker before the next. An application gets executors until its
//! maximum total cores or its requested executor count is reached.
//!
//! # Failure
//!
//! A worker silent for `worker_timeout_us`, or whose connection ends, is dead: its executors are
//! lost and their applications told. An executor that exits abnormally counts against its
//! application; once `max_executor_retries` such exits happened and none of its executors is
//! running, the application is removed with the reason (Spark's rule). The count does not reset
//! when an executor reaches RUNNING: a worker reports RUNNING as soon as the process starts, so
//! an executor that crashes right after starting would otherwise never count. Lost executors do
//! not count: the application was not at fault.
//!
//! # Recovery
//!
//! After a restart, [`Master::handle_recover`] takes the journaled workers and applications: workers are
//! UNKNOWN and applications disconnected until they come back. Nothing is placed until every one
//! of them came back or `recovery_timeout_us` passed (checked on [`Master::handle_timeout`], so the
//! executors a worker reports right after registering are adopted first); then the ones still
//! missing are removed.
//! Workers report executors that kept running ([`Master::handle_executor_reattached`]) and the master
//! adopts them instead of placing new ones.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod placement;
mod records;
mod types;

use records::{App, Executor, Worker};
pub use types::*;

/// The standalone master (see the module docs).
#[derive(Debug)]
pub struct Master {
    config: Config,
    id_prefix: String,
    workers: BTreeMap<String, Worker>,
    apps: BTreeMap<String, App>,
    next_app: u64,
    completed: VecDeque<AppView>,
    dead_order: VecDeque<String>,
    recovering_until_us: Option<u64>,
    outputs: VecDeque<Output>,
    /// The latest time an event brought (placement stamps executors with it).
    now_us: u64,
}

/// How [`AppView::waiting`] begins when no alive worker could ever hold one executor of the
/// application (whatever the others free up): waiting will not help.
pub const NO_WORKER_FITS: &str = "no worker can fit";

/// Longest reason text kept from a peer, in bytes.
const MESSAGE_MAX_BYTES: usize = 1024;

fn clip(text: &str) -> String {
    if text.len() <= MESSAGE_MAX_BYTES {
        return text.to_owned();
    }
    let mut end = MESSAGE_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default().to_owned()
}

impl Master {
    /// A master with no workers or applications. Application ids are `{id_prefix}-{n:04}`
    /// (Spark uses `app-{start time}`; a prefix that differs per start keeps ids unique).
    pub fn new(config: Config, id_prefix: impl Into<String>) -> Self {
        Master {
            config,
            id_prefix: id_prefix.into(),
            workers: BTreeMap::new(),
            apps: BTreeMap::new(),
            next_app: 1,
            completed: VecDeque::new(),
            dead_order: VecDeque::new(),
            recovering_until_us: None,
            outputs: VecDeque::new(),
            now_us: 0,
        }
    }

    /// What must hold between inputs, checked on entry to every `handle_*` (debug builds;
    /// the tests and the cluster simulator run it on every input): each worker's used cores
    /// and memory are the sums of what is placed on it; every executor an application holds is
    /// listed on its worker, and every pair a worker lists is held by that application on it.
    /// The negative space: no executor on a worker the master does not know, no executor held
    /// by an application that has ended. O(workers + executors).
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        for (id, w) in &self.workers {
            let placed =
                (w.executors.iter()).filter_map(|(app, e)| self.apps.get(app)?.executors.get(e));
            let (cores, memory) = placed.fold((0u64, 0u64), |(c, m), e| {
                assert_eq!(&e.worker, id, "an executor listed on {id} runs elsewhere");
                (c + u64::from(e.cores), m + e.memory_mb)
            });
            assert_eq!(cores, u64::from(w.cores_used), "worker {id}'s cores");
            assert_eq!(memory, w.memory_used_mb, "worker {id}'s memory");
        }
        for (app, a) in &self.apps {
            assert!(
                a.is_active() || a.executors.is_empty(),
                "ended application {app} holds executors"
            );
            for (e, executor) in &a.executors {
                let w = self.workers.get(&executor.worker);
                let listed = w.is_some_and(|w| w.executors.contains(&(app.clone(), e.clone())));
                assert!(listed, "executor {app}/{e} not listed on its worker");
            }
        }
    }

    /// The next thing to do, if any.
    pub fn poll_output(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// Whether the master is still waiting for journaled workers and applications.
    pub fn is_recovering(&self) -> bool {
        self.recovering_until_us.is_some()
    }

    /// The description of an active application.
    pub fn app_spec(&self, app: &str) -> Option<&AppSpec> {
        self.apps.get(app).map(|a| &a.spec)
    }

    /// Whether `worker` is registered and alive.
    pub fn is_worker_alive(&self, worker: &str) -> bool {
        self.workers
            .get(worker)
            .is_some_and(|w| w.state == WorkerState::Alive)
    }

    /// Loads journaled state after a restart (see the module docs). Call before anything else.
    pub fn handle_recover(
        &mut self,
        workers: Vec<WorkerSpec>,
        apps: Vec<RecoveredApp>,
        now_us: u64,
    ) {
        self.check();
        self.now_us = self.now_us.max(now_us);
        if workers.is_empty() && apps.is_empty() {
            return;
        }
        for spec in workers.into_iter().take(self.config.workers_max) {
            self.workers.insert(
                spec.id.clone(),
                Worker {
                    spec,
                    state: WorkerState::Unknown,
                    last_heard_us: now_us,
                    cores_used: 0,
                    memory_used_mb: 0,
                    executors: BTreeSet::new(),
                },
            );
        }
        for app in apps.into_iter().take(self.config.apps_max) {
            let seq = self.next_app;
            self.next_app += 1;
            self.apps.insert(
                app.id,
                App {
                    spec: app.spec,
                    seq,
                    state: AppState::Waiting,
                    connected: false,
                    executors: BTreeMap::new(),
                    executor_limit: app.executor_limit,
                    next_executor: app.next_executor,
                    retries: 0,
                    last_failure: String::new(),
                    adoptable_below: app.next_executor,
                    ended: BTreeSet::new(),
                    avoided_workers: BTreeSet::new(),
                },
            );
        }
        self.recovering_until_us = Some(now_us.saturating_add(self.config.recovery_timeout_us));
    }

    /// A worker registers. Refused (with the reason) when a worker with its id is alive, or
    /// when the master knows too many workers.
    pub fn handle_worker_registered(
        &mut self,
        spec: WorkerSpec,
        now_us: u64,
    ) -> Result<(), String> {
        self.check();
        self.now_us = self.now_us.max(now_us);
        if spec.id.is_empty() {
            return Err("empty worker id".into());
        }
        match self.workers.get(&spec.id) {
            Some(existing) if existing.state == WorkerState::Alive => {
                return Err(format!(
                    "duplicate worker id {:?}: a worker with this id is registered and alive",
                    spec.id
                ));
            }
            Some(_) => {}
            None if self.workers.len() >= self.config.workers_max => {
                self.prune_dead(self.config.workers_max.saturating_sub(1));
                if self.workers.len() >= self.config.workers_max {
                    return Err(format!(
                        "too many workers ({}, workers_max)",
                        self.workers.len()
                    ));
                }
            }
            None => {}
        }
        self.dead_order.retain(|id| *id != spec.id);
        self.workers.insert(
            spec.id.clone(),
            Worker {
                spec,
                state: WorkerState::Alive,
                last_heard_us: now_us,
                cores_used: 0,
                memory_used_mb: 0,
                executors: BTreeSet::new(),
            },
        );
        let _ = now_us;
        self.schedule();
        Ok(())
    }

    /// A worker heartbeats. False if it is not alive here (it should register again).
    pub fn handle_worker_heartbeat(&mut self, worker: &str, now_us: u64) -> bool {
        self.check();
        match self.workers.get_mut(worker) {
            Some(w) if w.state == WorkerState::Alive => {
                w.last_heard_us = now_us;
                true
            }
            _ => false,
        }
    }

    /// A worker is gone (its connection ended, or the IO layer knows otherwise).
    pub fn handle_worker_lost(&mut self, worker: &str, reason: &str) {
        self.check();
        self.remove_worker(worker, reason);
        self.schedule();
    }

    /// Marks a worker dead and reports its executors lost, without placing replacements.
    fn remove_worker(&mut self, worker: &str, reason: &str) {
        let Some(w) = self.workers.get_mut(worker) else {
            return;
        };
        if w.state == WorkerState::Dead {
            return;
        }
        w.state = WorkerState::Dead;
        w.cores_used = 0;
        w.memory_used_mb = 0;
        let host = w.spec.host.clone();
        let executors = std::mem::take(&mut w.executors);
        let reason = clip(reason);
        for (app_id, executor) in executors {
            if let Some(app) = self.apps.get_mut(&app_id) {
                if app.executors.remove(&executor).is_some() {
                    if let Ok(n) = executor.parse::<u64>() {
                        app.ended.insert(n);
                    }
                    self.outputs.push_back(Output::ExecutorUpdated {
                        app: app_id.clone(),
                        executor,
                        state: ProcessState::Lost,
                        message: format!("worker {worker} lost: {reason}"),
                        exit_code: None,
                    });
                }
                if app.executors.is_empty() && app.state == AppState::Running {
                    app.state = AppState::Waiting;
                }
            }
        }
        let apps = self
            .apps
            .iter()
            .filter(|(_, a)| a.is_active() && a.connected)
            .map(|(id, _)| id.clone())
            .collect();
        self.outputs.push_back(Output::WorkerRemoved {
            worker: worker.to_owned(),
            host,
            reason,
            apps,
        });
        self.dead_order.push_back(worker.to_owned());
        self.prune_dead(self.config.workers_max);
    }

    /// When [`Master::handle_timeout`] next has something to do: the first alive worker's
    /// heartbeat deadline, the first launch's deadline, the end of recovery; `None` when
    /// nothing waits on time. O(workers + executors).
    pub fn poll_timeout(&self) -> Option<u64> {
        let worker_timeout = self.config.worker_timeout_us;
        let workers = (self.workers.values())
            .filter(|w| w.state == WorkerState::Alive)
            .map(|w| {
                w.last_heard_us
                    .saturating_add(worker_timeout)
                    .saturating_add(1)
            });
        let launch_timeout = self.config.launch_timeout_us;
        let launches = (self.apps.values())
            .flat_map(|a| a.executors.values())
            .filter(|e| launch_timeout > 0 && e.state == ProcessState::Launching)
            .map(|e| e.placed_us.saturating_add(launch_timeout).saturating_add(1));
        workers
            .chain(launches)
            .chain(self.recovering_until_us)
            .min()
    }

    /// Time passed: expires silent workers, ends recovery when its time is up.
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.check();
        self.now_us = self.now_us.max(now_us);
        let timeout = self.config.worker_timeout_us;
        let silent: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| {
                w.state == WorkerState::Alive && now_us.saturating_sub(w.last_heard_us) > timeout
            })
            .map(|(id, _)| id.clone())
            .collect();
        // All silent workers go before any replacement is placed, so none lands on another
        // worker that is about to be declared dead.
        for worker in &silent {
            let reason = format!("no heartbeat for {} ms", timeout / 1000);
            self.remove_worker(worker, &reason);
        }
        if !silent.is_empty() {
            self.schedule();
        }
        self.expire_launches(now_us);
        self.check_recovery(now_us);
    }

    /// Executors still LAUNCHING past the launch timeout: failed, killed on their worker (in
    /// case it starts them late), and replaced on another worker.
    fn expire_launches(&mut self, now_us: u64) {
        let timeout = self.config.launch_timeout_us;
        if timeout == 0 {
            return;
        }
        let stuck: Vec<(String, String, String)> = self
            .apps
            .iter()
            .flat_map(|(app, a)| {
                a.executors
                    .iter()
                    .filter(|(_, e)| {
                        e.state == ProcessState::Launching
                            && now_us.saturating_sub(e.placed_us) > timeout
                    })
                    .map(move |(id, e)| (app.clone(), id.clone(), e.worker.clone()))
            })
            .collect();
        if stuck.is_empty() {
            return;
        }
        for (app, executor, worker) in stuck {
            let Some(a) = self.apps.get_mut(&app) else {
                continue;
            };
            let Some(e) = a.executors.remove(&executor) else {
                continue;
            };
            if let Ok(n) = executor.parse::<u64>() {
                a.ended.insert(n);
            }
            a.avoided_workers.insert(worker.clone());
            if a.executors.is_empty() && a.state == AppState::Running {
                a.state = AppState::Waiting;
            }
            if let Some(w) = self.workers.get_mut(&worker) {
                w.executors.remove(&(app.clone(), executor.clone()));
                w.cores_used = w.cores_used.saturating_sub(e.cores);
                w.memory_used_mb = w.memory_used_mb.saturating_sub(e.memory_mb);
            }
            self.outputs.push_back(Output::KillExecutor {
                worker: worker.clone(),
                app: app.clone(),
                executor: executor.clone(),
            });
            self.outputs.push_back(Output::ExecutorUpdated {
                app,
                executor,
                state: ProcessState::Failed,
                message: format!(
                    "worker {worker} did not start it within {} ms of its launch; placing it elsewhere",
                    timeout / 1000
                ),
                exit_code: None,
            });
        }
        self.schedule();
    }

    /// An application registers; returns its id.
    pub fn handle_app_registered(&mut self, spec: AppSpec, now_us: u64) -> Result<String, String> {
        self.check();
        self.now_us = self.now_us.max(now_us);
        let _ = now_us;
        let active = self.apps.values().filter(|a| a.is_active()).count();
        if active >= self.config.apps_max {
            return Err(format!("too many applications ({active}, apps_max)"));
        }
        let seq = self.next_app;
        self.next_app += 1;
        let id = format!("{}-{seq:04}", self.id_prefix);
        self.apps.insert(
            id.clone(),
            App {
                spec,
                seq,
                state: AppState::Waiting,
                connected: true,
                executors: BTreeMap::new(),
                executor_limit: None,
                next_executor: 0,
                retries: 0,
                last_failure: String::new(),
                adoptable_below: 0,
                ended: BTreeSet::new(),
                avoided_workers: BTreeSet::new(),
            },
        );
        self.schedule();
        Ok(id)
    }

    /// An application's driver is back (after a master restart or a lost connection).
    pub fn handle_app_reconnected(&mut self, app: &str, now_us: u64) -> Result<(), String> {
        self.check();
        self.now_us = self.now_us.max(now_us);
        match self.apps.get_mut(app) {
            Some(a) if a.is_active() => {
                let _ = now_us;
                a.connected = true;
                self.schedule();
                Ok(())
            }
            _ => Err(format!("unknown application {app:?}")),
        }
    }

    /// An application unregistered: it finished.
    pub fn handle_app_unregistered(&mut self, app: &str) {
        self.check();
        self.remove_app(app, AppState::Finished, "the application unregistered");
    }

    /// An application's driver connection ended: as in Spark, it is finished.
    pub fn handle_app_disconnected(&mut self, app: &str) {
        self.check();
        self.remove_app(app, AppState::Finished, "the driver disconnected");
    }

    /// An application asks for `total` executors in all.
    pub fn handle_request_executors(&mut self, app: &str, total: u32) -> bool {
        self.check();
        let Some(a) = self.apps.get_mut(app).filter(|a| a.is_active()) else {
            return false;
        };
        a.executor_limit = Some(total);
        self.schedule();
        true
    }

    /// An application asks to kill some of its executors.
    pub fn handle_kill_executors(&mut self, app: &str, executors: &[&str]) -> bool {
        self.check();
        let Some(a) = self.apps.get_mut(app).filter(|a| a.is_active()) else {
            return false;
        };
        let mut killed = Vec::new();
        for id in executors {
            if let Some(executor) = a.executors.remove(*id) {
                if let Ok(n) = id.parse::<u64>() {
                    a.ended.insert(n);
                }
                killed.push(((*id).to_owned(), executor));
            }
        }
        if a.executors.is_empty() && a.state == AppState::Running {
            a.state = AppState::Waiting;
        }
        for (id, executor) in killed {
            if let Some(w) = self.workers.get_mut(&executor.worker) {
                w.executors.remove(&(app.to_owned(), id.clone()));
                w.cores_used = w.cores_used.saturating_sub(executor.cores);
                w.memory_used_mb = w.memory_used_mb.saturating_sub(executor.memory_mb);
            }
            self.outputs.push_back(Output::KillExecutor {
                worker: executor.worker,
                app: app.to_owned(),
                executor: id.clone(),
            });
            self.outputs.push_back(Output::ExecutorUpdated {
                app: app.to_owned(),
                executor: id,
                state: ProcessState::Killed,
                message: "killed at the application's request".into(),
                exit_code: None,
            });
        }
        self.schedule();
        true
    }

    /// A worker reports an executor's state. Reports about executors the master does not place
    /// on that worker are ignored.
    pub fn handle_executor_state(
        &mut self,
        worker: &str,
        app: &str,
        executor: &str,
        state: ProcessState,
        message: &str,
        exit_code: Option<i32>,
    ) {
        self.check();
        let Some(a) = self.apps.get_mut(app) else {
            return;
        };
        match a.executors.get_mut(executor) {
            Some(e) if e.worker == worker => e.state = state,
            _ => return,
        }
        self.outputs.push_back(Output::ExecutorUpdated {
            app: app.to_owned(),
            executor: executor.to_owned(),
            state,
            message: clip(message),
            exit_code,
        });
        if state == ProcessState::Running {
            a.state = AppState::Running;
        }
        if !state.is_final() {
            return;
        }
        if let Some(e) = a.executors.remove(executor) {
            if let Ok(n) = executor.parse::<u64>() {
                a.ended.insert(n);
            }
            if let Some(w) = self.workers.get_mut(&e.worker) {
                w.executors.remove(&(app.to_owned(), executor.to_owned()));
                w.cores_used = w.cores_used.saturating_sub(e.cores);
                w.memory_used_mb = w.memory_used_mb.saturating_sub(e.memory_mb);
            }
        }
        let normal = state == ProcessState::Killed
            || (state == ProcessState::Exited && exit_code.unwrap_or(0) == 0);
        if !normal {
            a.retries += 1;
            a.last_failure = format!(
                "executor {executor} on {worker}: {state:?} ({}){}",
                clip(message),
                exit_code.map_or(String::new(), |c| format!(", exit code {c}"))
            );
            let running = a
                .executors
                .values()
                .any(|e| e.state == ProcessState::Running);
            if a.retries >= self.config.max_executor_retries && !running {
                let reason = format!(
                    "application {app} failed: {} abnormal executor exits in a row with none running (max executor retries {}); last: {}",
                    a.retries, self.config.max_executor_retries, a.last_failure
                );
                self.remove_app(app, AppState::Failed, &reason);
                return;
            }
        }
        if a.executors.is_empty() && a.state == AppState::Running {
            a.state = AppState::Waiting;
        }
        self.schedule();
    }

    /// A worker that registered again reports an executor of `app` still running on it. The
    /// master adopts it if it placed it before a restart and has not seen it end; otherwise it
    /// tells the worker to kill it. Returns whether it was adopted.
    pub fn handle_executor_reattached(&mut self, worker: &str, app: &str, executor: &str) -> bool {
        self.check();
        let alive = self.is_worker_alive(worker);
        let number = executor.parse::<u64>().ok();
        let adoptable = match (self.apps.get(app), number) {
            (Some(a), Some(n)) => {
                alive
                    && a.is_active()
                    && n < a.adoptable_below
                    && !a.ended.contains(&n)
                    && !a.executors.contains_key(executor)
            }
            _ => false,
        };
        if !adoptable {
            if self
                .apps
                .get(app)
                .and_then(|a| a.executors.get(executor))
                .is_some_and(|e| e.worker == worker)
            {
                return true;
            }
            self.outputs.push_back(Output::KillExecutor {
                worker: worker.to_owned(),
                app: app.to_owned(),
                executor: executor.to_owned(),
            });
            return false;
        }
        let (Some(a), Some(w)) = (self.apps.get_mut(app), self.workers.get_mut(worker)) else {
            return false;
        };
        let cores = a.cores_per_executor();
        let memory_mb = a.spec.memory_mb;
        w.cores_used = w.cores_used.saturating_add(cores);
        w.memory_used_mb = w.memory_used_mb.saturating_add(memory_mb);
        w.executors.insert((app.to_owned(), executor.to_owned()));
        a.executors.insert(
            executor.to_owned(),
            Executor {
                worker: worker.to_owned(),
                cores,
                memory_mb,
                state: ProcessState::Running,
                placed_us: self.now_us,
            },
        );
        a.state = AppState::Running;
        true
    }

    /// The cluster as it is now.
    pub fn status(&self) -> Status {
        let mut workers: Vec<WorkerView> = self
            .workers
            .values()
            .map(|w| WorkerView {
                spec: w.spec.clone(),
                state: w.state,
                cores_used: w.cores_used,
                memory_used_mb: w.memory_used_mb,
            })
            .collect();
        workers.sort_by_key(|w| w.state != WorkerState::Alive);
        let default_cores = self.config.default_cores;
        let mut apps: Vec<(u64, AppView)> = self
            .apps
            .iter()
            .map(|(id, a)| {
                (
                    a.seq,
                    AppView {
                        id: id.clone(),
                        name: a.spec.name.clone(),
                        state: a.state,
                        cores_granted: a.cores_granted(),
                        executors_requested: a.requested(default_cores),
                        waiting: self.waiting_reason(a),
                    },
                )
            })
            .collect();
        apps.sort_by_key(|(seq, _)| *seq);
        let executors = self
            .apps
            .iter()
            .flat_map(|(app, a)| {
                a.executors.iter().map(move |(id, e)| ExecutorView {
                    app: app.clone(),
                    id: id.clone(),
                    worker: e.worker.clone(),
                    cores: e.cores,
                    state: e.state,
                })
            })
            .collect();
        Status {
            workers,
            apps: apps
                .into_iter()
                .map(|(_, a)| a)
                .chain(self.completed.iter().cloned())
                .collect(),
            executors,
        }
    }

    fn remove_app(&mut self, app: &str, state: AppState, reason: &str) {
        let Some(mut a) = self.apps.remove(app) else {
            return;
        };
        for (id, executor) in std::mem::take(&mut a.executors) {
            if let Some(w) = self.workers.get_mut(&executor.worker) {
                w.executors.remove(&(app.to_owned(), id.clone()));
                w.cores_used = w.cores_used.saturating_sub(executor.cores);
                w.memory_used_mb = w.memory_used_mb.saturating_sub(executor.memory_mb);
                if w.state == WorkerState::Alive {
                    self.outputs.push_back(Output::KillExecutor {
                        worker: executor.worker.clone(),
                        app: app.to_owned(),
                        executor: id,
                    });
                }
            }
        }
        for (id, w) in &self.workers {
            if w.state == WorkerState::Alive {
                self.outputs.push_back(Output::ApplicationFinished {
                    worker: id.clone(),
                    app: app.to_owned(),
                });
            }
        }
        self.outputs.push_back(Output::ApplicationRemoved {
            app: app.to_owned(),
            state,
            reason: reason.to_owned(),
        });
        self.completed.push_back(AppView {
            id: app.to_owned(),
            name: a.spec.name.clone(),
            state,
            cores_granted: 0,
            executors_requested: a.requested(self.config.default_cores),
            waiting: String::new(),
        });
        while self.completed.len() > self.config.history_max {
            self.completed.pop_front();
        }
        self.schedule();
    }

    fn prune_dead(&mut self, keep_max: usize) {
        let dead_keep = self.config.history_max;
        while self.dead_order.len() > dead_keep || self.workers.len() > keep_max {
            let Some(id) = self.dead_order.pop_front() else {
                break;
            };
            if self
                .workers
                .get(&id)
                .is_some_and(|w| w.state == WorkerState::Dead)
            {
                self.workers.remove(&id);
            }
        }
    }

    fn check_recovery(&mut self, now_us: u64) {
        let Some(until_us) = self.recovering_until_us else {
            return;
        };
        let all_back = self
            .workers
            .values()
            .all(|w| w.state != WorkerState::Unknown)
            && self.apps.values().all(|a| a.connected || !a.is_active());
        if !all_back && now_us < until_us {
            return;
        }
        self.recovering_until_us = None;
        let missing_workers: Vec<String> = self
            .workers
            .iter()
            .filter(|(_, w)| w.state == WorkerState::Unknown)
            .map(|(id, _)| id.clone())
            .collect();
        for worker in missing_workers {
            self.remove_worker(&worker, "did not register again after the master restarted");
        }
        let missing_apps: Vec<String> = self
            .apps
            .iter()
            .filter(|(_, a)| !a.connected)
            .map(|(id, _)| id.clone())
            .collect();
        for app in missing_apps {
            self.remove_app(
                &app,
                AppState::Killed,
                "its driver did not come back after the master restarted",
            );
        }
        self.schedule();
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod properties;
