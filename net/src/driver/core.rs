//! The driver's protocol state, sans IO (in the style of quinn-proto): every peer's phase,
//! the executors, the [`Scheduler`], the jobs and their deadlines, the stall warnings. No
//! sockets, no threads, no clock: every input carries `now_us` (micros on a clock the caller
//! chooses, never going back), and the outputs wait to be polled.
//!
//! Inputs: [`DriverCore::handle_connected`], [`DriverCore::handle_frame`],
//! [`DriverCore::handle_closed`], [`DriverCore::handle_local_completions`],
//! [`DriverCore::handle_timeout`], [`DriverCore::submit`], [`DriverCore::cancel`] and the
//! requests of [`super::DriverMsg`]. Outputs: [`DriverCore::poll_transmit`] (encoded frames for
//! a peer), [`DriverCore::poll_close`] (a peer to close once its frames are written: drain
//! `poll_transmit` first), [`DriverCore::poll_local`] (what the in-process executor is to run
//! or kill) and [`DriverCore::poll_timeout`] (when to call `handle_timeout`; `None` while
//! nothing is pending, so an idle driver never wakes). Job results and outcomes go straight to
//! each job's [`JobShared`], as the caller's handles expect.
//!
//! The handshake, the table limits and the peers' deadlines run in here, in the transport's
//! sans-IO peer table ([`Peers`], which the master shares): the IO layer passes raw frames and
//! a fresh nonce per connection, so a simulation covers authentication, registration,
//! heartbeats and expiry with the same code as the real driver.
//!
//! An executor that heartbeats but does not read its socket holds what it was sent for as
//! long as the kernel's buffers take the launches (the IO layer's write-stuck check never
//! fires), so the core compares each heartbeat's running count with what the executor must
//! know of: the attempts it reported RUNNING and not final, plus those launched more than
//! `heartbeat_timeout` ago and never reported at all (an honest executor reads a launch well
//! within that, and sends the reports of the attempts it no longer counts ahead of the
//! heartbeat). Two heartbeats in a row reporting fewer, with at least one such old unreported
//! launch, and the executor is lost with the reason ("executor does not read its launches: N
//! attempts sent over T s ago, it reports M running"): its attempts are launched elsewhere.
//! An executor that reads its launches but runs them late (a busy pool) counts them in its
//! heartbeats and is never taken for one.
//!
//! Lanes: an executor of several cores registers on its lane 0 with `lanes` (1 to
//! [`LANES_MAX`], no more than its cores) and is given a random lane key; its other lanes
//! connect, pass the same handshake and join with `JoinLane` (executor id, lane, key), refused
//! with the reason for an unknown executor, a wrong key, a lane out of range or one joined
//! already, without touching the executor. The scheduler sees one executor; each launch goes to
//! the joined lane holding the fewest attempts (launches start as soon as lane 0 is
//! registered), a kill to the lane holding the attempt, and status updates are taken from any
//! lane of the executor (the scheduler ignores those about attempts it did not send there).
//! Each lane heartbeats on its own connection, is expired on its own deadline and is checked
//! against what it holds (the rule above, per lane). Fate-sharing: any lane lost (closed,
//! expired, not reading) loses the whole executor, the reason naming the lane, and its other
//! lanes are closed. Every lane counts against `connections_max` like any connection.
//!
//! Peers have small tables of their own: at most [`HANDSHAKES_MAX`] unauthenticated ones and
//! [`CLIENTS_MAX`] status clients (the oldest goes when another arrives), so executors always
//! find room under `connections_max`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use flint_engine::hash::FxHashMap;
use flint_engine::runtime::Reply;
use flint_engine::scheduler::{
    self, ExecutorId, ExecutorInfo, JobId, Output, RemovalReason, Scheduler, TaskId, TaskLaunch,
};

use super::{
    Counters, DriverConfig, ExecutorsView, PublishedStats, EXECUTOR_CORES_MAX, LANES_MAX,
    TASKS_PER_CORE_MAX, WARN_INTERVAL,
};
use crate::admission::Admission;
use crate::conn::{ConnError, Inbound};
use crate::job::{Job, JobShared, ResultObserver};
use crate::observe::{DriverView, Ended, LoopTelemetry, Refusal};
use crate::transport::peers::{Arrival, Limits, Peers, PeersConfig, Standing};
use crate::transport::unexpected;
use crate::wire::{self, batch, Frame, KeyValue, List, Message, Role};
use flint_engine::runner::TaskReport;

/// A peer connection as the IO layer names it: any number it does not reuse while the core
/// knows the peer (from `handle_connected` until `handle_closed` or `poll_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u64);

/// What the in-process executor (local mode) is to do: the IO layer hands it to its runner.
#[derive(Debug)]
pub enum LocalCommand {
    /// Run this attempt.
    Launch(TaskLaunch),
    /// Kill this attempt if it still runs.
    Kill {
        /// The task.
        task: TaskId,
        /// The attempt.
        attempt: u32,
    },
}

/// Connections still in the handshake (unauthenticated) held at once; the oldest goes when
/// another arrives.
pub const HANDSHAKES_MAX: usize = 256;
/// Client connections (`Role::Client`) held at once; the oldest goes when another arrives.
pub const CLIENTS_MAX: usize = 64;
/// A client connection silent this long is closed.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Removed executors whose ids the driver keeps for late exit reasons.
const GONE_IDS_MAX: usize = 1024;
/// Callers waiting for executors at once, at most.
const EXECUTOR_WAITERS_MAX: usize = 4096;
/// How often the driver looks for stalls while jobs are active (the checks scan executors).
const HEALTH_INTERVAL_US: u64 = 100_000;
/// The least time between two scheduler ticks, whatever the scheduler asks.
const TICK_GAP_MIN_US: u64 = 1_000;

/// The local executor's id.
pub const LOCAL_EXECUTOR: ExecutorId = ExecutorId(0);

/// Where an executor's launches go.
enum Link {
    Remote(Remote),
    Local,
}

/// Where a peer past the handshake is in the driver's protocol.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Registering,
    /// One lane of a registered executor (lane 0 registered it).
    Executor(ExecutorId, u32),
    Client,
}

/// The watch for stalls (see the module docs of [`super`]).
#[derive(Default)]
struct Health {
    next_check_us: u64,
    /// Since when tasks have waited with no executor able to run them.
    starved_since_us: Option<u64>,
    next_starved_warning_us: u64,
    next_stalled_warning_us: u64,
}

/// The scheduler's own timeout, asked again after inputs came (O(log jobs) each time).
#[derive(Default)]
struct SchedulerTimeout {
    deadline_us: Option<u64>,
    /// Inputs arrived since it was asked.
    stale: bool,
}

/// A remote executor: its lanes (connections) and what the driver launched on each and has
/// not heard end.
struct Remote {
    /// Lane `i`'s connection and counts; lane 0 registered, the others are `None` until they
    /// join. At most [`LANES_MAX`].
    lanes: Vec<Lane>,
    /// What the other lanes show to join.
    lane_key: [u8; 32],
    /// What was launched and not reported final (see [`Sent`]).
    sent: Sent,
}

/// One lane of a remote executor.
#[derive(Default)]
struct Lane {
    /// Its connection, once joined.
    peer: Option<PeerId>,
    /// Attempts launched on it and not reported final: launches go to the joined lane with
    /// the fewest.
    held: u32,
    /// Attempts launched on it in all (the driver's view shows them).
    launched: u64,
    /// Its last heartbeat reported fewer attempts than it must know of.
    suspect: bool,
}

impl Remote {
    fn new(lanes: u32, lane_key: [u8; 32], lane0: PeerId) -> Remote {
        let mut lanes: Vec<Lane> = (0..lanes.max(1)).map(|_| Lane::default()).collect();
        lanes[0].peer = Some(lane0);
        Remote {
            lanes,
            lane_key,
            sent: Sent::default(),
        }
    }

    /// The joined lane with the fewest attempts held (lane 0 is always joined).
    fn route(&self) -> u32 {
        let joined = self
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, l)| l.peer.is_some());
        joined
            .min_by_key(|(_, l)| l.held)
            .map_or(0, |(i, _)| i as u32)
    }

    /// Attempt `key` goes to `lane` at `now_us`.
    fn launched(&mut self, key: (TaskId, u32), lane: u32, now_us: u64) {
        if let Some(old) = self.sent.attempts.insert(key, (now_us, false, lane)) {
            // Relaunched while held (the scheduler does not): count it once.
            self.lane_mut(old.2).held -= 1;
        }
        let lane = self.lane_mut(lane);
        lane.held += 1;
        lane.launched += 1;
    }

    /// An executor's report on one of its attempts, from any of its lanes.
    fn reported(&mut self, key: (TaskId, u32), state: wire::TaskState) {
        if let Some(lane) = self.sent.reported(key, state) {
            self.lane_mut(lane).held -= 1;
        }
    }

    /// The connection holding attempt `key` (lane 0's if the attempt is not known).
    fn peer_of(&self, key: (TaskId, u32)) -> Option<PeerId> {
        let lane = self.sent.attempts.get(&key).map_or(0, |a| a.2);
        self.lanes.get(lane as usize).and_then(|l| l.peer)
    }

    /// Lets `peer` in as lane `lane` if it shows the key and the lane is free; why not
    /// otherwise.
    fn admit(&mut self, peer: PeerId, lane: u32, lane_key: &[u8; 32]) -> Result<(), String> {
        // An executor of one lane has the zero key and no lane to join.
        if !self.is_laned() || !eq_const_time(&self.lane_key, lane_key) {
            return Err("wrong lane key".into());
        }
        let lanes = self.lanes.len();
        match self.lanes.get_mut(lane as usize) {
            Some(slot) if lane > 0 && slot.peer.is_none() => {
                slot.peer = Some(peer);
                Ok(())
            }
            Some(_) if lane > 0 => Err(format!("lane {lane} has joined already")),
            _ => Err(format!(
                "lane {lane} out of range: the executor registered {lanes} lanes (lane 0 \
                 registers, 1 to {} join)",
                lanes - 1
            )),
        }
    }

    /// Lane 0's connection (the one that registered).
    fn lane0(&self) -> Option<PeerId> {
        self.lanes[0].peer
    }

    /// Whether the executor has more than one lane (its loss reasons name the lane).
    fn is_laned(&self) -> bool {
        self.lanes.len() > 1
    }

    fn lane_mut(&mut self, lane: u32) -> &mut Lane {
        &mut self.lanes[lane as usize]
    }
}

