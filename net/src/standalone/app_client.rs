//! The driver's side of the standalone cluster (Spark's `StandaloneAppClient`): registers an
//! application with the master, asks for executors, follows what the master says about them,
//! and unregisters at the end. It runs beside a [`crate::driver::Driver`], whose listen address
//! is the application's `driver_addr`; the executors the master places connect to that driver.
//!
//! When the master connection ends (a master restart) it reconnects with backoff (a
//! `transport::client::Link`) and names its application again
//! (`RequestExecutors{app_id, total}` as its first message), so the master reattaches it
//! instead of registering a new one. The protocol is sans IO in `session.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use flint_engine::runtime::{Ctx, Endpoint, EndpointRef, Runtime, RuntimeConfig, TimerId};
use flint_engine::standalone::AppSpec;
use mio::event::Event;
use mio::Token;

use crate::handshake::Secret;
use crate::transport::client::{Link, LinkConfig, Step, CONNECT_TIMEOUT};
use crate::wire::{ProcessState, Role, FRAME_SIZE_MAX_DEFAULT};

mod session;

use session::AppSession;

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

/// How many ended executors [`AppInfo::exits`] keeps.
pub const EXITS_KEPT: usize = 256;

/// How an executor ended, as its worker reported it through the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutorExit {
    /// The executor.
    pub id: String,
    /// Its final state (exited, failed, killed, lost).
    pub state: ProcessState,
    /// Its exit code (128 + the signal for one a signal ended), if its process exited.
    pub exit_code: Option<i32>,
}

/// What the client knows about its application.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppInfo {
    /// The id the master gave it.
    pub app_id: Option<String>,
    /// Why the master removed it, once it did.
    pub removed: Option<String>,
    /// Its executors that are not over, with their worker and state.
    pub executors: BTreeMap<String, (String, ProcessState)>,
    /// Executors the master placed so far.
    pub executors_added: u64,
    /// Executors that ended (any final state) so far.
    pub executors_ended: u64,
    /// How the last executors that ended did (at most [`EXITS_KEPT`], oldest first).
    pub exits: VecDeque<ExecutorExit>,
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

