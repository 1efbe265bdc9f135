//! The IO sides of the simulated processes: what the driver's endpoint and an executor's
//! endpoints (one per lane) do around their sans-IO cores, with the [`Network`] for sockets and a
//! [`FakeRunner`] for the task pool. Each node turns network deliveries into the core's inputs
//! and the core's outputs into sends, closes and task actions, as the real IO side does (frame
//! decoding, the not-reading check, closing after the last frames).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use flint_engine::scheduler::{Attempt, JobId};
use flint_engine::sim::Rng;

use crate::admission::Admission;
use crate::conn::ConnError;
use crate::driver::core::{DriverCore, PeerId};
use crate::driver::handles::Handles;
use crate::driver::DriverConfig;
use crate::executor::core::{Action, ExecutorCore};
use crate::executor::{ExecutorConfig, ExecutorError};
use crate::job::{DriverSide, Job, JobHandle, JobShared, SpareStates};
use crate::observe::LoopTelemetry;
use crate::sim::ledger::Ledger;
use crate::sim::network::{ConnId, Delivery, End, Network};
use crate::sim::runner::FakeRunner;
use crate::wire::{FrameDecoder, TaskState};

/// The cancels handles posted, for the next pump (the real loop takes them off its inbox), and
/// the job states they let go of, kept for new jobs as the real driver keeps them.
#[derive(Default)]
pub(crate) struct Cancels(Mutex<Vec<JobId>>, Arc<SpareStates>);

impl DriverSide for Cancels {
    fn cancel(&self, id: JobId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(id);
    }

    fn give_back(&self, shared: Arc<JobShared>) {
        self.1.give(shared);
    }
}

/// Micros in a `Duration` (saturating).
pub fn us(d: Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

/// A fresh nonce from the run's generator (the cores take nonces as inputs).
pub fn nonce(rng: &mut Rng) -> [u8; 32] {
    let mut n = [0u8; 32];
    for chunk in n.chunks_mut(8) {
        chunk.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    n
}

/// One connection as the driver's IO side holds it.
#[derive(Debug, Default)]
struct DriverConn {
    decoder: Option<FrameDecoder>,
    /// Bytes the core produced that the network has not taken yet.
    unsent: BytesMut,
    /// Since when bytes have waited with none taken (a peer not reading).
    stuck_since_us: Option<u64>,
}

/// The driver process: the core and its connections.
pub struct DriverNode {
    /// The core under test.
    pub core: DriverCore,
    admission: Arc<Admission>,
    /// The jobs' handles, as the endpoint holds them: the core's events go here.
    handles: Handles,
    /// Jobs whose handles cancelled them since the last pump (the handle's cancel closure
    /// posts here, as the real one posts to the loop's inbox).
    cancels: Arc<Cancels>,
    /// Connections open in the driver's view.
    conns: BTreeMap<ConnId, DriverConn>,
    frame_size_max: usize,
    heartbeat_timeout_us: u64,
    outbound_max: usize,
    /// `handle_timeout` calls.
    pub wakeups: u64,
    /// Frames handed to the core.
    pub frames: u64,
    /// Connections the IO side dropped as not reading.
    pub backlogged: u64,
}

impl std::fmt::Debug for DriverNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverNode")
            .field("conns", &self.conns.len())
            .finish_non_exhaustive()
    }
}

impl DriverNode {
    /// A driver as `config` says.
    pub fn new(config: DriverConfig) -> DriverNode {
        let admission = Arc::new(Admission::new(
            config.scheduler.pending_tasks_max,
            config.scheduler.jobs_max,
        ));
        let telemetry = Box::new(LoopTelemetry::new(Instant::now()));
        let cancels = Arc::new(Cancels::default());
        DriverNode {
            frame_size_max: config.frame_size_max,
            heartbeat_timeout_us: us(config.heartbeat_timeout),
            outbound_max: config.outbound_max,
            core: DriverCore::new(config, telemetry, [7; 32]),
            handles: Handles::new(admission.clone(), cancels.1.clone()),
            admission,
            cancels,
            conns: BTreeMap::new(),
            wakeups: 0,
            frames: 0,
            backlogged: 0,
        }
    }

    /// Whether `conn` is open in the driver's view.
    pub fn is_open(&self, conn: ConnId) -> bool {
        self.conns.contains_key(&conn)
    }

    /// Jobs admitted and not yet ended (given back by the core as each ends).
    pub fn active_jobs(&self) -> usize {
        self.admission.active_jobs()
    }

