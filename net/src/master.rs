//! The standalone master role: listens for workers (`Role::Worker`), drivers registering
//! applications (`Role::Driver`) and people's commands (`Role::Client`, `flint status`), feeds
//! what they say to the engine's [`Master`] state machine on an event loop, and carries out what
//! it decides as frames on the right connections. With a state directory it journals workers and
//! applications (see [`crate::journal`]) and recovers them when it starts again.
//!
//! Conventions on top of the message table (no new messages):
//! - the master answers each `WorkerHeartbeat` with `HeartbeatAck`, so a worker notices a master
//!   it can no longer reach; a heartbeat from a worker it declared dead closes the connection,
//!   and the worker registers again;
//! - a worker that registers again sends `ExecutorStateChanged(RUNNING)` with
//!   [`crate::standalone::REATTACH_MESSAGE`] for each executor still running: the master adopts
//!   those it placed before a restart and kills the others;
//! - a driver whose first message is `RequestExecutors{app_id, ..}` instead of
//!   `RegisterApplication` is coming back to its application (after a master restart);
//! - a driver connection may send `StatusRequest`: the answer tells it the master has handled
//!   everything it sent before (the app client's `sync`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flint_engine::runtime::{Ctx, Endpoint, Runtime, RuntimeConfig, TimerId};
use flint_engine::standalone::{self as sa, Master, Output, WorkerSpec};
use mio::event::Event;
use mio::net::TcpListener;
use mio::{Interest, Token};

use crate::conn::{accept_next, refuse, ConnError, Connection, Inbound, TABLE_FULL};
use crate::driver::encode;
use crate::handshake::{Handshake, Secret, SECRET_ENV};
use crate::journal::Journal;
use crate::standalone::{
    app_state_to_wire, executor_state_from_wire, executor_state_to_wire, spec_from_wire,
    with_description, worker_state_to_wire, REATTACH_MESSAGE,
};
use crate::wire::{self, List, Message, Role, FRAME_SIZE_MAX_DEFAULT};

/// How a master runs.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    /// Where to listen.
    pub listen: SocketAddr,
    /// Bind a non-loopback address even without a shared secret.
    pub allow_insecure_bind: bool,
    /// The shared secret peers must prove they hold.
    pub secret: Option<Secret>,
    /// Where to journal workers and applications (none: no recovery).
    pub state_dir: Option<PathBuf>,
    /// How often workers heartbeat.
    pub heartbeat_interval: Duration,
    /// The engine's settings (worker timeout, spread out, retries, recovery timeout).
    pub master: sa::Config,
    /// Time a new connection has to finish the handshake and register.
    pub handshake_timeout: Duration,
    /// Largest frame accepted or sent.
    pub frame_size_max: usize,
    /// Bytes a connection may have queued unsent before it is dropped.
    pub outbound_max: usize,
    /// Connections held at once.
    pub connections_max: usize,
    /// Connections still in the handshake (unauthenticated) held at once; when another
    /// arrives the oldest goes, so nobody can hold the table without the secret.
    pub handshakes_max: usize,
    /// Status connections (`Role::Client`) held at once; when another arrives the oldest goes.
    pub clients_max: usize,
    /// A status connection silent this long is closed.
    pub client_idle_timeout: Duration,
    /// Application connections held at once, so workers always have room.
    pub apps_connections_max: usize,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7077)),
            allow_insecure_bind: false,
            secret: None,
            state_dir: None,
            heartbeat_interval: Duration::from_millis(1000),
            master: sa::Config::default(),
            handshake_timeout: Duration::from_secs(5),
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 64 << 20,
            connections_max: 4096,
            handshakes_max: 256,
            clients_max: 64,
            client_idle_timeout: Duration::from_secs(30),
            apps_connections_max: 2048,
        }
    }
}

/// A running master.
#[derive(Debug)]
pub struct MasterHandle {
    runtime: Option<Runtime>,
    local_addr: Option<SocketAddr>,
}

