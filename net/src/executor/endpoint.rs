//! One executor lane's IO side on its event loop: the lane's socket to the driver, one timer,
//! and the lane's task runner around its [`ExecutorCore`]. Frames read go into the core; once
//! the loop has handled its round of inputs (`on_batch_end`) the endpoint carries out the core's
//! actions on the runner, writes what the core transmits, re-arms the timer for the core's next
//! timeout, and stops once the core has ended. Lane 0 also hands `run` the key the other lanes
//! join with, once registered.
//!
//! Short tasks (runs under [`INLINE_RUN_MAX`] on average) run on the lane's own thread, for at
//! most [`INLINE_ROUND`] per turn of its loop (what is left waits for the next turn, which a
//! zero timer brings at once); the rest run on the pool's threads (see `flint_engine::runner`),
//! so a long task never delays a heartbeat or a kill request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flint_engine::clock;
use flint_engine::pool::PoolHandle;
use flint_engine::runtime::{Ctx, Endpoint, Reply, TimerId};
use mio::event::Event;
use mio::{Interest, Token};

use super::core::{Action, ExecutorCore};
use super::{ExecutorError, ExitSlot, KeySlot};
use crate::conn::{ConnError, Connection, ReadUntil};
use crate::transport::notify_retrying;
use crate::wire::Frame;
use flint_engine::functions::Registry;
use flint_engine::runner::{TaskReport, TaskRunner};

/// Messages to the executor's endpoint.
#[derive(Debug)]
pub enum ExecutorMsg {
    /// The executor is going away (SIGTERM): tell the driver, take no new task.
    Drain,
    /// How many attempts this lane has in flight.
    InFlight(Reply<usize>),
    /// The drain's time is up: report the attempts in flight killed and send it now; replies
    /// how many.
    Leave(Reply<usize>),
}

/// How long a lane runs short tasks in one turn of its loop at most: the longest its reads,
/// heartbeats and kills wait for them. A lane holds at most `tasks_per_core` attempts, so a
/// turn usually runs every short one it read.
pub const INLINE_ROUND: Duration = Duration::from_millis(1);

/// A lane runs a function inline when its runs average under this: a tenth of its round, and
/// well over what handing a run to a pool thread and its completion back costs (two wake-ups,
/// each several microseconds on a virtual machine, and their system calls). A service's
/// 4-task jobs of 20 us tasks on two executors served 0.63-0.65x of doing the work inline with
/// the default 20 us, and 0.85-0.90x with this.
pub const INLINE_RUN_MAX: Duration = Duration::from_micros(100);

/// The endpoint on the executor's loop (see the module docs).
pub(super) struct ExecutorEndpoint {
    core: ExecutorCore,
    conn: Connection,
    /// Built on start (its kick needs the endpoint's reference) from the pool and registry.
    runner: Option<TaskRunner>,
    pool: Option<(PoolHandle, Registry)>,
    in_flight_max: usize,
    /// Shared by every lane: the first lane to end sets the executor's exit.
    exit: Arc<ExitSlot>,
    /// Lane 0 of several: where the lane key goes once registered (or `None` if it ends
    /// first); taken when set.
    key: Option<Arc<KeySlot>>,
    /// Shared by every lane: the attempts they ran, added as each stops.
    task_attempts: Arc<AtomicU64>,
    /// A lane the driver had no room for: it stopped without ending the executor.
    left_out: bool,
    /// Where the core's clock starts, on [`clock`]'s (read a few times per event).
    epoch_ns: u64,
    /// The frames of one readiness, handed to the core after the read (kept emptied).
    frames: Vec<Frame>,
    /// The runner's completions on their way to the core (kept emptied).
    completions: Vec<TaskReport>,
    /// The armed timer and the core's deadline it is for.
    timer: Option<(TimerId, u64)>,
    /// The zero timer that brings the loop back for short tasks still waiting, if armed.
    resume: Option<TimerId>,
}

impl ExecutorEndpoint {
    pub(super) fn new(
        core: ExecutorCore,
        conn: Connection,
        pool: (PoolHandle, Registry),
        in_flight_max: usize,
        shared: &super::LaneShared,
    ) -> Self {
        ExecutorEndpoint {
            core,
            conn,
            runner: None,
            pool: Some(pool),
            in_flight_max,
            exit: shared.exit.clone(),
            key: shared.key.clone(),
            task_attempts: shared.task_attempts.clone(),
            left_out: false,
            epoch_ns: clock::now_ns(),
            frames: Vec::new(),
            completions: Vec::new(),
            timer: None,
            resume: None,
        }
    }

    /// The core's clock: microseconds since the endpoint was made.
    fn now_us(&self) -> u64 {
        clock::elapsed_us(self.epoch_ns)
    }

    /// After an input: carry out the core's actions, write what it transmits, then stop if it
    /// ended or arm the timer for its next timeout.
    fn drive(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.run_actions();
        self.core.poll_transmit(self.conn.outbound());
        if let Err(error) = self.conn.flush() {
            self.core.handle_closed(error.to_string());
            self.run_actions();
        }
        if let Some(reason) = self.core.poll_exit() {
            if super::lane_left_out(self.core.lane(), &reason) {
                tracing::warn!(
                    executor_id = %self.core.executor_id(),
                    lane = self.core.lane(),
                    "lane left out (the driver's connection table is full): the executor runs on \
                     its other lanes"
                );
                self.left_out = true;
            } else {
                self.exit.set(reason);
            }
            ctx.stop();
            return;
        }
        if let Some(lane_key) = self.core.lane_key() {
            if let Some(slot) = self.key.take() {
                slot.set(Some(lane_key));
            }
        }
        self.arm_timer(ctx);
        self.resume_if_waiting(ctx);
    }