    /// Connections open in the driver's view.
    pub fn open_conns(&self) -> usize {
        self.conns.len()
    }

    /// Submits `job` as `Driver::try_submit` does: admission on the caller's side, then the
    /// core's submit; the handle's cancel reaches the core at the next pump.
    pub fn submit(&mut self, mut job: Job, now_us: u64) -> Result<JobHandle, String> {
        let tasks = job.len();
        let id = self
            .admission
            .admit(&job, tasks)
            .map_err(|e| e.to_string())?;
        job.prepare();
        let tasks = tasks as u64;
        let shared = self.cancels.1.take();
        let observer = job.observer.take();
        let token = (self.handles).open(id, shared.clone(), observer, tasks as usize, job.stream);
        if let Some(token) = token {
            self.core.submit(id, token, job, now_us);
        }
        self.hand_events();
        Ok(JobHandle {
            id: id.0,
            tasks,
            shared: std::mem::ManuallyDrop::new(shared),
            driver: self.cancels.clone(),
            detached: false,
        })
    }

    /// A peer connected on `conn`; false if the driver refused it (the connection is closed).
    pub fn connect(&mut self, rng: &mut Rng, net: &mut Network, conn: ConnId, now_us: u64) -> bool {
        match self
            .core
            .handle_connected(PeerId(conn as u64), nonce(rng), now_us)
        {
            Ok(()) => {
                let c = DriverConn {
                    decoder: Some(FrameDecoder::new(self.frame_size_max)),
                    ..DriverConn::default()
                };
                self.conns.insert(conn, c);
                true
            }
            Err(_) => {
                net.close(rng, conn, End::Driver, now_us);
                false
            }
        }
    }

    /// What the network delivered on `conn`.
    pub fn deliver(
        &mut self,
        rng: &mut Rng,
        net: &mut Network,
        conn: ConnId,
        what: Delivery,
        now_us: u64,
    ) {
        let peer = PeerId(conn as u64);
        let error = match what {
            Delivery::Bytes(bytes) => match self.read(conn, &bytes, now_us) {
                Ok(()) => return,
                Err(e) => e,
            },
            Delivery::Fin => ConnError::Closed,
            Delivery::Reset => ConnError::Io(std::io::ErrorKind::ConnectionReset.into()),
        };
        if self.conns.remove(&conn).is_some() {
            self.core.handle_closed(peer, &error, now_us);
            net.close(rng, conn, End::Driver, now_us);
        }
    }

