//! The driver's IO on its runtime loop: the listener, the connections and the local mode's
//! task runner around a [`DriverCore`], which decides everything else.
//!
//! After every event (readiness, message, timer) the endpoint drains the core: the local
//! executor's launches and kills go to the [`TaskRunner`], encoded frames to their connections,
//! closes are carried out after what was queued for them, and each touched connection is
//! flushed once, so a write carries every frame produced by that event. One timer is armed for
//! the earliest of the core's [`DriverCore::poll_timeout`] and this layer's own deadline: a
//! registered executor with bytes queued and none written for `heartbeat_timeout` is not
//! reading, and the core hears it is lost. Idle, no timer is armed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use flint_engine::hash::{FxHashMap, FxHashSet};
use flint_engine::pool::PoolHandle;
use flint_engine::runtime::{Ctx, Endpoint, TimerId};
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Token};

use super::core::{us, DriverCore, LocalCommand, PeerId};
use super::{DriverConfig, DriverMsg};
use crate::admission::Admission;
use crate::conn::{accept_next, refuse, ConnError, Connection};
use crate::functions::Registry;
use crate::handshake::random_nonce;
use crate::runner::{Completion, TaskRunner};
use crate::transport::send_retrying;

/// One connection and what the IO layer tracks for it.
struct Conn {
    conn: Connection,
    token: Token,
    /// Since when bytes have been queued for it with none written (a peer not reading).
    write_stuck_since_us: Option<u64>,
}

/// The driver on its loop (see the module docs).
pub(crate) struct DriverEndpoint {
    core: DriverCore,
    /// The origin of the core's clock.
    epoch: Instant,
    listener: TcpListener,
    listener_token: Option<Token>,
    conns: FxHashMap<PeerId, Conn>,
    peers: FxHashMap<Token, PeerId>,
    next_peer: u64,
    /// Executors' connections with bytes stuck (see [`Conn::write_stuck_since_us`]).
    stuck: FxHashSet<PeerId>,
    /// Connections to flush after this event.
    touched: Vec<PeerId>,
    local: Option<(PoolHandle, Registry)>,
    local_cores: Option<u32>,
    runner: Option<TaskRunner>,
    /// The local runner completed attempts on this thread while launching: drain it (no kick
    /// comes for those).
    local_spilled: bool,
    completions: Vec<Completion>,
    /// The armed timer and its deadline (micros on the core's clock).
    timer: Option<(TimerId, u64)>,
    frame_size_max: usize,
    outbound_max: usize,
    heartbeat_timeout_us: u64,
    admission: Arc<Admission>,
}

impl DriverEndpoint {
    /// The endpoint around `core`; `local` is the local mode's pool and functions.
    pub(crate) fn new(
        core: DriverCore,
        config: &DriverConfig,
        listener: TcpListener,
        epoch: Instant,
        admission: Arc<Admission>,
        local: Option<(PoolHandle, Registry)>,
    ) -> DriverEndpoint {
        DriverEndpoint {
            core,
            epoch,
            listener,
            listener_token: None,
            conns: FxHashMap::default(),
            peers: FxHashMap::default(),
            next_peer: 0,
            stuck: FxHashSet::default(),
            touched: Vec::new(),
            local,
            local_cores: config.local_cores,
            runner: None,
            local_spilled: false,
            completions: Vec::new(),
            timer: None,
            frame_size_max: config.frame_size_max,
            outbound_max: config.outbound_max,
            heartbeat_timeout_us: us(config.heartbeat_timeout),
            admission,
        }
    }

    fn now_us(&self) -> u64 {
        us(self.epoch.elapsed())
    }

    fn accept(&mut self, ctx: &mut Ctx<'_, Self>) {
        while let Some((stream, addr)) = accept_next(&self.listener) {
            let nonce = match random_nonce() {
                Ok(nonce) => nonce,
                Err(error) => {
                    tracing::warn!(%addr, "could not set up a connection: no random nonce: {error}");
                    continue;
                }
            };
            let peer = PeerId(self.next_peer);
            self.next_peer += 1;
            if let Err(reason) = self.core.handle_connected(peer, nonce, self.now_us()) {
                refuse(stream, &reason);
                continue;
            }
            let mut conn = Connection::new(stream, self.frame_size_max, self.outbound_max);
            match ctx.register(conn.stream_mut(), Interest::READABLE | Interest::WRITABLE) {
                Ok(token) => {
                    let conn = Conn {
                        conn,
                        token,
                        write_stuck_since_us: None,
                    };
                    self.conns.insert(peer, conn);
                    self.peers.insert(token, peer);
                }
                Err(error) => {
                    tracing::warn!(%addr, "could not set up a connection: {error}");
                    let why = ConnError::Protocol(format!("could not set up: {error}"));
                    self.core.handle_closed(peer, &why, self.now_us());
                }
            }
        }
    }

