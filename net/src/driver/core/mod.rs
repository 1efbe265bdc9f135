//! The driver's protocol state, sans IO (in the style of quinn-proto): every peer's phase,
//! the [`Scheduler`] and what it decides. No sockets, no threads, no clock, no entropy, no
//! shared state and no user callbacks: every input carries `now_us` (micros on a clock the
//! caller chooses, never going back), randomness comes in (a nonce per connection, a seed for
//! lane keys), and the outputs wait to be polled.
//!
//! Inputs: [`DriverCore::handle_connected`], [`DriverCore::handle_frame`],
//! [`DriverCore::handle_closed`], [`DriverCore::handle_local_completions`],
//! [`DriverCore::handle_timeout`], [`DriverCore::submit`], [`DriverCore::cancel`] and the
//! requests of [`super::DriverMsg`]. Outputs: [`DriverCore::poll_transmit`] (encoded frames for
//! a peer), [`DriverCore::poll_close`] (a peer to close once its frames are written: drain
//! `poll_transmit` first), [`DriverCore::poll_local`] (what the in-process executor is to run
//! or kill), [`DriverCore::poll_event`] (task results and job outcomes, which the endpoint
//! delivers to the jobs' handles and observers) and [`DriverCore::poll_timeout`] (when to call
//! `handle_timeout`; `None` while nothing is pending, so an idle driver never wakes). Counts a
//! caller reads without asking the loop ([`DriverCore::counts`], [`DriverCore::stats`]) are
//! published by the endpoint.
//!
//! Sub-states live in their own files, each a type that owns its data (quinn-proto's
//! `Connection` and its `StreamsState` are the model): `executors.rs` (ids, lanes, what each
//! lane holds, lane keys, retiring and recently gone executors), `jobs.rs` (active jobs,
//! deadlines, the events owed to the callers' side), `health.rs` (the stall warnings); beside
//! them `registration.rs` (an executor's registration and its lanes' joins), `views.rs` (what the core shows) and `table.rs` (the peer table's settings).
//!
//! A peer's life. The handshake, the table's limits (`table.rs`) and the peers' deadlines run
//! in the transport's sans-IO peer table ([`Peers`], which the master shares), so a simulation
//! covers authentication, registration, heartbeats and expiry with the real driver's code:
//!
//! ```text
//!  connected --Hello/proofs--> Registering --RegisterExecutor--> Executor(id, lane 0)
//!                                  |   \--JoinLane(key)--------> Executor(id, lane n)
//!                                  \--(role Client)-----------> Client
//!  any phase --closed / expired / refused / malformed--> gone (an executor's lane gone: the
//!                                                      whole executor leaves the scheduler)
//! ```
//!
//! Lanes, and the executors that heartbeat but do not read their launches: see `executors.rs`.

mod executors;
mod functions;
mod health;
mod jobs;
mod registration;
mod table;
#[cfg(test)]
mod tests;
mod views;

use std::time::Duration;

use bytes::BytesMut;
use flint_engine::clock;
use flint_engine::runner::TaskReport;
use flint_engine::scheduler::{
    self, Attempt, ExecutorId, ExecutorInfo, JobId, JobToken, Output, RemovalReason, Scheduler,
    Stats, TaskId, TaskLaunch, TaskState,
};

pub use self::executors::LOCAL_EXECUTOR;
use self::executors::{Departure, ExecutorLink, Executors, How, Lane, Registration};
use self::functions::Index;
use self::health::Health;
pub use self::jobs::Event;
use self::jobs::Jobs;
pub(crate) use self::table::inbound;
use self::table::peers_config;
use super::{DriverConfig, ExecutorHealth, ExecutorsView, TASKS_PER_CORE_MAX};
use crate::conn::ConnError;
use crate::job::Job;
use crate::observe::{DriverView, JobEnd, LoopTelemetry, PeerRefusal};
use crate::transport::peers::{Arrival, Peers, Standing};
use crate::transport::unexpected;
use crate::wire::{self, batch, Frame, List, Message, Role};

/// A peer connection as the IO layer names it: any number it does not reuse while the core
/// knows the peer (from `handle_connected` until `handle_closed` or `poll_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u64);

impl crate::transport::peers::PeerKey for PeerId {
    fn number(self) -> u64 {
        self.0
    }
    fn from_number(n: u64) -> Self {
        PeerId(n)
    }
}

/// What the in-process executor (local mode) is to do: the IO layer hands it to its runner.
#[derive(Debug)]
pub enum LocalCommand {
    /// Run this attempt.
    Launch(TaskLaunch),
    /// Kill this attempt if it still runs.
    Kill(Attempt),
}

/// Counts a caller reads without asking the driver's loop; the endpoint publishes them after
/// every round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Executors registered now (the local one included).
    pub executors: usize,
    /// Remote executors registered in all.
    pub executors_registered: u64,
    /// Executors lost in all.
    pub executors_lost: u64,
    /// Since when tasks have waited with no executor able to run them, if they do.
    pub starved_since_us: Option<u64>,
}

/// The least time between two scheduler ticks, whatever the scheduler asks.
const TICK_GAP_MIN_US: u64 = 1_000;