    /// Decodes `bytes` into frames for the core; an error is a malformed stream.
    fn read(&mut self, conn: ConnId, bytes: &[u8], now_us: u64) -> Result<(), ConnError> {
        let Some(c) = self.conns.get_mut(&conn) else {
            return Ok(());
        };
        let Some(decoder) = c.decoder.as_mut() else {
            return Ok(());
        };
        decoder.extend_from_slice(bytes);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    self.frames += 1;
                    if !self.core.handle_frame(PeerId(conn as u64), &frame, now_us) {
                        // The core closed it: it is in `poll_close`; nothing more is read.
                        c.decoder = None;
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(ConnError::Wire(e)),
            }
        }
    }

    /// When the driver must next be woken: the core's timeout or a stuck connection's limit.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        let stuck = (self.conns.values())
            .filter_map(|c| c.stuck_since_us)
            .map(|t| t.saturating_add(self.heartbeat_timeout_us))
            .min();
        [self.core.poll_timeout(), stuck]
            .into_iter()
            .flatten()
            .min()
    }

    /// Time passed: the core's timeout if due. Afterwards the core must want nothing before
    /// `now_us` passes, or its IO loop would spin.
    pub fn handle_timeout(&mut self, now_us: u64) -> Result<(), String> {
        if self.core.poll_timeout().is_some_and(|t| t <= now_us) {
            self.wakeups += 1;
            self.core.handle_timeout(now_us);
            if let Some(t) = self.core.poll_timeout().filter(|&t| t <= now_us) {
                return Err(format!(
                    "driver: after handle_timeout({now_us}), poll_timeout is {t}: its loop \
                     would spin"
                ));
            }
        }
        Ok(())
    }

    /// Hands the core the cancels handles posted (the real loop takes them off its inbox).
    pub fn apply_cancels(&mut self, now_us: u64) {
        let cancels =
            std::mem::take(&mut *self.cancels.0.lock().unwrap_or_else(|p| p.into_inner()));
        for job in cancels {
            self.core.cancel(job, now_us);
        }
    }

    /// Hands the core's events to the jobs' handles, as the endpoint does.
    fn hand_events(&mut self) {
        let core = &mut self.core;
        self.handles.deliver_all(|| core.poll_event());
    }

    /// Carries out the core's outputs: cancels from handles in, results and outcomes to the
    /// handles, frames out, closes, and drops connections that do not read (as the endpoint
    /// does).
    pub fn pump(&mut self, rng: &mut Rng, net: &mut Network, now_us: u64) {
        self.apply_cancels(now_us);
        loop {
            self.hand_events();
            while let Some((peer, bytes)) = self.core.poll_transmit() {
                if let Some(c) = self.conns.get_mut(&(peer.0 as usize)) {
                    c.unsent.extend_from_slice(&bytes);
                }
            }
            self.flush(rng, net, now_us);
            let Some((peer, _why)) = self.core.poll_close() else {
                if !self.drop_stuck(rng, net, now_us) {
                    return;
                }
                continue;
            };
            let conn = peer.0 as usize;
            if self.conns.remove(&conn).is_some() {
                net.close(rng, conn, End::Driver, now_us);
            }
        }
    }

    /// Hands the network what it takes of each connection's unsent bytes.
    fn flush(&mut self, rng: &mut Rng, net: &mut Network, now_us: u64) {
        for (&conn, c) in self.conns.iter_mut() {
            if c.unsent.is_empty() {
                c.stuck_since_us = None;
                continue;
            }
            let bytes = Bytes::copy_from_slice(&c.unsent);
            let taken = net.send(rng, conn, End::Driver, now_us, bytes);
            let _ = c.unsent.split_to(taken);
            if c.unsent.is_empty() {
                c.stuck_since_us = None;
            } else if taken > 0 || c.stuck_since_us.is_none() {
                c.stuck_since_us = Some(now_us);
            }
        }
    }

    /// Drops executors' connections stuck for `heartbeat_timeout` or over `outbound_max`;
    /// whether any was dropped.
    fn drop_stuck(&mut self, rng: &mut Rng, net: &mut Network, now_us: u64) -> bool {
        let limit_us = self.heartbeat_timeout_us;
        let stuck: Vec<ConnId> = (self.conns.iter())
            .filter(|(_, c)| {
                c.unsent.len() > self.outbound_max
                    || c.stuck_since_us
                        .is_some_and(|t| now_us >= t.saturating_add(limit_us))
            })
            .map(|(&conn, _)| conn)
            .collect();
        for &conn in &stuck {
            if let Some(c) = self.conns.remove(&conn) {
                self.backlogged += 1;
                let why = ConnError::Backlog(c.unsent.len());
                self.core.handle_closed(PeerId(conn as u64), &why, now_us);
                net.close(rng, conn, End::Driver, now_us);
            }
        }
        !stuck.is_empty()
    }
}

/// What an executor process is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Running normally.
    Running,
    /// Reads nothing (its bytes pile up) but runs, heartbeats and sends.
    Deaf,
    /// Frozen: reads nothing, runs nothing, sends nothing.
    Frozen,
    /// Gone (crashed, or exited).
    Dead,
}

/// One lane of an executor process: its core, its runner, its end of a connection.
struct LaneNode {
    conn: ConnId,
    core: ExecutorCore,
    runner: FakeRunner,
    /// What the lane is doing (a deaf lane reads nothing; the others may still read).
    liveness: Liveness,
    unsent: BytesMut,
}

impl LaneNode {
    fn is_running(&self) -> bool {
        !matches!(self.liveness, Liveness::Frozen | Liveness::Dead)
    }

    fn poll_timeout(&self) -> Option<u64> {
        if !self.is_running() {
            return None;
        }
        [self.core.poll_timeout(), self.runner.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
    }
}

/// One executor process: its lanes (lane 0 registers it; the others join once it has, each on
/// a connection of its own, as `executor::run` starts them), sharing one fate.
pub struct ExecNode {
    /// Its name (executor id on the wire).
    pub name: String,
    /// Cores it claims.
    pub cores: u32,
    config: ExecutorConfig,
    /// The fake pool's failure chance and slowness, for each lane's runner.
    runner_params: (f64, u64),
    /// Lane 0 first; the others as they start.
    lanes: Vec<LaneNode>,
    /// When its registration was seen accepted.
    pub registered_us: Option<u64>,
    /// How it ended, once it did: the first lane's reason, the attempts all lanes ran.
    pub exit: Option<Result<u64, ExecutorError>>,
}

impl std::fmt::Debug for ExecNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lanes: Vec<(ConnId, Liveness)> =
            self.lanes.iter().map(|l| (l.conn, l.liveness)).collect();
        f.debug_struct("ExecNode")
            .field("name", &self.name)
            .field("lanes", &lanes)
            .finish_non_exhaustive()
    }
}

