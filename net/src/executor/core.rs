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
use flint_engine::hash::FxHashSet;

use super::{ExecutorConfig, ExecutorError, ExecutorSummary};
use crate::transport::link::{move_bytes, LinkCore, LinkRules, Received};
use crate::transport::{encode, unexpected};
use crate::wire::{self, batch, Frame, FrameDecoder, List, Message, Metric, Role, TaskState};
use flint_engine::runner::TaskReport;
use flint_engine::scheduler::{TaskId, TaskLaunch};

/// The heartbeat interval until the driver's `RegisteredExecutor` sets it, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 500;
/// The shortest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MIN: u64 = 10;
/// The longest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MAX: u64 = 60_000;

/// What the executor must do to its tasks, from [`ExecutorCore::poll_action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run this attempt: the registered function (`name` or `name:ARG`, shared by every launch
    /// that names it) on its payload (which shares the driver's frame). Its completions go to
    /// [`ExecutorCore::handle_completion`].
    Launch(TaskLaunch),
    /// Ask a running attempt to stop; it completes as killed.
    Kill {
        /// The task.
        task_id: u64,
        /// The attempt.
        attempt: u32,
    },
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
    actions: VecDeque<Action>,
    /// Completions to report at the next [`ExecutorCore::poll_transmit`], already bounded.
    updates: Vec<TaskReport>,
    /// Attempts launched and not yet completed.
    in_flight: FxHashSet<(u64, u32)>,
    /// The function names launches carried, each once (see [`Names`]).
    names: Names,
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
            actions: VecDeque::new(),
            updates: Vec::new(),
            in_flight: FxHashSet::default(),
            names: Names::default(),
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
                Ok(None) => return,
                Err(error) => {
                    let why = format!("malformed frame from the driver: {error}");
                    self.end(Err(ExecutorError::DriverGone(why)));
                }
            }
        }
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
    }

    /// Feeds a task attempt's completion (from the task runner). A final one leaves the
    /// in-flight set and counts as an attempt run; each goes out at the next
    /// [`ExecutorCore::poll_transmit`], a result too large for a frame failing its task.
    pub fn handle_completion(&mut self, mut completion: TaskReport, _now_us: u64) {
        if self.is_ended() {
            return;
        }
        let key = (completion.task.0, completion.attempt);
        if self.draining && !self.in_flight.contains(&key) {
            // Reported killed when the executor left.
            return;
        }
        if completion.state != TaskState::Running {
            self.in_flight.remove(&key);
            self.task_attempts += 1;
        }
        bound_report(&mut completion, self.frame_size_max);
        self.updates.push(completion);
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
        let left: Vec<(u64, u32)> = self.in_flight.drain().collect();
        for &(task_id, attempt) in &left {
            let why = Bytes::from_static(b"the executor is shutting down (SIGTERM)");
            self.report_ended(task_id, attempt, TaskState::Killed, why);
        }
        self.encode_updates();
        debug_assert!(self.in_flight.is_empty());
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
        self.send_heartbeat();
    }

    /// The connection ended (`why`: closed by the driver, or a read or write error): the
    /// executor ends with [`ExecutorError::DriverGone`] unless it already ended.
    pub fn handle_closed(&mut self, why: impl Into<String>) {
        if !self.is_ended() {
            self.end(Err(ExecutorError::DriverGone(why.into())));
        }
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

    /// The next thing to do to the tasks, in the order the driver asked.
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
            Message::LaunchTasks { tasks } => {
                for task in tasks {
                    let launch = TaskLaunch {
                        task: TaskId(task.task_id),
                        attempt: task.attempt,
                        function: self.names.get(task.function),
                        payload: frame.share(task.payload),
                        cores: task.cores,
                        // Not on the wire: an executor runs a copy like any attempt.
                        speculative: false,
                    };
                    self.launch(launch);
                }
            }
            Message::KillTask {
                task_id, attempt, ..
            } => {
                if self.in_flight.contains(&(task_id, attempt)) {
                    self.actions.push_back(Action::Kill { task_id, attempt });
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
    fn launch(&mut self, launch: TaskLaunch) {
        let (task_id, attempt) = (launch.task.0, launch.attempt);
        let key = (task_id, attempt);
        if self.in_flight.contains(&key) {
            tracing::warn!(task_id, attempt, "duplicate launch ignored");
            return;
        }
        if self.draining {
            let why = Bytes::from_static(b"the executor is draining (going away)");
            return self.report_ended(task_id, attempt, TaskState::Killed, why);
        }
        if self.in_flight.len() >= self.in_flight_max {
            let reason = format!(
                "not run: the executor already holds its maximum of {} attempts",
                self.in_flight_max
            );
            return self.report_ended(task_id, attempt, TaskState::Failed, Bytes::from(reason));
        }
        self.in_flight.insert(key);
        self.actions.push_back(Action::Launch(launch));
    }

    /// An attempt that ends here without running (or without running further): its final
    /// report, queued with the completions.
    fn report_ended(&mut self, task_id: u64, attempt: u32, state: TaskState, data: Bytes) {
        debug_assert!(state != TaskState::Running && state != TaskState::Finished);
        self.task_attempts += 1;
        self.updates.push(TaskReport {
            task: TaskId(task_id),
            attempt,
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
        let batch: Vec<wire::StatusUpdate> = self
            .updates
            .iter()
            .map(|update| wire::StatusUpdate {
                task_id: update.task.0,
                attempt: update.attempt,
                state: update.state,
                data: &update.data,
            })
            .collect();
        if let Err(error) =
            batch::encode_status_updates(&batch, &mut self.transmit, self.frame_size_max)
        {
            // Unreachable: `bound_report` keeps every update within a frame.
            tracing::error!(executor_id = %self.executor_id, "status updates not sent: {error}");
        }
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
        self.actions.clear();
        self.actions.push_back(Action::KillAll);
        self.exit = Some(reason.map(|()| ExecutorSummary {
            task_attempts: completed,
        }));
    }
}

/// Function names as launches carry them, each kept once as a shared `Arc<str>`, so a launch
/// costs no allocation for its name: at most [`NAMES_MAX`] (another name replaces the oldest),
/// the one asked last checked first.
#[derive(Debug, Default)]
struct Names {
    names: Vec<Arc<str>>,
    last: usize,
    next_out: usize,
}

/// Function names an executor lane keeps (see [`Names`]).
const NAMES_MAX: usize = 64;

impl Names {
    fn get(&mut self, name: &str) -> Arc<str> {
        if let Some(found) = self.names.get(self.last).filter(|n| ***n == *name) {
            return found.clone();
        }
        if let Some(i) = self.names.iter().position(|n| **n == *name) {
            self.last = i;
            return self.names[i].clone();
        }
        let shared: Arc<str> = Arc::from(name);
        if self.names.len() < NAMES_MAX {
            self.last = self.names.len();
            self.names.push(shared.clone());
        } else {
            self.last = self.next_out;
            self.names[self.next_out] = shared.clone();
            self.next_out = (self.next_out + 1) % NAMES_MAX;
        }
        shared
    }
}

/// Keeps a report within what one frame carries: a result too large for a frame fails its task
/// with the reason (the driver never sees a wrong success), and a failure's text is cut to
/// [`batch::REASON_BYTES_MAX`].
fn bound_report(update: &mut TaskReport, frame_size_max: usize) {
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
mod tests {
    use super::*;
    use crate::handshake::{Handshake, Secret};
    use crate::wire::{Kind, TaskLaunch};

    const FRAME_SIZE_MAX: usize = 4096;
    const DRIVER: &[Role] = &[Role::Executor];

    fn config(secret: Option<Secret>) -> ExecutorConfig {
        let mut config = ExecutorConfig::new(([127, 0, 0, 1], 1).into(), "e1");
        config.cores = 2;
        config.tasks_per_core = 2;
        config.frame_size_max = FRAME_SIZE_MAX;
        config.secret = secret;
        config
    }

    /// The frames the core transmits now.
    fn sent(core: &mut ExecutorCore) -> Vec<Frame> {
        let mut out = BytesMut::new();
        core.poll_transmit(&mut out);
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX);
        decoder.extend_from_slice(&out);
        let mut frames = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("the core sends valid frames") {
            frames.push(frame);
        }
        assert_eq!(decoder.buffered_len(), 0, "only whole frames");
        frames
    }

    fn kinds(frames: &[Frame]) -> Vec<Kind> {
        frames
            .iter()
            .map(|f| Kind::from_u16(f.kind()).expect("known kind"))
            .collect()
    }

    /// Sends the driver's `message` to the core as bytes.
    fn deliver(core: &mut ExecutorCore, message: &Message<'_>, now_us: u64) {
        let mut out = BytesMut::new();
        message.encode(&mut out, FRAME_SIZE_MAX).expect("encodes");
        core.handle_bytes(&out, now_us);
    }

    /// Plays the driver's side of the handshake; returns the core's frames after it.
    fn handshake(core: &mut ExecutorCore, secret: Option<Secret>) -> Vec<Frame> {
        let mut to_core = BytesMut::new();
        let mut driver = Handshake::accept(Role::Driver, secret, [9; 32], DRIVER, &mut to_core);
        let mut authenticated = false;
        for _ in 0..4 {
            core.handle_bytes(&to_core.split(), 0);
            let frames = sent(core);
            let mut rest = Vec::new();
            for frame in frames {
                if authenticated {
                    rest.push(frame);
                    continue;
                }
                let done = driver
                    .on_frame(frame.kind(), frame.body(), &mut to_core)
                    .expect("the driver accepts the executor");
                authenticated = done == Some(Role::Executor);
            }
            if authenticated && to_core.is_empty() {
                return rest;
            }
        }
        panic!("the handshake did not finish");
    }

    /// A core past the handshake, registered at `now_us` with a heartbeat every `interval_ms`.
    fn registered(interval_ms: u32, now_us: u64) -> ExecutorCore {
        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        handshake(&mut core, None);
        let registered = Message::RegisteredExecutor {
            heartbeat_interval_ms: interval_ms,
            lane_key: [0; 32],
        };
        deliver(&mut core, &registered, now_us);
        core
    }

    fn launch(core: &mut ExecutorCore, tasks: &[(u64, &str, &[u8])], now_us: u64) {
        let launches: Vec<TaskLaunch> = tasks
            .iter()
            .map(|&(task_id, function, payload)| TaskLaunch {
                task_id,
                attempt: 0,
                cores: 1,
                function,
                payload,
            })
            .collect();
        let mut out = BytesMut::new();
        batch::encode_launches(&launches, &mut out, FRAME_SIZE_MAX).expect("encodes");
        core.handle_bytes(&out, now_us);
    }

    /// The action a one-core launch of attempt `attempt` of `task_id` becomes.
    fn launched(task_id: u64, attempt: u32, function: &str, payload: Bytes) -> Action {
        Action::Launch(flint_engine::scheduler::TaskLaunch {
            task: TaskId(task_id),
            attempt,
            function: Arc::from(function),
            payload,
            cores: 1,
            speculative: false,
        })
    }

    fn actions(core: &mut ExecutorCore) -> Vec<Action> {
        std::iter::from_fn(|| core.poll_action()).collect()
    }

    fn done(task_id: u64, state: TaskState, data: &[u8]) -> TaskReport {
        TaskReport {
            task: TaskId(task_id),
            attempt: 0,
            state,
            data: Bytes::copy_from_slice(data),
        }
    }

    #[test]
    fn the_first_bytes_are_a_hello_from_an_executor() {
        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        let frames = sent(&mut core);
        assert_eq!(kinds(&frames), [Kind::Hello]);
        let hello = Message::decode_hello(frames[0].kind(), frames[0].body()).expect("a Hello");
        assert!(matches!(
            hello,
            Message::Hello { role: Role::Executor, nonce, .. } if nonce == [1; 32]
        ));
        assert_eq!(
            core.poll_timeout(),
            None,
            "no heartbeat before registration"
        );
    }

    #[test]
    fn it_registers_after_the_handshake_with_or_without_a_secret() {
        for secret in [None, Some(Secret::new("s3cret").expect("secret"))] {
            let mut core = ExecutorCore::new(&config(secret.clone()), [1; 32]);
            let frames = handshake(&mut core, secret);
            assert_eq!(kinds(&frames), [Kind::RegisterExecutor]);
            let Ok(Message::RegisterExecutor {
                executor_id, cores, ..
            }) = frames[0].message()
            else {
                panic!("a RegisterExecutor");
            };
            assert_eq!((executor_id, cores), ("e1", 2));
        }
    }

    #[test]
    fn lane_0_registers_the_lanes_and_hands_out_the_key_once_registered() {
        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        let frames = handshake(&mut core, None);
        let Ok(Message::RegisterExecutor { lanes, cores, .. }) = frames[0].message() else {
            panic!("a RegisterExecutor");
        };
        assert_eq!((lanes, cores), (2, 2), "one lane per core");
        assert_eq!(core.lane_key(), None, "not before the driver answers");
        let registered = Message::RegisteredExecutor {
            heartbeat_interval_ms: 100,
            lane_key: [7; 32],
        };
        deliver(&mut core, &registered, 0);
        assert_eq!(core.lane_key(), Some([7; 32]));
        assert_eq!(core.lane(), 0);

        // One core: one lane, no key to hand out.
        let mut one = config(None);
        one.cores = 1;
        let mut core = ExecutorCore::new(&one, [1; 32]);
        let frames = handshake(&mut core, None);
        let Ok(Message::RegisterExecutor { lanes, .. }) = frames[0].message() else {
            panic!("a RegisterExecutor");
        };
        assert_eq!(lanes, 1);
        deliver(&mut core, &registered, 0);
        assert_eq!(core.lane_key(), None);
    }

    #[test]
    fn cores_beyond_lanes_max_share_the_lanes() {
        let mut many = config(None);
        many.cores = crate::driver::LANES_MAX * 4;
        assert_eq!(many.lanes(), crate::driver::LANES_MAX);
    }

    #[test]
    fn a_lane_joins_with_the_key_then_heartbeats_and_runs_its_launches() {
        let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
        let frames = handshake(&mut core, None);
        assert_eq!(kinds(&frames), [Kind::JoinLane]);
        let Ok(Message::JoinLane {
            executor_id,
            lane,
            lane_key,
        }) = frames[0].message()
        else {
            panic!("a JoinLane");
        };
        assert_eq!((executor_id, lane, lane_key), ("e1", 1, [7; 32]));
        assert_eq!(core.poll_timeout(), None, "no heartbeat before it joined");
        deliver(
            &mut core,
            &Message::LaneJoined {
                heartbeat_interval_ms: 100,
            },
            1_000,
        );
        assert_eq!(core.poll_timeout(), Some(101_000));
        assert_eq!(core.lane_key(), None, "only lane 0 hands out the key");
        launch(&mut core, &[(1, "echo", b"x")], 2_000);
        assert_eq!(actions(&mut core).len(), 1);
        core.handle_timeout(101_000);
        let frames = sent(&mut core);
        let Ok(Message::Heartbeat { running_tasks, .. }) = frames[0].message() else {
            panic!("a Heartbeat");
        };
        assert_eq!(running_tasks, 1, "what this lane holds");
    }

    #[test]
    fn a_lane_refused_or_answered_as_lane_0_ends_with_typed_errors() {
        let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
        handshake(&mut core, None);
        let refused = Message::RegisterExecutorFailed {
            reason: "wrong lane key",
        };
        deliver(&mut core, &refused, 0);
        assert_eq!(
            core.poll_exit(),
            Some(Err(ExecutorError::Refused("wrong lane key".into())))
        );

        let mut core = ExecutorCore::new_lane(&config(None), [1; 32], 1, [7; 32]);
        handshake(&mut core, None);
        let registered = Message::RegisteredExecutor {
            heartbeat_interval_ms: 100,
            lane_key: [7; 32],
        };
        deliver(&mut core, &registered, 0);
        assert!(matches!(
            core.poll_exit(),
            Some(Err(ExecutorError::DriverGone(why))) if why.contains("RegisteredExecutor")
        ));

        // Lane 0 is not told it joined.
        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        handshake(&mut core, None);
        deliver(
            &mut core,
            &Message::LaneJoined {
                heartbeat_interval_ms: 100,
            },
            0,
        );
        assert!(matches!(
            core.poll_exit(),
            Some(Err(ExecutorError::DriverGone(_)))
        ));
    }

    #[test]
    fn a_wrong_secret_is_refused_and_the_driver_told_why() {
        let mut core = ExecutorCore::new(&config(Some(Secret::new("a").expect("a"))), [1; 32]);
        let mut to_core = BytesMut::new();
        let wrong = Some(Secret::new("b").expect("b"));
        let mut driver = Handshake::accept(Role::Driver, wrong, [9; 32], DRIVER, &mut to_core);
        for frame in sent(&mut core) {
            driver
                .on_frame(frame.kind(), frame.body(), &mut to_core)
                .expect("the Hello is fine");
        }
        core.handle_bytes(&to_core.split(), 0);
        // The executor proves itself first; the driver checks, refuses and says why.
        for frame in sent(&mut core) {
            let _ = driver.on_frame(frame.kind(), frame.body(), &mut to_core);
        }
        assert!(kinds(&crate::transport::frames_of(&to_core)).contains(&Kind::HandshakeRefused));
        core.handle_bytes(&to_core, 0);
        let exit = core.poll_exit().expect("ended");
        assert!(
            matches!(&exit, Err(ExecutorError::Refused(r)) if r.contains("wrong shared secret")),
            "{exit:?}"
        );
        assert_eq!(actions(&mut core), [Action::KillAll]);
    }

    #[test]
    fn heartbeats_come_at_the_interval_the_driver_set() {
        let start_us = 1_000;
        let mut core = registered(200, start_us);
        let first_us = start_us + 200_000;
        assert_eq!(core.poll_timeout(), Some(first_us));
        core.handle_timeout(first_us - 1);
        assert!(sent(&mut core).is_empty(), "not due yet");
        for beat in 0..3 {
            let due_us = first_us + beat * 200_000;
            assert_eq!(core.poll_timeout(), Some(due_us));
            core.handle_timeout(due_us);
            let frames = sent(&mut core);
            assert_eq!(kinds(&frames), [Kind::Heartbeat], "beat {beat}");
            let Ok(Message::Heartbeat { executor_id, .. }) = frames[0].message() else {
                panic!("a Heartbeat");
            };
            assert_eq!(executor_id, "e1");
        }
        // Beats missed (a stalled caller) are not made up: one, then one interval on.
        let late_us = first_us + 10 * 200_000 + 7;
        core.handle_timeout(late_us);
        assert_eq!(kinds(&sent(&mut core)), [Kind::Heartbeat]);
        assert_eq!(core.poll_timeout(), Some(late_us + 200_000));
    }

    #[test]
    fn a_heartbeat_interval_out_of_bounds_is_clamped() {
        let core = registered(1, 0);
        assert_eq!(core.poll_timeout(), Some(HEARTBEAT_INTERVAL_MS_MIN * 1000));
        let core = registered(u32::MAX, 0);
        assert_eq!(core.poll_timeout(), Some(HEARTBEAT_INTERVAL_MS_MAX * 1000));
    }

    #[test]
    fn launch_tasks_become_launch_actions_with_their_payloads() {
        let mut core = registered(500, 0);
        launch(&mut core, &[(1, "echo", b"one"), (2, "sleep:5", b"")], 10);
        let expected = [
            launched(1, 0, "echo", Bytes::from_static(b"one")),
            launched(2, 0, "sleep:5", Bytes::new()),
        ];
        assert_eq!(actions(&mut core), expected);
        assert_eq!(core.in_flight(), 2);
        // A duplicate of an attempt in flight is ignored.
        launch(&mut core, &[(1, "echo", b"one")], 20);
        assert!(actions(&mut core).is_empty());
        // The heartbeat counts them as running.
        core.handle_timeout(500_000);
        let frames = sent(&mut core);
        let Ok(Message::Heartbeat { running_tasks, .. }) = frames[0].message() else {
            panic!("a Heartbeat");
        };
        assert_eq!(running_tasks, 2);
    }

    #[test]
    fn a_launch_past_the_in_flight_limit_fails_at_once() {
        let mut core = registered(500, 0);
        // Two cores, two per core.
        let tasks: Vec<(u64, &str, &[u8])> = (0..5).map(|i| (i, "noop", &b""[..])).collect();
        launch(&mut core, &tasks, 10);
        assert_eq!(actions(&mut core).len(), 4);
        let frames = sent(&mut core);
        let Ok(Message::StatusUpdates { updates }) = frames[0].message() else {
            panic!("a StatusUpdates");
        };
        let updates: Vec<StatusUpdateOwned> = updates.iter().map(owned).collect();
        assert_eq!(updates.len(), 1);
        assert_eq!((updates[0].0, updates[0].1), (4, TaskState::Failed));
        assert!(
            updates[0].2.contains("maximum of 4 attempts"),
            "{}",
            updates[0].2
        );
    }

    type StatusUpdateOwned = (u64, TaskState, String);

    fn owned(update: wire::StatusUpdate<'_>) -> StatusUpdateOwned {
        (
            update.task_id,
            update.state,
            String::from_utf8_lossy(update.data).into_owned(),
        )
    }

    /// The driver takes an executor whose heartbeat counts fewer attempts than it must hold
    /// for one that does not read: an attempt the count leaves out has its report ahead.
    #[test]
    fn a_heartbeat_goes_after_the_reports_of_the_attempts_it_no_longer_counts() {
        let mut core = registered(500, 0);
        launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
        actions(&mut core);
        core.handle_completion(done(1, TaskState::Finished, b"r1"), 20);
        core.handle_timeout(500_000);
        let frames = sent(&mut core);
        assert_eq!(kinds(&frames), [Kind::StatusUpdates, Kind::Heartbeat]);
        let Ok(Message::Heartbeat { running_tasks, .. }) = frames[1].message() else {
            panic!("a Heartbeat");
        };
        assert_eq!(running_tasks, 1, "attempt 2 only");
    }

    #[test]
    fn completions_leave_in_one_status_frame_and_an_oversized_result_fails() {
        let mut core = registered(500, 0);
        launch(
            &mut core,
            &[(1, "a", b""), (2, "b", b""), (3, "c", b"")],
            10,
        );
        actions(&mut core);
        let big = vec![b'x'; batch::item_bytes_max(FRAME_SIZE_MAX) + 1];
        core.handle_completion(done(1, TaskState::Running, b""), 20);
        core.handle_completion(done(1, TaskState::Finished, b"r1"), 20);
        core.handle_completion(done(2, TaskState::Finished, &big), 20);
        core.handle_completion(done(3, TaskState::Failed, b"it broke"), 20);
        let frames = sent(&mut core);
        assert_eq!(kinds(&frames), [Kind::StatusUpdates]);
        let Ok(Message::StatusUpdates { updates }) = frames[0].message() else {
            panic!("a StatusUpdates");
        };
        let updates: Vec<StatusUpdateOwned> = updates.iter().map(owned).collect();
        assert_eq!(updates[0], (1, TaskState::Running, String::new()));
        assert_eq!(updates[1], (1, TaskState::Finished, "r1".into()));
        assert_eq!((updates[2].0, updates[2].1), (2, TaskState::Failed));
        assert!(
            updates[2].2.contains("larger than a status frame carries"),
            "{}",
            updates[2].2
        );
        assert_eq!(updates[3], (3, TaskState::Failed, "it broke".into()));
        assert_eq!(core.in_flight(), 0, "final states leave the in-flight set");
        assert!(sent(&mut core).is_empty(), "each completion is sent once");
    }

    #[test]
    fn frames_split_anywhere_are_taken_whole() {
        let mut core = registered(500, 0);
        let tasks = [TaskLaunch {
            task_id: 5,
            attempt: 2,
            cores: 1,
            function: "echo",
            payload: b"split",
        }];
        let mut out = BytesMut::new();
        batch::encode_launches(&tasks, &mut out, FRAME_SIZE_MAX).expect("encodes");
        for byte in out.iter() {
            assert!(
                actions(&mut core).is_empty(),
                "nothing before the frame is whole"
            );
            core.handle_bytes(&[*byte], 10);
        }
        assert_eq!(
            actions(&mut core),
            [launched(5, 2, "echo", Bytes::from_static(b"split"))]
        );
    }

    #[test]
    fn a_drain_tells_the_driver_kills_new_launches_and_the_leave_reports_the_rest_killed() {
        let mut core = registered(500, 0);
        launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
        assert_eq!(actions(&mut core).len(), 2);
        sent(&mut core);
        core.handle_drain(20);
        assert_eq!(kinds(&sent(&mut core)), [Kind::ExecutorDraining]);
        core.handle_drain(21);
        assert!(sent(&mut core).is_empty(), "told once");
        // A launch that crossed the message comes back killed; task 1 finishes.
        launch(&mut core, &[(3, "c", b"")], 30);
        assert!(actions(&mut core).is_empty(), "not run");
        core.handle_completion(done(1, TaskState::Finished, b"r"), 40);
        assert_eq!(core.in_flight(), 1);
        assert_eq!(core.handle_leave(50), 1, "task 2 still runs");
        assert_eq!(core.in_flight(), 0);
        let frames = sent(&mut core);
        let updates: Vec<StatusUpdateOwned> = frames
            .iter()
            .filter_map(|f| match f.message() {
                Ok(Message::StatusUpdates { updates }) => {
                    Some(updates.iter().map(owned).collect::<Vec<_>>())
                }
                _ => None,
            })
            .flatten()
            .collect();
        let states: Vec<(u64, TaskState)> = updates.iter().map(|u| (u.0, u.1)).collect();
        assert_eq!(
            states,
            [
                (3, TaskState::Killed),
                (1, TaskState::Finished),
                (2, TaskState::Killed)
            ]
        );
        // Task 2's late completion is not reported twice.
        core.handle_completion(done(2, TaskState::Finished, b"late"), 60);
        assert!(sent(&mut core).is_empty());
    }

    #[test]
    fn kill_task_becomes_a_kill_for_an_attempt_in_flight() {
        let mut core = registered(500, 0);
        launch(&mut core, &[(7, "sleep:1000", b"")], 10);
        actions(&mut core);
        for task_id in [7, 8] {
            let kill = Message::KillTask {
                task_id,
                attempt: 0,
                reason: "speculation won",
            };
            deliver(&mut core, &kill, 20);
        }
        assert_eq!(
            actions(&mut core),
            [Action::Kill {
                task_id: 7,
                attempt: 0
            }],
            "task 8 is not here"
        );
    }

    #[test]
    fn stop_executor_ends_with_what_it_ran() {
        let mut core = registered(500, 0);
        launch(&mut core, &[(1, "a", b""), (2, "b", b"")], 10);
        actions(&mut core);
        core.handle_completion(done(1, TaskState::Finished, b""), 20);
        assert_eq!(core.poll_exit(), None, "still running");
        deliver(&mut core, &Message::StopExecutor {}, 30);
        assert_eq!(
            core.poll_exit(),
            Some(Ok(ExecutorSummary { task_attempts: 1 }))
        );
        assert_eq!(core.poll_exit(), None, "the exit comes once");
        assert_eq!(actions(&mut core), [Action::KillAll]);
        assert_eq!(core.poll_timeout(), None, "no heartbeat after the end");
        // Nothing more is taken in.
        launch(&mut core, &[(3, "c", b"")], 40);
        core.handle_completion(done(2, TaskState::Killed, b"killed"), 40);
        assert!(actions(&mut core).is_empty());
        assert_eq!(
            kinds(&sent(&mut core)),
            [Kind::StatusUpdates],
            "only task 1"
        );
    }

    #[test]
    fn refusals_and_a_lost_driver_end_with_typed_errors() {
        let mut core = registered(500, 0);
        core.handle_closed("the driver closed the connection");
        assert_eq!(
            core.poll_exit(),
            Some(Err(ExecutorError::DriverGone(
                "the driver closed the connection".into()
            )))
        );

        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        handshake(&mut core, None);
        let refused = Message::RegisterExecutorFailed {
            reason: "duplicate executor id",
        };
        deliver(&mut core, &refused, 0);
        assert_eq!(
            core.poll_exit(),
            Some(Err(ExecutorError::Refused("duplicate executor id".into())))
        );

        // A full driver refuses before its Hello; `run` retries on this reason.
        let mut core = ExecutorCore::new(&config(None), [1; 32]);
        let full = Message::HandshakeRefused {
            reason: crate::conn::TABLE_FULL,
        };
        deliver(&mut core, &full, 0);
        let exit = core.poll_exit();
        assert!(
            matches!(&exit, Some(Err(ExecutorError::Refused(r))) if r.contains(crate::conn::TABLE_FULL)),
            "{exit:?}"
        );

        let mut core = registered(500, 0);
        core.handle_bytes(&[0xff; 16], 0);
        assert!(matches!(
            core.poll_exit(),
            Some(Err(ExecutorError::DriverGone(_)))
        ));
    }
}
