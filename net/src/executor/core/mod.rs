//! The executor's side of the protocol as a sans-IO state machine, in the style of
//! quinn-proto: the handshake (a [`LinkCore`] without reconnection), registration, heartbeats, the driver's frames turned into
//! [`Action`]s, and task completions turned into batched `StatusUpdates` frames.
//!
//! No sockets, threads or clock: every input carries `now_us` (microseconds on whatever clock
//! the caller keeps, the same one for every input), and every output is polled:
//!
//! - inputs: [`ExecutorCore::handle_frame`] (or [`ExecutorCore::handle_bytes`]),
//!   [`ExecutorCore::handle_completion`], [`ExecutorCore::handle_timeout`],
//!   [`ExecutorCore::handle_closed`];
//! - outputs: [`ExecutorCore::poll_transmit`] (bytes for the driver),
//!   [`ExecutorCore::poll_action`] (what to do to the tasks), [`ExecutorCore::poll_timeout`]
//!   (when the next heartbeat is due: the one timer), [`ExecutorCore::poll_exit`] (why it
//!   ended, once).
//!
//! Its output depends on its inputs only (the handshake nonce is one of them), so a simulator
//! can run many cores against a driver in one thread with simulated time. Completions queue
//! until the next `poll_transmit`, so all the completions fed in between leave in as few
//! frames as fit.

use std::collections::VecDeque;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{ExecutorConfig, ExecutorError, ExecutorSummary};
use crate::admission::FUNCTION_NAME_MAX_BYTES;
use crate::transport::link::{move_bytes, LinkCore, LinkRules, Received};
use crate::transport::{encode, unexpected};
use crate::wire::limits::FUNCTIONS_PER_CONNECTION;
use crate::wire::{self, batch, Frame, FrameDecoder, List, Message, Metric, Role, TaskState};
use flint_engine::runner::TaskReport;
use flint_engine::scheduler::{Attempt, TaskId, TaskLaunch};
use in_flight::InFlight;

mod in_flight;

/// The heartbeat interval until the driver's `RegisteredExecutor` sets it, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 500;
/// The shortest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MIN: u64 = 10;
/// The longest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MAX: u64 = 60_000;

/// What the executor must do to its running tasks, from [`ExecutorCore::poll_action`] (the
/// attempts to run come from [`ExecutorCore::poll_launches`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Ask a running attempt to stop; it completes as killed.
    Kill(Attempt),
    /// Ask every running attempt to stop: the executor has ended (see
    /// [`ExecutorCore::poll_exit`]).
    KillAll,
}

enum Phase {
    /// The link's handshake is running.
    Handshake,
    /// Authenticated, `RegisterExecutor` (lane 0) or `JoinLane` sent, waiting for the answer.
    Registering,
    Running,
    Ended,
}

/// One executor's protocol state (see the module docs).
pub struct ExecutorCore {
    executor_id: String,
    host: String,
    cores: u32,
    /// Which lane this core is (0 registers the executor, the others join it).
    lane: u32,
    /// The executor's lanes.
    lanes: u32,
    /// Lane 0: the key the driver gave, once registered. The others: the key they join with.
    lane_key: Option<[u8; 32]>,
    frame_size_max: usize,
    in_flight_max: usize,
    phase: Phase,
    /// The connection to the driver: the handshake and the bytes it sends.
    link: LinkCore,
    /// Encoded frames not yet handed to [`ExecutorCore::poll_transmit`].
    transmit: BytesMut,
    /// Attempts to run, in the order the driver sent them (see [`ExecutorCore::poll_launches`]).
    launches: Vec<TaskLaunch>,
    actions: VecDeque<Action>,
    /// Completions to report at the next [`ExecutorCore::poll_transmit`], already bounded.
    updates: Vec<TaskReport>,
    /// The wire view of `updates` being encoded (empty between calls: its borrows end with
    /// the call), kept so that a batch allocates nothing.
    batch: Vec<wire::StatusUpdate<'static>>,
    /// Attempts launched and not yet completed.
    in_flight: InFlight,
    /// The functions the driver defined on this lane (see [`Functions`]).
    functions: Functions,
    heartbeat_interval_us: u64,
    heartbeat_next_us: Option<u64>,
    /// Attempts that reached a final state here.
    task_attempts: u64,
    /// Going away (SIGTERM): the driver was told, launches come back killed.
    draining: bool,
    exit: Option<Result<ExecutorSummary, ExecutorError>>,
    /// For [`ExecutorCore::handle_bytes`] only.
    decoder: FrameDecoder,
}