/// What an executor did in one step that the world checks.
#[derive(Debug, Default)]
pub struct ExecStep {
    /// It was just seen registered.
    pub registered: bool,
    /// Attempts launched.
    pub launched: Vec<Attempt>,
}

impl ExecNode {
    /// An executor process starting its lane 0 on `conn`.
    pub fn new(
        rng: &mut Rng,
        config: &ExecutorConfig,
        conn: ConnId,
        runner_params: (f64, u64),
    ) -> ExecNode {
        let lane0 = LaneNode {
            conn,
            core: ExecutorCore::new(config, nonce(rng)),
            runner: FakeRunner::new(runner_params.0, runner_params.1),
            liveness: Liveness::Running,
            unsent: BytesMut::new(),
        };
        ExecNode {
            name: config.executor_id.clone(),
            cores: config.cores,
            config: config.clone(),
            runner_params,
            lanes: vec![lane0],
            registered_us: None,
            exit: None,
        }
    }

    /// Lane 0's connection (the one that registers).
    pub fn conn(&self) -> ConnId {
        self.lanes[0].conn
    }

    /// Its lanes' connections, lane 0 first.
    pub fn conns(&self) -> impl Iterator<Item = ConnId> + '_ {
        self.lanes.iter().map(|l| l.conn)
    }

    /// Lanes started so far.
    pub fn lanes(&self) -> usize {
        self.lanes.len()
    }

    /// Whether the process runs (stalled or not).
    pub fn is_alive(&self) -> bool {
        self.lanes.iter().any(|l| l.liveness != Liveness::Dead)
    }

    /// What lane 0 is doing (the process's state, but for a lane gone deaf alone).
    pub fn liveness(&self) -> Liveness {
        self.lanes[0].liveness
    }

    /// The process dies: nothing more runs, reads or sends, on any lane.
    pub fn crash(&mut self) {
        for lane in &mut self.lanes {
            lane.liveness = Liveness::Dead;
            lane.runner = FakeRunner::new(0.0, 1);
            lane.unsent.clear();
        }
    }

    /// Lane `lane` (or, `None`, every lane) starts doing `liveness`, if the process runs.
    pub fn set_liveness(&mut self, lane: Option<usize>, liveness: Liveness) {
        for (i, l) in self.lanes.iter_mut().enumerate() {
            if l.liveness != Liveness::Dead && lane.is_none_or(|only| only == i) {
                l.liveness = liveness;
            }
        }
    }

    /// Lane 0's key once registered, while lanes are still to start: the cue to connect the
    /// next one.
    pub fn lane_to_start(&self) -> Option<[u8; 32]> {
        let wanted = self.lanes.len() < self.config.lanes() as usize;
        let key = self.lanes[0].core.lane_key();
        // A frozen process starts nothing.
        key.filter(|_| wanted && self.lanes[0].is_running())
    }

    /// Starts the next lane on `conn`, joining with `key`.
    pub fn start_lane(&mut self, rng: &mut Rng, conn: ConnId, key: [u8; 32]) {
        let lane = self.lanes.len() as u32;
        let (failure_prob, slowness) = self.runner_params;
        self.lanes.push(LaneNode {
            conn,
            core: ExecutorCore::new_lane(&self.config, nonce(rng), lane, key),
            runner: FakeRunner::new(failure_prob, slowness),
            liveness: self.lanes[0].liveness,
            unsent: BytesMut::new(),
        });
    }

    /// The attempts running on each lane whose connection `held` says the driver still holds.
    pub fn attempts(&self, held: impl Fn(ConnId) -> bool) -> Vec<(ConnId, u64, u32)> {
        (self.lanes.iter())
            .filter(|l| l.liveness != Liveness::Dead && held(l.conn))
            .flat_map(|l| l.runner.attempts().map(|a| (l.conn, a.task.0, a.attempt)))
            .collect()
    }

    /// What the network delivered on `conn`.
    pub fn deliver(&mut self, conn: ConnId, what: Delivery, now_us: u64) {
        let Some(lane) = self.lanes.iter_mut().find(|l| l.conn == conn) else {
            return;
        };
        if lane.liveness == Liveness::Dead {
            return;
        }
        match what {
            Delivery::Bytes(bytes) => lane.core.handle_bytes(&bytes, now_us),
            Delivery::Fin => lane.core.handle_closed("the driver closed the connection"),
            Delivery::Reset => lane.core.handle_closed("the connection was reset"),
        }
    }

    /// When it must next be woken (never while frozen or dead).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.lanes.iter().filter_map(LaneNode::poll_timeout).min()
    }

    /// Runs everything due at `now_us` on each lane: the core's timer, finished attempts, the
    /// core's actions, then sends what it has. A lane that ended ends the process
    /// (fate-sharing): every connection closed.
    pub fn step(
        &mut self,
        rng: &mut Rng,
        net: &mut Network,
        ledger: &mut Ledger,
        now_us: u64,
    ) -> Result<ExecStep, String> {
        let mut step = ExecStep::default();
        let mut ended = None;
        for lane in &mut self.lanes {
            let Some(exit) = step_lane(lane, &self.name, rng, net, ledger, now_us, &mut step)?
            else {
                continue;
            };
            if crate::executor::lane_left_out(lane.core.lane(), &exit) {
                // The driver had no room for it: the others run on (as `executor::run` does).
                net.close(rng, lane.conn, End::Peer, now_us);
                lane.liveness = Liveness::Dead;
            } else {
                ended.get_or_insert(exit);
            }
        }
        let lane0 = &self.lanes[0];
        if self.registered_us.is_none() && lane0.is_running() && lane0.core.poll_timeout().is_some()
        {
            self.registered_us = Some(now_us);
            step.registered = true;
        }
        if let Some(exit) = ended {
            let ran: u64 = self.lanes.iter().map(|l| l.core.task_attempts()).sum();
            self.exit = Some(exit.map(|_| ran));
            for lane in &self.lanes {
                net.close(rng, lane.conn, End::Peer, now_us);
            }
            self.crash();
        }
        Ok(step)
    }
}

