//! The executor's side of the protocol as a sans-IO state machine, in the style of
//! quinn-proto: the handshake, registration, heartbeats, the driver's frames turned into
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

use bytes::{Bytes, BytesMut};
use flint_engine::hash::FxHashSet;

use super::{ExecutorConfig, ExecutorError, ExecutorSummary};
use crate::driver::encode;
use crate::handshake::Handshake;
use crate::runner::Completion;
use crate::wire::{self, batch, Frame, FrameDecoder, List, Message, Metric, Role, TaskState};

/// The heartbeat interval when the driver's `Registered` names none, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 500;
/// The shortest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MIN: u64 = 10;
/// The longest heartbeat interval a driver may ask for, in milliseconds.
pub const HEARTBEAT_INTERVAL_MS_MAX: u64 = 60_000;

/// What the executor must do to its tasks, from [`ExecutorCore::poll_action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run attempt `attempt` of task `task_id`: the registered `function` on `payload` (which
    /// shares the driver's frame). Its completions go to [`ExecutorCore::handle_completion`].
    Launch {
        /// The task.
        task_id: u64,
        /// The attempt.
        attempt: u32,
        /// The registered function to run (`name` or `name:ARG`).
        function: String,
        /// The function's input.
        payload: Bytes,
    },
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
    Handshake(Box<Handshake>),
    /// Authenticated, `RegisterExecutor` sent, waiting for the answer.
    Registering,
    Running,
    Ended,
}

/// One executor's protocol state (see the module docs).
pub struct ExecutorCore {
    executor_id: String,
    host: String,
    cores: u32,
    frame_size_max: usize,
    in_flight_max: usize,
    phase: Phase,
    /// Encoded frames not yet handed to [`ExecutorCore::poll_transmit`].
    transmit: BytesMut,
    actions: VecDeque<Action>,
    /// Completions to report at the next [`ExecutorCore::poll_transmit`], already bounded.
    updates: Vec<Completion>,
    /// Attempts launched and not yet completed.
    in_flight: FxHashSet<(u64, u32)>,
    heartbeat_interval_us: u64,
    heartbeat_next_us: Option<u64>,
    /// Attempts that reached a final state here.
    task_attempts: u64,
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
    /// An executor as `config` describes it (its id, host, cores, secret, frame size and
    /// in-flight limit; the address and connect timeout are the IO side's), starting its
    /// handshake with `nonce`: its `Hello` is the first thing to transmit.
    pub fn new(config: &ExecutorConfig, nonce: [u8; 32]) -> Self {
        let mut transmit = BytesMut::new();
        let handshake = Handshake::start(
            Role::Executor,
            config.secret.clone(),
            nonce,
            &[Role::Driver],
            &mut transmit,
        );
        ExecutorCore {
            executor_id: config.executor_id.clone(),
            host: config.host.clone(),
            cores: config.cores,
            frame_size_max: config.frame_size_max,
            in_flight_max: config.in_flight_max(),
            phase: Phase::Handshake(Box::new(handshake)),
            transmit,
            actions: VecDeque::new(),
            updates: Vec::new(),
            in_flight: FxHashSet::default(),
            heartbeat_interval_us: HEARTBEAT_INTERVAL_MS_DEFAULT * 1000,
            heartbeat_next_us: None,
            task_attempts: 0,
            exit: None,
            decoder: FrameDecoder::new(config.frame_size_max),
        }
    }

