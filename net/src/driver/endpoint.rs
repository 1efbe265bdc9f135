//! The driver's IO on its runtime loop: the transport's [`Sockets`] (the listener and the
//! connections, as for every listening role) and the local mode's task runner around a
//! [`DriverCore`], which decides everything else (the handshake and the table limits too).
//!
//! Each event (readiness, message, timer) goes into the core; once the loop has handled its
//! round of events (`on_batch_end`: a burst of submissions, say, or completions from several
//! executors) the endpoint drains the core: the counts callers read are published, task results
//! and job outcomes go to the callers' side ([`Handles`]: the jobs' handles and result
//! observers), the local executor's launches and kills go to the [`TaskRunner`], encoded
//! frames to their connections, closes are carried out after what was queued for them, and
//! each touched connection is flushed once, so one write carries every frame the round
//! produced. One timer is armed for
//! the earliest of the core's [`DriverCore::poll_timeout`] and this layer's own deadline: a
//! registered executor with bytes queued and none written for `heartbeat_timeout` is not
//! reading, and the core hears it is lost. Idle, no timer is armed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::clock;
use flint_engine::pool::PoolHandle;
use flint_engine::runtime::{Ctx, Endpoint, TimerId};
use flint_engine::scheduler::Remains;
use mio::event::Event;
use mio::net::TcpListener;
use mio::Token;

use super::core::{Burst, Counts, DriverCore, LocalCommand, PeerId};
use super::handles::Handles;
use super::submissions::{Submission, Submissions};
use super::{Counters, DriverConfig, DriverMsg, PublishedStats};
use crate::admission::Admission;
use crate::conn::{ConnError, ReadUntil};
use crate::job::{Job, JobShared, SpareStates};
use crate::transport::notify_retrying;
use crate::transport::server::{Admit, Sockets};
use flint_engine::functions::Registry;
use flint_engine::runner::{TaskReport, TaskRunner};
use flint_engine::scheduler::{JobId, JobToken};

/// The notice ([`Endpoint::on_notify`]) of jobs waiting in the submissions queue.
pub(crate) const SUBMITTED: u32 = 0;
/// Local mode's pool takes runs of functions that average under this in batches, a few to a
/// pool task (`flint_engine::runner`'s `batch.rs`): what an executor's lane runs inline (its
/// `INLINE_RUN_MAX`), which here the driver's loop would hold up the scheduler for.
const LOCAL_POOL_BATCHES: Duration = Duration::from_micros(100);

/// The notice of the local runner's completions waiting.
const LOCAL_DONE: u32 = 1;

/// The driver on its loop (see the module docs).
pub(crate) struct DriverEndpoint {
    core: DriverCore,
    /// The origin of the core's clock, on [`clock`]'s (the cheap reading of the monotonic
    /// clock `Instant` reads: this loop reads it a few times per event).
    epoch_ns: u64,
    /// The listener and the connections; a connection's token is its [`PeerId`].
    sockets: Sockets,
    local: Option<(PoolHandle, Registry)>,
    local_cores: Option<u32>,
    runner: Option<TaskRunner>,
    completions: Vec<TaskReport>,
    /// The armed timer and its deadline (micros on the core's clock).
    timer: Option<(TimerId, u64)>,
    /// The zero timer that brings the loop back while the local runner's short tasks wait.
    resume: Option<TimerId>,
    admission: Arc<Admission>,
    /// Jobs callers queued (`submissions.rs`).
    submissions: Arc<Submissions>,
    /// A drain left queued jobs (a flood): the resume timer brings the loop back for them.
    submissions_left: bool,
    /// The jobs' handles and observers, and the callers waiting for executors.
    handles: Handles,
    /// What callers read without asking the loop, published after every round.
    counters: Arc<Counters>,
    /// The counts last published: they change seldom, and publishing them is four
    /// sequentially consistent stores, so only a change is published.
    published: Counts,
    stats: Arc<PublishedStats>,
}

impl Admit for DriverCore {
    fn refusal(&mut self) -> Option<String> {
        DriverCore::refusal(self)
    }

    fn connected(&mut self, token: Token, nonce: [u8; 32], now_us: u64) -> Result<(), String> {
        self.handle_connected(peer_of(token), nonce, now_us)
    }
}

/// A connection's peer id.
fn peer_of(token: Token) -> PeerId {
    PeerId(token.0 as u64)
}

/// A peer's connection.
fn token_of(peer: PeerId) -> Token {
    Token(peer.0 as usize)
}