/// What the driver launched on a remote executor's lanes and has not heard end: to tell a
/// lane that does not read its launches (see the module docs).
#[derive(Default)]
struct Sent {
    /// Attempts launched and not reported final: when each was launched, whether the
    /// executor reported it RUNNING, and the lane it went to. At most the executor's slots
    /// (the scheduler launches no more than it frees with final reports).
    attempts: FxHashMap<(TaskId, u32), (u64, bool, u32)>,
}

impl Sent {
    /// Lane `lane`'s heartbeat saying it runs `running` attempts at `now_us` (`suspect`: the
    /// lane's last heartbeat showed too few): why it does not read its launches, when this is
    /// the second heartbeat in a row to show it (see the module docs).
    fn heartbeat(
        &self,
        lane: u32,
        suspect: &mut bool,
        running: u32,
        now_us: u64,
        timeout_us: u64,
    ) -> Option<String> {
        let (mut reported, mut unread) = (0u64, 0u64);
        for &(launched_us, running_reported, on) in self.attempts.values() {
            if on != lane {
                continue;
            }
            if running_reported {
                reported += 1;
            } else if launched_us.saturating_add(timeout_us) <= now_us {
                unread += 1;
            }
        }
        let known = reported + unread;
        let now_suspect = unread > 0 && u64::from(running) < known;
        if !std::mem::replace(suspect, now_suspect) || !now_suspect {
            return None;
        }
        let timeout_s = Duration::from_micros(timeout_us).as_secs_f64();
        Some(format!(
            "executor does not read its launches: {unread} attempts sent over {timeout_s} s ago, \
             it reports {running} running (it must hold at least {known})"
        ))
    }

    /// A report on one attempt: the lane that held it, when it is final and was held.
    fn reported(&mut self, key: (TaskId, u32), state: wire::TaskState) -> Option<u32> {
        if state == wire::TaskState::Running {
            if let Some((_, running_reported, _)) = self.attempts.get_mut(&key) {
                *running_reported = true;
            }
            None
        } else {
            self.attempts.remove(&key).map(|(_, _, lane)| lane)
        }
    }
}

struct JobEntry {
    shared: Arc<JobShared>,
    observer: Option<ResultObserver>,
    /// Tasks in the job, given back to admission when it ends.
    tasks: usize,
}

/// The driver's state machine (see the module docs).
pub struct DriverCore {
    config: DriverConfig,
    scheduler: Scheduler,
    peers: Peers<PeerId, Phase>,
    /// Executor ids on the wire, for refusing duplicates (peer-chosen strings: SipHash).
    executor_ids: HashMap<String, ExecutorId>,
    /// Where each executor's launches go: its lanes, or the local runner.
    links: FxHashMap<ExecutorId, Link>,
    next_executor: u64,
    stopping: bool,
    /// Executors being stopped or removed for a known reason: the reason their removal gets,
    /// and whether it counts as a loss (a cluster manager's report does, a stop does not).
    retiring: FxHashMap<ExecutorId, (RemovalReason, bool)>,
    /// Executors removed lately (newest last, at most [`GONE_IDS_MAX`]) by their id on the
    /// wire, so a cluster manager's later exit reason still reaches the scheduler.
    gone: VecDeque<(String, ExecutorId)>,
    jobs: FxHashMap<JobId, JobEntry>,
    /// Jobs' deadlines, earliest first.
    deadlines: BinaryHeap<Reverse<(u64, JobId)>>,
    /// Callers waiting for a number of executors.
    executor_waiters: Vec<(usize, Reply<()>)>,
    health: Health,
    /// What the driver shows ([`crate::observe`]).
    telemetry: Box<LoopTelemetry>,
    counters: Arc<Counters>,
    admission: Arc<Admission>,
    stats: Arc<PublishedStats>,
    outputs: Vec<Output>,
    local: VecDeque<LocalCommand>,
    /// The latest input's time.
    now_us: u64,
    scheduler_timeout: SchedulerTimeout,
    last_tick_us: u64,
}

impl DriverCore {
    /// A driver with no peers and no jobs. `admission` is shared with the callers' side;
    /// `telemetry` is what the driver shows.
    pub fn new(
        config: DriverConfig,
        telemetry: Box<LoopTelemetry>,
        admission: Arc<Admission>,
    ) -> DriverCore {
        DriverCore {
            scheduler: Scheduler::new(config.scheduler.clone()),
            peers: Peers::new(peers_config(&config)),
            config,
            executor_ids: HashMap::new(),
            links: FxHashMap::default(),
            next_executor: 1,
            stopping: false,
            retiring: FxHashMap::default(),
            gone: VecDeque::new(),
            jobs: FxHashMap::default(),
            deadlines: BinaryHeap::new(),
            executor_waiters: Vec::new(),
            health: Health::default(),
            telemetry,
            counters: Arc::new(Counters::default()),
            admission,
            stats: Arc::new(PublishedStats::default()),
            outputs: Vec::new(),
            local: VecDeque::new(),
            now_us: 0,
            scheduler_timeout: SchedulerTimeout::default(),
            last_tick_us: 0,
        }
    }