impl std::fmt::Debug for ExecutorCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorCore")
            .field("executor_id", &self.executor_id)
            .field("in_flight", &self.in_flight.len())
            .field("task_attempts", &self.task_attempts)
            .finish_non_exhaustive()
    }
}

impl ExecutorCore {
    /// An executor's lane 0 as `config` describes it (its id, host, cores and lanes, secret,
    /// frame size and in-flight limit; the address and connect timeout are the IO side's),
    /// starting its handshake with `nonce`: its `Hello` is the first thing to transmit. It
    /// registers the executor; once registered, [`ExecutorCore::lane_key`] is what the other
    /// lanes join with.
    pub fn new(config: &ExecutorConfig, nonce: [u8; 32]) -> Self {
        Self::with_lane(config, nonce, 0, None)
    }

    /// Lane `lane` (1 or more) of the executor `config` describes, which lane 0 registered:
    /// after the handshake it joins with `lane_key` (see [`ExecutorCore::lane_key`]) instead
    /// of registering, then runs as lane 0 does with its share of the attempts.
    pub fn new_lane(
        config: &ExecutorConfig,
        nonce: [u8; 32],
        lane: u32,
        lane_key: [u8; 32],
    ) -> Self {
        Self::with_lane(config, nonce, lane, Some(lane_key))
    }

    fn with_lane(
        config: &ExecutorConfig,
        nonce: [u8; 32],
        lane: u32,
        lane_key: Option<[u8; 32]>,
    ) -> Self {
        let mut link = LinkCore::new(LinkRules {
            role: Role::Executor,
            peer_roles: &[Role::Driver],
            secret: config.secret.clone(),
            label: if lane == 0 {
                format!("executor {}", config.executor_id)
            } else {
                format!("executor {} lane {lane}", config.executor_id)
            },
            peer_name: "the driver",
            peer_addr: config.driver,
            // The IO side bounds the one attempt; an executor does not reconnect.
            connect_timeout_us: None,
            backoff: None,
        });
        link.handle_connected(nonce, 0);
        ExecutorCore {
            executor_id: config.executor_id.clone(),
            host: config.host.clone(),
            cores: config.cores,
            lane,
            lanes: config.lanes(),
            lane_key,
            frame_size_max: config.frame_size_max,
            in_flight_max: config.in_flight_max(),
            phase: Phase::Handshake,
            link,
            transmit: BytesMut::new(),
            launches: Vec::new(),
            actions: VecDeque::new(),
            updates: Vec::new(),
            batch: Vec::new(),
            in_flight: InFlight::new(),
            functions: Functions::default(),
            heartbeat_interval_us: HEARTBEAT_INTERVAL_MS_DEFAULT * 1000,
            heartbeat_next_us: None,
            task_attempts: 0,
            draining: false,
            exit: None,
            decoder: FrameDecoder::new(config.frame_size_max),
        }
    }

    /// This executor's id.
    pub fn executor_id(&self) -> &str {
        &self.executor_id
    }

    /// Which lane this core is (0: the one that registers the executor).
    pub fn lane(&self) -> u32 {
        self.lane
    }

    /// Lane 0, once registered with more than one lane: the key its other lanes join with
    /// (never logged). `None` before, for the other lanes, and for an executor of one lane.
    pub fn lane_key(&self) -> Option<[u8; 32]> {
        let registered = matches!(self.phase, Phase::Running);
        self.lane_key
            .filter(|_| self.lane == 0 && registered && self.lanes > 1)
    }

