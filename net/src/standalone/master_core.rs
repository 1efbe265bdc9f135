//! The standalone master's protocol as a sans-IO core: what each peer's frames mean, fed to the
//! engine's [`Master`] state machine, and what it decides, as frames for peers, connections to
//! close and journal records. No sockets and no clock: the endpoint ([`super::master`]) hands
//! in peers opening and closing, frames and `now_us`, and drains [`MasterCore::poll_transmit`],
//! [`MasterCore::poll_close`] and [`MasterCore::poll_record`] (records before any frame goes
//! out: a peer never hears of something a restarted master would not know).
//!
//! Peers are named by the transport's [`Token`] and held in the transport's sans-IO peer table
//! ([`Peers`], as in the driver's core): the handshake, the limits per kind and the deadlines
//! run in here too, so the endpoint only accepts, reads, writes and ticks. Each peer past the
//! handshake has a [`Phase`]: registering as the role its handshake named, then a worker, an
//! application, or a status client (also an application that is over). The message
//! conventions are in [`super::master`]'s header.

use std::collections::{HashMap, VecDeque};

use bytes::BytesMut;
use flint_engine::standalone::{Master, Output, WorkerSpec};
use mio::Token;

use crate::conn::{ConnError, TABLE_FULL};
use crate::handshake::SECRET_ENV;
use crate::standalone::journal::Record;
use crate::standalone::{spec_from_wire, with_description, REATTACH_MESSAGE};
use crate::transport::peers::{Arrival, Peers, PeersConfig, Standing};
use crate::transport::server::Admit;
use crate::transport::{encode, unexpected};
use crate::wire::{self, AppDescription, Frame, List, Message, Role};

/// Where a peer is in the master's protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Past the handshake as this role, not registered yet.
    Registering(Role),
    /// A registered worker.
    Worker(String),
    /// A registered application's driver.
    App(String),
    /// A status client, or an application that is over.
    Client,
}

/// The core's settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// How often workers heartbeat, in ms (told them in `RegisteredWorker`).
    pub heartbeat_interval_ms: u32,
    /// Application connections (registering or registered) held at once.
    pub apps_connections_max: usize,
    /// Largest frame sent.
    pub frame_size_max: usize,
    /// How often the endpoint should call [`MasterCore::handle_timeout`], in µs.
    pub tick_period_us: u64,
    /// Whom the master lets in and the bounds of its peer table.
    pub peers: PeersConfig,
}

/// The master's protocol, sans IO.
pub struct MasterCore {
    config: CoreConfig,
    master: Master,
    peers: Peers<Token, Phase>,
    workers: HashMap<String, Token>,
    apps: HashMap<String, Token>,
    records: VecDeque<Record>,
    last_tick_us: u64,
}

impl std::fmt::Debug for MasterCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterCore")
            .field("peers", &self.peers.len())
            .field("workers", &self.workers.len())
            .field("apps", &self.apps.len())
            .finish_non_exhaustive()
    }
}

impl MasterCore {
    /// A core around `master` (already recovered from the journal, if there is one).
    pub fn new(master: Master, config: CoreConfig) -> MasterCore {
        MasterCore {
            peers: Peers::new(config.peers.clone()),
            config,
            master,
            workers: HashMap::new(),
            apps: HashMap::new(),
            records: VecDeque::new(),
            last_tick_us: 0,
        }
    }

    /// The state machine inside.
    pub fn master(&self) -> &Master {
        &self.master
    }

    /// Why a connection arriving now would be refused (the table is full), if it would: the
    /// endpoint tells the newcomer before setting it up.
    pub fn refusal(&self) -> Option<String> {
        self.peers.refusal()
    }

    /// A connection was accepted; `nonce` is fresh for it. Our `Hello` is queued at once; a
    /// full table refuses it with the reason, making room may close older connections.
    pub fn handle_connected(
        &mut self,
        peer: Token,
        nonce: [u8; 32],
        now_us: u64,
    ) -> Result<(), String> {
        let result = self.peers.handle_connected(peer, nonce, now_us);
        self.forget_gone();
        self.check();
        result
    }

