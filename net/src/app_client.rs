//! The driver's side of the standalone cluster (Spark's `StandaloneAppClient`): registers an
//! application with the master, asks for executors, follows what the master says about them,
//! and unregisters at the end. It runs beside a [`crate::driver::Driver`], whose listen address
//! is the application's `driver_addr`; the executors the master places connect to that driver.
//!
//! When the master connection ends (a master restart) it reconnects with backoff and names its
//! application again (`RequestExecutors{app_id, total}` as its first message), so the master
//! reattaches it instead of registering a new one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flint_engine::runtime::{Ctx, Endpoint, EndpointRef, Runtime, RuntimeConfig, TimerId};
use flint_engine::standalone::AppSpec;
use mio::event::Event;
use mio::net::TcpStream;
use mio::{Interest, Token};

use crate::conn::{ConnError, Connection};

/// How long one attempt to connect to the master and finish the handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
use crate::driver::encode;
use crate::handshake::{random_nonce, Handshake, Secret};
use crate::standalone::with_description;
use crate::wire::{self, ExecutorState, List, Message, Role, FRAME_SIZE_MAX_DEFAULT};

/// How an application client runs.
#[derive(Debug, Clone)]
pub struct AppClientConfig {
    /// The master's address.
    pub master: SocketAddr,
    /// The shared secret for the master.
    pub secret: Option<Secret>,
    /// The application.
    pub spec: AppSpec,
    /// Executors to ask for (none: as many as its cores allow).
    pub executors: Option<u32>,
    /// Longest wait between two connection attempts.
    pub reconnect_max: Duration,
}

/// What the client knows about its application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppInfo {
    /// The id the master gave it.
    pub app_id: Option<String>,
    /// Why the master removed it, once it did.
    pub removed: Option<String>,
    /// Its executors that are not over, with their worker and state.
    pub executors: BTreeMap<String, (String, ExecutorState)>,
    /// Executors the master placed so far.
    pub executors_added: u64,
    /// Executors that ended (any final state) so far.
    pub executors_ended: u64,
    /// Workers the master reported lost.
    pub workers_removed: u64,
    /// Whether it is connected to the master now.
    pub connected: bool,
    /// Answers the master gave to [`AppClient::sync`] so far.
    pub syncs: u64,
    /// Why the application does not have all it asked for, as of the last [`AppClient::sync`]
    /// (empty: it does). Starts with
    /// [`NO_WORKER_FITS`](flint_engine::standalone::NO_WORKER_FITS) when waiting cannot help.
    pub waiting: String,
}