    /// Attempts that reached a final state on this lane.
    pub fn task_attempts(&self) -> u64 {
        self.task_attempts
    }

    /// Attempts launched and not yet completed (what heartbeats report as running).
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether the executor has ended (its exit may already have been polled).
    pub fn is_ended(&self) -> bool {
        matches!(self.phase, Phase::Ended)
    }

    /// Feeds bytes from the driver in any chunking; complete frames go to
    /// [`ExecutorCore::handle_frame`]. A malformed stream ends the executor.
    pub fn handle_bytes(&mut self, bytes: &[u8], now_us: u64) {
        self.decoder.extend_from_slice(bytes);
        while !self.is_ended() {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => self.handle_frame(&frame, now_us),
                Ok(None) => break,
                Err(error) => {
                    let why = format!("malformed frame from the driver: {error}");
                    self.end(Err(ExecutorError::DriverGone(why)));
                }
            }
        }
        self.check();
    }

    /// Feeds one frame from the driver. Ignored once the executor has ended.
    pub fn handle_frame(&mut self, frame: &Frame, now_us: u64) {
        let result = match &mut self.phase {
            Phase::Ended => return,
            Phase::Handshake => match self.link.handle_frame(frame, now_us) {
                Ok(Received::Opened(_driver)) => {
                    self.register();
                    Ok(())
                }
                Ok(_) => Ok(()),
                Err(ended) => Err(ExecutorError::Refused(ended.why)),
            },
            Phase::Registering | Phase::Running => self.on_message(frame, now_us),
        };
        if let Err(error) = result {
            self.end(Err(error));
        }
        self.check();
    }

    /// Feeds a task attempt's completion (from the task runner). A final one leaves the
    /// in-flight set and counts as an attempt run; each goes out at the next
    /// [`ExecutorCore::poll_transmit`], a result too large for a frame failing its task.
    pub fn handle_completion(&mut self, mut completion: TaskReport, _now_us: u64) {
        if !self.is_ended() && self.accept(&mut completion) {
            self.updates.push(completion);
        }
        self.check();
    }

    /// Feeds a batch of completions as [`ExecutorCore::handle_completion`] does each, taking
    /// them out of `completions` (when none are queued, its buffer is taken over and nothing
    /// is copied).
    pub fn handle_completions(&mut self, completions: &mut Vec<TaskReport>, _now_us: u64) {
        if self.is_ended() {
            completions.clear();
            return;
        }
        let mut i = 0;
        while let Some(completion) = completions.get_mut(i) {
            if self.accept(completion) {
                i += 1;
            } else {
                // Only while draining: rare, and a batch is short.
                completions.remove(i);
            }
        }
        if self.updates.is_empty() {
            std::mem::swap(&mut self.updates, completions);
        } else {
            self.updates.append(completions);
        }
        self.check();
    }

    /// One completion, bounded to a frame; whether it is to be reported (not when the
    /// executor, draining, reported it killed already).
    #[inline(always)]
    fn accept(&mut self, completion: &mut TaskReport) -> bool {
        let key = Attempt::new(completion.task, completion.attempt);
        if self.draining && !self.in_flight.contains(key) {
            // Reported killed when the executor left.
            return false;
        }
        if completion.state != TaskState::Running {
            self.in_flight.remove(key);
            self.task_attempts += 1;
        }
        bound_report(completion, self.frame_size_max);
        true
    }

    /// The executor is going away (SIGTERM): the driver is told (`ExecutorDraining`) and
    /// gives it no new task; the attempts in flight go on; a launch that crossed the message
    /// comes back killed (re-queued, not counted).
    pub fn handle_drain(&mut self, _now_us: u64) {
        if self.draining || self.is_ended() {
            return;
        }
        self.draining = true;
        tracing::info!(executor_id = %self.executor_id, lane = self.lane, "draining");
        if matches!(self.phase, Phase::Running) {
            self.send_draining();
        }
        self.check();
    }

    /// Tells the driver this lane's executor is going away (a lane registered after the drain
    /// began tells it when it is accepted).
    fn send_draining(&mut self) {
        self.encode_updates();
        let draining = Message::ExecutorDraining {};
        encode(&draining, &mut self.transmit, self.frame_size_max);
    }

    /// The drain's time is up: every attempt still in flight is reported killed, so the driver
    /// runs it elsewhere at once instead of losing it with the executor. How many.
    pub fn handle_leave(&mut self, _now_us: u64) -> usize {
        debug_assert!(self.draining, "leave follows drain");
        let left = self.in_flight.take_all();
        for &key in &left {
            let why = Bytes::from_static(b"the executor is shutting down (SIGTERM)");
            self.report_ended(key, TaskState::Killed, why);
        }
        self.encode_updates();
        debug_assert!(self.in_flight.is_empty());
        self.check();
        left.len()
    }

    /// Time has passed: sends a heartbeat when one is due (see
    /// [`ExecutorCore::poll_timeout`]).
    pub fn handle_timeout(&mut self, now_us: u64) {
        let Some(due_us) = self.heartbeat_next_us else {
            return;
        };
        if now_us < due_us {
            return;
        }
        let next_us = due_us.saturating_add(self.heartbeat_interval_us);
        // Missed beats are not made up: the next comes one interval from now.
        self.heartbeat_next_us = Some(if next_us <= now_us {
            now_us.saturating_add(self.heartbeat_interval_us)
        } else {
            next_us
        });
        debug_assert!(
            self.heartbeat_next_us > Some(now_us),
            "the next beat is in the future"
        );
        self.send_heartbeat();
        self.check();
    }

    /// The connection ended (`why`: closed by the driver, or a read or write error): the
    /// executor ends with [`ExecutorError::DriverGone`] unless it already ended.
    pub fn handle_closed(&mut self, why: impl Into<String>) {
        if !self.is_ended() {
            self.end(Err(ExecutorError::DriverGone(why.into())));
        }
        self.check();
    }

    /// Appends what is to be sent to the driver to `out` (taking over its buffer when `out` is
    /// empty, so nothing is copied): frames made by earlier inputs, then the completions fed in
    /// since the last call as `StatusUpdates` frames. Returns the bytes appended.
    pub fn poll_transmit(&mut self, out: &mut BytesMut) -> usize {
        // The handshake's frames come before anything the executor says after it.
        let handshake = self.link.poll_transmit(out);
        self.encode_updates();
        handshake + move_bytes(&mut self.transmit, out)
    }

    /// The attempts to run, in the order the driver sent them, each taken out: the registered
    /// function (`name` or `name:ARG`, shared by every launch that names it) on its payload
    /// (which shares the driver's frame). Their completions go to
    /// [`ExecutorCore::handle_completions`]. Carry them out before
    /// [`ExecutorCore::poll_action`]'s, which may kill one of them.
    pub fn poll_launches(&mut self) -> std::vec::Drain<'_, TaskLaunch> {
        self.launches.drain(..)
    }

    /// The next thing to do to the running tasks, in the order the driver asked (after
    /// [`ExecutorCore::poll_launches`]).
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`ExecutorCore::handle_timeout`] must next be called (`now_us` of the next
    /// heartbeat), or `None` while no heartbeat is scheduled (before registration, after
    /// the end).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.heartbeat_next_us
    }

    /// How the executor ended, once: `Ok` with what it did when the driver stopped it, `Err`
    /// when it was refused or the driver went away. `None` while it runs (and after the
    /// first answer).
    pub fn poll_exit(&mut self) -> Option<Result<ExecutorSummary, ExecutorError>> {
        self.exit.take()
    }

    /// What must hold after every input (debug builds and the simulator's `sim` profile):
    /// the in-flight set within its bound, heartbeats scheduled exactly while running, an
    /// exit only once ended, its lane one of its executor's, every queued report within a
    /// frame, the name cache bounded.
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.in_flight.len() <= self.in_flight_max,
            "in flight over its bound"
        );
        let running = matches!(self.phase, Phase::Running);
        let ended = matches!(self.phase, Phase::Ended);
        assert_eq!(
            self.heartbeat_next_us.is_some(),
            running,
            "a heartbeat is scheduled exactly while running"
        );
        assert!(self.exit.is_none() || ended, "an exit before the end");
        assert!(
            self.lanes == 0 || self.lane < self.lanes,
            "lane {} of {}",
            self.lane,
            self.lanes
        );
        for update in &self.updates {
            assert!(
                update.data.len() < self.frame_size_max,
                "a report over a frame queued"
            );
        }
        assert!(self.functions.names.len() <= FUNCTIONS_PER_CONNECTION as usize);
    }

    /// The handshake succeeded: lane 0 asks to register, the others to join.
    fn register(&mut self) {
        let message = match self.lane_key.filter(|_| self.lane > 0) {
            Some(lane_key) => Message::JoinLane {
                executor_id: &self.executor_id,
                lane: self.lane,
                lane_key,
            },
            None => Message::RegisterExecutor {
                executor_id: &self.executor_id,
                host: &self.host,
                cores: self.cores,
                lanes: self.lanes,
                attributes: List::empty(),
            },
        };
        encode(&message, &mut self.transmit, self.frame_size_max);
        self.phase = Phase::Registering;
    }

    /// The driver accepted this lane (registered or joined): heartbeats start.
    fn accepted(&mut self, heartbeat_interval_ms: u32, now_us: u64) {
        let interval_ms = u64::from(heartbeat_interval_ms)
            .clamp(HEARTBEAT_INTERVAL_MS_MIN, HEARTBEAT_INTERVAL_MS_MAX);
        self.heartbeat_interval_us = interval_ms * 1000;
        self.heartbeat_next_us = Some(now_us.saturating_add(self.heartbeat_interval_us));
        self.phase = Phase::Running;
        tracing::info!(executor_id = %self.executor_id, lane = self.lane, "registered with the driver");
        if self.draining {
            self.send_draining();
        }
    }

    /// One message after the handshake.
    fn on_message(&mut self, frame: &Frame, now_us: u64) -> Result<(), ExecutorError> {
        let message = frame.message().map_err(|e| {
            ExecutorError::DriverGone(format!("malformed frame from the driver: {e}"))
        })?;
        let registering = matches!(self.phase, Phase::Registering);
        match message {
            Message::RegisteredExecutor {
                heartbeat_interval_ms,
                lane_key,
            } if registering && self.lane == 0 => {
                self.lane_key = Some(lane_key);
                self.accepted(heartbeat_interval_ms, now_us);
            }
            Message::LaneJoined {
                heartbeat_interval_ms,
            } if registering && self.lane > 0 => self.accepted(heartbeat_interval_ms, now_us),
            Message::RegisterExecutorFailed { reason } => {
                return Err(ExecutorError::Refused(reason.to_owned()))
            }
            Message::DefineFunction { index, name } => self.functions.define(index, name)?,
            Message::LaunchTasks { tasks } => {
                let mut undefined = None;
                for task in tasks {
                    let Some(function) = self.functions.get(task.function) else {
                        let key = Attempt::new(TaskId(task.task_id), task.attempt);
                        let why = Bytes::from_static(UNDEFINED_FUNCTION);
                        self.report_ended(key, TaskState::Failed, why);
                        undefined = Some(undefined.map_or((task.function, 1), |(i, n)| (i, n + 1)));
                        continue;
                    };
                    let launch = TaskLaunch {
                        task: TaskId(task.task_id),
                        attempt: task.attempt,
                        function,
                        payload: frame.share(task.payload),
                        cores: task.cores,
                        // Not on the wire: an executor runs a copy like any attempt.
                        speculative: false,
                    };
                    self.launch(launch);
                }
                if let Some((index, failed)) = undefined {
                    tracing::warn!(
                        index,
                        failed,
                        "launches naming a function index never defined failed"
                    );
                }
            }
            Message::KillTask {
                task_id, attempt, ..
            } => {
                let key = Attempt::new(TaskId(task_id), attempt);
                if self.in_flight.contains(key) {
                    self.actions.push_back(Action::Kill(key));
                }
            }
            Message::HeartbeatAck {} => {}
            Message::StopExecutor {} => {
                tracing::info!(executor_id = %self.executor_id, "stopped by the driver");
                self.end(Ok(()));
            }
            Message::Shutdown {} => {
                return Err(ExecutorError::DriverGone("the driver shut down".into()))
            }
            other => return Err(ExecutorError::DriverGone(unexpected(&other, "the driver"))),
        }
        Ok(())
    }

    /// One launch: a duplicate of an attempt in flight is ignored; one past the in-flight
    /// limit fails at once (a driver keeps within `tasks_per_core`, which is at most that).
    #[inline(always)]
    fn launch(&mut self, launch: TaskLaunch) {
        let key = Attempt::new(launch.task, launch.attempt);
        let room = !self.draining && self.in_flight.len() < self.in_flight_max;
        // Taken in now if new: the usual launch looks at the in-flight set once.
        if room && self.in_flight.insert(key) {
            self.launches.push(launch);
        } else {
            self.launch_refused(key, room);
        }
    }

    /// A launch not taken in: a duplicate (found in flight, whether or not there was `room`),
    /// or one that comes while draining or past the in-flight limit.
    #[cold]
    #[inline(never)]
    fn launch_refused(&mut self, key: Attempt, room: bool) {
        if room || self.in_flight.contains(key) {
            tracing::warn!(
                task_id = key.task.0,
                attempt = key.attempt,
                "duplicate launch ignored"
            );
        } else if self.draining {
            let why = Bytes::from_static(b"the executor is draining (going away)");
            self.report_ended(key, TaskState::Killed, why);
        } else {
            let reason = format!(
                "not run: the executor already holds its maximum of {} attempts",
                self.in_flight_max
            );
            self.report_ended(key, TaskState::Failed, Bytes::from(reason));
        }
    }

    /// An attempt that ends here without running (or without running further): its final
    /// report, queued with the completions.
    fn report_ended(&mut self, key: Attempt, state: TaskState, data: Bytes) {
        debug_assert!(state != TaskState::Running && state != TaskState::Finished);
        self.task_attempts += 1;
        self.updates.push(TaskReport {
            task: key.task,
            attempt: key.attempt,
            state,
            data,
        });
    }

    /// A heartbeat with the attempts in flight. The completions fed in before go out ahead of
    /// it, so a driver that reads the count has heard every attempt it leaves out end (the
    /// driver's check for executors that do not read their launches relies on it).
    fn send_heartbeat(&mut self) {
        self.encode_updates();
        let running = self.in_flight.len();
        let metrics = [Metric {
            name: "tasks_running",
            value: running as u64,
        }];
        let heartbeat = Message::Heartbeat {
            executor_id: &self.executor_id,
            running_tasks: running.min(u32::MAX as usize) as u32,
            metrics: List::from_items(&metrics),
        };
        encode(&heartbeat, &mut self.transmit, self.frame_size_max);
    }

    /// The queued completions as `StatusUpdates` frames.
    fn encode_updates(&mut self) {
        if self.updates.is_empty() {
            return;
        }
        let mut batch: Vec<wire::StatusUpdate<'_>> =
            batch::emptied(std::mem::take(&mut self.batch));
        batch.extend(self.updates.iter().map(|update| wire::StatusUpdate {
            task_id: update.task.0,
            attempt: update.attempt,
            state: update.state,
            data: &update.data,
        }));
        if let Err(error) =
            batch::encode_status_updates(&batch, &mut self.transmit, self.frame_size_max)
        {
            // Unreachable: `bound_report` keeps every update within a frame.
            tracing::error!(executor_id = %self.executor_id, "status updates not sent: {error}");
        }
        self.batch = batch::emptied(batch);
        self.updates.clear();
    }

    /// Ends the executor: every task is to be killed, no heartbeat follows, and the exit is
    /// ready for [`ExecutorCore::poll_exit`]. Frames already queued still go out (a
    /// handshake refusal tells the driver why).
    fn end(&mut self, reason: Result<(), ExecutorError>) {
        if let Err(error) = &reason {
            tracing::error!(executor_id = %self.executor_id, "{error}");
        }
        let completed = self.task_attempts;
        tracing::info!(executor_id = %self.executor_id, completed, "ran {completed} task attempts");
        self.phase = Phase::Ended;
        self.heartbeat_next_us = None;
        self.launches.clear();
        self.actions.clear();
        self.actions.push_back(Action::KillAll);
        self.exit = Some(reason.map(|()| ExecutorSummary {
            task_attempts: completed,
        }));
    }
}