impl MasterHandle {
    /// Binds, replays the journal, and starts the master's loop.
    pub fn start(config: MasterConfig) -> Result<MasterHandle, String> {
        let addr = config.listen;
        if !addr.ip().is_loopback() && config.secret.is_none() && !config.allow_insecure_bind {
            return Err(format!(
                "refusing to listen on non-loopback {addr} without a shared secret (set a secret, or allow it explicitly)"
            ));
        }
        let epoch = Instant::now();
        let started_s = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut master = Master::new(config.master.clone(), format!("app-{started_s}"));
        let journal = match &config.state_dir {
            None => None,
            Some(dir) => {
                let (journal, recovered) = Journal::open(dir)?;
                if !recovered.workers.is_empty() || !recovered.apps.is_empty() {
                    tracing::info!(
                        "recovering {} workers and {} applications from {}",
                        recovered.workers.len(),
                        recovered.apps.len(),
                        dir.display()
                    );
                }
                master.recover(0, recovered.workers, recovered.apps);
                Some(journal)
            }
        };
        let listener =
            TcpListener::bind(addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        let local_addr = listener.local_addr().ok();
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            thread_name: "flint-master".into(),
            ..RuntimeConfig::default()
        })
        .map_err(|e| format!("runtime: {e}"))?;
        let endpoint = MasterEndpoint {
            config,
            master,
            journal,
            listener,
            listener_token: None,
            peers: HashMap::new(),
            workers: HashMap::new(),
            apps: HashMap::new(),
            epoch,
            dirty: Vec::new(),
            to_close: Vec::new(),
        };
        runtime
            .handle()
            .spawn("master", endpoint)
            .map_err(|e| format!("master endpoint: {e}"))?;
        Ok(MasterHandle {
            runtime: Some(runtime),
            local_addr,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Stops the loop, dropping every connection.
    pub fn shutdown(mut self) {
        if let Some(mut runtime) = self.runtime.take() {
            runtime.shutdown();
        }
    }
}

enum Phase {
    Handshake(Box<Handshake>),
    Registering(Role),
    Worker(String),
    App(String),
    /// A status client, or an application that is over.
    Client,
}

struct Peer {
    conn: Connection,
    phase: Phase,
    opened: Instant,
    last_heard: Instant,
}

struct MasterEndpoint {
    config: MasterConfig,
    master: Master,
    journal: Option<Journal>,
    listener: TcpListener,
    listener_token: Option<Token>,
    peers: HashMap<Token, Peer>,
    workers: HashMap<String, Token>,
    apps: HashMap<String, Token>,
    epoch: Instant,
    dirty: Vec<Token>,
    to_close: Vec<(Token, String)>,
}

impl MasterEndpoint {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn accept(&mut self, ctx: &mut Ctx<'_, Self>) {
        let inbound = Inbound {
            role: Role::Master,
            accepted_roles: &[Role::Worker, Role::Driver, Role::Client],
            secret: self.config.secret.clone(),
            frame_size_max: self.config.frame_size_max,
            outbound_max: self.config.outbound_max,
        };
        while let Some((stream, addr)) = accept_next(&self.listener) {
            // Unauthenticated connections have a table of their own: the oldest goes.
            if self.count(|p| matches!(p, Phase::Handshake(_))) >= self.config.handshakes_max {
                self.evict_oldest(|p| matches!(p, Phase::Handshake(_)), "handshakes_max");
            }
            if self.peers.len() >= self.config.connections_max
                && !self.evict_oldest(
                    |p| matches!(p, Phase::Handshake(_) | Phase::Client),
                    "connections_max",
                )
            {
                tracing::warn!(%addr, "refused a connection: {TABLE_FULL}");
                refuse(
                    stream,
                    &format!(
                        "{TABLE_FULL}: the master holds {} connections",
                        self.peers.len()
                    ),
                );
                continue;
            }
            match inbound.open(stream, ctx) {
                Ok((token, conn, handshake)) => {
                    let phase = Phase::Handshake(Box::new(handshake));
                    let now = Instant::now();
                    self.peers.insert(
                        token,
                        Peer {
                            conn,
                            phase,
                            opened: now,
                            last_heard: now,
                        },
                    );
                    self.dirty.push(token);
                }
                Err(error) => tracing::warn!(%addr, "could not set up a connection: {error}"),
            }
        }
    }

    /// Connections whose phase matches.
    fn count(&self, matching: impl Fn(&Phase) -> bool) -> usize {
        self.peers.values().filter(|p| matching(&p.phase)).count()
    }

    /// Closes the oldest connection whose phase matches (telling it the table is full);
    /// whether there was one.
    fn evict_oldest(&mut self, matching: impl Fn(&Phase) -> bool, limit: &str) -> bool {
        let oldest = self
            .peers
            .iter()
            .filter(|(_, p)| matching(&p.phase))
            .min_by_key(|(_, p)| p.opened)
            .map(|(t, _)| *t);
        let Some(token) = oldest else {
            return false;
        };
        if let Some(mut peer) = self.peers.remove(&token) {
            peer.conn.evict_for_full_table(Some(limit));
        }
        true
    }

    fn on_peer_event(&mut self, token: Token, event: &Event) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let mut result = Ok(());
        if event.is_readable() || event.is_read_closed() || event.is_error() {
            peer.last_heard = Instant::now();
            let phase = &mut peer.phase;
            result = peer
                .conn
                .read_frames(|conn, frame| self.on_frame(token, phase, conn, frame));
        }
        self.peers.insert(token, peer);
        match result {
            Ok(()) => self.dirty.push(token),
            Err(error) => self.close(token, &error),
        }
    }

    fn on_frame(
        &mut self,
        token: Token,
        phase: &mut Phase,
        conn: &mut Connection,
        frame: wire::Frame,
    ) -> Result<(), ConnError> {
        let frame_size_max = self.config.frame_size_max;
        if let Phase::Handshake(handshake) = phase {
            return match handshake.on_frame(frame.kind(), frame.body(), conn.outbound()) {
                Ok(None) => Ok(()),
                Ok(Some(Role::Client)) => {
                    // Status connections have a table of their own: the oldest goes.
                    if self.count(|p| matches!(p, Phase::Client)) >= self.config.clients_max {
                        self.evict_oldest(|p| matches!(p, Phase::Client), "clients_max");
                    }
                    *phase = Phase::Client;
                    Ok(())
                }
                Ok(Some(Role::Driver))
                    if self.count(|p| {
                        matches!(p, Phase::App(_) | Phase::Registering(Role::Driver))
                    }) >= self.config.apps_connections_max =>
                {
                    let reason = format!(
                        "{TABLE_FULL}: {} application connections (apps_connections_max)",
                        self.config.apps_connections_max
                    );
                    encode(
                        &Message::HandshakeRefused { reason: &reason },
                        conn.outbound(),
                        frame_size_max,
                    );
                    Err(ConnError::Protocol(reason))
                }
                Ok(Some(role)) => {
                    *phase = Phase::Registering(role);
                    Ok(())
                }
                Err(error) => Err(ConnError::Protocol(format!("handshake failed: {error}"))),
            };
        }
        let now_us = self.now_us();
        let message = frame.message()?;
        match (&*phase, message) {
            (
                Phase::Registering(Role::Worker),
                Message::RegisterWorker {
                    worker_id,
                    host,
                    port,
                    cores,
                    memory_mb,
                },
            ) => {
                let spec = WorkerSpec {
                    id: worker_id.to_owned(),
                    host: host.to_owned(),
                    port,
                    cores,
                    memory_mb,
                };
                let registered = if crate::worker::valid_id(&spec.id) {
                    self.master.worker_registered(now_us, spec.clone())
                } else {
                    Err(format!(
                        "worker id {:?} is not 1 to {} letters, digits, '-', '_' or '.'",
                        crate::standalone::clip_for_log(&spec.id),
                        crate::worker::ID_LEN_MAX
                    ))
                };
                match registered {
                    Ok(()) => {
                        if let Some(journal) = self.journal.as_mut() {
                            journal.worker_registered(&spec);
                        }
                        if let Some(old) = self.workers.insert(spec.id.clone(), token) {
                            if old != token {
                                self.to_close
                                    .push((old, "the worker registered again".into()));
                            }
                        }
                        let interval_ms = self
                            .config
                            .heartbeat_interval
                            .as_millis()
                            .min(u32::MAX as u128) as u32;
                        encode(
                            &Message::RegisteredWorker {
                                heartbeat_interval_ms: interval_ms,
                            },
                            conn.outbound(),
                            frame_size_max,
                        );
                        tracing::info!(
                            "worker {worker_id} registered ({host}:{port}, {cores} cores, {memory_mb} MiB)"
                        );
                        *phase = Phase::Worker(spec.id);
                        Ok(())
                    }
                    Err(reason) => {
                        encode(
                            &Message::RegisterWorkerFailed { reason: &reason },
                            conn.outbound(),
                            frame_size_max,
                        );
                        Err(ConnError::Protocol(format!(
                            "worker registration refused: {reason}"
                        )))
                    }
                }
            }
            (Phase::Worker(id), Message::WorkerHeartbeat { .. }) => {
                if self.master.worker_heartbeat(now_us, id) {
                    // The ack lets the worker notice a master it can no longer reach.
                    encode(&Message::HeartbeatAck {}, conn.outbound(), frame_size_max);
                    Ok(())
                } else {
                    Err(ConnError::Protocol(format!(
                        "heartbeat from worker {id}, which is not alive here; it must register again"
                    )))
                }
            }
            (
                Phase::Worker(id),
                Message::ExecutorStateChanged {
                    app_id,
                    executor_id,
                    state,
                    message,
                    exit_code,
                },
            ) => {
                if state == wire::ExecutorState::Running && message == REATTACH_MESSAGE {
                    self.master.executor_reattached(id, app_id, executor_id);
                } else {
                    self.master.executor_state_changed(
                        id,
                        app_id,
                        executor_id,
                        executor_state_from_wire(state),
                        message,
                        exit_code,
                    );
                }
                Ok(())
            }
            (Phase::Registering(Role::Driver), Message::RegisterApplication { app }) => {
                let mut spec = spec_from_wire(&app);
                // Secrets never reach the journal: workers give executors their own copy.
                let before = spec.env.len();
                spec.env.retain(|(key, _)| key != SECRET_ENV);
                if spec.env.len() != before {
                    tracing::warn!(
                        "dropped {SECRET_ENV} from application {:?}'s environment: the master journals it, and workers pass their own secret to executors",
                        spec.name
                    );
                }
                match self.master.app_registered(now_us, spec.clone()) {
                    Ok(app_id) => {
                        if let Some(journal) = self.journal.as_mut() {
                            journal.app_registered(&app_id, &spec);
                        }
                        encode(
                            &Message::RegisteredApplication { app_id: &app_id },
                            conn.outbound(),
                            frame_size_max,
                        );
                        tracing::info!("application {app_id} ({}) registered", spec.name);
                        self.apps.insert(app_id.clone(), token);
                        *phase = Phase::App(app_id);
                        Ok(())
                    }
                    Err(reason) => {
                        encode(
                            &Message::ApplicationRemoved {
                                app_id: "",
                                reason: &reason,
                            },
                            conn.outbound(),
                            frame_size_max,
                        );
                        Err(ConnError::Protocol(format!(
                            "application refused: {reason}"
                        )))
                    }
                }
            }
            // A driver coming back (after a master restart) names its application.
            (Phase::Registering(Role::Driver), Message::RequestExecutors { app_id, total }) => {
                match self.master.app_reconnected(now_us, app_id) {
                    Ok(()) => {
                        tracing::info!("application {app_id} reconnected");
                        if let Some(old) = self.apps.insert(app_id.to_owned(), token) {
                            if old != token {
                                self.to_close
                                    .push((old, "the application reconnected".into()));
                            }
                        }
                        *phase = Phase::App(app_id.to_owned());
                        self.request_executors(app_id, total);
                        Ok(())
                    }
                    Err(reason) => {
                        encode(
                            &Message::ApplicationRemoved {
                                app_id,
                                reason: &reason,
                            },
                            conn.outbound(),
                            frame_size_max,
                        );
                        Err(ConnError::Protocol(reason))
                    }
                }
            }
            (Phase::App(id), Message::RequestExecutors { app_id, total }) if app_id == id => {
                let id = id.clone();
                self.request_executors(&id, total);
                Ok(())
            }
            (
                Phase::App(id),
                Message::KillExecutors {
                    app_id,
                    executor_ids,
                },
            ) if app_id == id => {
                let ids: Vec<&str> = executor_ids.iter().collect();
                self.master.kill_executors(id, &ids);
                Ok(())
            }
            (Phase::App(id), Message::UnregisterApplication { app_id }) if app_id == id => {
                let id = id.clone();
                tracing::info!("application {id} unregistered");
                self.master.app_unregistered(&id);
                Ok(())
            }
            (Phase::Client | Phase::App(_), Message::StatusRequest {}) => {
                self.status(conn);
                Ok(())
            }
            (_, Message::Shutdown {}) => Err(ConnError::Closed),
            (_, other) => Err(ConnError::Protocol(format!(
                "unexpected {} from this peer",
                other.kind().name()
            ))),
        }
    }

    fn request_executors(&mut self, app_id: &str, total: u32) {
        if self.master.request_executors(app_id, total) {
            if let Some(journal) = self.journal.as_mut() {
                journal.executors_requested(app_id, total);
            }
        }
    }

    fn status(&self, conn: &mut Connection) {
        let status = self.master.status();
        let workers: Vec<wire::WorkerStatus<'_>> = status
            .workers
            .iter()
            .map(|w| wire::WorkerStatus {
                worker_id: &w.spec.id,
                host: &w.spec.host,
                port: w.spec.port,
                state: worker_state_to_wire(w.state),
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
                state: app_state_to_wire(a.state),
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
                state: executor_state_to_wire(e.state),
            })
            .collect();
        encode(
            &Message::StatusResponse {
                workers: List::from_items(&workers),
                applications: List::from_items(&applications),
                executors: List::from_items(&executors),
            },
            conn.outbound(),
            self.config.frame_size_max,
        );
    }

    fn close(&mut self, token: Token, why: &ConnError) {
        let Some(mut peer) = self.peers.remove(&token) else {
            return;
        };
        let _ = peer.conn.flush();
        match peer.phase {
            Phase::Worker(id) => {
                if self.workers.get(&id) == Some(&token) {
                    self.workers.remove(&id);
                    tracing::warn!("worker {id} disconnected: {why}");
                    self.master
                        .worker_lost(&id, &format!("its connection ended: {why}"));
                }
            }
            Phase::App(id) => {
                if self.apps.get(&id) == Some(&token) {
                    self.apps.remove(&id);
                    self.master.app_disconnected(&id);
                }
            }
            _ => {
                if !matches!(why, ConnError::Closed) {
                    tracing::info!(peer = ?peer.conn.peer(), "dropped a connection: {why}");
                }
            }
        }
    }

    /// Sends `message` on `token`'s connection, if it is open.
    fn send_to(&mut self, token: Option<Token>, message: &Message<'_>) {
        let Some(token) = token else {
            return;
        };
        if let Some(peer) = self.peers.get_mut(&token) {
            encode(message, peer.conn.outbound(), self.config.frame_size_max);
            self.dirty.push(token);
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
                let token = self.workers.get(&worker).copied();
                let Some(spec) = self.master.app_spec(&app).cloned() else {
                    return;
                };
                with_description(&spec, |description| {
                    self.send_to(
                        token,
                        &Message::LaunchExecutor {
                            app_id: &app,
                            executor_id: &executor,
                            app: description,
                            cores,
                            memory_mb,
                        },
                    );
                });
            }
            Output::KillExecutor {
                worker,
                app,
                executor,
            } => {
                let token = self.workers.get(&worker).copied();
                self.send_to(
                    token,
                    &Message::KillExecutor {
                        app_id: &app,
                        executor_id: &executor,
                    },
                );
            }
            Output::ApplicationFinished { worker, app } => {
                let token = self.workers.get(&worker).copied();
                self.send_to(token, &Message::ApplicationFinished { app_id: &app });
            }
            Output::ExecutorAdded {
                app,
                executor,
                worker,
                host_port,
                cores,
                memory_mb,
            } => {
                if let Some(journal) = self.journal.as_mut() {
                    journal.executor_added(&app, &executor);
                }
                let token = self.apps.get(&app).copied();
                self.send_to(
                    token,
                    &Message::ExecutorAdded {
                        app_id: &app,
                        executor_id: &executor,
                        worker_id: &worker,
                        host_port: &host_port,
                        cores,
                        memory_mb,
                    },
                );
            }
            Output::ExecutorUpdated {
                app,
                executor,
                state,
                message,
                exit_code,
            } => {
                let token = self.apps.get(&app).copied();
                self.send_to(
                    token,
                    &Message::ExecutorStateChanged {
                        app_id: &app,
                        executor_id: &executor,
                        state: executor_state_to_wire(state),
                        message: &message,
                        exit_code,
                    },
                );
            }
            Output::ApplicationRemoved { app, state, reason } => {
                tracing::info!("application {app} removed ({state:?}): {reason}");
                if let Some(journal) = self.journal.as_mut() {
                    journal.app_removed(&app);
                }
                let token = self.apps.remove(&app);
                self.send_to(
                    token,
                    &Message::ApplicationRemoved {
                        app_id: &app,
                        reason: &reason,
                    },
                );
                if let Some(peer) = token.and_then(|t| self.peers.get_mut(&t)) {
                    peer.phase = Phase::Client;
                }
            }
            Output::WorkerRemoved {
                worker,
                host,
                reason,
                apps,
            } => {
                tracing::warn!("worker {worker} removed: {reason}");
                if let Some(journal) = self.journal.as_mut() {
                    journal.worker_removed(&worker);
                }
                for app in apps {
                    let token = self.apps.get(&app).copied();
                    self.send_to(
                        token,
                        &Message::WorkerRemoved {
                            worker_id: &worker,
                            host: &host,
                            reason: &reason,
                        },
                    );
                }
                if let Some(token) = self.workers.remove(&worker) {
                    if let Some(peer) = self.peers.get_mut(&token) {
                        peer.phase = Phase::Client;
                    }
                    self.to_close
                        .push((token, format!("worker removed: {reason}")));
                }
            }
        }
    }