    /// A frame from a peer; `Err` is why the core closed it (it is in
    /// [`MasterCore::poll_close`], after its last frames: drain [`MasterCore::poll_transmit`]
    /// first).
    pub fn handle_frame(
        &mut self,
        peer: Token,
        frame: &Frame,
        now_us: u64,
    ) -> Result<(), ConnError> {
        let Some(frame) = self.peers.unseal(peer, frame) else {
            self.forget_gone();
            return Err(ConnError::Protocol("a bad seal".into()));
        };
        let frame = &frame;
        let result = match self.peers.handle_frame(peer, frame, now_us) {
            Arrival::Handshaking => Ok(()),
            Arrival::Opened(role) => {
                self.open(peer, role);
                Ok(())
            }
            Arrival::Failed | Arrival::Unknown => Err(ConnError::Protocol("closed".into())),
            Arrival::Open => match frame.message() {
                Ok(message) => self.handle_message(peer, message, now_us),
                Err(error) => Err(error.into()),
            },
        };
        if let Err(why) = &result {
            self.close(peer, ConnError::Protocol(why.to_string()));
        }
        self.forget_gone();
        self.drive();
        self.check();
        result
    }

    /// A peer's connection ended.
    pub fn handle_closed(&mut self, peer: Token, why: &ConnError) {
        let phase = self.peers.remove(peer);
        self.forget(peer, phase, why);
        self.drive();
        debug_assert!(!self.peers.contains(peer));
        self.check();
    }