impl DriverEndpoint {
    /// The endpoint around `core`; `local` is the local mode's pool and functions.
    pub(crate) fn new(
        core: DriverCore,
        config: &DriverConfig,
        listener: TcpListener,
        epoch: Instant,
        (admission, submissions, spare): (Arc<Admission>, Arc<Submissions>, Arc<SpareStates>),
        local: Option<(PoolHandle, Registry)>,
    ) -> DriverEndpoint {
        let inbound = super::core::inbound(config);
        DriverEndpoint {
            handles: Handles::new(admission.clone(), spare),
            counters: Arc::default(),
            published: Counts::default(),
            stats: Arc::default(),
            core,
            epoch_ns: clock::now_ns().saturating_sub(epoch.elapsed().as_nanos() as u64),
            sockets: Sockets::new(listener, inbound, Some(config.heartbeat_timeout)),
            local,
            local_cores: config.local_cores,
            runner: None,
            completions: Vec::new(),
            timer: None,
            resume: None,
            admission,
            submissions,
            submissions_left: false,
        }
    }

    /// The counters and stats this endpoint publishes, for the [`super::Driver`].
    pub(crate) fn published(&self) -> (Arc<Counters>, Arc<PublishedStats>) {
        (self.counters.clone(), self.stats.clone())
    }

    fn now_us(&self) -> u64 {
        clock::elapsed_us(self.epoch_ns)
    }

    fn accept(&mut self, ctx: &mut Ctx<'_, Self>) {
        let now_us = self.now_us();
        self.sockets.accept(ctx, &mut self.core, now_us);
    }

    fn on_peer_event(&mut self, token: Token, event: &Event) {
        if !(event.is_readable() || event.is_read_closed() || event.is_error()) {
            self.sockets.touch(token);
            return;
        }
        let peer = peer_of(token);
        let (core, epoch_ns) = (&mut self.core, self.epoch_ns);
        let mut closed_by_core = false;
        let result = self.sockets.read(token, ReadUntil::of(event), |frame| {
            if core.handle_frame(peer, &frame, clock::elapsed_us(epoch_ns)) {
                Ok(())
            } else {
                closed_by_core = true;
                Err(ConnError::Closed)
            }
        });
        // A peer the core closed is in its `poll_close`.
        if let (Err(error), false) = (result, closed_by_core) {
            self.sockets.close(token);
            self.core.handle_closed(peer, &error, self.now_us());
        }
    }

    /// Carries out what the core decided, then flushes each touched connection once; repeats
    /// while that makes the core decide more (a write failed). The local runner gets one round
    /// of short tasks per call; the launches their ends made wait in it for the next round.
    fn drain(&mut self) {
        for job in self.handles.cancelled() {
            self.core.cancel(job, self.now_us());
        }
        loop {
            self.run_local();
            self.drain_local();
            self.run_local();
            self.deliver();
            while let Some((peer, frames)) = self.core.poll_transmit() {
                let spare = self.sockets.append(token_of(peer), frames);
                self.core.recycle_transmit(peer, spare);
            }
            while let Some((peer, why)) = self.core.poll_close() {
                tracing::debug!(?peer, "closing a connection: {why}");
                self.sockets.close(token_of(peer));
            }
            while let Some(remains) = self.core.poll_remains() {
                free_elsewhere(remains);
            }
            let now_us = self.now_us();
            let core = &self.core;
            let failed = (self.sockets).flush(now_us, |token| core.is_executor(peer_of(token)));
            if failed.is_empty() {
                return;
            }
            for (token, error) in failed {
                self.core.handle_closed(peer_of(token), &error, now_us);
            }
        }
    }

    /// Publishes the counts callers read, then hands results and outcomes to the callers'
    /// side (stats first: a caller that sees a job end sees its counts).
    fn deliver(&mut self) {
        let counts = self.core.counts();
        self.stats.publish(self.core.stats());
        if counts != self.published {
            self.counters.publish(&counts);
            self.published = counts;
        }
        let core = &mut self.core;
        self.handles.deliver_all(|| core.poll_event());
        self.handles.executors_registered(counts.executors);
    }

    /// Hands the local executor's launches and kills to the runner.
    fn run_local(&mut self) {
        while let Some(command) = self.core.poll_local() {
            let Some(runner) = self.runner.as_mut() else {
                continue;
            };
            match command {
                LocalCommand::Launch(task) => runner.launch(task),
                LocalCommand::Kill(attempt) => {
                    runner.kill(attempt);
                }
            }
        }
    }

    fn drain_local(&mut self) {
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        runner.drain(&mut self.completions);
        if !self.completions.is_empty() {
            let now_us = self.now_us();
            self.core
                .handle_local_completions(&mut self.completions, now_us);
        }
    }

