//! The standalone master role: listens for workers (`Role::Worker`), drivers registering
//! applications (`Role::Driver`) and people's commands (`Role::Client`, `flint status`) on a
//! [`crate::transport::server::Sockets`], feeds what they say to the sans-IO [`MasterCore`]
//! (the peer table with the handshake and its limits, and the protocol around the engine's
//! [`Master`] state machine) on an event loop, and carries out what it decides: frames on the
//! right connections, closes, journal records. With a state
//! directory it journals workers and applications and recovers them
//! when it starts again.
//!
//! Conventions on top of the message table (no new messages):
//! - the master answers each `WorkerHeartbeat` with `HeartbeatAck`, so a worker notices a master
//!   it can no longer reach; a heartbeat from a worker it declared dead closes the connection,
//!   and the worker registers again;
//! - a worker that registers again sends `ExecutorStateChanged(RUNNING)` with
//!   `REATTACH_MESSAGE` for each executor still running: the master adopts
//!   those it placed before a restart and kills the others;
//! - a driver whose first message is `RequestExecutors{app_id, ..}` instead of
//!   `RegisterApplication` is coming back to its application (after a master restart);
//! - a driver connection may send `StatusRequest`: the answer tells it the master has handled
//!   everything it sent before (the app client's `sync`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flint_engine::runtime::{Ctx, Endpoint, Runtime, RuntimeConfig, TimerId};
use flint_engine::standalone::{self as sa, Master};
use mio::event::Event;
use mio::net::TcpListener;
use mio::Token;

use crate::conn::{Inbound, ReadUntil};
use crate::handshake::Secret;
use crate::standalone::journal::Journal;
use crate::standalone::master_core::{CoreConfig, MasterCore};
use crate::transport::peers::{Limits, PeersConfig};
use crate::transport::server::Sockets;
use crate::wire::{Role, FRAME_SIZE_MAX_DEFAULT};

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

/// Why a master could not start.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    /// A non-loopback address without a secret, and `allow_insecure_bind` not set.
    #[error("refusing to listen on non-loopback {0} without a shared secret (set a secret, or allow it explicitly)")]
    InsecureBind(SocketAddr),
    /// The journal in the state directory could not be opened.
    #[error(transparent)]
    Journal(#[from] crate::standalone::journal::JournalError),
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The event loop could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] flint_engine::runtime::RuntimeError),
    /// The master's endpoint could not be spawned on the loop.
    #[error("master endpoint: {0}")]
    Spawn(#[from] flint_engine::runtime::SpawnError),
}

/// A running master.
#[derive(Debug)]
pub struct MasterHandle {
    runtime: Option<Runtime>,
    local_addr: Option<SocketAddr>,
}

impl MasterHandle {
    /// Binds, replays the journal, and starts the master's loop.
    pub fn start(config: MasterConfig) -> Result<MasterHandle, MasterError> {
        let addr = config.listen;
        if !addr.ip().is_loopback() && config.secret.is_none() && !config.allow_insecure_bind {
            return Err(MasterError::InsecureBind(addr));
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
                master.handle_recover(recovered.workers, recovered.apps, 0);
                Some(journal)
            }
        };
        let listener =
            TcpListener::bind(addr).map_err(|source| MasterError::Listen { addr, source })?;
        let local_addr = listener.local_addr().ok();
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            thread_name: "flint-master".into(),
            ..RuntimeConfig::default()
        })?;
        let endpoint = MasterEndpoint::new(config, master, journal, listener, epoch);
        runtime.handle().spawn("master", endpoint)?;
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

/// The master's endpoint: the transport's sockets around the protocol core (which holds the
/// peer table), the journal and the loop's clock.
struct MasterEndpoint {
    sockets: Sockets,
    core: MasterCore,
    epoch: Instant,
    journal: Option<Journal>,
    tick_period: Duration,
}