    fn pump(&mut self) {
        loop {
            while let Some(output) = self.master.poll_output() {
                self.carry_out(output);
            }
            if let Some(journal) = self.journal.as_mut() {
                journal.flush();
            }
            let mut failed: Vec<(Token, ConnError)> = self
                .to_close
                .drain(..)
                .map(|(token, why)| (token, ConnError::Protocol(why)))
                .collect();
            for token in std::mem::take(&mut self.dirty) {
                if let Some(peer) = self.peers.get_mut(&token) {
                    if let Err(error) = peer.conn.flush() {
                        failed.push((token, error));
                    }
                }
            }
            if failed.is_empty() {
                return;
            }
            for (token, error) in failed {
                self.close(token, &error);
            }
        }
    }

    fn on_tick(&mut self) {
        self.master.tick(self.now_us());
        let timeout = self.config.handshake_timeout;
        let idle = self.config.client_idle_timeout;
        let expired: Vec<(Token, String)> = self
            .peers
            .iter()
            .filter_map(|(token, p)| match p.phase {
                Phase::Handshake(_) | Phase::Registering(_) if p.opened.elapsed() > timeout => {
                    Some((
                        *token,
                        format!(
                            "no handshake and registration within {} ms",
                            timeout.as_millis()
                        ),
                    ))
                }
                Phase::Client if p.last_heard.elapsed() > idle => Some((
                    *token,
                    format!("a status connection silent for {} ms", idle.as_millis()),
                )),
                _ => None,
            })
            .collect();
        for (token, why) in expired {
            self.close(token, &ConnError::Protocol(why));
        }
    }
}

impl Endpoint for MasterEndpoint {
    type Msg = ();

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        match ctx.register(&mut self.listener, Interest::READABLE) {
            Ok(token) => self.listener_token = Some(token),
            Err(error) => tracing::error!("cannot watch the listener: {error}"),
        }
        let period = (self.config.heartbeat_interval / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(250));
        if let Err(error) = ctx.timer_periodic(period) {
            tracing::error!("no tick timer: {error}");
        }
    }

    fn on_message(&mut self, _msg: (), _ctx: &mut Ctx<'_, Self>) {}

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if Some(token) == self.listener_token {
            self.accept(ctx);
        } else {
            self.on_peer_event(token, event);
        }
        self.pump();
    }

    fn on_timer(&mut self, _timer: TimerId, _ctx: &mut Ctx<'_, Self>) {
        self.on_tick();
        self.pump();
    }
}