    /// Drops executors' connections stuck past `heartbeat_timeout`: the core hears they are
    /// lost.
    fn expire_stuck(&mut self, now_us: u64) {
        for (token, why) in self.sockets.expire_stuck(now_us) {
            self.core.handle_closed(peer_of(token), &why, now_us);
        }
    }

    /// Drains the core, then keeps one timer at the earliest deadline (the core's or a stuck
    /// connection's). A timer armed earlier than needed is kept (it fires, and the next one is
    /// armed then); none is armed while nothing is pending.
    fn after_event(&mut self, ctx: &mut Ctx<'_, Self>) {
        if !self.submissions.is_empty() {
            // A caller whose notice found the inbox full sent none: the round's end is when
            // the loop looks (a full inbox means rounds to come).
            self.take_submissions(self.now_us());
        }
        self.drain();
        self.resume_if_waiting(ctx);
        self.sockets.release(ctx);
        let stuck = self.sockets.stuck_deadline_us();
        let deadline = clock::earliest(&[self.core.poll_timeout(), stuck]);
        match (deadline, self.timer) {
            (None, None) => {}
            (None, Some((timer, _))) => {
                ctx.cancel_timer(timer);
                self.timer = None;
            }
            (Some(at_us), Some((_, armed_us))) if armed_us <= at_us => {}
            (Some(at_us), armed) => {
                if let Some((timer, _)) = armed {
                    ctx.cancel_timer(timer);
                }
                let delay = Duration::from_micros(at_us.saturating_sub(self.now_us()));
                self.timer = match ctx.timer_once(delay) {
                    Ok(timer) => Some((timer, at_us)),
                    Err(error) => {
                        tracing::error!("no driver timer: {error}");
                        None
                    }
                };
            }
        }
    }

    /// Brings the loop back at once while the local runner's short tasks or queued jobs wait.
    fn resume_if_waiting(&mut self, ctx: &mut Ctx<'_, Self>) {
        let waiting =
            self.submissions_left || self.runner.as_ref().is_some_and(TaskRunner::has_waiting);
        if !waiting || self.resume.is_some() {
            return;
        }
        match ctx.timer_once(Duration::ZERO) {
            Ok(timer) => self.resume = Some(timer),
            Err(error) => tracing::error!("no timer to resume local tasks or queued jobs: {error}"),
        }
    }

    fn start_local(&mut self, ctx: &mut Ctx<'_, Self>) {
        let Some((pool, registry)) = self.local.take() else {
            return;
        };
        let cores = self.local_cores.unwrap_or(1);
        let slots = self.core.add_local_executor(cores, self.now_us());
        let me = ctx.myself();
        let kick = Arc::new(move || notify_retrying(&me, LOCAL_DONE));
        let mut runner = TaskRunner::new(pool, registry, slots as usize, kick);
        runner.set_pool_batches(LOCAL_POOL_BATCHES);
        self.runner = Some(runner);
    }

    /// Takes the queued submissions (see `submissions.rs`), a queue's worth at most: the
    /// resume timer brings the loop back for the rest after its round.
    /// They go to the core as one burst, whose launches leave together.
    fn take_submissions(&mut self, now_us: u64) {
        let (handles, submissions, epoch_ns) =
            (&mut self.handles, &self.submissions, self.epoch_ns);
        self.submissions_left = (self.core).submit_burst(now_us, |burst| {
            let left = submissions.drain(
                |Submission {
                     id,
                     mut job,
                     shared,
                 }| {
                    if let Some(token) = open(handles, id, shared, &mut job) {
                        burst.submit(id, token, job);
                    }
                },
            );
            advance_if_big(burst, epoch_ns);
            left
        });
        self.admission.room_made();
    }

    fn on_msg(&mut self, msg: DriverMsg) {
        let now_us = self.now_us();
        let core = &mut self.core;
        match msg {
            DriverMsg::Submit(submission) => {
                // The queued ones were submitted before it.
                self.take_submissions(now_us);
                let Submission {
                    id,
                    mut job,
                    shared,
                } = *submission;
                let Some(token) = open(&mut self.handles, id, shared, &mut job) else {
                    return;
                };
                let epoch_ns = self.epoch_ns;
                self.core.submit_burst(now_us, |burst| {
                    burst.submit(id, token, job);
                    advance_if_big(burst, epoch_ns);
                });
            }
            DriverMsg::Cancel(job) => core.cancel(job, now_us),
            DriverMsg::WhenExecutors { count, reply } => {
                let registered = core.counts().executors;
                self.handles.when_executors(count, reply, registered);
            }
            DriverMsg::StopExecutors(reply) => {
                let _ = reply.send(core.stop_executors());
            }
            DriverMsg::Executors(reply) => {
                let _ = reply.send(core.executors_view());
            }
            DriverMsg::Observe(reply) => {
                let _ = reply.send(Box::new(core.observe(now_us)));
            }
            DriverMsg::Health(reply) => {
                let _ = reply.send(core.executor_health());
            }
            DriverMsg::StopExecutor { executor_id, reply } => {
                let _ = reply.send(core.stop_executor(&executor_id));
            }
            DriverMsg::DrainExecutor { executor_id, reply } => {
                let _ = reply.send(core.drain_executor(&executor_id));
            }
            DriverMsg::RemoveExecutor {
                executor_id,
                reason,
            } => {
                core.remove_executor(&executor_id, reason, now_us);
            }
        }
    }
}