/// Where a peer past the handshake is in the driver's protocol.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Registering,
    /// One lane of a registered executor (lane 0 registered it).
    Executor(ExecutorId, u32),
    Client,
}

/// The scheduler's own timeout, asked again after inputs came (O(log jobs) each time).
#[derive(Default)]
struct SchedulerTimeout {
    deadline_us: Option<u64>,
    /// Inputs arrived since it was asked.
    stale: bool,
}

/// A burst of submissions under way ([`DriverCore::submit_burst`]).
pub struct Burst<'a> {
    core: &'a mut DriverCore,
    /// Tasks submitted in it so far.
    tasks: usize,
}

impl Burst<'_> {
    /// Submits `job` under `id` and `token` (see [`DriverCore::submit`]); its launches wait
    /// for the burst's end.
    pub fn submit(&mut self, id: JobId, token: JobToken, job: Job) {
        let tasks = job.len();
        self.tasks += tasks;
        self.core.submit_inner(id, token, job, tasks);
    }

    /// Tasks submitted in the burst so far.
    pub fn tasks(&self) -> usize {
        self.tasks
    }

    /// The time now, after submissions that took long (a job of millions of tasks builds for
    /// seconds): the burst's launches leave at it, so they do not look that much older than
    /// they are.
    pub fn advance(&mut self, now_us: u64) {
        self.core.advance(now_us);
    }
}

/// The driver's state machine (see the module docs).
pub struct DriverCore {
    config: DriverConfig,
    scheduler: Scheduler,
    peers: Peers<PeerId, Phase>,
    executors: Executors,
    jobs: Jobs,
    health: Health,
    /// Told every executor to stop: registrations are refused.
    stopping: bool,
    /// What the driver shows ([`crate::observe`]).
    telemetry: Box<LoopTelemetry>,
    local: std::collections::VecDeque<LocalCommand>,
    /// The latest input's time.
    now_us: u64,
    scheduler_timeout: SchedulerTimeout,
    last_tick_us: u64,
    /// Vectors a launch fills and empties, kept so that a launch allocates none.
    scratch: Scratch,
    /// The scheduler's results and outcomes waiting for [`DriverCore::poll_event`] that the
    /// telemetry has counted (the first ones waiting).
    events_counted: usize,
}

/// Vectors [`DriverCore`] fills and empties within one call, kept between calls.
#[derive(Debug, Default)]
struct Scratch {
    /// Each launched task's lane.
    lanes: Vec<u32>,
}

impl DriverCore {
    /// A driver with no peers and no jobs; `telemetry` is what it shows, `seed` (32 bytes
    /// from the operating system's random source, or fixed in a simulation) keys its lane keys.
    pub fn new(config: DriverConfig, telemetry: Box<LoopTelemetry>, seed: [u8; 32]) -> DriverCore {
        DriverCore {
            scheduler: Scheduler::new(config.scheduler.clone()),
            peers: Peers::new(peers_config(&config)),
            config,
            executors: Executors::new(seed),
            jobs: Jobs::default(),
            health: Health::default(),
            stopping: false,
            telemetry,
            local: std::collections::VecDeque::new(),
            now_us: 0,
            scheduler_timeout: SchedulerTimeout::default(),
            last_tick_us: 0,
            scratch: Scratch::default(),
            events_counted: 0,
        }
    }

    /// The counts a [`super::Driver`] reads (the endpoint publishes them).
    pub fn counts(&self) -> Counts {
        let (executors_registered, executors_lost) = self.executors.totals();
        Counts {
            executors: self.executors.live(),
            executors_registered,
            executors_lost,
            starved_since_us: self.health.starved_since_us(),
        }
    }

    /// The scheduler's counters (the endpoint publishes them before delivering events, so a
    /// caller that sees a job end sees its counts).
    pub fn stats(&self) -> &Stats {
        self.scheduler.stats()
    }

    /// Whether `peer` is a registered executor.
    pub fn is_executor(&self, peer: PeerId) -> bool {
        matches!(self.peers.state(peer), Some(Phase::Executor(..)))
    }

    fn advance(&mut self, now_us: u64) {
        self.now_us = self.now_us.max(now_us);
        self.scheduler_timeout.stale = true;
    }

    // ----- inputs: peers -----

    /// A connection was accepted; `nonce` is fresh for it. Our `Hello` is queued at once.
    /// A full table refuses it with the reason (the IO layer tells the peer and drops it);
    /// making room may close older connections (see [`DriverCore::poll_close`]).
    pub fn handle_connected(
        &mut self,
        peer: PeerId,
        nonce: [u8; 32],
        now_us: u64,
    ) -> Result<(), String> {
        self.advance(now_us);
        let result = self.peers.handle_connected(peer, nonce, self.now_us);
        if result.is_err() {
            self.telemetry.refused(PeerRefusal::TableFull);
        }
        self.forget_gone();
        debug_assert!(result.is_err() || self.peers.contains(peer));
        result
    }

    /// Why a connection arriving now would be refused (the table is full of executors), if it
    /// would: the IO layer tells the newcomer before setting it up. Counted as a refusal.
    pub fn refusal(&mut self) -> Option<String> {
        let refusal = self.peers.refusal();
        if refusal.is_some() {
            self.telemetry.refused(PeerRefusal::TableFull);
        }
        refusal
    }