impl MasterEndpoint {
    fn new(
        config: MasterConfig,
        master: Master,
        journal: Option<Journal>,
        listener: TcpListener,
        epoch: Instant,
    ) -> MasterEndpoint {
        let inbound = Inbound {
            role: Role::Master,
            accepted_roles: &[Role::Worker, Role::Driver, Role::Client],
            secret: config.secret.clone(),
            frame_size_max: config.frame_size_max,
            outbound_max: config.outbound_max,
        };
        let limits = Limits {
            connections_max: config.connections_max,
            handshakes_max: config.handshakes_max,
            clients_max: config.clients_max,
            handshake_timeout: config.handshake_timeout,
            client_idle_timeout: config.client_idle_timeout,
            // The core expires workers by their heartbeats, and applications never.
            member_timeout: None,
        };
        let tick_period = (config.heartbeat_interval / 4)
            .clamp(Duration::from_millis(10), Duration::from_millis(250));
        let core = MasterCore::new(
            master,
            CoreConfig {
                heartbeat_interval_ms: config.heartbeat_interval.as_millis().min(u32::MAX as u128)
                    as u32,
                apps_connections_max: config.apps_connections_max,
                frame_size_max: config.frame_size_max,
                tick_period_us: tick_period.as_micros() as u64,
                peers: PeersConfig {
                    inbound: inbound.clone(),
                    name: "the master",
                    limits,
                },
            },
        );
        MasterEndpoint {
            sockets: Sockets::new(listener, inbound, None),
            core,
            epoch,
            journal,
            tick_period,
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn on_peer_event(&mut self, token: Token, event: &Event) {
        if !(event.is_readable() || event.is_read_closed() || event.is_error()) {
            self.sockets.touch(token);
            return;
        }
        let now_us = self.now_us();
        let core = &mut self.core;
        let mut closed_by_core = false;
        let result = self.sockets.read(token, ReadUntil::WouldBlock, |frame| {
            let result = core.handle_frame(token, &frame, now_us);
            closed_by_core = result.is_err();
            result
        });
        // A peer the core closed is in its `poll_close`.
        if let (Err(error), false) = (result, closed_by_core) {
            self.sockets.close(token);
            self.core.handle_closed(token, &error);
        }
    }

    /// Carries out what the core decided, until it has nothing more: records journaled and
    /// synced first, then frames queued, connections closed and flushed (a failed write tells
    /// the core, which may decide more).
    fn pump(&mut self) {
        loop {
            while let Some(record) = self.core.poll_record() {
                if let Some(journal) = self.journal.as_mut() {
                    journal.record(&record);
                }
            }
            if let Some(journal) = self.journal.as_mut() {
                journal.flush();
            }
            while let Some((peer, bytes)) = self.core.poll_transmit() {
                self.sockets.append(peer, bytes);
            }
            while let Some((peer, why)) = self.core.poll_close() {
                tracing::debug!("closing a connection: {why}");
                self.sockets.close(peer);
            }
            for (peer, error) in self.sockets.flush(self.now_us(), |_| false) {
                self.core.handle_closed(peer, &error);
            }
            if !self.core.has_output() {
                return;
            }
        }
    }
}

impl Endpoint for MasterEndpoint {
    type Msg = ();

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Err(error) = self.sockets.start(ctx) {
            tracing::error!("{error}");
        }
        if let Err(error) = ctx.timer_periodic(self.tick_period) {
            tracing::error!("no tick timer: {error}");
        }
    }

    fn on_message(&mut self, _msg: (), _ctx: &mut Ctx<'_, Self>) {}

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if self.sockets.is_listener(token) {
            let now_us = self.now_us();
            self.sockets.accept(ctx, &mut self.core, now_us);
        } else {
            self.on_peer_event(token, event);
        }
        self.pump();
        self.sockets.release(ctx);
    }

    fn on_timer(&mut self, _timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        let now_us = self.now_us();
        self.core.handle_timeout(now_us);
        self.pump();
        self.sockets.release(ctx);
    }
}