    fn on_peer_event(&mut self, token: Token, event: &Event) {
        let Some(&peer) = self.peers.get(&token) else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&peer) else {
            return;
        };
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            let (core, epoch) = (&mut self.core, self.epoch);
            let mut closed_by_core = false;
            let result = conn.conn.read_frames(|_, frame| {
                if core.handle_frame(peer, &frame, us(epoch.elapsed())) {
                    Ok(())
                } else {
                    closed_by_core = true;
                    Err(ConnError::Closed)
                }
            });
            if let Err(error) = result {
                // A peer the core closed is in its `poll_close`.
                if !closed_by_core {
                    self.drop_conn(peer);
                    self.core.handle_closed(peer, &error, self.now_us());
                }
                return;
            }
        }
        self.touched.push(peer);
    }

    /// Forgets a connection (dropping it closes the socket).
    fn drop_conn(&mut self, peer: PeerId) -> Option<Conn> {
        let conn = self.conns.remove(&peer)?;
        self.peers.remove(&conn.token);
        self.stuck.remove(&peer);
        Some(conn)
    }

    /// Carries out what the core decided, then flushes each touched connection once; repeats
    /// while that makes the core decide more (a local attempt ended at once, a write failed).
    fn drain(&mut self) {
        loop {
            self.run_local();
            if std::mem::take(&mut self.local_spilled) {
                self.drain_local();
                continue;
            }
            while let Some((peer, frames)) = self.core.poll_transmit() {
                if let Some(conn) = self.conns.get_mut(&peer) {
                    append(conn.conn.outbound(), frames);
                    self.touched.push(peer);
                }
            }
            while let Some((peer, why)) = self.core.poll_close() {
                if let Some(mut conn) = self.drop_conn(peer) {
                    tracing::debug!(peer = ?conn.conn.peer(), "closing a connection: {why}");
                    let _ = conn.conn.flush();
                }
            }
            if !self.flush_touched() {
                return;
            }
        }
    }

    /// Flushes the touched connections, noting which are stuck; whether one failed (the core
    /// heard, and may have more to say).
    fn flush_touched(&mut self) -> bool {
        let now_us = self.now_us();
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        let mut failed = Vec::new();
        for &peer in &touched {
            let Some(conn) = self.conns.get_mut(&peer) else {
                continue;
            };
            let before = conn.conn.outbound_len();
            let flushed = conn.conn.flush();
            let after = conn.conn.outbound_len();
            if after == 0 {
                conn.write_stuck_since_us = None;
                self.stuck.remove(&peer);
            } else if after < before || conn.write_stuck_since_us.is_none() {
                conn.write_stuck_since_us = Some(now_us);
                if self.core.is_executor(peer) {
                    self.stuck.insert(peer);
                }
            }
            if let Err(error) = flushed {
                failed.push((peer, error));
            }
        }
        touched.clear();
        self.touched = touched;
        let any = !failed.is_empty();
        for (peer, error) in failed {
            self.drop_conn(peer);
            self.core.handle_closed(peer, &error, now_us);
        }
        any
    }

    /// Hands the local executor's launches and kills to the runner.
    fn run_local(&mut self) {
        while let Some(command) = self.core.poll_local() {
            let Some(runner) = self.runner.as_mut() else {
                continue;
            };
            match command {
                LocalCommand::Launch(task) => {
                    // An attempt that fails at once comes with no kick: drained in `drain`.
                    self.local_spilled |=
                        runner.launch(task.task.0, task.attempt, &task.function, task.payload);
                }
                LocalCommand::Kill { task, attempt } => {
                    runner.kill(task.0, attempt);
                }
            }
        }
    }

    fn drain_local(&mut self) {
        let Some(runner) = self.runner.as_mut() else {
            return;
        };
        let completions = &mut self.completions;
        runner.drain(|completion| completions.push(completion));
        if !self.completions.is_empty() {
            let now_us = self.now_us();
            self.core
                .handle_local_completions(&mut self.completions, now_us);
        }
    }

    /// Drops executors' connections stuck past `heartbeat_timeout`: the core hears they are
    /// lost.
    fn expire_stuck(&mut self, now_us: u64) {
        let expired: Vec<PeerId> = (self.stuck.iter())
            .filter(|peer| self.stuck_deadline_us(**peer).is_some_and(|t| t <= now_us))
            .copied()
            .collect();
        for peer in expired {
            let Some(conn) = self.drop_conn(peer) else {
                continue;
            };
            let why = ConnError::Protocol(format!(
                "not reading: {} bytes queued for it and none written for {} ms",
                conn.conn.outbound_len(),
                self.heartbeat_timeout_us / 1000
            ));
            self.core.handle_closed(peer, &why, now_us);
        }
    }

    /// When a stuck connection counts as not reading (strictly after `heartbeat_timeout`).
    fn stuck_deadline_us(&self, peer: PeerId) -> Option<u64> {
        let since = self.conns.get(&peer)?.write_stuck_since_us?;
        Some(
            since
                .saturating_add(self.heartbeat_timeout_us)
                .saturating_add(1),
        )
    }

    /// Drains the core, then keeps one timer at the earliest deadline (the core's or a stuck
    /// connection's). A timer armed earlier than needed is kept (it fires, and the next one is
    /// armed then); none is armed while nothing is pending.
    fn after_event(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.drain();
        let stuck = (self.stuck.iter())
            .filter_map(|peer| self.stuck_deadline_us(*peer))
            .min();
        let deadline = [self.core.poll_timeout(), stuck]
            .into_iter()
            .flatten()
            .min();
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

    fn start_local(&mut self, ctx: &mut Ctx<'_, Self>) {
        let Some((pool, registry)) = self.local.take() else {
            return;
        };
        let cores = self.local_cores.unwrap_or(1);
        let slots = self.core.add_local_executor(cores, self.now_us());
        let me = ctx.myself();
        let kick = Arc::new(move || send_retrying(&me, || DriverMsg::LocalKick));
        self.runner = Some(TaskRunner::new(pool, registry, slots as usize, kick));
    }

    fn on_msg(&mut self, msg: DriverMsg) {
        let now_us = self.now_us();
        let core = &mut self.core;
        match msg {
            DriverMsg::Submit { id, job, shared } => core.submit(id, job, shared, now_us),
            DriverMsg::Cancel(job) => core.cancel(job, now_us),
            DriverMsg::WhenExecutors { count, reply } => core.when_executors(count, reply),
            DriverMsg::StopExecutors(reply) => {
                let _ = reply.send(core.stop_executors());
            }
            DriverMsg::LocalKick => self.drain_local(),
            DriverMsg::Executors(reply) => {
                let _ = reply.send(core.executors_view());
            }
            DriverMsg::Observe(reply) => {
                let _ = reply.send(Box::new(core.observe(now_us)));
            }
            DriverMsg::Stalled(reply) => {
                let _ = reply.send(core.stalled());
            }
            DriverMsg::StopExecutor { name, reply } => {
                let _ = reply.send(core.stop_executor(&name));
            }
            DriverMsg::RemoveExecutor { name, reason } => {
                core.remove_executor(&name, reason, now_us);
            }
        }
    }
}