    /// Carries out the core's actions on the runner, then hands the runner's completions to
    /// the core (the short tasks among them run here, for a round at most).
    fn run_actions(&mut self) {
        let now_us = self.now_us();
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        runner.launch_all(self.core.poll_launches());
        while let Some(action) = self.core.poll_action() {
            match action {
                Action::Kill(attempt) => {
                    runner.kill(attempt);
                }
                Action::KillAll => runner.kill_all(),
            }
        }
        runner.drain(&mut self.completions);
        if !self.completions.is_empty() {
            (self.core).handle_completions(&mut self.completions, now_us);
        }
    }

    /// Brings the loop back at once while short tasks wait for the next round.
    fn resume_if_waiting(&mut self, ctx: &mut Ctx<'_, Self>) {
        let waiting = self.runner.as_ref().is_some_and(TaskRunner::has_waiting);
        if !waiting || self.resume.is_some() {
            return;
        }
        match ctx.timer_once(Duration::ZERO) {
            Ok(timer) => self.resume = Some(timer),
            Err(error) => tracing::error!(
                executor_id = %self.core.executor_id(),
                "no timer to resume short tasks: {error}"
            ),
        }
    }

    /// Keeps one timer armed for the core's next timeout.
    fn arm_timer(&mut self, ctx: &mut Ctx<'_, Self>) {
        let want = self.core.poll_timeout();
        if self.timer.map(|(_, at_us)| at_us) == want {
            return;
        }
        if let Some((timer, _)) = self.timer.take() {
            ctx.cancel_timer(timer);
        }
        let Some(at_us) = want else {
            return;
        };
        let delay = Duration::from_micros(at_us.saturating_sub(self.now_us()));
        match ctx.timer_once(delay) {
            Ok(timer) => self.timer = Some((timer, at_us)),
            Err(error) => tracing::error!(
                executor_id = %self.core.executor_id(),
                "no heartbeat timer: {error}"
            ),
        }
    }

    fn fail_start(&mut self, why: String, ctx: &mut Ctx<'_, Self>) {
        let error = ExecutorError::Start(why);
        tracing::error!(executor_id = %self.core.executor_id(), "{error}");
        self.exit.set(Err(error));
        ctx.stop();
    }
}

impl Endpoint for ExecutorEndpoint {
    type Msg = ExecutorMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(error) = ctx.register(
            self.conn.stream_mut(),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            return self.fail_start(format!("cannot watch the socket: {error}"), ctx);
        }
        if let Some((pool, registry)) = self.pool.take() {
            let me = ctx.myself();
            // Task completions are waiting: a notice wakes the loop (the round's end drains
            // them).
            let kick = Arc::new(move || notify_retrying(&me, 0));
            let mut runner = TaskRunner::new(pool, registry, self.in_flight_max, kick)
                .with_executor(self.core.executor_id());
            runner.set_inline_round(INLINE_ROUND);
            runner.set_inline_max(INLINE_RUN_MAX);
            self.runner = Some(runner);
        }
        // The core's `Hello` goes out.
        self.drive(ctx);
    }

    fn on_message(&mut self, msg: ExecutorMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            ExecutorMsg::Drain => self.core.handle_drain(self.now_us()),
            ExecutorMsg::InFlight(reply) => {
                self.run_actions();
                let _ = reply.send(self.core.in_flight());
            }
            ExecutorMsg::Leave(reply) => {
                self.run_actions();
                let left = self.core.handle_leave(self.now_us());
                self.drive(ctx);
                let _ = reply.send(left);
            }
        }
    }

    fn on_readiness(&mut self, _token: Token, event: &Event, _ctx: &mut Ctx<'_, Self>) {
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            let (conn, frames) = (&mut self.conn, &mut self.frames);
            let read = conn.read_frames_until(ReadUntil::of(event), |_, frame| {
                frames.push(frame);
                Ok(())
            });
            let now_us = self.now_us();
            for frame in &self.frames {
                self.core.handle_frame(frame, now_us);
            }
            self.frames.clear();
            if let Err(error) = read {
                self.core.handle_closed(match error {
                    ConnError::Closed => "the driver closed the connection".to_owned(),
                    other => other.to_string(),
                });
            }
        }
    }

    fn on_timer(&mut self, timer: TimerId, _ctx: &mut Ctx<'_, Self>) {
        if self.resume == Some(timer) {
            // The round's end runs what waits.
            self.resume = None;
            return;
        }
        if self.timer.is_some_and(|(armed, _)| armed == timer) {
            self.timer = None;
        }
        self.core.handle_timeout(self.now_us());
    }

    fn on_batch_end(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.drive(ctx);
    }
}

/// However a started lane stops (its core ended, the runtime shut down, a handler panicked),
/// `run` hears it: the exit (if no lane set one before), no key, and what the lane ran. One
/// never started (its spawn failed) leaves the exit to the caller, who knows why; one left out
/// leaves the executor running.
impl Drop for ExecutorEndpoint {
    fn drop(&mut self) {
        if self.pool.is_none() && !self.left_out {
            self.exit.set(Err(ExecutorError::DriverGone(
                "the executor's loop stopped".into(),
            )));
        }
        if let Some(slot) = self.key.take() {
            slot.set(None);
        }
        (self.task_attempts).fetch_add(self.core.task_attempts(), Ordering::SeqCst);
    }
}