    /// A frame from a peer. False once the core has closed the peer (it is in
    /// [`DriverCore::poll_close`]): the IO layer stops reading it.
    pub fn handle_frame(&mut self, peer: PeerId, frame: &Frame, now_us: u64) -> bool {
        self.advance(now_us);
        let now = self.now_us;
        let alive = match self.peers.handle_frame(peer, frame, now) {
            Arrival::Unknown => return false,
            Arrival::Failed => {
                self.telemetry.refused(PeerRefusal::Handshake);
                false
            }
            Arrival::Handshaking => true,
            Arrival::Opened(Role::Client) => {
                self.peers.open(peer, Phase::Client, Standing::Client);
                true
            }
            Arrival::Opened(_) => {
                self.peers
                    .open(peer, Phase::Registering, Standing::Registering);
                true
            }
            Arrival::Open => match self.on_frame(peer, frame) {
                Ok(()) => true,
                Err(why) => {
                    self.close(peer, why);
                    false
                }
            },
        };
        self.forget_gone();
        self.pump();
        debug_assert!(
            !alive || self.peers.contains(peer),
            "alive but not in the table"
        );
        alive
    }

    /// The IO layer lost a peer (closed, failed, malformed bytes, not reading). Nothing more
    /// goes to it; an executor's running tasks go back to pending.
    pub fn handle_closed(&mut self, peer: PeerId, why: &ConnError, now_us: u64) {
        self.advance(now_us);
        if self.peers.contains(peer) {
            let phase = self.peers.remove(peer);
            self.forget(phase, why);
        }
        self.pump();
        debug_assert!(!self.peers.contains(peer));
    }

    /// One frame from a peer past the handshake, by its phase.
    fn on_frame(&mut self, peer: PeerId, frame: &Frame) -> Result<(), ConnError> {
        let Some(&phase) = self.peers.state(peer) else {
            return Ok(());
        };
        match (phase, frame.message()?) {
            (
                Phase::Registering,
                Message::RegisterExecutor {
                    executor_id,
                    host,
                    cores,
                    lanes,
                    attributes,
                },
            ) => {
                let registration = Registration {
                    executor_id,
                    host,
                    cores,
                    lanes,
                };
                let executor = self
                    .register(peer, registration, attributes)
                    .inspect_err(|_| self.telemetry.refused(PeerRefusal::Registration))?;
                self.open_lane(peer, executor, 0);
                Ok(())
            }
            (
                Phase::Registering,
                Message::JoinLane {
                    executor_id,
                    lane,
                    lane_key,
                },
            ) => {
                let executor = self
                    .join_lane(peer, executor_id, lane, &lane_key)
                    .inspect_err(|_| self.telemetry.refused(PeerRefusal::Registration))?;
                self.open_lane(peer, executor, lane);
                Ok(())
            }
            (Phase::Executor(executor, _), Message::StatusUpdates { updates }) => {
                self.status_updates(executor, updates, frame);
                Ok(())
            }
            (Phase::Executor(executor, lane), Message::Heartbeat { running_tasks, .. }) => {
                self.heartbeat(peer, executor, lane, running_tasks)
            }
            (Phase::Executor(executor, lane), Message::ExecutorDraining {}) => {
                tracing::info!(?executor, lane, "the executor is draining (going away)");
                self.scheduler.handle_drain(executor);
                Ok(())
            }
            (Phase::Executor(..) | Phase::Client, Message::Shutdown {}) => Err(ConnError::Closed),
            (_, other) => Err(ConnError::Protocol(unexpected(&other, "this peer"))),
        }
    }

    /// Lane `lane` of `executor` says it runs `running` attempts: acked, unless it is the
    /// second heartbeat in a row to show it does not read its launches.
    fn heartbeat(
        &mut self,
        peer: PeerId,
        executor: ExecutorId,
        lane: u32,
        running: u32,
    ) -> Result<(), ConnError> {
        let timeout_us = us(self.config.heartbeat_timeout);
        let now = self.now_us;
        // An executor of one lane is checked against the scheduler's book of its attempts.
        let book = self.scheduler.attempts_heard(executor, now, timeout_us);
        if let Some(remote) = self.executors.remote_mut(executor) {
            if let Some(why) = remote.heartbeat(lane, running, (now, timeout_us), book) {
                return Err(ConnError::Protocol(why));
            }
        }
        self.scheduler.handle_heard(executor, now);
        self.send(peer, &Message::HeartbeatAck {});
        Ok(())
    }

    /// An executor's batch of status updates, to the scheduler.
    fn status_updates(
        &mut self,
        executor: ExecutorId,
        updates: List<'_, wire::StatusUpdate<'_>>,
        frame: &Frame,
    ) {
        let now = self.now_us;
        let mut remote = self.executors.remote_mut(executor);
        let telemetry = &mut self.telemetry;
        let mut finished = 0;
        // One batch for the scheduler: the slots it frees are filled in one pass.
        let updates = updates.into_iter().map(|update| {
            let task = TaskId(update.task_id);
            let (attempt, state) = (update.attempt, update.state);
            if let Some(remote) = remote.as_deref_mut() {
                remote.reported(Attempt::new(task, attempt), state);
            }
            finished += u64::from(state == TaskState::Finished);
            telemetry.status_update(now, executor, task, attempt, state, update.data);
            scheduler::StatusUpdate {
                executor,
                task,
                attempt,
                state,
                // A result outlives its frame: a small one is copied out so it does not keep
                // the whole frame alive.
                data: frame.retain(update.data),
            }
        });
        self.scheduler.handle_statuses(updates, now);
        self.telemetry.tasks_finished(executor, finished);
    }