/// Why a launch naming an index the driver never defined on this lane failed.
const UNDEFINED_FUNCTION: &[u8] =
    b"not run: the launch names a function index the driver never defined on this lane";

/// The functions the driver defined on this lane, by index (`DefineFunction`; launches name
/// one by index). A name defined again shares the `Arc` it had, so the runner's pointer check
/// finds it.
#[derive(Debug, Default)]
struct Functions {
    names: Vec<Option<Arc<str>>>,
}

impl Functions {
    /// Defines `index` as `name`. Fails for an index past [`FUNCTIONS_PER_CONNECTION`] or a
    /// name longer than a driver lets a job name ([`FUNCTION_NAME_MAX_BYTES`]).
    fn define(&mut self, index: u32, name: &str) -> Result<(), ExecutorError> {
        if index >= FUNCTIONS_PER_CONNECTION {
            return Err(ExecutorError::DriverGone(format!(
                "the driver defined function index {index}, past the {FUNCTIONS_PER_CONNECTION} \
                 a connection has"
            )));
        }
        if name.len() > FUNCTION_NAME_MAX_BYTES {
            return Err(ExecutorError::DriverGone(format!(
                "the driver defined a function name of {} bytes, over {FUNCTION_NAME_MAX_BYTES}",
                name.len()
            )));
        }
        let shared = match (self.names.iter().flatten()).find(|n| ***n == *name) {
            Some(known) => known.clone(),
            None => Arc::from(name),
        };
        let index = index as usize;
        if index >= self.names.len() {
            self.names.resize(index + 1, None);
        }
        self.names[index] = Some(shared);
        Ok(())
    }