/// One lane's step (see [`ExecNode::step`]): its exit, if its core ended.
fn step_lane(
    lane: &mut LaneNode,
    name: &str,
    rng: &mut Rng,
    net: &mut Network,
    ledger: &mut Ledger,
    now_us: u64,
    step: &mut ExecStep,
) -> Result<Option<Result<u64, ExecutorError>>, String> {
    if !lane.is_running() {
        return Ok(None);
    }
    if lane.core.poll_timeout().is_some_and(|t| t <= now_us) {
        lane.core.handle_timeout(now_us);
    }
    while let Some(c) = lane.runner.poll_completion(now_us) {
        tracing::debug!(target: "flint_net::sim", now_us, executor = %name, lane = lane.core.lane(), "{:#x}.{} ends {:?}", c.task.0, c.attempt, c.state);
        match c.state {
            TaskState::Finished => ledger.ran(c.task.0, c.attempt, Ok(c.data.clone())),
            TaskState::Failed => ledger.ran(c.task.0, c.attempt, Err(())),
            _ => {}
        }
        lane.core.handle_completion(c, now_us);
    }
    let lane_no = lane.core.lane();
    for launch in lane.core.poll_launches() {
        let (task_id, attempt, payload) = (launch.task.0, launch.attempt, launch.payload);
        if *launch.function != *super::FUNCTION {
            return Err(format!(
                "launch of task {task_id:#x} with function {:?}",
                launch.function
            ));
        }
        tracing::debug!(target: "flint_net::sim", now_us, executor = %name, lane = lane_no, "launch {task_id:#x}.{attempt}");
        ledger.launch(task_id, attempt, &payload)?;
        let key = Attempt::new(launch.task, attempt);
        lane.runner.launch(rng, now_us, key, &payload);
        step.launched.push(key);
    }
    while let Some(action) = lane.core.poll_action() {
        match action {
            Action::Kill(key) => {
                lane.runner.kill(now_us, key);
            }
            Action::KillAll => lane.runner = FakeRunner::new(0.0, 1),
        }
    }
    lane.core.poll_transmit(&mut lane.unsent);
    if !lane.unsent.is_empty() {
        let bytes = Bytes::copy_from_slice(&lane.unsent);
        let taken = net.send(rng, lane.conn, End::Peer, now_us, bytes);
        let _ = lane.unsent.split_to(taken);
    }
    Ok(lane
        .core
        .poll_exit()
        .map(|exit| exit.map(|summary| summary.task_attempts)))
}