    /// Registers the in-process executor (local mode) with `cores`; the slots its runner
    /// must hold.
    pub fn add_local_executor(&mut self, cores: u32, now_us: u64) -> u32 {
        self.advance(now_us);
        let slots = cores.saturating_mul(self.tasks_per_core());
        let info = ExecutorInfo {
            id: LOCAL_EXECUTOR,
            host: "localhost".into(),
            cores: slots,
            attributes: Vec::new(),
        };
        match self.scheduler.handle_register(info, self.now_us) {
            Ok(()) => {
                self.executors.add_local();
                self.telemetry
                    .executor_registered(LOCAL_EXECUTOR, "local", "localhost", cores);
            }
            Err(refusal) => tracing::error!("local executor refused: {refusal}"),
        }
        self.pump();
        slots
    }

    /// Attempts the in-process executor ended (drained from `reports`).
    pub fn handle_local_completions(&mut self, reports: &mut Vec<TaskReport>, now_us: u64) {
        self.advance(now_us);
        let now = self.now_us;
        let telemetry = &mut self.telemetry;
        let mut finished = 0;
        let updates = reports.drain(..).map(|report| {
            let (task, attempt, state) = (report.task, report.attempt, report.state);
            finished += u64::from(state == TaskState::Finished);
            telemetry.status_update(now, LOCAL_EXECUTOR, task, attempt, state, &report.data);
            report.into_update(LOCAL_EXECUTOR)
        });
        self.scheduler.handle_statuses(updates, now);
        self.telemetry.tasks_finished(LOCAL_EXECUTOR, finished);
        self.pump();
        debug_assert!(reports.is_empty());
    }

    // ----- inputs: jobs and requests -----

    /// A job the caller admitted under `id` (its result observer, if any, stays with the
    /// caller's side): into the scheduler, with its deadline noted. Its events carry `token`
    /// back ([`DriverCore::poll_event`]). A job refused here (a malformed one) ends
    /// at once: its outcome is in [`DriverCore::poll_event`].
    pub fn submit(&mut self, id: JobId, token: JobToken, job: Job, now_us: u64) {
        self.advance(now_us);
        let tasks = job.len();
        self.submit_inner(id, token, job, tasks);
        self.pump();
    }