    /// Time passed: the state machine's deadlines (heartbeats, launches, recovery) and the
    /// peer table's (handshakes, registrations, idle clients).
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.last_tick_us = now_us;
        self.master.handle_timeout(now_us);
        self.peers.handle_timeout(now_us);
        self.forget_gone();
        self.drive();
        self.check();
    }

    /// What must hold between inputs (debug builds and the simulators): each worker and
    /// application the core routes to is a peer in that phase, and the table is within its
    /// bounds. The negative space: no two workers on one connection, no application
    /// connections past `apps_connections_max`. O(peers).
    fn check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        self.peers.check();
        for (id, &peer) in &self.workers {
            let held = self.peers.state(peer);
            assert!(
                matches!(held, Some(Phase::Worker(w)) if w == id),
                "worker {id}'s peer"
            );
        }
        for (id, &peer) in &self.apps {
            let held = self.peers.state(peer);
            assert!(
                matches!(held, Some(Phase::App(a)) if a == id),
                "application {id}'s peer"
            );
        }
        let peers: std::collections::BTreeSet<_> = self.workers.values().collect();
        assert_eq!(peers.len(), self.workers.len(), "one connection per worker");
        let apps = self.app_connections();
        assert!(
            apps <= self.config.apps_connections_max,
            "{apps} application connections"
        );
    }

    /// When the core wants its next [`MasterCore::handle_timeout`], in µs.
    pub fn poll_timeout(&self) -> Option<u64> {
        Some(self.last_tick_us.saturating_add(self.config.tick_period_us))
    }

    /// Frames for a peer, in order (poll [`MasterCore::poll_record`] first).
    pub fn poll_transmit(&mut self) -> Option<(Token, BytesMut)> {
        self.peers.poll_transmit()
    }

    /// A connection to drop once its frames are written, and why. The core has forgotten it.
    pub fn poll_close(&mut self) -> Option<(Token, ConnError)> {
        self.peers.poll_close()
    }

    /// A record to journal.
    pub fn poll_record(&mut self) -> Option<Record> {
        self.records.pop_front()
    }

    /// Whether anything waits to be polled.
    pub fn has_output(&self) -> bool {
        !self.records.is_empty() || self.peers.has_output()
    }

    /// How a peer counts against the connection limits.
    pub fn standing(&self, peer: Token) -> Standing {
        self.peers.standing(peer).unwrap_or(Standing::Registering)
    }

    /// A peer's phase (`None` in the handshake or once closed).
    pub fn phase(&self, peer: Token) -> Option<&Phase> {
        self.peers.state(peer)
    }

    /// A peer finished the handshake as `role`: a client, or one to register (applications
    /// bounded by `apps_connections_max`, so workers keep room).
    fn open(&mut self, peer: Token, role: Role) {
        let phase = match role {
            Role::Client => Phase::Client,
            Role::Driver if self.app_connections() >= self.config.apps_connections_max => {
                let reason = format!(
                    "{TABLE_FULL}: {} application connections (apps_connections_max)",
                    self.config.apps_connections_max
                );
                return self.peers.refuse(peer, reason);
            }
            role => Phase::Registering(role),
        };
        let standing = standing_of(&phase);
        self.peers.open(peer, phase, standing);
    }

    /// A peer's phase from now on.
    fn set_phase(&mut self, peer: Token, phase: Phase) {
        let standing = standing_of(&phase);
        if let Some((found, _)) = self.peers.open_mut(peer) {
            *found = phase;
        }
        self.peers.set_standing(peer, standing);
    }

    /// Closes a peer: its last frames go out, then the endpoint drops it.
    fn close(&mut self, peer: Token, why: ConnError) {
        if self.peers.contains(peer) {
            let phase = self.peers.state(peer).cloned();
            self.forget(peer, phase, &why);
            self.peers.close(peer, why);
        }
    }

    /// Forgets the peers the table closed itself (evicted, expired).
    fn forget_gone(&mut self) {
        while let Some((peer, phase, why)) = self.peers.poll_gone() {
            self.forget(peer, Some(phase), &why);
        }
    }

    /// A peer left the table: a worker is lost, an application disconnected.
    fn forget(&mut self, peer: Token, phase: Option<Phase>, why: &ConnError) {
        match phase {
            Some(Phase::Worker(id)) if self.workers.get(&id) == Some(&peer) => {
                self.workers.remove(&id);
                tracing::warn!("worker {id} disconnected: {why}");
                let reason = format!("its connection ended: {why}");
                self.master.handle_worker_lost(&id, &reason);
            }
            Some(Phase::App(id)) if self.apps.get(&id) == Some(&peer) => {
                self.apps.remove(&id);
                self.master.handle_app_disconnected(&id);
            }
            _ => {
                if !matches!(why, ConnError::Closed) {
                    tracing::info!("dropped a connection: {why}");
                }
            }
        }
    }

    fn app_connections(&self) -> usize {
        (self.peers.states())
            .filter(|p| matches!(p, Phase::App(_) | Phase::Registering(Role::Driver)))
            .count()
    }

    fn handle_message(
        &mut self,
        peer: Token,
        message: Message<'_>,
        now_us: u64,
    ) -> Result<(), ConnError> {
        let phase = self.peers.state(peer).cloned();
        match (phase, message) {
            (Some(Phase::Registering(Role::Worker)), m @ Message::RegisterWorker { .. }) => {
                self.register_worker(peer, &m, now_us)
            }
            (Some(Phase::Worker(id)), Message::WorkerHeartbeat { .. }) => {
                if self.master.handle_worker_heartbeat(&id, now_us) {
                    // The ack lets the worker notice a master it can no longer reach.
                    self.send(peer, &Message::HeartbeatAck {});
                    Ok(())
                } else {
                    Err(ConnError::Protocol(format!(
                        "heartbeat from worker {id}, which is not alive here; it must register again"
                    )))
                }
            }
            (Some(Phase::Worker(id)), m @ Message::ExecutorStateChanged { .. }) => {
                self.handle_executor_state(&id, &m);
                Ok(())
            }
            (Some(Phase::Registering(Role::Driver)), Message::RegisterApplication { app }) => {
                self.register_app(peer, &app, now_us)
            }
            // A driver coming back (after a master restart) names its application.
            (
                Some(Phase::Registering(Role::Driver)),
                Message::RequestExecutors { app_id, total },
            ) => self.reconnect_app(peer, app_id, total, now_us),
            (Some(Phase::App(id)), message) if app_message_for(&message) == Some(id.as_str()) => {
                self.app_message(&id, message);
                Ok(())
            }
            (Some(Phase::Client | Phase::App(_)), Message::StatusRequest {}) => {
                let mut out = BytesMut::new();
                status(&self.master, &mut out, self.config.frame_size_max);
                self.queue(peer, &out);
                Ok(())
            }
            (_, Message::Shutdown {}) => Err(ConnError::Closed),
            (_, other) => Err(ConnError::Protocol(unexpected(&other, "this peer"))),
        }
    }

    fn register_worker(
        &mut self,
        peer: Token,
        message: &Message<'_>,
        now_us: u64,
    ) -> Result<(), ConnError> {
        let &Message::RegisterWorker {
            worker_id,
            host,
            port,
            cores,
            memory_mb,
        } = message
        else {
            return Err(ConnError::Protocol("not a registration".into()));
        };
        let spec = WorkerSpec {
            id: worker_id.to_owned(),
            host: host.to_owned(),
            port,
            cores,
            memory_mb,
        };
        let registered = if crate::standalone::worker::valid_id(&spec.id) {
            self.master.handle_worker_registered(spec.clone(), now_us)
        } else {
            Err(format!(
                "worker id {:?} is not 1 to {} letters, digits, '-', '_' or '.'",
                crate::standalone::clip_for_log(&spec.id),
                crate::standalone::worker::ID_LEN_MAX
            ))
        };
        if let Err(reason) = registered {
            self.send(peer, &Message::RegisterWorkerFailed { reason: &reason });
            return Err(ConnError::Protocol(format!(
                "worker registration refused: {reason}"
            )));
        }
        self.records
            .push_back(Record::WorkerRegistered(spec.clone()));
        let heartbeat_interval_ms = self.config.heartbeat_interval_ms;
        self.send(
            peer,
            &Message::RegisteredWorker {
                heartbeat_interval_ms,
            },
        );
        tracing::info!(
            "worker {worker_id} registered ({host}:{port}, {cores} cores, {memory_mb} MiB)"
        );
        self.workers.insert(spec.id.clone(), peer);
        self.set_phase(peer, Phase::Worker(spec.id));
        Ok(())
    }

    fn handle_executor_state(&mut self, worker: &str, message: &Message<'_>) {
        let &Message::ExecutorStateChanged {
            app_id,
            executor_id,
            state,
            message,
            exit_code,
        } = message
        else {
            return;
        };
        if state == wire::ProcessState::Running && message == REATTACH_MESSAGE {
            self.master
                .handle_executor_reattached(worker, app_id, executor_id);
        } else {
            self.master.handle_executor_state(
                worker,
                app_id,
                executor_id,
                state,
                message,
                exit_code,
            );
        }
    }

    fn register_app(
        &mut self,
        peer: Token,
        app: &AppDescription<'_>,
        now_us: u64,
    ) -> Result<(), ConnError> {
        let mut spec = spec_from_wire(app);
        // Secrets never reach the journal: workers give executors their own copy.
        let before = spec.env.len();
        spec.env.retain(|(key, _)| key != SECRET_ENV);
        if spec.env.len() != before {
            tracing::warn!(
                "dropped {SECRET_ENV} from application {:?}'s environment: the master journals it, and workers pass their own secret to executors",
                spec.name
            );
        }
        match self.master.handle_app_registered(spec.clone(), now_us) {
            Ok(app_id) => {
                self.records
                    .push_back(Record::AppRegistered(app_id.clone(), spec.clone()));
                self.send(peer, &Message::RegisteredApplication { app_id: &app_id });
                tracing::info!("application {app_id} ({}) registered", spec.name);
                self.apps.insert(app_id.clone(), peer);
                self.set_phase(peer, Phase::App(app_id));
                Ok(())
            }
            Err(reason) => {
                let removed = Message::ApplicationRemoved {
                    app_id: "",
                    reason: &reason,
                };
                self.send(peer, &removed);
                Err(ConnError::Protocol(format!(
                    "application refused: {reason}"
                )))
            }
        }
    }

    fn reconnect_app(
        &mut self,
        peer: Token,
        app_id: &str,
        total: u32,
        now_us: u64,
    ) -> Result<(), ConnError> {
        if let Err(reason) = self.master.handle_app_reconnected(app_id, now_us) {
            self.send(
                peer,
                &Message::ApplicationRemoved {
                    app_id,
                    reason: &reason,
                },
            );
            return Err(ConnError::Protocol(reason));
        }
        tracing::info!("application {app_id} reconnected");
        if let Some(old) = self.apps.insert(app_id.to_owned(), peer) {
            if old != peer {
                let why = ConnError::Protocol("the application reconnected".into());
                self.close(old, why);
            }
        }
        self.set_phase(peer, Phase::App(app_id.to_owned()));
        self.handle_request_executors(app_id, total);
        Ok(())
    }

    /// A registered application's request (its id already checked).
    fn app_message(&mut self, id: &str, message: Message<'_>) {
        match message {
            Message::RequestExecutors { total, .. } => self.handle_request_executors(id, total),
            Message::KillExecutors { executor_ids, .. } => {
                let ids: Vec<&str> = executor_ids.iter().collect();
                self.master.handle_kill_executors(id, &ids);
            }
            Message::UnregisterApplication { .. } => {
                tracing::info!("application {id} unregistered");
                self.master.handle_app_unregistered(id);
            }
            _ => {}
        }
    }

    fn handle_request_executors(&mut self, app_id: &str, total: u32) {
        if self.master.handle_request_executors(app_id, total) {
            self.records
                .push_back(Record::ExecutorsRequested(app_id.to_owned(), total));
        }
    }

    /// Carries out what the state machine decided.
    fn drive(&mut self) {
        while let Some(output) = self.master.poll_output() {
            self.carry_out(output);
        }
    }

    fn carry_out(&mut self, output: Output) {
        match output {
            Output::LaunchExecutor {
                worker,
                app,
                executor,
                cores,
                memory_mb,
            } => {
                let Some(spec) = self.master.app_spec(&app).cloned() else {
                    return;
                };
                let peer = self.workers.get(&worker).copied();
                with_description(&spec, |description| {
                    let launch = Message::LaunchExecutor {
                        app_id: &app,
                        executor_id: &executor,
                        app: description,
                        cores,
                        memory_mb,
                    };
                    self.send_to(peer, &launch);
                });
            }
            Output::KillExecutor {
                worker,
                app,
                executor,
            } => {
                let peer = self.workers.get(&worker).copied();
                let kill = Message::KillExecutor {
                    app_id: &app,
                    executor_id: &executor,
                };
                self.send_to(peer, &kill);
            }
            Output::ApplicationFinished { worker, app } => {
                let peer = self.workers.get(&worker).copied();
                self.send_to(peer, &Message::ApplicationFinished { app_id: &app });
            }
            Output::ExecutorAdded { .. } | Output::ExecutorUpdated { .. } => {
                self.tell_app(output);
            }
            Output::ApplicationRemoved { app, state, reason } => {
                tracing::info!("application {app} removed ({state:?}): {reason}");
                self.records.push_back(Record::AppRemoved(app.clone()));
                let peer = self.apps.remove(&app);
                let removed = Message::ApplicationRemoved {
                    app_id: &app,
                    reason: &reason,
                };
                self.send_to(peer, &removed);
                self.demote(peer);
            }
            Output::WorkerRemoved {
                worker,
                host,
                reason,
                apps,
            } => self.worker_removed(&worker, &host, &reason, &apps),
        }
    }

    /// What an application hears about its executors.
    fn tell_app(&mut self, output: Output) {
        match output {
            Output::ExecutorAdded {
                app,
                executor,
                worker,
                host_port,
                cores,
                memory_mb,
            } => {
                self.records
                    .push_back(Record::ExecutorAdded(app.clone(), executor.clone()));
                let peer = self.apps.get(&app).copied();
                let added = Message::ExecutorAdded {
                    app_id: &app,
                    executor_id: &executor,
                    worker_id: &worker,
                    host_port: &host_port,
                    cores,
                    memory_mb,
                };
                self.send_to(peer, &added);
            }
            Output::ExecutorUpdated {
                app,
                executor,
                state,
                message,
                exit_code,
            } => {
                let peer = self.apps.get(&app).copied();
                let changed = Message::ExecutorStateChanged {
                    app_id: &app,
                    executor_id: &executor,
                    state,
                    message: &message,
                    exit_code,
                };
                self.send_to(peer, &changed);
            }
            _ => {}
        }
    }

    fn worker_removed(&mut self, worker: &str, host: &str, reason: &str, apps: &[String]) {
        tracing::warn!("worker {worker} removed: {reason}");
        self.records
            .push_back(Record::WorkerRemoved(worker.to_owned()));
        for app in apps {
            let peer = self.apps.get(app).copied();
            let removed = Message::WorkerRemoved {
                worker_id: worker,
                host,
                reason,
            };
            self.send_to(peer, &removed);
        }
        if let Some(peer) = self.workers.remove(worker) {
            self.demote(Some(peer));
            self.close(
                peer,
                ConnError::Protocol(format!("worker removed: {reason}")),
            );
        }
    }

    /// A worker or application that is over: from now on the peer is only a status client.
    fn demote(&mut self, peer: Option<Token>) {
        if let Some(peer) = peer {
            self.set_phase(peer, Phase::Client);
        }
    }

    fn send_to(&mut self, peer: Option<Token>, message: &Message<'_>) {
        if let Some(peer) = peer {
            self.send(peer, message);
        }
    }

    fn send(&mut self, peer: Token, message: &Message<'_>) {
        let mut out = BytesMut::new();
        encode(message, &mut out, self.config.frame_size_max);
        self.queue(peer, &out);
    }

    fn queue(&mut self, peer: Token, bytes: &[u8]) {
        if let Some(out) = self.peers.outbound(peer) {
            out.extend_from_slice(bytes);
        }
    }
}