/// Appends frames to a connection's outbound buffer (taking the buffer when it is empty).
fn append(outbound: &mut BytesMut, frames: BytesMut) {
    if outbound.is_empty() {
        *outbound = frames;
    } else {
        outbound.extend_from_slice(&frames);
    }
}

impl Endpoint for DriverEndpoint {
    type Msg = DriverMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match ctx.register(&mut self.listener, Interest::READABLE) {
            Ok(token) => self.listener_token = Some(token),
            Err(error) => tracing::error!("cannot watch the listener: {error}"),
        }
        self.start_local(ctx);
        self.after_event(ctx);
    }

    fn on_message(&mut self, msg: DriverMsg, ctx: &mut Ctx<'_, Self>) {
        self.admission.room_made();
        self.on_msg(msg);
        self.after_event(ctx);
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if Some(token) == self.listener_token {
            self.accept(ctx);
        } else {
            self.on_peer_event(token, event);
        }
        self.after_event(ctx);
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if self.timer.is_some_and(|(armed, _)| armed == timer) {
            self.timer = None;
        }
        let now_us = self.now_us();
        self.expire_stuck(now_us);
        self.core.handle_timeout(now_us);
        self.after_event(ctx);
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.core.shutdown();
        while let Some((peer, frames)) = self.core.poll_transmit() {
            if let Some(conn) = self.conns.get_mut(&peer) {
                append(conn.conn.outbound(), frames);
            }
        }
        for conn in self.conns.values_mut() {
            let _ = conn.conn.flush();
        }
    }
}