    /// The counters a [`super::Driver`] reads.
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The scheduler's counters as published after every input.
    pub(crate) fn published_stats(&self) -> Arc<PublishedStats> {
        self.stats.clone()
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
            self.telemetry.refused(Refusal::TableFull);
        }
        self.forget_gone();
        result
    }

    /// Why a connection arriving now would be refused (the table is full of executors), if it
    /// would: the IO layer tells the newcomer before setting it up. Counted as a refusal.
    pub fn refusal(&mut self) -> Option<String> {
        let refusal = self.peers.refusal();
        if refusal.is_some() {
            self.telemetry.refused(Refusal::TableFull);
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
                self.telemetry.refused(Refusal::Handshake);
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
    }

    /// One frame from a peer past the handshake, by its phase.
    fn on_frame(&mut self, peer: PeerId, frame: &Frame) -> Result<(), ConnError> {
        let Some(&phase) = self.peers.state(peer) else {
            return Ok(());
        };
        let message = frame.message()?;
        let now = self.now_us;
        match (phase, message) {
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
                    attributes,
                };
                let executor = self
                    .register(peer, registration)
                    .inspect_err(|_| self.telemetry.refused(Refusal::Registration))?;
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
                    .inspect_err(|_| self.telemetry.refused(Refusal::Registration))?;
                self.open_lane(peer, executor, lane);
                Ok(())
            }
            (Phase::Executor(executor, _), Message::StatusUpdates { updates }) => {
                self.status_updates(executor, updates, frame);
                Ok(())
            }
            (Phase::Executor(executor, lane), Message::Heartbeat { running_tasks, .. }) => {
                let timeout_us = us(self.config.heartbeat_timeout);
                if let Some(Link::Remote(remote)) = self.links.get_mut(&executor) {
                    let Remote { lanes, sent, .. } = remote;
                    let suspect = &mut lanes[lane as usize].suspect;
                    if let Some(why) = sent.heartbeat(lane, suspect, running_tasks, now, timeout_us)
                    {
                        return Err(ConnError::Protocol(why));
                    }
                }
                self.send(peer, &Message::HeartbeatAck {});
                Ok(())
            }
            (Phase::Executor(..) | Phase::Client, Message::Shutdown {}) => Err(ConnError::Closed),
            (_, other) => Err(ConnError::Protocol(unexpected(&other, "this peer"))),
        }
    }

    /// An executor's batch of status updates, to the scheduler.
    fn status_updates(
        &mut self,
        executor: ExecutorId,
        updates: List<'_, wire::StatusUpdate<'_>>,
        frame: &Frame,
    ) {
        let now = self.now_us;
        let mut remote = match self.links.get_mut(&executor) {
            Some(Link::Remote(remote)) => Some(remote),
            _ => None,
        };
        for update in updates {
            let task = TaskId(update.task_id);
            let (attempt, state) = (update.attempt, update.state);
            if let Some(remote) = remote.as_deref_mut() {
                remote.reported((task, attempt), state);
            }
            self.telemetry
                .status_update(now, executor, task, attempt, state, update.data);
            let update = scheduler::StatusUpdate {
                executor,
                task,
                attempt,
                state,
                // A result outlives its frame: a small one is copied out so it does not keep
                // the whole frame alive.
                data: frame.retain(update.data),
            };
            self.scheduler.status_update(now, update);
        }
    }

    fn register(&mut self, peer: PeerId, r: Registration<'_>) -> Result<ExecutorId, ConnError> {
        let Registration {
            executor_id,
            host,
            cores,
            lanes,
            attributes,
        } = r;
        let refuse = |peers: &mut Peers<PeerId, Phase>, reason: String| {
            tracing::warn!(executor_id, "registration refused: {reason}");
            peers.send(peer, &Message::RegisterExecutorFailed { reason: &reason });
            Err(ConnError::Protocol(format!(
                "registration refused: {reason}"
            )))
        };
        if self.stopping {
            return refuse(&mut self.peers, "the driver is stopping".into());
        }
        if cores > EXECUTOR_CORES_MAX {
            let reason =
                format!("executor claims {cores} cores; at most {EXECUTOR_CORES_MAX} are accepted");
            return refuse(&mut self.peers, reason);
        }
        if lanes == 0 || lanes > LANES_MAX || lanes > cores.max(1) {
            let reason = format!(
                "executor claims {lanes} lanes; from 1 to {LANES_MAX} are accepted, and no more \
                 than its {cores} cores"
            );
            return refuse(&mut self.peers, reason);
        }
        if self.executor_ids.contains_key(executor_id) {
            return refuse(
                &mut self.peers,
                format!("duplicate executor id {executor_id:?}"),
            );
        }
        // An executor of one lane has no lane to admit: no key (no lane of it joins, see
        // `Remote::admit`).
        let lane_key = if lanes > 1 {
            match crate::handshake::random_nonce() {
                Ok(key) => key,
                Err(error) => return refuse(&mut self.peers, format!("no lane key: {error}")),
            }
        } else {
            [0; 32]
        };
        let id = ExecutorId(self.next_executor);
        let info = ExecutorInfo {
            id,
            host: host.to_owned(),
            cores: cores.saturating_mul(self.tasks_per_core()),
            attributes: attributes
                .iter()
                .map(|kv| (kv.key.to_owned(), kv.value.to_owned()))
                .collect(),
        };
        if let Err(refusal) = self.scheduler.register_executor(self.now_us, info) {
            return refuse(&mut self.peers, refusal.to_string());
        }
        self.next_executor += 1;
        self.executor_ids.insert(executor_id.to_owned(), id);
        self.links
            .insert(id, Link::Remote(Remote::new(lanes, lane_key, peer)));
        self.counters
            .executors_registered
            .fetch_add(1, Ordering::SeqCst);
        self.executor_added();
        let registered = Message::RegisteredExecutor {
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
            lane_key,
        };
        self.send(peer, &registered);
        tracing::info!(executor_id, host, cores, lanes, "executor registered");
        self.telemetry
            .executor_registered(id, executor_id, host, cores);
        Ok(id)
    }

    /// A lane of a registered executor asks to join (see the module docs): its executor, or
    /// the refusal (told to the peer, whose connection closes).
    fn join_lane(
        &mut self,
        peer: PeerId,
        executor_id: &str,
        lane: u32,
        lane_key: &[u8; 32],
    ) -> Result<ExecutorId, ConnError> {
        let id = self.executor_ids.get(executor_id).copied();
        let remote = match id.and_then(|id| self.links.get_mut(&id)) {
            Some(Link::Remote(remote)) => Some(remote),
            _ => None,
        };
        let admitted = match remote {
            None => Err(format!("no executor {executor_id:?} is registered")),
            Some(remote) => remote.admit(peer, lane, lane_key),
        };
        if let Err(reason) = admitted {
            tracing::warn!(executor_id, lane, "lane refused: {reason}");
            self.peers
                .send(peer, &Message::RegisterExecutorFailed { reason: &reason });
            return Err(ConnError::Protocol(format!("lane refused: {reason}")));
        }
        let joined = Message::LaneJoined {
            heartbeat_interval_ms: self.heartbeat_interval_ms(),
        };
        self.send(peer, &joined);
        tracing::info!(executor_id, lane, "executor lane joined");
        Ok(id.unwrap_or_else(|| unreachable!("joined a registered executor")))
    }

    /// A registered lane: a member of the peer table, its heartbeats due.
    fn open_lane(&mut self, peer: PeerId, executor: ExecutorId, lane: u32) {
        if let Some((phase, _)) = self.peers.open_mut(peer) {
            *phase = Phase::Executor(executor, lane);
        }
        self.peers.set_standing(peer, Standing::Member);
    }

    fn heartbeat_interval_ms(&self) -> u32 {
        u32::try_from(self.config.heartbeat_interval.as_millis()).unwrap_or(u32::MAX)
    }

    fn tasks_per_core(&self) -> u32 {
        self.config.tasks_per_core.clamp(1, TASKS_PER_CORE_MAX)
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
        match self.scheduler.register_executor(self.now_us, info) {
            Ok(()) => {
                self.links.insert(LOCAL_EXECUTOR, Link::Local);
                self.telemetry
                    .executor_registered(LOCAL_EXECUTOR, "local", "localhost", cores);
                self.executor_added();
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
        for report in reports.drain(..) {
            let (task, attempt, state) = (report.task, report.attempt, report.state);
            self.telemetry
                .status_update(now, LOCAL_EXECUTOR, task, attempt, state, &report.data);
            let update = report.into_update(LOCAL_EXECUTOR);
            self.scheduler.status_update(now, update);
        }
        self.pump();
    }

    fn executor_added(&mut self) {
        self.counters.executors.fetch_add(1, Ordering::SeqCst);
        self.answer_executor_waiters();
    }

    // ----- inputs: jobs and requests -----

    /// A job the caller admitted under `id`: into the scheduler, with its deadline noted.
    /// A job refused here (a malformed one, or cancelled already) ends at once through
    /// `shared`.
    pub fn submit(&mut self, id: JobId, job: Job, shared: Arc<JobShared>, now_us: u64) {
        self.advance(now_us);
        self.submit_inner(id, job, shared);
        self.pump();
    }

    fn submit_inner(&mut self, id: JobId, job: Job, shared: Arc<JobShared>) {
        let Job {
            function,
            payloads,
            cores,
            observer,
            keep_results,
            result_bytes_max,
            deadline,
            stream: _,
            scheduling,
        } = job;
        let n = payloads.len();
        let executor_ids = &self.executor_ids;
        let spec = crate::job::job_spec(
            function,
            payloads,
            cores,
            keep_results,
            result_bytes_max,
            *scheduling,
            |executor_id| executor_ids.get(executor_id).copied(),
        );
        let refused = |admission: &Admission, error: String| {
            admission.release(n);
            let reason = format!("job refused: {error}");
            shared.finish(scheduler::JobOutcome::Failed(vec![reason]));
        };
        let spec = match spec {
            Ok(spec) => spec,
            Err(error) => return refused(&self.admission, error.to_string()),
        };
        if shared.is_cancelled() {
            self.admission.release(n);
            shared.finish(scheduler::JobOutcome::Cancelled);
            return;
        }
        let now_us = self.now_us;
        // The function's name, shared with the job's tasks (a job of no tasks has none to show).
        let function: Arc<str> = match spec.tasks.first_function() {
            Some(function) => function.clone(),
            None => Arc::from(""),
        };
        self.telemetry
            .job_submitted(now_us, id, &function, n, &spec.pool);
        if self.jobs.is_empty() && self.health.starved_since_us.is_none() {
            // The first stall check one interval after work arrives.
            self.health.next_check_us = now_us.saturating_add(HEALTH_INTERVAL_US);
        }
        // The entry goes in first: the scheduler may end a job (no tasks, a payload over the
        // limit) within the call.
        let entry = JobEntry {
            shared: shared.clone(),
            observer,
            tasks: n,
        };
        self.jobs.insert(id, entry);
        if let Err(error) = self.scheduler.submit_job_with_id(now_us, id, spec) {
            self.jobs.remove(&id);
            return refused(&self.admission, error.to_string());
        }
        if let Some(deadline) = deadline {
            let at_us = now_us.saturating_add(us(deadline));
            self.deadlines.push(Reverse((at_us, id)));
        }
    }

    /// A caller cancelled a job.
    pub fn cancel(&mut self, job: JobId, now_us: u64) {
        self.advance(now_us);
        self.scheduler.cancel_job(self.now_us, job);
        self.pump();
    }

    /// Answers `reply` once at least `count` executors are registered (at once if they are).
    /// Waiters that gave up are forgotten; past [`EXECUTOR_WAITERS_MAX`] the asker hears
    /// `Stopped` at once (its reply is dropped).
    pub fn when_executors(&mut self, count: usize, reply: Reply<()>) {
        if self.counters.executors.load(Ordering::SeqCst) >= count {
            let _ = reply.send(());
            return;
        }
        self.executor_waiters.retain(|(_, r)| !r.is_abandoned());
        if self.executor_waiters.len() < EXECUTOR_WAITERS_MAX {
            self.executor_waiters.push((count, reply));
        }
    }

    /// Tells every remote executor to exit and refuses new registrations; how many were told.
    pub fn stop_executors(&mut self) -> usize {
        self.stopping = true;
        let peers: Vec<PeerId> = self.remote_peers().collect();
        for &peer in &peers {
            self.send(peer, &Message::StopExecutor {});
        }
        peers.len()
    }

    /// Tells one remote executor (by its id on the wire) to exit, its removal not counted as a
    /// loss; whether it was registered.
    pub fn stop_executor(&mut self, executor_id: &str) -> bool {
        let Some((id, peer)) = self.remote_by_id(executor_id) else {
            return false;
        };
        self.retiring.insert(id, (RemovalReason::Killed, false));
        self.send(peer, &Message::StopExecutor {});
        true
    }

    /// Removes a remote executor (by its id on the wire) for `reason`, closing its connection;
    /// one removed lately still has an application-caused reason charged (see
    /// [`super::Driver::remove_executor`]).
    pub fn remove_executor(&mut self, executor_id: &str, reason: RemovalReason, now_us: u64) {
        self.advance(now_us);
        if let Some((id, peer)) = self.remote_by_id(executor_id) {
            self.retiring.insert(id, (reason, true));
            self.close(peer, ConnError::Closed);
        } else if let Some(&(_, id)) = self.gone.iter().rev().find(|(n, _)| *n == executor_id) {
            // Already removed (its connection closed first): the scheduler charges a reason
            // that blames the application to the attempts it held then.
            tracing::info!(%executor_id, "late exit reason: {reason}");
            self.scheduler.remove_executor(self.now_us, id, reason);
        }
        self.pump();
    }

    /// The driver stops: every peer is told (`Shutdown`, to poll and flush) and every job
    /// fails with that reason.
    pub fn shutdown(&mut self) {
        let peers: Vec<PeerId> = self.peers.keys().collect();
        for peer in peers {
            self.send(peer, &Message::Shutdown {});
        }
        for (_, entry) in self.jobs.drain() {
            self.admission.release(entry.tasks);
            let reason = "the driver stopped".to_owned();
            entry
                .shared
                .finish(scheduler::JobOutcome::Failed(vec![reason]));
        }
    }

    // ----- views -----

    /// The backlog and the remote executors.
    pub fn executors_view(&self) -> ExecutorsView {
        let pending_tasks = self.scheduler.pending_tasks();
        let running_tasks = self
            .scheduler
            .unfinished_tasks()
            .saturating_sub(pending_tasks);
        let executors = self
            .executor_ids
            .iter()
            .map(|(executor_id, id)| (executor_id.clone(), self.running_on(*id)))
            .collect();
        ExecutorsView {
            pending_tasks,
            running_tasks,
            executors,
        }
    }

    /// The stalled executors' ids on the wire.
    pub fn stalled(&self) -> Vec<String> {
        self.scheduler
            .stalled_executors()
            .into_iter()
            .map(|(id, _)| self.executor_id_of(id))
            .collect()
    }

    /// What the driver shows at `now_us` (metrics, web UI).
    pub fn observe(&self, now_us: u64) -> DriverView {
        let scheduler = &self.scheduler;
        let job_info = |job| scheduler.job_info(job);
        let mut view = self
            .telemetry
            .view(|id| self.running_on(id), job_info, now_us);
        for executor in view.executors.iter_mut() {
            let id = self.executor_ids.get(&executor.executor_id);
            if let Some(Link::Remote(remote)) = id.and_then(|id| self.links.get(id)) {
                executor.lane_launches = remote.lanes.iter().map(|l| l.launched).collect();
                executor.lanes_joined =
                    remote.lanes.iter().filter(|l| l.peer.is_some()).count() as u32;
            }
        }
        view.stats = scheduler.stats().clone();
        view.pending_tasks = scheduler.pending_tasks() as u64;
        view.running_tasks = scheduler
            .unfinished_tasks()
            .saturating_sub(scheduler.pending_tasks()) as u64;
        view.executors_registered = self.counters.executors_registered.load(Ordering::Relaxed);
        view.executors_lost = self.counters.executors_lost.load(Ordering::Relaxed);
        view
    }

    fn running_on(&self, id: ExecutorId) -> u32 {
        self.scheduler
            .executor_cores(id)
            .map_or(0, |(slots, free)| slots.saturating_sub(free))
    }

    /// An executor's id on the wire (`local` for the in-process one). O(executors).
    fn executor_id_of(&self, id: ExecutorId) -> String {
        self.executor_ids
            .iter()
            .find(|(_, named)| **named == id)
            .map_or_else(
                || "local".to_owned(),
                |(executor_id, _)| executor_id.clone(),
            )
    }

    // ----- outputs -----

    /// The next peer with frames to send, and the frames (append them to its connection).
    pub fn poll_transmit(&mut self) -> Option<(PeerId, BytesMut)> {
        self.peers.poll_transmit()
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

    /// When [`DriverCore::handle_timeout`] is next due (on the callers' clock): the earliest of
    /// the scheduler's own timeout, the peers' deadlines (heartbeat, handshake, client idle),
    /// the jobs' deadlines and, while jobs are active, the stall checks. `None` while nothing
    /// is pending.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        // Deadlines of jobs that ended are no reason to wake.
        while let Some(Reverse((_, id))) = self.deadlines.peek() {
            if self.jobs.contains_key(id) {
                break;
            }
            self.deadlines.pop();
        }
        let jobs_deadline = self.deadlines.peek().map(|Reverse((at_us, _))| *at_us);
        let watching = !self.jobs.is_empty() || self.health.starved_since_us.is_some();
        let health = watching.then_some(self.health.next_check_us);
        [
            self.scheduler_deadline(),
            self.peers.poll_timeout(),
            jobs_deadline,
            health,
        ]
        .into_iter()
        .flatten()
        .min()
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
            self.scheduler.tick(now);
            self.last_tick_us = now;
        }
        self.check_jobs();
        self.peers.handle_timeout(now);
        self.forget_gone();
        let watching = !self.jobs.is_empty() || self.health.starved_since_us.is_some();
        if watching && now >= self.health.next_check_us {
            self.health.next_check_us = now.saturating_add(HEALTH_INTERVAL_US);
            self.check_health();
        }
        self.pump();
    }

    // ----- internals -----

    /// Carries out everything the scheduler decided: launches and kills to their executors,
    /// results and outcomes to their jobs.
    fn pump(&mut self) {
        if self.admission.cancels_pending.load(Ordering::Acquire) {
            self.check_jobs();
        }
        self.scheduler.drain_outputs(&mut self.outputs);
        // Before the outputs reach anyone: a caller that sees a job end sees its counts.
        self.stats.publish(self.scheduler.stats());
        if self.telemetry.point_due(self.now_us) {
            let (pending, running) = (self.scheduler.pending_tasks(), self.scheduler.unfinished_tasks());
            let running = running.saturating_sub(pending) as u64;
            let stats = self.scheduler.stats();
            self.telemetry.take_point(self.now_us, stats, pending as u64, running);
        }
        let mut outputs = std::mem::take(&mut self.outputs);
        for output in outputs.drain(..) {
            self.carry_out(output);
        }
        self.outputs = outputs;
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::Launch { executor, tasks } => self.launch(executor, tasks),
            Output::Kill {
                executor,
                task,
                attempt,
                reason,
            } => match self.links.get(&executor) {
                Some(Link::Remote(remote)) => {
                    // To the lane that holds the attempt.
                    let Some(peer) = remote.peer_of((task, attempt)) else {
                        return;
                    };
                    self.telemetry.kill_sent(self.now_us, task, attempt);
                    let kill = Message::KillTask {
                        task_id: task.0,
                        attempt,
                        reason: &reason,
                    };
                    self.send(peer, &kill);
                }
                Some(Link::Local) => self.local.push_back(LocalCommand::Kill { task, attempt }),
                None => {}
            },
            Output::TaskResult { task, result } => {
                if let Some(entry) = self.jobs.get_mut(&task.job()) {
                    let result = result.as_ref().map_err(String::as_str);
                    entry.shared.task_done(task.index(), result);
                    if let Some(observer) = entry.observer.as_mut() {
                        observer(task.index(), result);
                    }
                }
                // After the job heard: recording never delays a result.
                self.telemetry.task_done(task.job());
            }
            Output::JobOutcome { job, outcome } => {
                let ended = Ended::of(&outcome);
                if let Some(entry) = self.jobs.remove(&job) {
                    self.admission.release(entry.tasks);
                    entry.shared.finish(outcome);
                }
                self.telemetry.job_over(self.now_us, job, ended);
            }
        }
    }

    fn launch(&mut self, executor: ExecutorId, tasks: Vec<TaskLaunch>) {
        let now = self.now_us;
        match self.links.get_mut(&executor) {
            Some(Link::Remote(remote)) => {
                // Each attempt to the joined lane holding the fewest: one batch per lane.
                let mut batches: Vec<Vec<wire::TaskLaunch>> =
                    (0..remote.lanes.len()).map(|_| Vec::new()).collect();
                for task in &tasks {
                    let lane = remote.route();
                    self.telemetry.launched(now, task, executor, lane);
                    remote.launched((task.task, task.attempt), lane, now);
                    batches[lane as usize].push(wire::TaskLaunch {
                        task_id: task.task.0,
                        attempt: task.attempt,
                        cores: task.cores,
                        function: &task.function,
                        payload: &task.payload,
                    });
                }
                for (lane, batch) in remote.lanes.iter().zip(&batches) {
                    let out = lane.peer.and_then(|peer| self.peers.outbound(peer));
                    let (Some(out), false) = (out, batch.is_empty()) else {
                        continue;
                    };
                    // Payloads are bounded below a frame (`Driver::start`), so this fits.
                    let frame_size_max = self.config.frame_size_max;
                    if let Err(error) = batch::encode_launches(batch, out, frame_size_max) {
                        tracing::error!(executor = executor.0, "launch not sent: {error}");
                    }
                }
            }
            Some(Link::Local) => {
                for task in tasks {
                    self.telemetry.launched(now, &task, executor, 0);
                    self.local.push_back(LocalCommand::Launch(task));
                }
            }
            None => tracing::error!(
                executor = executor.0,
                "launch for an unknown executor dropped"
            ),
        }
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
        let Some(Link::Remote(remote)) = self.links.remove(&id) else {
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
        self.remove_executor_id(id, why);
    }

    /// Executor `id` leaves the scheduler (its lanes are closed already).
    fn remove_executor_id(&mut self, id: ExecutorId, why: &ConnError) {
        self.links.remove(&id);
        let executor_id = self.executor_id_of(id);
        let gone = &mut self.gone;
        self.executor_ids.retain(|executor_id, named| {
            if *named == id {
                if gone.len() >= GONE_IDS_MAX {
                    gone.pop_front();
                }
                gone.push_back((executor_id.clone(), id));
            }
            *named != id
        });
        self.counters.executors.fetch_sub(1, Ordering::SeqCst);
        let (reason, lost) = if let Some((reason, lost)) = self.retiring.remove(&id) {
            tracing::info!(%executor_id, "executor removed: {reason}");
            self.telemetry
                .executor_removed(self.now_us, id, &reason.to_string(), lost);
            (reason, lost)
        } else if self.stopping {
            tracing::info!(%executor_id, "executor stopped");
            self.telemetry
                .executor_removed(self.now_us, id, "stopped", false);
            (RemovalReason::Killed, false)
        } else {
            tracing::warn!(%executor_id, "executor lost: {why}");
            self.telemetry
                .executor_removed(self.now_us, id, &why.to_string(), true);
            (RemovalReason::Lost(why.to_string()), true)
        };
        if lost {
            self.counters.executors_lost.fetch_add(1, Ordering::SeqCst);
        }
        self.scheduler.remove_executor(self.now_us, id, reason);
    }

    /// Answers the callers waiting for as many executors as are registered now.
    fn answer_executor_waiters(&mut self) {
        let registered = self.counters.executors.load(Ordering::SeqCst);
        if self
            .executor_waiters
            .iter()
            .all(|(count, _)| *count > registered)
        {
            return;
        }
        for (count, reply) in std::mem::take(&mut self.executor_waiters) {
            if count <= registered {
                let _ = reply.send(());
            } else {
                self.executor_waiters.push((count, reply));
            }
        }
    }

    /// Fails jobs whose deadline passed, and cancels jobs whose handles cancelled them while
    /// the inbox was full.
    fn check_jobs(&mut self) {
        let now_us = self.now_us;
        while let Some(&Reverse((at_us, id))) = self.deadlines.peek() {
            if at_us > now_us {
                break;
            }
            self.deadlines.pop();
            let reason = format!("job {} failed: its deadline passed", id.0);
            self.scheduler.fail_job(now_us, id, &reason);
        }
        if self.admission.cancels_pending.swap(false, Ordering::AcqRel) {
            let cancelled: Vec<JobId> = (self.jobs.iter())
                .filter(|(_, entry)| entry.shared.is_cancelled())
                .map(|(id, _)| *id)
                .collect();
            for id in cancelled {
                self.scheduler.cancel_job(now_us, id);
            }
        }
    }

    /// Warns about stalled executors and about tasks no executor can run, and publishes the
    /// latter for [`super::Driver::no_executor_for`].
    fn check_health(&mut self) {
        let now = self.now_us;
        let warn_us = us(WARN_INTERVAL);
        if self.scheduler.starved(now) {
            let since = match self.health.starved_since_us {
                Some(since) => since,
                None => {
                    self.counters
                        .starved_since_us
                        .store(now.saturating_add(1), Ordering::SeqCst);
                    // The first warning after one interval: executors starting or coming back
                    // (dynamic allocation from zero, a replaced executor) are not worth one.
                    self.health.next_starved_warning_us = now.saturating_add(warn_us);
                    self.health.starved_since_us = Some(now);
                    now
                }
            };
            if now >= self.health.next_starved_warning_us {
                self.health.next_starved_warning_us = now.saturating_add(warn_us);
                tracing::warn!(
                    pending_tasks = self.scheduler.pending_tasks(),
                    executors = self.scheduler.executors(),
                    waited_s = now.saturating_sub(since) / 1_000_000,
                    "tasks are waiting and no executor can run them (none registered, or all \
                     excluded)"
                );
            }
        } else if self.health.starved_since_us.take().is_some() {
            self.counters.starved_since_us.store(0, Ordering::SeqCst);
        }
        if now >= self.health.next_stalled_warning_us {
            let stalled = self.scheduler.stalled_executors();
            if !stalled.is_empty() {
                self.health.next_stalled_warning_us = now.saturating_add(warn_us);
                for (id, attempts) in stalled {
                    let executor_id = self.executor_id_of(id);
                    tracing::warn!(
                        executor_id = executor_id.as_str(),
                        attempts,
                        "executor is stalled: it holds a straggler and has finished nothing \
                         since it was launched; its stragglers are copied elsewhere and it gets \
                         no new work until it reports a task"
                    );
                }
            }
        }
    }

    /// The remote executors' lane 0 connections (a `StopExecutor` there stops every lane).
    fn remote_peers(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.links.values().filter_map(|link| match link {
            Link::Remote(remote) => remote.lane0(),
            Link::Local => None,
        })
    }

    /// A registered remote executor by its id on the wire, with its lane 0 connection.
    fn remote_by_id(&self, executor_id: &str) -> Option<(ExecutorId, PeerId)> {
        let id = *self.executor_ids.get(executor_id)?;
        match self.links.get(&id)? {
            Link::Remote(remote) => Some((id, remote.lane0()?)),
            Link::Local => None,
        }
    }
}