    /// Submits a burst of jobs at `now_us`: `each` hands every job of it to
    /// [`Burst::submit`]; their launches leave together, one batch per executor, after it.
    pub fn submit_burst<R>(&mut self, now_us: u64, each: impl FnOnce(&mut Burst<'_>) -> R) -> R {
        self.advance(now_us);
        self.scheduler.hold_launches(now_us);
        let result = each(&mut Burst {
            core: self,
            tasks: 0,
        });
        self.scheduler.release_launches(self.now_us);
        self.pump();
        result
    }

    /// Submits `job` of `n` tasks (its [`Job::len`], which its caller counted already).
    fn submit_inner(&mut self, id: JobId, token: JobToken, job: Job, n: usize) {
        // Scheduler outputs wait for the pump (after one job, or after a burst).
        debug_assert!(job.observer.is_none(), "an observer reached the core");
        debug_assert_eq!(n, job.len());
        let Job {
            function,
            payloads,
            cores,
            observer: _,
            keep_results,
            deadline_us,
            stream: _,
            scheduling,
        } = job;
        let now_us = self.now_us;
        let filed = match scheduling {
            // Most jobs: every setting the scheduler's, no preferences, nothing to refuse (as
            // `job_spec` makes it). Their spec is built in the call's argument, not in a local
            // moved there (a spec is 176 bytes, and that move was a `memcpy` call per job), and
            // their function and payloads go into it from here, not through an enum of the two
            // kinds of job first.
            None => {
                // The function's name, shared with the job's tasks (a job of no tasks has none
                // to show); the default pool (the telemetry need not look).
                let shown = payloads.first().map(|_| &function);
                self.submitted(now_us, id, shown, n, None);
                let tasks = scheduler::Tasks::Same {
                    function,
                    cores,
                    payloads,
                };
                let spec = scheduler::JobSpec {
                    keep_results,
                    token,
                    ..scheduler::JobSpec::new(tasks)
                };
                self.scheduler.handle_submit_with_id(id, spec, now_us)
            }
            Some(scheduling) => {
                match self.spec_with(function, payloads, cores, keep_results, scheduling) {
                    Ok(spec) => self.submit_own(id, scheduler::JobSpec { token, ..spec }, n),
                    Err(error) => return self.refuse(id, token, &error),
                }
            }
        };
        match filed {
            // Filed even if the scheduler ended it within the call (no tasks, a payload over
            // the limit): a deadline of an ended job is dropped when it comes up.
            Ok(()) => {
                if let Some(d) = deadline_us {
                    self.jobs.set_deadline(id, now_us.saturating_add(d.get()));
                }
            }
            Err(error) => self.refuse(id, token, &error),
        }
    }

    /// A job of `n` tasks submitted at `now_us` under `id`, `function` shown for it and run in
    /// `pool` (`None`: the default), as the telemetry and the stall check see it. Always
    /// inline: the submission of a job without settings is its caller on every job.
    #[inline(always)]
    fn submitted(
        &mut self,
        now_us: u64,
        id: JobId,
        function: Option<&std::sync::Arc<str>>,
        n: usize,
        pool: Option<&str>,
    ) {
        (self.telemetry).job_submitted_to(now_us, id, function, n, pool);
        if self.scheduler.active_jobs() == 0 {
            // The first stall check one interval after work arrives.
            self.health.work_arrived(now_us);
        }
    }

    /// Submits the job of `n` tasks with settings of its own whose spec is `spec`; out of
    /// line, since most jobs have none.
    #[inline(never)]
    fn submit_own(
        &mut self,
        id: JobId,
        spec: scheduler::JobSpec,
        n: usize,
    ) -> Result<(), scheduler::SubmitError> {
        let now_us = self.now_us;
        let function = spec.tasks.first_function();
        self.submitted(now_us, id, function, n, Some(&*spec.pool));
        self.scheduler.handle_submit_with_id(id, spec, now_us)
    }

    /// The spec of a job with settings of its own (its preferred executors resolved by their
    /// names); out of line, since most jobs have none.
    #[inline(never)]
    fn spec_with(
        &self,
        function: std::sync::Arc<str>,
        payloads: scheduler::Payloads,
        cores: u32,
        keep_results: bool,
        scheduling: Box<crate::job::JobScheduling>,
    ) -> Result<scheduler::JobSpec, String> {
        let executors = &self.executors;
        crate::job::job_spec(
            function,
            payloads,
            cores,
            keep_results,
            Some(scheduling),
            |executor_id| executors.id_of(executor_id),
        )
    }

    /// Ends job `id` (its caller's `token`) at once, refused for `error`: its outcome waits
    /// in the events.
    #[cold]
    #[inline(never)]
    fn refuse(&mut self, id: JobId, token: JobToken, error: &dyn std::fmt::Display) {
        let reason = format!("job refused: {error}");
        let outcome = scheduler::JobOutcome::Failed(vec![reason]);
        self.jobs.end(id, token, outcome);
    }

    /// A caller cancelled a job.
    pub fn cancel(&mut self, job: JobId, now_us: u64) {
        self.advance(now_us);
        self.scheduler.handle_cancel(job, self.now_us);
        self.pump();
    }

    /// Tells every remote executor to exit and refuses new registrations; how many were told.
    pub fn stop_executors(&mut self) -> usize {
        self.stopping = true;
        let peers: Vec<PeerId> = self.executors.lane0s().collect();
        for &peer in &peers {
            self.send(peer, &Message::StopExecutor {});
        }
        peers.len()
    }

    /// Tells one remote executor (by its id on the wire) to exit, its removal not counted as a
    /// loss; whether it was registered.
    pub fn stop_executor(&mut self, executor_id: &str) -> bool {
        let Some((id, peer)) = self.executors.remote_by_name(executor_id) else {
            return false;
        };
        self.executors.retire(id, RemovalReason::Killed, false);
        self.send(peer, &Message::StopExecutor {});
        true
    }

    /// Drains a remote executor (by its id on the wire): the scheduler offers it nothing from
    /// now on while its running attempts go on (Spark's decommissioning; the lifecycle stops it
    /// once they end). Draining is its own state, apart from the suspicion of sick executors:
    /// it never ends. Whether it was registered.
    pub fn drain_executor(&mut self, executor_id: &str) -> bool {
        let Some((id, _)) = self.executors.remote_by_name(executor_id) else {
            return false;
        };
        let drained = self.scheduler.handle_drain(id);
        debug_assert!(drained, "a registered remote executor is in the scheduler");
        drained
    }

    /// Removes a remote executor (by its id on the wire) for `reason`, closing its connection;
    /// one removed lately still has an application-caused reason charged (see
    /// [`super::Driver::remove_executor`]).
    pub fn remove_executor(&mut self, executor_id: &str, reason: RemovalReason, now_us: u64) {
        self.advance(now_us);
        if let Some((id, peer)) = self.executors.remote_by_name(executor_id) {
            self.executors.retire(id, reason, true);
            self.close(peer, ConnError::Closed);
        } else if let Some(id) = self.executors.gone(executor_id) {
            // Already removed (its connection closed first): the scheduler charges a reason
            // that blames the application to the attempts it held then.
            tracing::info!(%executor_id, "late exit reason: {reason}");
            self.scheduler.handle_remove(id, reason, self.now_us);
        }
        self.pump();
    }

    /// The driver stops: every peer is told (`Shutdown`, to poll and flush) and every job
    /// fails with that reason (outcomes in [`DriverCore::poll_event`]).
    pub fn shutdown(&mut self) {
        let peers: Vec<PeerId> = self.peers.keys().collect();
        for peer in peers {
            self.send(peer, &Message::Shutdown {});
        }
        self.jobs.clear_deadlines();
        let active: Vec<(JobId, JobToken)> = self.scheduler.active_job_tokens().collect();
        for (id, token) in active {
            let reason = "the driver stopped".to_owned();
            let outcome = scheduler::JobOutcome::Failed(vec![reason]);
            self.jobs.end(id, token, outcome);
        }
    }

    // ----- views -----

    /// The backlog and the remote executors.
    pub fn executors_view(&self) -> ExecutorsView {
        views::executors(&self.scheduler, &self.executors)
    }

    /// The executors that get less work or none (stalled, suspected, on probation).
    pub fn executor_health(&self) -> ExecutorHealth {
        views::health(&self.scheduler, &self.executors)
    }

    /// What the driver shows at `now_us` (metrics, web UI).
    pub fn observe(&self, now_us: u64) -> DriverView {
        views::driver(&self.scheduler, &self.executors, &self.telemetry, now_us)
    }

    // ----- outputs -----

    /// The next peer with frames to send, and the frames (append them to its connection).
    pub fn poll_transmit(&mut self) -> Option<(PeerId, BytesMut)> {
        self.peers.poll_transmit()
    }

    /// Hands back a buffer once its frames are on their connection (see
    /// [`Peers::recycle`](crate::transport::Peers::recycle)): the peer's next frames reuse it.
    pub fn recycle_transmit(&mut self, peer: PeerId, spare: BytesMut) {
        self.peers.recycle(peer, spare);
    }

    /// The next peer to close, and why: the IO layer writes what it has for it (drain
    /// [`DriverCore::poll_transmit`] first), then drops it. The core has forgotten it.
    pub fn poll_close(&mut self) -> Option<(PeerId, ConnError)> {
        self.peers.poll_close()
    }

    /// The next thing the in-process executor is to do.
    pub fn poll_local(&mut self) -> Option<LocalCommand> {
        self.local.pop_front()
    }

    /// The records and payloads of a big job that ended, for the IO layer to free off the
    /// loop ([`scheduler::Scheduler::poll_remains`]).
    pub fn poll_remains(&mut self) -> Option<scheduler::Remains> {
        self.scheduler.poll_remains()
    }

    /// The next task result or job outcome for the callers' side: refusals of submissions
    /// first, then what the scheduler decided, in the order it did (a job's results before its
    /// outcome). They wait in the scheduler until asked for, so each is queued once. Each
    /// comes with the token its job was submitted with.
    pub fn poll_event(&mut self) -> Option<(Event, JobToken)> {
        if let Some(event) = self.jobs.poll_event() {
            return Some(event);
        }
        let event = self.scheduler.poll_event_with_token()?;
        debug_assert!(
            self.events_counted > 0,
            "an event is counted before it leaves"
        );
        self.events_counted = self.events_counted.saturating_sub(1);
        Some(event)
    }

    /// When [`DriverCore::handle_timeout`] is next due (on the callers' clock): the earliest of
    /// the scheduler's own timeout, the peers' deadlines (heartbeat, handshake, client idle),
    /// the jobs' deadlines and, while jobs are active, the stall checks. `None` while nothing
    /// is pending.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        let jobs_active = self.scheduler.active_jobs() > 0;
        let scheduler = &self.scheduler;
        let job_deadline = self.jobs.next_deadline(|id| scheduler.is_active(id));
        clock::earliest(&[
            self.scheduler_deadline(),
            self.peers.poll_timeout(),
            job_deadline,
            self.health.poll_timeout(jobs_active),
        ])
    }