impl Admit for MasterCore {
    fn refusal(&mut self) -> Option<String> {
        MasterCore::refusal(self)
    }

    fn connected(&mut self, token: Token, nonce: [u8; 32], now_us: u64) -> Result<(), String> {
        self.handle_connected(token, nonce, now_us)
    }
}

/// How a phase counts against the table's limits.
fn standing_of(phase: &Phase) -> Standing {
    match phase {
        Phase::Registering(_) => Standing::Registering,
        Phase::Client => Standing::Client,
        Phase::Worker(_) | Phase::App(_) => Standing::Member,
    }
}

/// The application id a registered application's request names, if it is one.
fn app_message_for<'a>(message: &Message<'a>) -> Option<&'a str> {
    match *message {
        Message::RequestExecutors { app_id, .. }
        | Message::KillExecutors { app_id, .. }
        | Message::UnregisterApplication { app_id } => Some(app_id),
        _ => None,
    }
}

/// The cluster's status as a `StatusResponse`.
fn status(master: &Master, out: &mut BytesMut, frame_size_max: usize) {
    let status = master.status();
    let workers: Vec<wire::WorkerStatus<'_>> = status
        .workers
        .iter()
        .map(|w| wire::WorkerStatus {
            worker_id: &w.spec.id,
            host: &w.spec.host,
            port: w.spec.port,
            state: w.state,
            cores: w.spec.cores,
            cores_used: w.cores_used,
            memory_mb: w.spec.memory_mb,
            memory_used_mb: w.memory_used_mb,
        })
        .collect();
    let applications: Vec<wire::AppStatus<'_>> = status
        .apps
        .iter()
        .map(|a| wire::AppStatus {
            app_id: &a.id,
            name: &a.name,
            state: a.state,
            cores_granted: a.cores_granted,
            executors_requested: a.executors_requested,
            waiting: &a.waiting,
        })
        .collect();
    let executors: Vec<wire::ExecutorStatus<'_>> = status
        .executors
        .iter()
        .map(|e| wire::ExecutorStatus {
            app_id: &e.app,
            executor_id: &e.id,
            worker_id: &e.worker,
            cores: e.cores,
            state: e.state,
        })
        .collect();
    let response = Message::StatusResponse {
        workers: List::from_items(&workers),
        applications: List::from_items(&applications),
        executors: List::from_items(&executors),
    };
    encode(&response, out, frame_size_max);
}

#[cfg(test)]
mod tests;