    /// This executor's id.
    pub fn executor_id(&self) -> &str {
        &self.executor_id
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
            Phase::Handshake(handshake) => {
                match handshake.on_frame(frame.kind(), frame.body(), &mut self.transmit) {
                    Ok(None) => Ok(()),
                    Ok(Some(_driver)) => {
                        self.register();
                        Ok(())
                    }
                    Err(error) => Err(ExecutorError::Refused(format!("handshake failed: {error}"))),
                }
            }
            Phase::Registering | Phase::Running => self.on_message(frame, now_us),
        };
        if let Err(error) = result {
            self.end(Err(error));
        }
    }

    /// Feeds a task attempt's completion (from the task runner). A final one leaves the
    /// in-flight set and counts as an attempt run; each goes out at the next
    /// [`ExecutorCore::poll_transmit`], a result too large for a frame failing its task.
    pub fn handle_completion(&mut self, mut completion: Completion, _now_us: u64) {
        if self.is_ended() {
            return;
        }
        if completion.state.is_final() {
            self.in_flight
                .remove(&(completion.task_id, completion.attempt));
            self.task_attempts += 1;
        }
        bound_report(&mut completion, self.frame_size_max);
        self.updates.push(completion);
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
        self.encode_updates();
        let len = self.transmit.len();
        if out.is_empty() {
            std::mem::swap(out, &mut self.transmit);
        } else {
            out.extend_from_slice(&self.transmit);
            self.transmit.clear();
        }
        len
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

    /// The handshake succeeded: asks to register.
    fn register(&mut self) {
        let register = Message::RegisterExecutor {
            executor_id: &self.executor_id,
            host: &self.host,
            cores: self.cores,
            attributes: List::empty(),
        };
        encode(&register, &mut self.transmit, self.frame_size_max);
        self.phase = Phase::Registering;
    }

    /// One message after the handshake.
    fn on_message(&mut self, frame: &Frame, now_us: u64) -> Result<(), ExecutorError> {
        let message = frame.message().map_err(|e| {
            ExecutorError::DriverGone(format!("malformed frame from the driver: {e}"))
        })?;
        match message {
            Message::RegisteredExecutor { settings } => {
                let interval_ms = settings
                    .iter()
                    .find(|kv| kv.key == "heartbeat_interval_ms")
                    .and_then(|kv| kv.value.parse::<u64>().ok())
                    .unwrap_or(HEARTBEAT_INTERVAL_MS_DEFAULT)
                    .clamp(HEARTBEAT_INTERVAL_MS_MIN, HEARTBEAT_INTERVAL_MS_MAX);
                self.heartbeat_interval_us = interval_ms * 1000;
                self.heartbeat_next_us = Some(now_us.saturating_add(self.heartbeat_interval_us));
                self.phase = Phase::Running;
                tracing::info!(executor = %self.executor_id, "registered with the driver");
            }
            Message::RegisterExecutorFailed { reason } => {
                return Err(ExecutorError::Refused(reason.to_owned()))
            }
            Message::LaunchTasks { tasks } => {
                for task in tasks {
                    let payload = frame.share(task.payload);
                    self.launch(task.task_id, task.attempt, task.function, payload);
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
                tracing::info!(executor = %self.executor_id, "stopped by the driver");
                self.end(Ok(()));
            }
            Message::Shutdown {} => {
                return Err(ExecutorError::DriverGone("the driver shut down".into()))
            }
            other => {
                return Err(ExecutorError::DriverGone(format!(
                    "unexpected {} from the driver",
                    other.kind().name()
                )))
            }
        }
        Ok(())
    }

    /// One launch: a duplicate of an attempt in flight is ignored; one past the in-flight
    /// limit fails at once (a driver keeps within `tasks_per_core`, which is at most that).
    fn launch(&mut self, task_id: u64, attempt: u32, function: &str, payload: Bytes) {
        let key = (task_id, attempt);
        if self.in_flight.contains(&key) {
            tracing::warn!(task_id, attempt, "duplicate launch ignored");
            return;
        }
        if self.in_flight.len() >= self.in_flight_max {
            let reason = format!(
                "not run: the executor already holds its maximum of {} attempts",
                self.in_flight_max
            );
            self.task_attempts += 1;
            self.updates.push(Completion {
                task_id,
                attempt,
                state: TaskState::Failed,
                data: Bytes::from(reason),
            });
            return;
        }
        self.in_flight.insert(key);
        self.actions.push_back(Action::Launch {
            task_id,
            attempt,
            function: function.to_owned(),
            payload,
        });
    }

    fn send_heartbeat(&mut self) {
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
                task_id: update.task_id,
                attempt: update.attempt,
                state: update.state,
                data: &update.data,
            })
            .collect();
        if let Err(error) =
            batch::encode_status_updates(&batch, &mut self.transmit, self.frame_size_max)
        {
            // Unreachable: `bound_report` keeps every update within a frame.
            tracing::error!(executor = %self.executor_id, "status updates not sent: {error}");
        }
        self.updates.clear();
    }

    /// Ends the executor: every task is to be killed, no heartbeat follows, and the exit is
    /// ready for [`ExecutorCore::poll_exit`]. Frames already queued still go out (a
    /// handshake refusal tells the driver why).
    fn end(&mut self, reason: Result<(), ExecutorError>) {
        if let Err(error) = &reason {
            tracing::error!(executor = %self.executor_id, "{error}");
        }
        let completed = self.task_attempts;
        tracing::info!(executor = %self.executor_id, completed, "ran {completed} task attempts");
        self.phase = Phase::Ended;
        self.heartbeat_next_us = None;
        self.actions.clear();
        self.actions.push_back(Action::KillAll);
        self.exit = Some(reason.map(|()| ExecutorSummary {
            task_attempts: completed,
        }));
    }
}

/// Keeps a report within what one frame carries: a result too large for a frame fails its task
/// with the reason (the driver never sees a wrong success), and a failure's text is cut to
/// [`batch::REASON_BYTES_MAX`].
fn bound_report(update: &mut Completion, frame_size_max: usize) {
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