#[derive(Default)]
struct Shared {
    info: Mutex<AppInfo>,
    changed: Condvar,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut AppInfo)) {
        let mut info = self.info.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut info);
        self.changed.notify_all();
    }

    fn wait_for<R>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&AppInfo) -> Option<R>,
    ) -> Option<R> {
        let deadline = Instant::now() + timeout;
        let mut info = self.info.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(found) = f(&info) {
                return Some(found);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            info = self
                .changed
                .wait_timeout(info, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A running application client.
pub struct AppClient {
    runtime: Option<Runtime>,
    endpoint: EndpointRef<AppEndpoint>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for AppClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppClient")
            .field("info", &self.info())
            .finish()
    }
}

impl AppClient {
    /// Starts connecting and registering.
    pub fn start(config: AppClientConfig) -> Result<AppClient, String> {
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            thread_name: "flint-app-client".into(),
            ..RuntimeConfig::default()
        })
        .map_err(|e| format!("runtime: {e}"))?;
        let shared = Arc::new(Shared::default());
        let endpoint = AppEndpoint {
            config,
            link: None,
            backoff: Duration::from_millis(50),
            reconnect: None,
            connect_deadline: None,
            shared: shared.clone(),
            app_id: None,
            unregistering: false,
        };
        let endpoint = runtime
            .handle()
            .spawn("app-client", endpoint)
            .map_err(|e| format!("app client endpoint: {e}"))?;
        Ok(AppClient {
            runtime: Some(runtime),
            endpoint,
            shared,
        })
    }

    /// What it knows now.
    pub fn info(&self) -> AppInfo {
        self.shared
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Why the master removed the application, if it did.
    pub fn removed(&self) -> Option<String> {
        self.info().removed
    }

    /// Waits until the master gave the application an id.
    pub fn wait_registered(&self, timeout: Duration) -> Result<String, String> {
        match self.shared.wait_for(timeout, |info| {
            if let Some(reason) = &info.removed {
                return Some(Err(format!("the master refused the application: {reason}")));
            }
            info.app_id.clone().map(Ok)
        }) {
            Some(result) => result,
            None => Err(format!(
                "no registration with the master within {} ms",
                timeout.as_millis()
            )),
        }
    }

    /// Asks for `total` executors in all.
    pub fn request_executors(&self, total: u32) -> Result<(), String> {
        self.endpoint
            .send(AppMsg::Request(total))
            .map_err(|e| e.to_string())
    }

    /// Waits (up to `timeout`) until the master has handled everything sent before this call:
    /// it asks for the cluster status on the same connection and waits for the answer.
    pub fn sync(&self, timeout: Duration) -> Result<(), String> {
        let before = self.info().syncs;
        self.endpoint
            .send(AppMsg::Sync)
            .map_err(|e| e.to_string())?;
        self.shared
            .wait_for(timeout, |info| (info.syncs > before).then_some(()))
            .ok_or_else(|| {
                format!(
                    "no answer from the master within {} ms",
                    timeout.as_millis()
                )
            })
    }

    /// Asks the master to kill these executors.
    pub fn kill_executors(&self, ids: Vec<String>) -> Result<(), String> {
        self.endpoint
            .send(AppMsg::Kill(ids))
            .map_err(|e| e.to_string())
    }

    /// Unregisters the application (waiting up to `timeout` for the master to confirm) and
    /// stops the client.
    pub fn stop(mut self, timeout: Duration) {
        if self.endpoint.send(AppMsg::Unregister).is_ok() {
            let _ = self
                .shared
                .wait_for(timeout, |info| info.removed.as_ref().map(|_| ()));
        }
        if let Some(mut runtime) = self.runtime.take() {
            runtime.shutdown();
        }
    }
}

impl Drop for AppClient {
    fn drop(&mut self) {
        if let Some(mut runtime) = self.runtime.take() {
            runtime.shutdown();
        }
    }
}

/// Messages to the client's endpoint.
#[derive(Debug)]
pub enum AppMsg {
    /// Ask for this many executors.
    Request(u32),
    /// Kill these executors.
    Kill(Vec<String>),
    /// Unregister.
    Unregister,
    /// Ask for the status, to know the master handled what came before.
    Sync,
}

enum Phase {
    Connecting(Box<Handshake>),
    Handshake(Box<Handshake>),
    Ready,
}

struct Link {
    conn: Connection,
    token: Token,
    phase: Phase,
}

struct AppEndpoint {
    config: AppClientConfig,
    link: Option<Link>,
    backoff: Duration,
    reconnect: Option<TimerId>,
    /// Fires when a connection attempt (connect and handshake) has taken too long.
    connect_deadline: Option<TimerId>,
    shared: Arc<Shared>,
    app_id: Option<String>,
    unregistering: bool,
}

impl AppEndpoint {
    fn connect(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.reconnect = None;
        let stream = match TcpStream::connect(self.config.master) {
            Ok(stream) => stream,
            Err(_) => return self.schedule_reconnect(ctx),
        };
        let mut conn = Connection::new(stream, FRAME_SIZE_MAX_DEFAULT, 64 << 20);
        let Ok(token) = ctx.register(conn.stream_mut(), Interest::READABLE | Interest::WRITABLE)
        else {
            return self.schedule_reconnect(ctx);
        };
        let Ok(nonce) = random_nonce() else {
            return self.schedule_reconnect(ctx);
        };
        let handshake = Handshake::start(
            Role::Driver,
            self.config.secret.clone(),
            nonce,
            &[Role::Master],
            conn.outbound(),
        );
        self.link = Some(Link {
            conn,
            token,
            phase: Phase::Connecting(Box::new(handshake)),
        });
        // A SYN into a cut link is retried for minutes; give up sooner and start again.
        if let Some(old) = self.connect_deadline.take() {
            ctx.cancel_timer(old);
        }
        self.connect_deadline = ctx.timer_once(CONNECT_TIMEOUT).ok();
    }

    fn schedule_reconnect(&mut self, ctx: &mut Ctx<'_, Self>) {
        if self.reconnect.is_some() || self.is_over() {
            return;
        }
        self.reconnect = ctx.timer_once(self.backoff).ok();
        self.backoff = (self.backoff * 2).min(self.config.reconnect_max);
    }

    fn is_over(&self) -> bool {
        self.shared
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .removed
            .is_some()
    }

    fn disconnect(&mut self, why: &str, ctx: &mut Ctx<'_, Self>) {
        if let Some(mut link) = self.link.take() {
            if matches!(link.phase, Phase::Ready) {
                tracing::warn!("lost the master ({why}); reconnecting");
            } else {
                tracing::info!(
                    "cannot reach the master at {}: {why}; retrying in {} ms",
                    self.config.master,
                    self.backoff.as_millis()
                );
            }
            let _ = ctx.deregister(link.conn.stream_mut(), link.token);
        }
        self.shared.update(|info| info.connected = false);
        self.schedule_reconnect(ctx);
    }

    fn on_link_event(&mut self, event: &Event, ctx: &mut Ctx<'_, Self>) {
        let Some(mut link) = self.link.take() else {
            return;
        };
        if let Phase::Connecting(_) = link.phase {
            if event.is_error() || event.is_read_closed() || event.is_write_closed() {
                self.link = Some(link);
                return self.disconnect("connection failed", ctx);
            }
            if !event.is_writable() {
                self.link = Some(link);
                return;
            }
            if link.conn.stream_mut().peer_addr().is_err() {
                self.link = Some(link);
                return self.disconnect("connection failed", ctx);
            }
            if let Phase::Connecting(handshake) = std::mem::replace(&mut link.phase, Phase::Ready) {
                link.phase = Phase::Handshake(handshake);
            }
        }
        let mut frames = Vec::new();
        let read = if event.is_readable() || event.is_read_closed() || event.is_error() {
            link.conn.read_frames(|_, frame| {
                frames.push(frame);
                Ok(())
            })
        } else {
            Ok(())
        };
        for frame in frames {
            if let Err(why) = self.on_frame(&mut link, frame) {
                let _ = link.conn.flush();
                self.link = Some(link);
                return self.disconnect(&why, ctx);
            }
        }
        let flushed = link.conn.flush();
        self.link = Some(link);
        if let Err(error) = read.and(flushed) {
            let why = match error {
                ConnError::Closed => "the master closed the connection".to_owned(),
                other => other.to_string(),
            };
            self.disconnect(&why, ctx);
        }
    }

    fn desired(&self) -> u32 {
        self.config.executors.unwrap_or(u32::MAX)
    }

    fn on_frame(&mut self, link: &mut Link, frame: wire::Frame) -> Result<(), String> {
        if let Phase::Handshake(handshake) = &mut link.phase {
            return match handshake.on_frame(frame.kind(), frame.body(), link.conn.outbound()) {
                Ok(None) => Ok(()),
                Ok(Some(_)) => {
                    match &self.app_id {
                        Some(app_id) => encode(
                            &Message::RequestExecutors {
                                app_id,
                                total: self.desired(),
                            },
                            link.conn.outbound(),
                            FRAME_SIZE_MAX_DEFAULT,
                        ),
                        None => with_description(&self.config.spec, |app| {
                            encode(
                                &Message::RegisterApplication { app },
                                link.conn.outbound(),
                                FRAME_SIZE_MAX_DEFAULT,
                            )
                        }),
                    }
                    if self.app_id.is_some() {
                        tracing::info!("reconnected to the master");
                        if self.unregistering {
                            self.send_unregister(link);
                        }
                    }
                    link.phase = Phase::Ready;
                    self.backoff = Duration::from_millis(50);
                    self.shared.update(|info| info.connected = true);
                    Ok(())
                }
                Err(error) => {
                    let why = format!("handshake with the master failed: {error}");
                    let table_full = error.to_string().contains(crate::conn::TABLE_FULL);
                    if self.app_id.is_none() && !table_full {
                        // A wrong secret or protocol version does not fix itself: give up.
                        let reason = why.clone();
                        self.shared.update(|info| info.removed = Some(reason));
                    }
                    Err(why)
                }
            };
        }
        let message = frame
            .message()
            .map_err(|e| format!("malformed frame from the master: {e}"))?;
        match message {
            Message::RegisteredApplication { app_id } => {
                self.app_id = Some(app_id.to_owned());
                if let Some(total) = self.config.executors {
                    encode(
                        &Message::RequestExecutors { app_id, total },
                        link.conn.outbound(),
                        FRAME_SIZE_MAX_DEFAULT,
                    );
                }
                if self.unregistering {
                    self.send_unregister(link);
                }
                self.shared
                    .update(|info| info.app_id = Some(app_id.to_owned()));
            }
            Message::ExecutorAdded {
                executor_id,
                worker_id,
                ..
            } => self.shared.update(|info| {
                info.executors_added += 1;
                info.executors.insert(
                    executor_id.to_owned(),
                    (worker_id.to_owned(), ExecutorState::Launching),
                );
            }),
            Message::ExecutorStateChanged {
                executor_id,
                state,
                message,
                ..
            } => {
                let is_final = !matches!(state, ExecutorState::Launching | ExecutorState::Running);
                if is_final && !self.unregistering {
                    tracing::warn!("executor {executor_id} {state}: {message}");
                }
                self.shared.update(|info| {
                    if is_final {
                        if info.executors.remove(executor_id).is_some() {
                            info.executors_ended += 1;
                        }
                    } else if let Some(entry) = info.executors.get_mut(executor_id) {
                        entry.1 = state;
                    }
                });
            }
            Message::WorkerRemoved {
                worker_id, reason, ..
            } => {
                tracing::warn!("the master lost worker {worker_id}: {reason}");
                self.shared.update(|info| info.workers_removed += 1);
            }
            Message::ApplicationRemoved { reason, .. } => {
                if !self.unregistering {
                    tracing::warn!("the master removed the application: {reason}");
                }
                let reason = reason.to_owned();
                self.shared.update(|info| info.removed = Some(reason));
            }
            Message::StatusResponse { applications, .. } => {
                let waiting = self.app_id.as_deref().and_then(|id| {
                    applications
                        .iter()
                        .find(|a| a.app_id == id)
                        .map(|a| a.waiting.to_owned())
                });
                self.shared.update(|info| {
                    info.syncs += 1;
                    if let Some(waiting) = waiting {
                        info.waiting = waiting;
                    }
                })
            }
            Message::Shutdown {} => return Err("the master shut down".into()),
            // The master's table for applications is full: say so and try again later.
            Message::HandshakeRefused { reason } => {
                return Err(format!("the master refused the connection: {reason}"))
            }
            other => {
                return Err(format!(
                    "unexpected {} from the master",
                    other.kind().name()
                ))
            }
        }
        Ok(())
    }

    fn send_unregister(&self, link: &mut Link) {
        if let Some(app_id) = &self.app_id {
            encode(
                &Message::UnregisterApplication { app_id },
                link.conn.outbound(),
                FRAME_SIZE_MAX_DEFAULT,
            );
        }
    }

    fn ready_link(&mut self) -> Option<&mut Link> {
        self.link
            .as_mut()
            .filter(|l| matches!(l.phase, Phase::Ready))
    }
}

impl Endpoint for AppEndpoint {
    type Msg = AppMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.connect(ctx);
    }

    fn on_message(&mut self, msg: AppMsg, ctx: &mut Ctx<'_, Self>) {
        let app_id = self.app_id.clone();
        match msg {
            AppMsg::Request(total) => {
                self.config.executors = Some(total);
                if let (Some(app_id), Some(link)) = (app_id, self.ready_link()) {
                    encode(
                        &Message::RequestExecutors {
                            app_id: &app_id,
                            total,
                        },
                        link.conn.outbound(),
                        FRAME_SIZE_MAX_DEFAULT,
                    );
                }
            }
            AppMsg::Kill(ids) => {
                if let (Some(app_id), Some(link)) = (app_id, self.ready_link()) {
                    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                    encode(
                        &Message::KillExecutors {
                            app_id: &app_id,
                            executor_ids: List::from_items(&ids),
                        },
                        link.conn.outbound(),
                        FRAME_SIZE_MAX_DEFAULT,
                    );
                }
            }
            AppMsg::Sync => {
                if let Some(link) = self.ready_link() {
                    encode(
                        &Message::StatusRequest {},
                        link.conn.outbound(),
                        FRAME_SIZE_MAX_DEFAULT,
                    );
                }
            }
            AppMsg::Unregister => {
                self.unregistering = true;
                let mut link = self.link.take();
                if let Some(l) = link.as_mut().filter(|l| matches!(l.phase, Phase::Ready)) {
                    self.send_unregister(l);
                }
                self.link = link;
            }
        }
        if let Some(link) = self.ready_link() {
            if let Err(error) = link.conn.flush() {
                self.disconnect(&error.to_string(), ctx);
            }
        }
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if self.link.as_ref().is_some_and(|l| l.token == token) {
            self.on_link_event(event, ctx);
        }
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if Some(timer) == self.connect_deadline {
            self.connect_deadline = None;
            let stuck = self
                .link
                .as_ref()
                .is_some_and(|link| !matches!(link.phase, Phase::Ready));
            if stuck {
                let why = format!(
                    "no connection to the master within {} ms",
                    CONNECT_TIMEOUT.as_millis()
                );
                self.disconnect(&why, ctx);
            }
            return;
        }
        if Some(timer) == self.reconnect {
            self.reconnect = None;
            if self.link.is_none() {
                self.connect(ctx);
            }
        }
    }
}