    /// The function `index` names, if defined.
    #[inline]
    fn get(&self, index: u32) -> Option<Arc<str>> {
        self.names.get(index as usize)?.clone()
    }
}

/// Keeps a report within what one frame carries: a result too large for a frame fails its task
/// with the reason (the driver never sees a wrong success), and a failure's text is cut to
/// [`batch::REASON_BYTES_MAX`]. A result that fits, the usual report, is checked inline.
#[inline(always)]
fn bound_report(update: &mut TaskReport, frame_size_max: usize) {
    let fits = update.data.len() <= batch::item_bytes_max(frame_size_max);
    if update.state != TaskState::Finished || !fits {
        bound_report_cold(update, frame_size_max);
    }
}

/// [`bound_report`] past its check of a result that fits.
#[cold]
#[inline(never)]
fn bound_report_cold(update: &mut TaskReport, frame_size_max: usize) {
    let result_max = batch::item_bytes_max(frame_size_max);
    if update.state == TaskState::Finished && update.data.len() > result_max {
        update.state = TaskState::Failed;
        update.data = Bytes::from(format!(
            "the result of {} bytes is larger than a status frame carries ({result_max} bytes with \
             a maximum frame size of {frame_size_max}): return less from the task",
            update.data.len()
        ));
    } else if update.state != TaskState::Finished {
        update.data = batch::bound_reason(std::mem::take(&mut update.data));
    }
}

#[cfg(test)]
mod tests;