/// A job a caller submitted as `id`, opened on the callers' side (its observer taken out of
/// it): the token it goes to the core with, if it goes (not if its handle cancelled it
/// already). The job is
/// passed by reference: it is a hundred bytes, and moved in and out it was copied twice.
/// Always inline (the hint alone was not taken): out of line, its call and saved registers
/// were a fifth of it.
#[inline(always)]
fn open(
    handles: &mut Handles,
    id: JobId,
    shared: Arc<JobShared>,
    job: &mut Job,
) -> Option<JobToken> {
    let observer = job.observer.take();
    handles.open(id, shared, observer, job.len(), job.stream)
}

/// Tasks in a burst from which its build may have taken long enough to matter (the scheduler
/// builds a task with locality preferences in about 45 ns: 16,384 take about 0.7 ms, near its
/// `RESTAMP_AFTER_US` of 1 ms; a job of one function over payloads only has each payload's
/// size checked, about 1 ns a task, its records built as the tasks leave): smaller bursts read
/// no clock.
const BUILD_CLOCKED_TASKS: usize = 16_384;

/// Tells a big burst the time after its build (see [`Burst::advance`]).
fn advance_if_big(burst: &mut Burst<'_>, epoch_ns: u64) {
    if burst.tasks() >= BUILD_CLOCKED_TASKS {
        burst.advance(clock::elapsed_us(epoch_ns));
    }
}

/// Frees a big ended job's records and payloads on a thread of their own, so the loop does
/// not spend the milliseconds; here if no thread can be had.
fn free_elsewhere(remains: Remains) {
    let tasks = remains.tasks();
    let spawned = std::thread::Builder::new()
        .name("flint-free".into())
        .spawn(move || drop(remains));
    if let Err(error) = spawned {
        // The closure, and the remains with it, were dropped here.
        tracing::debug!(tasks, "freed an ended job's records on the loop: {error}");
    }
}

/// A job a caller submitted, on its own (see [`open`]), at `now_us`.
fn submit(handles: &mut Handles, core: &mut DriverCore, submission: Submission, now_us: u64) {
    let Submission {
        id,
        mut job,
        shared,
    } = submission;
    if let Some(token) = open(handles, id, shared, &mut job) {
        core.submit(id, token, job, now_us);
    }
}

impl Endpoint for DriverEndpoint {
    type Msg = DriverMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(error) = self.sockets.start(ctx) {
            tracing::error!("{error}");
        }
        self.start_local(ctx);
        self.after_event(ctx);
    }

    fn on_message(&mut self, msg: DriverMsg, _ctx: &mut Ctx<'_, Self>) {
        self.admission.room_made();
        self.on_msg(msg);
    }

    fn on_notify(&mut self, what: u32, _ctx: &mut Ctx<'_, Self>) {
        match what {
            SUBMITTED => self.take_submissions(self.now_us()),
            _ => self.drain_local(),
        }
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if self.sockets.is_listener(token) {
            self.accept(ctx);
        } else {
            self.on_peer_event(token, event);
        }
    }

    fn on_timer(&mut self, timer: TimerId, _ctx: &mut Ctx<'_, Self>) {
        if self.resume == Some(timer) {
            // The round's end runs the local tasks that wait.
            self.resume = None;
            if self.submissions_left {
                self.take_submissions(self.now_us());
            }
            return;
        }
        if self.timer.is_some_and(|(armed, _)| armed == timer) {
            self.timer = None;
        }
        let now_us = self.now_us();
        self.expire_stuck(now_us);
        self.core.handle_timeout(now_us);
    }

    fn on_batch_end(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.after_event(ctx);
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        // Queued jobs are taken, to end with the others below.
        let now_us = self.now_us();
        let (handles, core) = (&mut self.handles, &mut self.core);
        (self.submissions).take_all(|s| submit(handles, core, s, now_us));
        self.core.shutdown();
        self.deliver();
        while let Some((peer, frames)) = self.core.poll_transmit() {
            self.sockets.append(token_of(peer), frames);
        }
        self.sockets.flush_all();
    }
}
