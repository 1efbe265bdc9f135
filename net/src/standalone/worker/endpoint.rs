//! The worker's endpoint on its runtime loop: the link to the master (registration after every
//! handshake, heartbeats, the silence rule), the master's frames handed to the [`Session`] and
//! what they ask carried out by the [`Supervisor`], the exits its watcher threads report, and
//! the status server's readiness and expiry.

use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::runtime::{Ctx, Endpoint, TimerId};
use mio::event::Event;
use mio::Token;

use super::process::{Launch, Supervisor};
use super::session::{FromMaster, Identity, Session};
use super::status::StatusPeers;
use super::{WorkerConfig, WorkerError, WorkerMsg};
use crate::transport::client::{Link, Silence, Step};
use crate::transport::server::Server;
use crate::transport::Exit;
use crate::wire::Frame;

/// Heartbeat intervals without a word from the master after which the worker drops the
/// connection and reconnects (15 s at the default 1 s interval): a master behind a cut link
/// sends no reset, so silence is the only sign.
const MASTER_SILENCE: Silence = Silence { intervals: 15 };

/// The worker on its loop.
pub(super) struct WorkerEndpoint {
    pub config: WorkerConfig,
    /// The link to the master.
    pub link: Link,
    /// The protocol with the master, sans IO.
    pub session: Session,
    /// The executors' processes.
    pub supervisor: Supervisor,
    pub heartbeat: Option<TimerId>,
    pub exit: Arc<Exit<Result<(), WorkerError>>>,
    /// `flint status` connections, with `--listen`.
    pub status: Option<Server<()>>,
    /// Expires status connections.
    pub status_tick: Option<TimerId>,
    /// Stopping ([`WorkerMsg::Stop`]): the timer after which the worker leaves whatever still
    /// runs (`None` inside if it could not be set).
    pub stopping: Option<Option<TimerId>>,
}

/// How long past `kill_timeout` a stopping worker waits for its executors' ends to be heard
/// (their SIGKILL was sent at `kill_timeout`).
const STOP_MARGIN: Duration = Duration::from_secs(2);

impl WorkerEndpoint {
    /// A readiness event on the master link, if it is the link's.
    fn on_link_event(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) -> bool {
        let Some(step) = self.link.read(token, event) else {
            return false;
        };
        let outcome = self.on_step(step, ctx);
        if self.exit.is_set() {
            ctx.stop();
            return true;
        }
        self.link.settle(outcome, ctx);
        true
    }

    /// The registration after a handshake, the master's frames, then the reports.
    fn on_step(&mut self, step: Step, ctx: &mut Ctx<'_, Self>) -> Result<(), String> {
        if step.opened {
            self.register();
        }
        for frame in &step.frames {
            self.on_frame(frame, ctx)?;
        }
        if let Some(ended) = &step.ended {
            if self.session.handshake_failure_stops(ended.refused) {
                // A wrong secret or protocol version does not fix itself: stop.
                self.stop(WorkerError::Refused(ended.why.clone()));
            }
        }
        self.send_reports();
        step.outcome()
    }

    /// A signal asked the worker to stop (Spark's worker kills its executors when it shuts
    /// down): every executor gets SIGTERM, then SIGKILL after `kill_timeout`, and the worker
    /// leaves once none runs, their ends reported to the master if it is there; or at
    /// `kill_timeout` + [`STOP_MARGIN`], whatever still runs then killed.
    fn begin_stop(&mut self, why: &str, ctx: &mut Ctx<'_, Self>) {
        if self.stopping.is_some() {
            return;
        }
        let keys: Vec<_> = self.supervisor.running().keys().cloned().collect();
        tracing::info!(
            "worker {}: {why}: stopping {} executors, then leaving",
            self.config.id,
            keys.len()
        );
        for key in keys {
            self.supervisor.kill(key, &self.config, ctx);
        }
        let timer = ctx.timer_once(self.config.kill_timeout + STOP_MARGIN).ok();
        self.stopping = Some(timer);
        self.leave_if_stopped(ctx);
    }

    /// Leaves, once stopping and no executor runs.
    fn leave_if_stopped(&mut self, ctx: &mut Ctx<'_, Self>) {
        if self.stopping.is_some() && self.supervisor.running().is_empty() {
            self.leave(ctx);
        }
    }

    /// Sends what is left to say and ends the loop (`on_stop` kills any executor left).
    fn leave(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.flush(ctx);
        self.exit.set(Ok(()));
        ctx.stop();
    }

    fn stop(&mut self, why: WorkerError) {
        tracing::warn!("worker {}: {why}", self.config.id);
        self.supervisor.kill_all();
        self.exit.set(Err(why));
    }