/// Why an application client could not start, or a request to the master failed.
#[derive(Debug, thiserror::Error)]
pub enum AppClientError {
    /// The client's event loop could not start.
    #[error("runtime: {0}")]
    Runtime(#[from] flint_engine::runtime::RuntimeError),
    /// The client's endpoint could not be spawned on its loop.
    #[error("app client endpoint: {0}")]
    Spawn(#[from] flint_engine::runtime::SpawnError),
    /// The master refused (or removed) the application, saying why.
    #[error("the master refused the application: {0}")]
    Refused(String),
    /// No application id from the master within the timeout.
    #[error("no registration with the master within {timeout_ms} ms")]
    NotRegistered {
        /// The timeout that expired.
        timeout_ms: u128,
    },
    /// No answer to a [`AppClient::sync`] within the timeout.
    #[error("no answer from the master within {timeout_ms} ms")]
    NoAnswer {
        /// The timeout that expired.
        timeout_ms: u128,
    },
    /// The client's loop did not take the request (stopped, or its inbox full).
    #[error(transparent)]
    Send(flint_engine::runtime::SendError<()>),
}

impl<M> From<flint_engine::runtime::SendError<M>> for AppClientError {
    fn from(e: flint_engine::runtime::SendError<M>) -> Self {
        use flint_engine::runtime::SendError;
        AppClientError::Send(match e {
            SendError::Full(_) => SendError::Full(()),
            SendError::Stopped(_) => SendError::Stopped(()),
            SendError::Shutdown(_) => SendError::Shutdown(()),
        })
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
    pub fn start(config: AppClientConfig) -> Result<AppClient, AppClientError> {
        let runtime = Runtime::new(RuntimeConfig {
            threads: 1,
            thread_name: "flint-app-client".into(),
            ..RuntimeConfig::default()
        })?;
        let shared = Arc::new(Shared::default());
        let endpoint = AppEndpoint::new(config, shared.clone());
        let endpoint = runtime.handle().spawn("app-client", endpoint)?;
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
    pub fn wait_registered(&self, timeout: Duration) -> Result<String, AppClientError> {
        match self.shared.wait_for(timeout, |info| {
            if let Some(reason) = &info.removed {
                return Some(Err(AppClientError::Refused(reason.clone())));
            }
            info.app_id.clone().map(Ok)
        }) {
            Some(result) => result,
            None => Err(AppClientError::NotRegistered {
                timeout_ms: timeout.as_millis(),
            }),
        }
    }

    /// Asks for `total` executors in all.
    pub fn request_executors(&self, total: u32) -> Result<(), AppClientError> {
        Ok(self.endpoint.send(AppMsg::Request(total))?)
    }

    /// Waits (up to `timeout`) until the master has handled everything sent before this call:
    /// it asks for the cluster status on the same connection and waits for the answer.
    pub fn sync(&self, timeout: Duration) -> Result<(), AppClientError> {
        let before = self.info().syncs;
        self.endpoint.send(AppMsg::Sync)?;
        self.shared
            .wait_for(timeout, |info| (info.syncs > before).then_some(()))
            .ok_or(AppClientError::NoAnswer {
                timeout_ms: timeout.as_millis(),
            })
    }

    /// Asks the master to kill these executors.
    pub fn kill_executors(&self, ids: Vec<String>) -> Result<(), AppClientError> {
        Ok(self.endpoint.send(AppMsg::Kill(ids))?)
    }

    /// Unregisters the application (waiting up to `timeout` for the master to confirm) and
    /// stops the client. A client that never reached the master has nothing to unregister and
    /// does not wait.
    pub fn stop(mut self, timeout: Duration) {
        let info = self.info();
        let timeout = if info.app_id.is_none() && !info.connected {
            Duration::ZERO
        } else {
            timeout
        };
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

struct AppEndpoint {
    link: Link,
    session: AppSession,
    shared: Arc<Shared>,
}

impl AppEndpoint {
    fn new(config: AppClientConfig, shared: Arc<Shared>) -> AppEndpoint {
        let link = Link::new(LinkConfig {
            addr: config.master,
            role: Role::Driver,
            peer_roles: &[Role::Master],
            secret: config.secret,
            label: "application client".into(),
            peer_name: "the master",
            connect_timeout: CONNECT_TIMEOUT,
            reconnect_max: config.reconnect_max,
            frame_size_max: FRAME_SIZE_MAX_DEFAULT,
            outbound_max: 64 << 20,
        });
        AppEndpoint {
            link,
            session: AppSession::new(config.spec, config.executors),
            shared,
        }
    }

    /// The handshake done (register, or name the application again), then the master's frames.
    fn on_step(&mut self, step: Step) -> Result<(), String> {
        if step.opened {
            if let Some(out) = self.link.outbound() {
                self.session.handle_open(out);
            }
            // The master accepts an application once the handshake is done.
            self.link.established();
            self.shared.update(|info| info.connected = true);
        }
        for frame in &step.frames {
            let message = frame
                .message()
                .map_err(|e| format!("malformed frame from the master: {e}"))?;
            let mut out = bytes::BytesMut::new();
            let session = &mut self.session;
            let mut result = Ok(());
            self.shared
                .update(|info| result = session.handle_message(message, info, &mut out));
            if let Some(link_out) = self.link.outbound() {
                link_out.extend_from_slice(&out);
            }
            result?;
        }
        if let Some(ended) = &step.ended {
            if self.session.handshake_failure_is_final(ended.refused) {
                // A wrong secret or protocol version does not fix itself: give up.
                let reason = ended.why.clone();
                self.shared.update(|info| info.removed = Some(reason));
            }
        }
        step.outcome()
    }

    fn is_over(&self) -> bool {
        self.shared
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .removed
            .is_some()
    }

    /// After any event: no more attempts once the application is over; `connected` follows
    /// the link.
    fn after(&mut self) {
        if self.is_over() {
            self.link.stop_reconnecting();
        }
        let open = self.link.is_open();
        let connected = self
            .shared
            .info
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .connected;
        if connected != open {
            self.shared.update(|info| info.connected = open);
        }
    }
}

impl Endpoint for AppEndpoint {
    type Msg = AppMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.link.start(ctx);
    }

    fn on_message(&mut self, msg: AppMsg, ctx: &mut Ctx<'_, Self>) {
        let out = self.link.outbound();
        match msg {
            AppMsg::Request(total) => self.session.request(total, out),
            AppMsg::Kill(ids) => self.session.kill(&ids, out),
            AppMsg::Sync => self.session.sync(out),
            AppMsg::Unregister => self.session.unregister(out),
        }
        self.link.flush(ctx);
        self.after();
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if let Some(step) = self.link.read(token, event) {
            let outcome = self.on_step(step);
            if self.is_over() {
                self.link.stop_reconnecting();
            }
            self.link.settle(outcome, ctx);
            self.after();
        }
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if self.link.on_timer(timer, ctx) {
            self.after();
        }
    }
}