    /// The scheduler's timeout, asked again after inputs came (O(log jobs)), no earlier than
    /// [`TICK_GAP_MIN_US`] after the last tick.
    fn scheduler_deadline(&mut self) -> Option<u64> {
        let timeout = &mut self.scheduler_timeout;
        if timeout.stale {
            let gap_us = self.last_tick_us.saturating_add(TICK_GAP_MIN_US);
            timeout.deadline_us = self.scheduler.poll_timeout().map(|t| t.max(gap_us));
            timeout.stale = false;
        }
        timeout.deadline_us
    }

    /// Time passed: ticks the scheduler when it asked, fails jobs past their deadline, drops
    /// peers past theirs, checks for stalls.
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.advance(now_us);
        let now = self.now_us;
        if self.scheduler.poll_timeout().is_some_and(|t| t <= now) {
            self.scheduler.handle_timeout(now);
            self.last_tick_us = now;
        }
        while let Some(id) = (self.jobs).due(now, |id| self.scheduler.is_active(id)) {
            let reason = format!("job {} failed: its deadline passed", id.0);
            self.scheduler.handle_fail(id, &reason, now);
        }
        self.peers.handle_timeout(now);
        self.forget_gone();
        let (executors, jobs_active) = (&self.executors, self.scheduler.active_jobs() > 0);
        self.health
            .handle_timeout(now, jobs_active, &self.scheduler, |id| {
                executors.name_of(id)
            });
        self.pump();
        let scheduler = &self.scheduler;
        let next = self.jobs.next_deadline(|id| scheduler.is_active(id));
        debug_assert!(next.is_none_or(|at| at > now));
    }

    // ----- internals -----

    /// Carries out everything the scheduler decided: launches and kills to their executors,
    /// results and outcomes to the events for the callers' side.
    fn pump(&mut self) {
        if self.telemetry.point_due(self.now_us) {
            views::take_point(&self.scheduler, &mut self.telemetry, self.now_us);
        }
        // Carrying an output out gives the scheduler no input, so no new output comes of it.
        while let Some(output) = self.scheduler.poll_command() {
            self.carry_out(output);
        }
        self.count_events();
        self.check();
    }

    /// Tells the telemetry of the results and outcomes the scheduler decided since the last
    /// call; they wait in the scheduler for [`DriverCore::poll_event`].
    fn count_events(&mut self) {
        // The telemetry through one reference and the count as `fold`'s accumulator (in a
        // register): in a loop writing through the box, both were loaded and stored again for
        // every event. `fold` walks the events' queue half by half, not checking at every step
        // which half it is in.
        let (telemetry, now_us) = (&mut *self.telemetry, self.now_us);
        let events = self.scheduler.pending_events(self.events_counted);
        let counted = events.fold(0, |counted, event| {
            match event {
                Event::TaskResult { task, .. } => telemetry.task_done(task.job()),
                Event::JobOutcome { job, outcome } => {
                    telemetry.job_over(now_us, *job, JobEnd::of(outcome));
                }
                Event::OneTaskJobSucceeded { task, .. } => {
                    telemetry.one_task_job_succeeded(now_us, task.job());
                }
            }
            counted + 1
        });
        self.events_counted += counted;
    }

    /// What must hold after every input (debug builds and the simulators, which run with
    /// assertions on): the peer table within its bounds; every lane the core routes to is a
    /// peer in that executor's phase, and every executor peer is a joined lane of a registered
    /// executor (never a lane of one that left); the scheduler knows exactly the executors the
    /// core does. O(peers + executors).
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        self.peers.check();
        assert_eq!(
            self.executors.live(),
            self.scheduler.executors(),
            "executors"
        );
        for peer in self.peers.keys() {
            let Some(&Phase::Executor(id, lane)) = self.peers.state(peer) else {
                continue;
            };
            let joined = match self.executors.link(id) {
                Some(ExecutorLink::Remote(remote)) => {
                    remote.lanes.get(lane as usize).map(|l| l.peer)
                }
                _ => None,
            };
            assert_eq!(joined, Some(Some(peer)), "executor {} lane {lane}", id.0);
        }
        for (_, id) in self.executors.remotes() {
            let Some(ExecutorLink::Remote(remote)) = self.executors.link(id) else {
                panic!("executor {} named but not linked", id.0);
            };
            for (lane, slot) in remote.lanes.iter().enumerate() {
                if let Some(peer) = slot.peer {
                    let phase = self.peers.state(peer);
                    let held = matches!(phase, Some(&Phase::Executor(i, l)) if i == id && l as usize == lane);
                    assert!(held, "lane {lane} of executor {} is not its peer", id.0);
                }
            }
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Launch { executor, tasks } => self.launch(executor, tasks),
            Output::Kill {
                executor,
                task,
                attempt,
                reason,
            } => self.kill(executor, Attempt::new(task, attempt), &reason),
            Output::Event(_) => unreachable!("results and outcomes wait for poll_event"),
        }
    }

    /// A kill of `attempt` to the lane of `executor` that holds it (or the local runner).
    fn kill(&mut self, executor: ExecutorId, attempt: Attempt, reason: &str) {
        match self.executors.link(executor) {
            Some(ExecutorLink::Remote(remote)) => {
                let Some(peer) = remote.peer_of(attempt) else {
                    return;
                };
                self.telemetry.kill_sent(self.now_us, attempt);
                let kill = Message::KillTask {
                    task_id: attempt.task.0,
                    attempt: attempt.attempt,
                    reason,
                };
                self.send(peer, &kill);
            }
            Some(ExecutorLink::Local) => self.local.push_back(LocalCommand::Kill(attempt)),
            None => {}
        }
    }

    fn launch(&mut self, executor: ExecutorId, mut tasks: Vec<TaskLaunch>) {
        let now = self.now_us;
        match self.executors.link_mut(executor) {
            Some(ExecutorLink::Remote(remote)) => {
                let frame_size_max = self.config.frame_size_max;
                let mut lanes = std::mem::take(&mut self.scratch.lanes);
                if !remote.route_all(&tasks, now, &mut lanes) {
                    // One lane: every task goes to it, with no lane to look up per task.
                    for task in &tasks {
                        self.telemetry.launched(now, task, executor, || 0);
                    }
                    let (peers, slot) = (&mut self.peers, &mut remote.lanes[0]);
                    write_launches(peers, slot, tasks.iter(), executor, frame_size_max);
                } else {
                    for (task, &lane) in tasks.iter().zip(&lanes) {
                        self.telemetry.launched(now, task, executor, || lane);
                    }
                    for (lane, slot) in (0u32..).zip(remote.lanes.iter_mut()) {
                        let routed = (tasks.iter().zip(&lanes))
                            .filter(|(_, l)| **l == lane)
                            .map(|(task, _)| task);
                        write_launches(&mut self.peers, slot, routed, executor, frame_size_max);
                    }
                }
                self.scratch.lanes = lanes;
            }
            Some(ExecutorLink::Local) => {
                for task in tasks.drain(..) {
                    self.telemetry.launched(now, &task, executor, || 0);
                    self.local.push_back(LocalCommand::Launch(task));
                }
            }
            None => tracing::error!(
                executor = executor.0,
                "launch for an unknown executor dropped"
            ),
        }
        self.scheduler.recycle_launches(tasks);
    }

    /// Encodes a message for a peer.
    fn send(&mut self, peer: PeerId, message: &Message<'_>) {
        self.peers.send(peer, message);
    }

    /// Closes a peer: its last frames go out, then the IO layer drops it.
    fn close(&mut self, peer: PeerId, why: ConnError) {
        if self.peers.contains(peer) {
            let phase = self.peers.state(peer).copied();
            self.forget(phase, &why);
            self.peers.close(peer, why);
        }
    }

    /// Forgets the peers the table closed itself (evicted, expired).
    fn forget_gone(&mut self) {
        while let Some((_, phase, why)) = self.peers.poll_gone() {
            self.forget(Some(phase), &why);
        }
    }

    /// A peer removed from the table (`None`: in the handshake): an executor leaves the
    /// scheduler.
    fn forget(&mut self, phase: Option<Phase>, why: &ConnError) {
        if let Some(Phase::Executor(id, lane)) = phase {
            self.lose_lane(id, lane, why);
        } else if !matches!(why, ConnError::Closed) {
            tracing::warn!("dropped a connection: {why}");
        }
    }

    /// Lane `lane` of executor `id` is gone: the executor goes with it (fate-sharing), its
    /// other lanes closed, the reason naming the lane when it has more than one.
    fn lose_lane(&mut self, id: ExecutorId, lane: u32, why: &ConnError) {
        let Some(remote) = self.executors.take_remote(id) else {
            // Its removal already closed this lane.
            return;
        };
        let named = (remote.is_laned()).then(|| ConnError::Protocol(format!("lane {lane}: {why}")));
        let why = named.as_ref().unwrap_or(why);
        for (other, slot) in remote.lanes.iter().enumerate() {
            if let Some(peer) = slot.peer.filter(|_| other != lane as usize) {
                let reason = format!("its executor is lost: {why}");
                self.peers.close(peer, ConnError::Protocol(reason));
            }
        }
        self.depart(id, why);
    }

    /// Executor `id` leaves the scheduler (its lanes are closed already).
    fn depart(&mut self, id: ExecutorId, why: &ConnError) {
        let why = why.to_string();
        let Departure {
            executor_id,
            reason,
            how,
            lost,
        } = self.executors.depart(id, &why, self.stopping);
        let shown = match how {
            How::Retired => {
                tracing::info!(%executor_id, "executor removed: {reason}");
                reason.to_string()
            }
            How::Stopped => {
                tracing::info!(%executor_id, "executor stopped");
                "stopped".to_owned()
            }
            How::Lost => {
                tracing::warn!(%executor_id, "executor lost: {why}");
                why
            }
        };
        (self.telemetry).executor_removed(self.now_us, id, &shown, lost);
        self.scheduler.handle_remove(id, reason, self.now_us);
        debug_assert!(self.executors.link(id).is_none());
    }
}