    fn on_frame(&mut self, frame: &Frame, ctx: &mut Ctx<'_, Self>) -> Result<(), String> {
        let message = frame
            .message()
            .map_err(|e| format!("malformed frame from the master: {e}"))?;
        match self.session.handle_message(message) {
            FromMaster::Registered(interval) => self.registered(interval, ctx),
            FromMaster::Launch {
                app_id,
                executor_id,
                ..
            } if self.stopping.is_some() => {
                // The master hears the worker is gone once it leaves, and places it again.
                tracing::warn!(
                    "worker {}: executor {app_id}/{executor_id} not started: stopping",
                    self.config.id
                );
            }
            FromMaster::Launch {
                app_id,
                executor_id,
                app,
                cores,
                memory_mb,
            } => {
                let launch = Launch {
                    app_id,
                    executor_id,
                    app: &app,
                    cores,
                    memory_mb,
                };
                let session = &mut self.session;
                self.supervisor.launch(&self.config, &launch, session, ctx);
            }
            FromMaster::Kill {
                app_id,
                executor_id,
            } => {
                let key = (app_id.to_owned(), executor_id.to_owned());
                self.supervisor.kill(key, &self.config, ctx);
            }
            FromMaster::AppFinished(app_id) => {
                self.supervisor.app_finished(app_id, &self.config, ctx);
            }
            FromMaster::Nothing => {}
            FromMaster::End { why, stop } => {
                if stop {
                    self.stop(WorkerError::Refused(why.clone()));
                }
                return Err(why);
            }
        }
        Ok(())
    }

    fn registered(&mut self, interval: Duration, ctx: &mut Ctx<'_, Self>) {
        if let Some(timer) = self.heartbeat.take() {
            ctx.cancel_timer(timer);
        }
        self.heartbeat = ctx.timer_periodic(interval).ok();
        self.link.established();
        tracing::info!(
            "worker {}: registered with the master at {}",
            self.config.id,
            self.config.master
        );
    }

    /// Appends the registration, the executors still running and the reports kept while away.
    fn register(&mut self) {
        let host = if self.config.host.is_empty() {
            self.link
                .local_addr()
                .map_or_else(|| "127.0.0.1".to_owned(), |a| a.ip().to_string())
        } else {
            self.config.host.clone()
        };
        let me = Identity {
            id: &self.config.id,
            host: &host,
            port: self.config.port,
            cores: self.config.cores,
            memory_mb: self.config.memory_mb,
        };
        let Some(out) = self.link.outbound() else {
            return;
        };
        let running = self.supervisor.running().keys();
        let running = running.map(|(a, e)| (a.as_str(), e.as_str()));
        self.session.registration(&me, running, out);
    }

    /// Appends the queued reports while registered.
    fn send_reports(&mut self) {
        if self.link.is_established() {
            if let Some(out) = self.link.outbound() {
                self.session.drain_reports(out);
            }
        }
    }

    /// A heartbeat, unless the master has been silent too long (then the link is dropped).
    fn on_heartbeat(&mut self, ctx: &mut Ctx<'_, Self>) {
        if !self.link.is_established() {
            if let Some(timer) = self.heartbeat.take() {
                ctx.cancel_timer(timer);
            }
            return;
        }
        let interval = self.session.heartbeat_interval();
        if MASTER_SILENCE.exceeded(interval, self.link.silent_for(Instant::now())) {
            let limit = MASTER_SILENCE.limit(interval);
            let why = format!("no answer from the master for {} ms", limit.as_millis());
            return self.link.drop_connection(&why, ctx);
        }
        if let Some(out) = self.link.outbound() {
            self.session.heartbeat(&self.config.id, out);
        }
        self.flush(ctx);
    }

    /// A readiness event for the status server.
    fn on_status_event(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        self.with_status(|server, peers| {
            server.on_readiness(token, event, peers, ctx);
            server.flush(peers);
        });
    }

    /// Calls `f` with the status server (with `--listen`) and what it answers from.
    fn with_status(&mut self, f: impl FnOnce(&mut Server<()>, &mut StatusPeers<'_>)) {
        let Some(server) = self.status.as_mut() else {
            return;
        };
        let mut peers = StatusPeers {
            config: &self.config,
            executors: self.supervisor.running(),
            registered: self.link.is_established(),
        };
        f(server, &mut peers);
    }

    fn flush(&mut self, ctx: &mut Ctx<'_, Self>) {
        self.send_reports();
        self.link.flush(ctx);
    }
}

impl Endpoint for WorkerEndpoint {
    type Msg = WorkerMsg;

    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        if let Some(server) = self.status.as_mut() {
            if let Err(error) = server.start(ctx) {
                tracing::error!("{error}");
            }
            self.status_tick = ctx.timer_periodic(Duration::from_secs(1)).ok();
        }
        self.link.start(ctx);
    }

    fn on_message(&mut self, msg: WorkerMsg, ctx: &mut Ctx<'_, Self>) {
        match msg {
            WorkerMsg::Stop(why) => self.begin_stop(&why, ctx),
            WorkerMsg::Exited {
                app,
                executor,
                code,
                signal,
            } => {
                let (key, how) = ((app, executor), (code, signal));
                (self.supervisor).on_exited(key, how, &self.config, &mut self.session);
                self.flush(ctx);
                self.leave_if_stopped(ctx);
            }
        }
    }

    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        if !self.on_link_event(token, event, ctx) {
            self.on_status_event(token, event, ctx);
        }
    }

    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        if self.link.on_timer(timer, ctx) {
            return;
        }
        if Some(timer) == self.heartbeat {
            return self.on_heartbeat(ctx);
        }
        if self.stopping == Some(Some(timer)) {
            tracing::warn!(
                "worker {}: {} executors still running; leaving",
                self.config.id,
                self.supervisor.running().len()
            );
            return self.leave(ctx);
        }
        if Some(timer) == self.status_tick {
            return self.with_status(|server, peers| server.expire(Instant::now(), peers));
        }
        self.supervisor.on_timer(timer);
    }

    fn on_stop(&mut self, _ctx: &mut Ctx<'_, Self>) {
        self.supervisor.kill_all();
        self.exit.set(Ok(()));
    }
}