/// Whether two keys are equal, in time independent of where they differ.
fn eq_const_time(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// What an executor registers with.
struct Registration<'a> {
    executor_id: &'a str,
    host: &'a str,
    cores: u32,
    lanes: u32,
    attributes: List<'a, KeyValue<'a>>,
}

/// Whom the driver lets in: executors and status clients.
pub(crate) fn inbound(config: &DriverConfig) -> Inbound {
    Inbound {
        role: Role::Driver,
        accepted_roles: &[Role::Executor, Role::Client],
        secret: config.secret.clone(),
        frame_size_max: config.frame_size_max,
        outbound_max: config.outbound_max,
    }
}

/// The driver's peer table: executors and status clients, bounded by the config.
fn peers_config(config: &DriverConfig) -> PeersConfig {
    PeersConfig {
        inbound: inbound(config),
        name: "the driver",
        limits: Limits {
            connections_max: config.connections_max,
            handshakes_max: HANDSHAKES_MAX,
            clients_max: CLIENTS_MAX,
            handshake_timeout: config.handshake_timeout,
            client_idle_timeout: CLIENT_IDLE_TIMEOUT,
            member_timeout: Some(config.heartbeat_timeout),
        },
    }
}

/// Micros in a duration, saturating.
pub(crate) fn us(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    //! The core alone: frames built with the wire encoders as a real executor would, time
    //! simulated.

    use std::time::Instant;

    use bytes::Bytes;

    use super::*;
    use crate::conn::TABLE_FULL;
    use crate::handshake::Handshake;
    use crate::job::{JobHandle, JobOutcome};
    use crate::wire::{FrameDecoder, StatusUpdate, TaskState, FRAME_SIZE_MAX_DEFAULT};

    const S: u64 = 1_000_000;
    const MS: u64 = 1_000;

    fn config() -> DriverConfig {
        let mut config = DriverConfig {
            tasks_per_core: 1,
            ..DriverConfig::default()
        };
        config.scheduler.speculation = None;
        config
    }

    fn new_core(config: DriverConfig) -> DriverCore {
        let admission = Arc::new(Admission::new(
            config.scheduler.pending_tasks_max,
            config.scheduler.jobs_max,
        ));
        let telemetry = Box::new(LoopTelemetry::new(Instant::now()));
        DriverCore::new(config, telemetry, admission)
    }

    fn decode(bytes: &[u8]) -> Vec<Frame> {
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
        decoder.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("the core sends valid frames") {
            frames.push(frame);
        }
        assert_eq!(decoder.buffered_len(), 0, "a partial frame was transmitted");
        frames
    }

    /// Everything the core has to send, as frames per peer.
    fn transmitted(core: &mut DriverCore) -> Vec<(PeerId, Frame)> {
        let mut out = Vec::new();
        while let Some((peer, bytes)) = core.poll_transmit() {
            out.extend(decode(&bytes).into_iter().map(|frame| (peer, frame)));
        }
        out
    }

    /// The frames for one peer, decoded (the rest are dropped).
    fn sent_to(core: &mut DriverCore, peer: PeerId) -> Vec<Frame> {
        (transmitted(core).into_iter())
            .filter(|(to, _)| *to == peer)
            .map(|(_, frame)| frame)
            .collect()
    }

    /// Sends one message as `peer`; whether the core keeps the peer.
    fn send(core: &mut DriverCore, peer: PeerId, message: &Message<'_>, now_us: u64) -> bool {
        let mut bytes = BytesMut::new();
        message
            .encode(&mut bytes, FRAME_SIZE_MAX_DEFAULT)
            .expect("encodes");
        let mut alive = true;
        for frame in decode(&bytes) {
            alive &= core.handle_frame(peer, &frame, now_us);
        }
        alive
    }

    /// Connects `peer` and runs an executor's side of the handshake (no secret).
    fn connect(core: &mut DriverCore, peer: PeerId, now_us: u64) {
        core.handle_connected(peer, [1; 32], now_us)
            .expect("room for the peer");
        let mut out = BytesMut::new();
        let mut handshake =
            Handshake::start(Role::Executor, None, [2; 32], &[Role::Driver], &mut out);
        let mut done = false;
        for frame in sent_to(core, peer) {
            done |= handshake
                .on_frame(frame.kind(), frame.body(), &mut out)
                .expect("the driver's handshake is valid")
                .is_some();
        }
        assert!(
            done,
            "the driver's Hello completes an unauthenticated handshake"
        );
        for frame in decode(&out) {
            assert!(core.handle_frame(peer, &frame, now_us), "handshake refused");
        }
    }

    /// Connects and registers an executor of one lane; the core's answer.
    fn register(
        core: &mut DriverCore,
        peer: PeerId,
        executor_id: &str,
        cores: u32,
        now_us: u64,
    ) -> (bool, Vec<Frame>) {
        register_lanes(core, peer, executor_id, (cores, 1), now_us)
    }

    /// Connects and registers an executor of `(cores, lanes)` as its lane 0; the answer.
    fn register_lanes(
        core: &mut DriverCore,
        peer: PeerId,
        executor_id: &str,
        (cores, lanes): (u32, u32),
        now_us: u64,
    ) -> (bool, Vec<Frame>) {
        connect(core, peer, now_us);
        let registration = Message::RegisterExecutor {
            executor_id,
            host: "h",
            cores,
            lanes,
            attributes: List::from_items(&[]),
        };
        let alive = send(core, peer, &registration, now_us);
        (alive, sent_to(core, peer))
    }

    fn refusal(frames: &[Frame]) -> Option<String> {
        frames.iter().find_map(|frame| match frame.message() {
            Ok(Message::RegisterExecutorFailed { reason }) => Some(reason.to_owned()),
            _ => None,
        })
    }

    fn registered(frames: &[Frame]) -> bool {
        (frames.iter()).any(|f| matches!(f.message(), Ok(Message::RegisteredExecutor { .. })))
    }

    /// The (task id, attempt) pairs launched in these frames.
    fn launches(frames: &[Frame]) -> Vec<(u64, u32)> {
        let mut launched = Vec::new();
        for frame in frames {
            if let Ok(Message::LaunchTasks { tasks }) = frame.message() {
                launched.extend(tasks.iter().map(|t| (t.task_id, t.attempt)));
            }
        }
        launched
    }

    /// Submits a job as `Driver::try_submit` does; its handle.
    fn submit(core: &mut DriverCore, job: Job, now_us: u64) -> JobHandle {
        let id = core.admission.admit(&job).expect("admitted");
        let tasks = job.payloads.len() as u64;
        let shared = Arc::new(JobShared::new(false));
        core.submit(id, job, shared.clone(), now_us);
        JobHandle {
            id: id.0,
            tasks,
            shared,
            cancel: Box::new(|| {}),
            detached: false,
        }
    }

    fn outcome(handle: JobHandle) -> JobOutcome {
        handle
            .wait_timeout(Duration::ZERO)
            .expect("the job has ended")
    }

    fn finished(task_id: u64, attempt: u32, data: &[u8]) -> Vec<u8> {
        let update = [StatusUpdate {
            task_id,
            attempt,
            state: TaskState::Finished,
            data,
        }];
        let mut out = BytesMut::new();
        batch::encode_status_updates(&update, &mut out, FRAME_SIZE_MAX_DEFAULT).expect("encodes");
        out.to_vec()
    }

    fn send_bytes(core: &mut DriverCore, peer: PeerId, bytes: &[u8], now_us: u64) -> bool {
        let mut alive = true;
        for frame in decode(bytes) {
            alive &= core.handle_frame(peer, &frame, now_us);
        }
        alive
    }

    #[test]
    fn an_executor_registers_and_a_duplicate_name_is_refused() {
        let mut core = new_core(config());
        let (alive, answer) = register(&mut core, PeerId(1), "e1", 2, 0);
        assert!(alive && registered(&answer), "first registration accepted");
        assert!(core.is_executor(PeerId(1)));
        assert_eq!(core.counters.executors.load(Ordering::SeqCst), 1);

        let (alive, answer) = register(&mut core, PeerId(2), "e1", 2, MS);
        assert!(!alive, "the duplicate stays connected");
        let reason = refusal(&answer).expect("a RegisterExecutorFailed");
        assert!(reason.contains("duplicate executor id"), "{reason}");
        let (closed, _) = core.poll_close().expect("the duplicate is closed");
        assert_eq!(closed, PeerId(2));
        assert_eq!(core.counters.executors.load(Ordering::SeqCst), 1);
        assert!(core.is_executor(PeerId(1)), "the first is untouched");
    }

    #[test]
    fn a_claim_over_the_core_bound_is_refused_with_the_reason() {
        let mut core = new_core(config());
        let (alive, answer) = register(&mut core, PeerId(1), "liar", EXECUTOR_CORES_MAX + 1, 0);
        assert!(!alive);
        let reason = refusal(&answer).expect("a RegisterExecutorFailed");
        assert!(
            reason.contains(&format!("at most {EXECUTOR_CORES_MAX}")),
            "{reason}"
        );
        assert_eq!(core.poll_close().map(|(p, _)| p), Some(PeerId(1)));
        assert_eq!(core.scheduler.executors(), 0);
        let (alive, answer) = register(&mut core, PeerId(2), "honest", EXECUTOR_CORES_MAX, MS);
        assert!(alive && registered(&answer), "the bound itself is accepted");
    }

    #[test]
    fn a_launched_task_reported_finished_ends_its_job_with_the_result() {
        let mut core = new_core(config());
        let (alive, _) = register(&mut core, PeerId(1), "e1", 1, 0);
        assert!(alive);
        let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("x")]), MS);
        let launched = launches(&sent_to(&mut core, PeerId(1)));
        assert_eq!(launched.len(), 1, "{launched:?}");
        let (task_id, attempt) = launched[0];
        assert!(send_bytes(
            &mut core,
            PeerId(1),
            &finished(task_id, attempt, b"result"),
            2 * MS
        ));
        match outcome(handle) {
            JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("result")]),
            other => panic!("{other:?}"),
        }
        assert_eq!(core.published_stats().read().succeeded, 1);
    }

    #[test]
    fn a_silent_executor_expires_and_its_task_runs_on_another() {
        let mut core = new_core(config());
        assert!(register(&mut core, PeerId(1), "a", 1, 0).0);
        assert!(register(&mut core, PeerId(2), "b", 1, 0).0);
        let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("x")]), MS);
        let sent = transmitted(&mut core);
        let (&(holder, _), launched) = (
            sent.first().expect("a launch"),
            launches(&sent.iter().map(|(_, f)| f.clone()).collect::<Vec<_>>()),
        );
        assert_eq!(launched.len(), 1);
        let other = if holder == PeerId(1) {
            PeerId(2)
        } else {
            PeerId(1)
        };
        let timeout_us = us(core.config.heartbeat_timeout);
        // The other heartbeats; the holder stays silent.
        let heartbeat = Message::Heartbeat {
            executor_id: "other",
            running_tasks: 0,
            metrics: List::from_items(&[]),
        };
        assert!(send(&mut core, other, &heartbeat, timeout_us / 2));
        let _ = transmitted(&mut core);
        core.handle_timeout(timeout_us);
        assert!(
            core.poll_close().is_none(),
            "expired at exactly the timeout"
        );
        let at_us = core.poll_timeout().expect("a heartbeat deadline");
        assert_eq!(
            at_us,
            timeout_us + 1,
            "the holder's expiry is the next deadline"
        );
        core.handle_timeout(at_us);
        let (closed, why) = core.poll_close().expect("the silent one is closed");
        assert_eq!(closed, holder);
        assert!(why.to_string().contains("no heartbeat"), "{why}");
        assert!(core.poll_close().is_none(), "the other stays");
        let relaunched = launches(&sent_to(&mut core, other));
        assert_eq!(
            relaunched,
            vec![(launched[0].0, 1)],
            "the task runs again elsewhere"
        );
        assert!(send_bytes(
            &mut core,
            other,
            &finished(launched[0].0, 1, b"again"),
            at_us + MS
        ));
        assert!(matches!(outcome(handle), JobOutcome::Succeeded(_)));
        assert_eq!(core.counters.executors_lost.load(Ordering::SeqCst), 1);
    }

    /// The lane key in a `RegisteredExecutor` answer.
    fn lane_key(frames: &[Frame]) -> [u8; 32] {
        frames
            .iter()
            .find_map(|frame| match frame.message() {
                Ok(Message::RegisteredExecutor { lane_key, .. }) => Some(lane_key),
                _ => None,
            })
            .expect("a RegisteredExecutor")
    }

    /// Connects `peer` and asks to join `executor_id` as `lane` with `key`; whether the core
    /// keeps the peer, and its answer.
    fn join(
        core: &mut DriverCore,
        peer: PeerId,
        (executor_id, lane, lane_key): (&str, u32, [u8; 32]),
        now_us: u64,
    ) -> (bool, Vec<Frame>) {
        connect(core, peer, now_us);
        let join = Message::JoinLane {
            executor_id,
            lane,
            lane_key,
        };
        let alive = send(core, peer, &join, now_us);
        (alive, sent_to(core, peer))
    }

    fn joined(frames: &[Frame]) -> bool {
        (frames.iter()).any(|f| matches!(f.message(), Ok(Message::LaneJoined { .. })))
    }

    /// Executor `e` of 2 cores on 2 lanes, both joined (lane 0 on peer 1, lane 1 on peer 2).
    fn two_lanes(core: &mut DriverCore, now_us: u64) {
        let (alive, answer) = register_lanes(core, PeerId(1), "e", (2, 2), now_us);
        assert!(alive && registered(&answer));
        let (alive, answer) = join(core, PeerId(2), ("e", 1, lane_key(&answer)), now_us);
        assert!(alive && joined(&answer), "lane 1 joins with the key");
    }

    /// The launches each peer was sent.
    fn launches_by_peer(core: &mut DriverCore) -> FxHashMap<PeerId, Vec<(u64, u32)>> {
        let mut by_peer: FxHashMap<PeerId, Vec<(u64, u32)>> = FxHashMap::default();
        for (peer, frame) in transmitted(core) {
            let launched = launches(std::slice::from_ref(&frame));
            if !launched.is_empty() {
                by_peer.entry(peer).or_default().extend(launched);
            }
        }
        by_peer
    }

    #[test]
    fn a_lane_joins_with_the_key_and_gets_launches_once_joined() {
        let mut core = new_core(config());
        let (alive, answer) = register_lanes(&mut core, PeerId(1), "e", (2, 2), 0);
        assert!(alive && registered(&answer));
        let key = lane_key(&answer);
        assert_ne!(key, [0; 32], "a random key for an executor of lanes");
        // Launches start with lane 0 alone.
        let first = submit(&mut core, Job::new("echo", vec![Bytes::from("1")]), MS);
        let sent = launches_by_peer(&mut core);
        assert_eq!(sent.keys().copied().collect::<Vec<_>>(), [PeerId(1)]);
        let (alive, answer) = join(&mut core, PeerId(2), ("e", 1, key), 2 * MS);
        assert!(alive && joined(&answer), "lane 1 joins");
        assert!(core.is_executor(PeerId(2)));
        // The scheduler sees one executor of 2 cores; the next launch goes to lane 1, which
        // holds fewer.
        assert_eq!(core.scheduler.executors(), 1);
        assert_eq!(core.executors_view().executors.len(), 1);
        let second = submit(&mut core, Job::new("echo", vec![Bytes::from("2")]), 3 * MS);
        let sent = launches_by_peer(&mut core);
        let on_lane1 = sent.get(&PeerId(2)).expect("lane 1 got the launch").clone();
        assert_eq!((sent.len(), on_lane1.len()), (1, 1), "{sent:?}");
        let view = core.observe(4 * MS);
        assert_eq!(view.executors[0].lane_launches, [1, 1]);
        assert_eq!(view.executors[0].lanes_joined, 2);
        // A report is taken from any lane of the executor (here lane 0, for lane 1's attempt).
        let (task_id, attempt) = on_lane1[0];
        assert!(send_bytes(
            &mut core,
            PeerId(1),
            &finished(task_id, attempt, b"two"),
            5 * MS
        ));
        match outcome(second) {
            JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("two")]),
            other => panic!("{other:?}"),
        }
        drop(first);
    }

    #[test]
    fn a_kill_goes_to_the_lane_that_holds_the_attempt() {
        let mut core = new_core(config());
        two_lanes(&mut core, 0);
        let a = submit(&mut core, Job::new("sleep", vec![Bytes::new()]), MS);
        let b = submit(&mut core, Job::new("sleep", vec![Bytes::new()]), MS);
        let sent = launches_by_peer(&mut core);
        assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
        let holder_of = |job: u64| {
            (sent.iter())
                .find(|(_, launched)| launched.iter().any(|(t, _)| t >> 32 == job))
                .map(|(peer, _)| *peer)
                .expect("launched")
        };
        let (holder, other) = (holder_of(b.id), holder_of(a.id));
        core.cancel(JobId(b.id), 2 * MS);
        let kills: Vec<PeerId> = (transmitted(&mut core).into_iter())
            .filter(|(_, f)| matches!(f.message(), Ok(Message::KillTask { .. })))
            .map(|(peer, _)| peer)
            .collect();
        assert_eq!(kills, [holder], "not to {other:?}");
        assert!(matches!(outcome(b), JobOutcome::Cancelled));
    }

    #[test]
    fn a_lane_is_refused_for_a_wrong_key_an_unknown_executor_or_a_lane_out_of_range_or_taken() {
        let mut core = new_core(config());
        let (_, answer) = register_lanes(&mut core, PeerId(1), "e", (3, 3), 0);
        let key = lane_key(&answer);
        let (alive, _) = join(&mut core, PeerId(2), ("e", 1, key), 0);
        assert!(alive);
        let mut wrong = key;
        wrong[31] ^= 1;
        let cases = [
            (("e", 2, wrong), "wrong lane key"),
            (("x", 2, key), "no executor \"x\""),
            (("e", 3, key), "lane 3 out of range"),
            (("e", 0, key), "lane 0 out of range"),
            (("e", 1, key), "lane 1 has joined already"),
        ];
        for (peer, (ask, expected)) in (10..).map(PeerId).zip(cases) {
            let (alive, answer) = join(&mut core, peer, ask, MS);
            assert!(!alive, "{ask:?} refused");
            let reason = refusal(&answer).expect("a RegisterExecutorFailed");
            assert!(reason.contains(expected), "{reason}");
            assert_eq!(core.poll_close().map(|(p, _)| p), Some(peer));
        }
        // None of it touched the executor: lane 2 still joins.
        assert!(core.is_executor(PeerId(1)) && core.is_executor(PeerId(2)));
        let (alive, answer) = join(&mut core, PeerId(3), ("e", 2, key), 2 * MS);
        assert!(alive && joined(&answer));
        // An executor of one lane has none to join, whatever key is shown.
        let (_, answer) = register(&mut core, PeerId(4), "solo", 2, 3 * MS);
        let (alive, _) = join(&mut core, PeerId(5), ("solo", 1, lane_key(&answer)), 3 * MS);
        assert!(!alive, "no lane of a one-lane executor joins");
    }

    #[test]
    fn a_registration_claiming_lanes_out_of_bounds_is_refused() {
        let mut core = new_core(config());
        for (peer, lanes, cores) in [(1, 0, 2), (2, 3, 2), (3, LANES_MAX + 1, 64)] {
            let (alive, answer) = register_lanes(&mut core, PeerId(peer), "e", (cores, lanes), 0);
            assert!(!alive, "{lanes} lanes of {cores} cores");
            let reason = refusal(&answer).expect("a RegisterExecutorFailed");
            assert!(
                reason.contains(&format!("claims {lanes} lanes")),
                "{reason}"
            );
        }
        let (alive, answer) = register_lanes(&mut core, PeerId(4), "e", (64, LANES_MAX), 0);
        assert!(alive && registered(&answer), "the bound itself is accepted");
    }

    #[test]
    fn a_lane_lost_loses_the_executor_and_its_attempts_run_elsewhere() {
        let mut core = new_core(config());
        two_lanes(&mut core, 0);
        let handle = submit(
            &mut core,
            Job::new("echo", vec![Bytes::from("a"), Bytes::from("b")]),
            MS,
        );
        let sent = launches_by_peer(&mut core);
        assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
        core.handle_closed(PeerId(2), &ConnError::Closed, 2 * MS);
        let (closed, why) = core.poll_close().expect("lane 0 is closed with it");
        assert_eq!(closed, PeerId(1));
        assert!(why.to_string().contains("lane 1: peer closed"), "{why}");
        assert_eq!(core.scheduler.executors(), 0);
        assert_eq!(core.counters.executors_lost.load(Ordering::SeqCst), 1);
        let view = core.observe(3 * MS);
        assert!(view.executors[0].removed.contains("lane 1"), "{view:?}");
        // Both attempts run again on another executor.
        let (alive, answer) = register(&mut core, PeerId(3), "b", 2, 3 * MS);
        assert!(alive);
        let relaunched = launches(&answer);
        assert_eq!(relaunched.len(), 2, "{relaunched:?}");
        for (task_id, attempt) in relaunched {
            assert_eq!(attempt, 1);
            let bytes = finished(task_id, attempt, b"again");
            assert!(send_bytes(&mut core, PeerId(3), &bytes, 4 * MS));
        }
        assert!(matches!(outcome(handle), JobOutcome::Succeeded(_)));
    }

    #[test]
    fn a_deaf_lane_is_lost_while_its_honest_sibling_counts_only_its_own() {
        let mut core = new_core(config());
        let timeout_us = us(core.config.heartbeat_timeout);
        let beat_us = timeout_us / 4;
        two_lanes(&mut core, 0);
        let _handle = submit(
            &mut core,
            Job::new("echo", vec![Bytes::from("a"), Bytes::from("b")]),
            MS,
        );
        let sent = launches_by_peer(&mut core);
        assert_eq!(sent.len(), 2, "one attempt on each lane: {sent:?}");
        // Lane 0 reads its launch and counts it (one, not both); lane 1 counts nothing.
        let mut now_us = MS;
        while now_us < MS + timeout_us + beat_us {
            now_us += beat_us;
            assert!(
                heartbeat(&mut core, PeerId(1), 1, now_us),
                "lane 0 kept at {now_us}"
            );
            let alive = heartbeat(&mut core, PeerId(2), 0, now_us);
            if !alive {
                break;
            }
        }
        assert!(now_us > MS + timeout_us, "not before its launch is old");
        let closed: FxHashMap<PeerId, String> = std::iter::from_fn(|| core.poll_close())
            .map(|(peer, why)| (peer, why.to_string()))
            .collect();
        assert_eq!(closed.len(), 2, "both lanes close: {closed:?}");
        let why = &closed[&PeerId(2)];
        assert!(why.contains("does not read its launches"), "{why}");
        let why = &closed[&PeerId(1)];
        assert!(
            why.contains("its executor is lost: lane 1: executor does not read"),
            "{why}"
        );
        assert_eq!(core.counters.executors_lost.load(Ordering::SeqCst), 1);
    }

    /// A heartbeat from `peer` counting `running_tasks`; whether the core keeps the peer.
    fn heartbeat(core: &mut DriverCore, peer: PeerId, running_tasks: u32, now_us: u64) -> bool {
        let heartbeat = Message::Heartbeat {
            executor_id: "any",
            running_tasks,
            metrics: List::from_items(&[]),
        };
        send(core, peer, &heartbeat, now_us)
    }

    /// Two executors of one core and a one-task job: the holder of its attempt 0, the other
    /// and the task id.
    fn one_task_on_two(core: &mut DriverCore, now_us: u64) -> (JobHandle, PeerId, PeerId, u64) {
        assert!(register(core, PeerId(1), "a", 1, now_us).0);
        assert!(register(core, PeerId(2), "b", 1, now_us).0);
        let handle = submit(core, Job::new("echo", vec![Bytes::from("x")]), now_us);
        let sent = transmitted(core);
        let frames: Vec<Frame> = sent.iter().map(|(_, f)| f.clone()).collect();
        let launched = launches(&frames);
        assert_eq!(launched.len(), 1, "{launched:?}");
        let holder = sent
            .iter()
            .find(|(_, f)| f.kind() == wire::Kind::LaunchTasks as u16)
            .map(|(peer, _)| *peer)
            .expect("a launch");
        let other = if holder == PeerId(1) {
            PeerId(2)
        } else {
            PeerId(1)
        };
        (handle, holder, other, launched[0].0)
    }

    #[test]
    fn an_executor_that_does_not_read_its_launches_is_lost_and_its_task_runs_elsewhere() {
        let mut core = new_core(config());
        let timeout_us = us(core.config.heartbeat_timeout);
        let beat_us = timeout_us / 4;
        let (handle, deaf, other, task_id) = one_task_on_two(&mut core, MS);
        // Heartbeats counting nothing while the launch may still be on its way are no sign.
        let mut now_us = MS;
        while now_us + beat_us < MS + timeout_us {
            now_us += beat_us;
            assert!(heartbeat(&mut core, deaf, 0, now_us), "kept at {now_us} us");
            assert!(heartbeat(&mut core, other, 0, now_us));
        }
        // Past the timeout: one heartbeat short is a suspicion, the second in a row a loss.
        now_us = MS + timeout_us;
        assert!(heartbeat(&mut core, deaf, 0, now_us), "one short heartbeat");
        assert!(heartbeat(&mut core, other, 0, now_us));
        let _ = transmitted(&mut core);
        now_us += beat_us;
        assert!(
            !heartbeat(&mut core, deaf, 0, now_us),
            "the second removes it"
        );
        let (closed, why) = core.poll_close().expect("the deaf one is closed");
        assert_eq!(closed, deaf);
        let timeout_s = core.config.heartbeat_timeout.as_secs_f64();
        let reason = format!(
            "executor does not read its launches: 1 attempts sent over {timeout_s} s ago, it \
             reports 0 running"
        );
        assert!(why.to_string().starts_with(&reason), "{why}");
        assert_eq!(core.counters.executors_lost.load(Ordering::SeqCst), 1);
        assert_eq!(
            launches(&sent_to(&mut core, other)),
            vec![(task_id, 1)],
            "the task runs again elsewhere"
        );
        assert!(send_bytes(
            &mut core,
            other,
            &finished(task_id, 1, b"again"),
            now_us + MS
        ));
        assert!(matches!(outcome(handle), JobOutcome::Succeeded(_)));
    }

    #[test]
    fn an_executor_that_reads_its_launches_and_runs_them_late_is_kept() {
        let mut core = new_core(config());
        let timeout_us = us(core.config.heartbeat_timeout);
        let beat_us = timeout_us / 4;
        let (handle, slow, other, task_id) = one_task_on_two(&mut core, MS);
        // It counts the attempt from its first heartbeat on, and reports it RUNNING only after
        // three timeouts, then finishes it.
        let mut now_us = MS;
        while now_us < 3 * timeout_us {
            now_us += beat_us;
            assert!(heartbeat(&mut core, slow, 1, now_us), "kept at {now_us} us");
            assert!(heartbeat(&mut core, other, 0, now_us));
        }
        let running = [StatusUpdate {
            task_id,
            attempt: 0,
            state: TaskState::Running,
            data: b"",
        }];
        let mut out = BytesMut::new();
        batch::encode_status_updates(&running, &mut out, FRAME_SIZE_MAX_DEFAULT).expect("encodes");
        assert!(send_bytes(&mut core, slow, &out, now_us));
        for _ in 0..8 {
            now_us += beat_us;
            assert!(heartbeat(&mut core, slow, 1, now_us), "kept at {now_us} us");
            assert!(heartbeat(&mut core, other, 0, now_us));
        }
        // Its final report goes ahead of the heartbeat that no longer counts the attempt.
        assert!(send_bytes(
            &mut core,
            slow,
            &finished(task_id, 0, b"late"),
            now_us
        ));
        for _ in 0..8 {
            now_us += beat_us;
            assert!(heartbeat(&mut core, slow, 0, now_us), "kept at {now_us} us");
        }
        assert!(core.poll_close().is_none(), "nobody is closed");
        assert_eq!(core.counters.executors_lost.load(Ordering::SeqCst), 0);
        assert!(matches!(outcome(handle), JobOutcome::Succeeded(ref r) if r[0] == "late"));
    }

    #[test]
    fn poll_timeout_is_none_when_idle_and_the_earliest_deadline_otherwise() {
        let config = config();
        let handshake_us = us(config.handshake_timeout);
        let heartbeat_us = us(config.heartbeat_timeout);
        let mut core = new_core(config);
        assert_eq!(core.poll_timeout(), None, "a new driver");
        core.handle_connected(PeerId(1), [1; 32], 0).expect("room");
        assert_eq!(
            core.poll_timeout(),
            Some(handshake_us + 1),
            "the handshake's"
        );
        core.handle_closed(PeerId(1), &ConnError::Closed, MS);
        core.handle_timeout(handshake_us + 1);
        assert_eq!(core.poll_timeout(), None, "the peer went");

        assert!(register(&mut core, PeerId(2), "e", 1, 10 * S).0);
        assert_eq!(
            core.poll_timeout(),
            Some(10 * S + heartbeat_us + 1),
            "its heartbeat's"
        );
        // A job that cannot start (it needs two cores): its deadline and the stall check.
        let mut job = Job::new("echo", vec![Bytes::new()]).deadline(Duration::from_millis(150));
        job.cores = 2;
        let handle = submit(&mut core, job, 11 * S);
        assert_eq!(
            core.poll_timeout(),
            Some(11 * S + HEALTH_INTERVAL_US),
            "the first stall check, before the job's deadline"
        );
        core.handle_timeout(11 * S + HEALTH_INTERVAL_US);
        assert_eq!(
            core.poll_timeout(),
            Some(11 * S + 150 * MS),
            "the job's deadline"
        );
        core.handle_timeout(11 * S + 150 * MS);
        assert!(matches!(outcome(handle), JobOutcome::Failed(_)));
        assert_eq!(
            core.poll_timeout(),
            Some(10 * S + heartbeat_us + 1),
            "only the executor's heartbeat once the job ended"
        );
    }

    #[test]
    fn a_job_past_its_deadline_fails_with_that_reason() {
        let mut core = new_core(config());
        // No executor: the task waits.
        let job = Job::new("echo", vec![Bytes::new()]).deadline(Duration::from_secs(2));
        let handle = submit(&mut core, job, 0);
        core.handle_timeout(S);
        assert_eq!(core.jobs.len(), 1, "still within its deadline");
        core.handle_timeout(2 * S);
        match outcome(handle) {
            JobOutcome::Failed(reasons) => assert!(
                reasons.iter().any(|r| r.contains("its deadline passed")),
                "{reasons:?}"
            ),
            other => panic!("{other:?}"),
        }
        assert!(core.jobs.is_empty());
        assert_eq!(core.admission.active_jobs(), 0, "its room given back");
    }

    #[test]
    fn a_full_table_evicts_the_oldest_handshake_and_then_refuses() {
        let mut core = new_core(DriverConfig {
            connections_max: 3,
            ..config()
        });
        assert!(register(&mut core, PeerId(0), "e", 1, 0).0);
        core.handle_connected(PeerId(1), [1; 32], MS).expect("room");
        core.handle_connected(PeerId(2), [1; 32], 2 * MS)
            .expect("room");
        let _ = transmitted(&mut core);
        // Full: the oldest unauthenticated connection makes room, told why.
        core.handle_connected(PeerId(3), [1; 32], 3 * MS)
            .expect("room made");
        let told = sent_to(&mut core, PeerId(1));
        assert!(
            told.iter().any(|f| matches!(
                f.message(),
                Ok(Message::HandshakeRefused { reason }) if reason.starts_with(TABLE_FULL)
            )),
            "the evicted peer hears the table is full"
        );
        assert_eq!(core.poll_close().map(|(p, _)| p), Some(PeerId(1)));
        assert!(core.poll_close().is_none());
        // Only executors left to evict: refused, the executor kept.
        core.handle_closed(PeerId(2), &ConnError::Closed, 4 * MS);
        core.handle_closed(PeerId(3), &ConnError::Closed, 4 * MS);
        assert!(register(&mut core, PeerId(5), "f", 1, 4 * MS).0);
        assert!(register(&mut core, PeerId(6), "g", 1, 4 * MS).0);
        let refused = core.handle_connected(PeerId(4), [1; 32], 5 * MS);
        assert!(refused.is_err_and(|reason| reason.starts_with(TABLE_FULL)));
        assert!(core.poll_close().is_none(), "no executor is evicted");
        assert_eq!(core.counters.executors.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_local_executor_gets_launches_and_its_completions_end_the_job() {
        let mut core = new_core(config());
        assert_eq!(core.add_local_executor(2, 0), 2, "two cores of one slot");
        let handle = submit(&mut core, Job::new("echo", vec![Bytes::from("a"); 2]), MS);
        let mut completions = Vec::new();
        while let Some(command) = core.poll_local() {
            let LocalCommand::Launch(task) = command else {
                panic!("only launches: {command:?}");
            };
            completions.push(TaskReport {
                task: task.task,
                attempt: task.attempt,
                state: TaskState::Finished,
                data: task.payload,
            });
        }
        assert_eq!(completions.len(), 2);
        assert!(core.poll_transmit().is_none(), "nothing goes over the wire");
        core.handle_local_completions(&mut completions, 2 * MS);
        assert!(completions.is_empty(), "drained");
        match outcome(handle) {
            JobOutcome::Succeeded(results) => assert_eq!(results, vec![Bytes::from("a"); 2]),
            other => panic!("{other:?}"),
        }
    }
}