/// Micros in a duration, saturating.
pub(crate) fn us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Writes the launches routed to a lane into its connection's output, each function defined
/// ahead of the first launch that names it (nothing if none is routed or the lane has no
/// connection).
fn write_launches<'t>(
    peers: &mut Peers<PeerId, Phase>,
    slot: &mut Lane,
    routed: impl Iterator<Item = &'t TaskLaunch>,
    executor: ExecutorId,
    frame_size_max: usize,
) {
    let mut routed = routed.peekable();
    let out = match routed.peek() {
        Some(_) => slot.peer.and_then(|peer| peers.outbound(peer)),
        None => None,
    };
    let Some(out) = out else {
        return;
    };
    let mut launches = batch::Launches::new(frame_size_max);
    // Every task when the executor has one lane; at most that when the lane has a share.
    let (_, routed_max) = routed.size_hint();
    launches.reserve(out, routed_max.unwrap_or(0));
    for task in routed {
        let function = match slot.functions.index_of(&task.function) {
            Index::Known(index) => index,
            Index::New { index, .. } => {
                // The launches written so far go first: the new definition may take over an
                // index they name, and it cannot go inside their frame.
                send_launches(&mut launches, out, executor);
                let define = Message::DefineFunction {
                    index,
                    name: &task.function,
                };
                if let Err(error) = define.encode(out, frame_size_max) {
                    tracing::error!(executor = executor.0, "function not defined: {error}");
                }
                index
            }
        };
        let launch = wire::TaskLaunch {
            task_id: task.task.0,
            attempt: task.attempt,
            cores: task.cores,
            function,
            payload: &task.payload,
        };
        launches.push(out, &launch);
    }
    send_launches(&mut launches, out, executor);
}

/// Closes the open frame of a lane's launches (nothing if none is open), logging a launch that
/// was not sent.
fn send_launches(launches: &mut batch::Launches, out: &mut BytesMut, executor: ExecutorId) {
    // Payloads are bounded below a frame (`Driver::start`), so this fits.
    if let Err(error) = launches.finish(out) {
        tracing::error!(executor = executor.0, "launch not sent: {error}");
    }
}
