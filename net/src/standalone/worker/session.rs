//! The worker's side of the master protocol, sans IO: what it tells the master on each
//! (re)registration (itself, the executors still running, how the others ended), the state
//! reports it keeps while the master is away (bounded, the oldest dropped), and what each of
//! the master's messages asks of it. The endpoint ([`super`]) does the IO: the link, the
//! children, the timers.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::BytesMut;

use crate::standalone::REATTACH_MESSAGE;
use crate::transport::{encode, unexpected};
use crate::wire::{AppDescription, Message, ProcessState, FRAME_SIZE_MAX_DEFAULT};

/// An executor's state change, to tell the master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Report {
    pub app: String,
    pub executor: String,
    pub state: ProcessState,
    pub message: String,
    pub exit_code: Option<i32>,
}

/// What the worker says about itself when it registers.
pub(super) struct Identity<'a> {
    pub id: &'a str,
    pub host: &'a str,
    pub port: u16,
    pub cores: u32,
    pub memory_mb: u64,
}

/// What a message from the master asks of the worker.
#[derive(Debug)]
pub(super) enum FromMaster<'a> {
    /// Registered: heartbeat at this interval.
    Registered(Duration),
    /// Start an executor.
    Launch {
        app_id: &'a str,
        executor_id: &'a str,
        app: AppDescription<'a>,
        cores: u32,
        memory_mb: u64,
    },
    /// Kill an executor.
    Kill {
        app_id: &'a str,
        executor_id: &'a str,
    },
    /// An application is over: kill its executors, remove its directory.
    AppFinished(&'a str),
    /// Nothing to do (a heartbeat's ack).
    Nothing,
    /// End the connection for this reason; `stop`: the worker must stop too (the master
    /// refused its first registration).
    End { why: String, stop: bool },
}

/// The worker's protocol state.
#[derive(Debug)]
pub(super) struct Session {
    reports: VecDeque<Report>,
    reports_max: usize,
    registered_once: bool,
    heartbeat_interval: Duration,
}

impl Session {
    pub fn new(reports_max: usize) -> Session {
        Session {
            reports: VecDeque::new(),
            reports_max: reports_max.max(1),
            registered_once: false,
            heartbeat_interval: Duration::from_secs(1),
        }
    }

    /// The heartbeat interval the master asked for.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// The registration, the executors still running (the master adopts them) and how the
    /// others ended while the master was away.
    pub fn registration<'a>(
        &mut self,
        me: &Identity<'_>,
        running: impl Iterator<Item = (&'a str, &'a str)>,
        out: &mut BytesMut,
    ) {
        let register = Message::RegisterWorker {
            worker_id: me.id,
            host: me.host,
            port: me.port,
            cores: me.cores,
            memory_mb: me.memory_mb,
        };
        encode(&register, out, FRAME_SIZE_MAX_DEFAULT);
        for (app_id, executor_id) in running {
            let still = Message::ExecutorStateChanged {
                app_id,
                executor_id,
                state: ProcessState::Running,
                message: REATTACH_MESSAGE,
                exit_code: None,
            };
            encode(&still, out, FRAME_SIZE_MAX_DEFAULT);
        }
        // Running executors were just announced; only how the others ended is news.
        self.reports
            .retain(|r| !matches!(r.state, ProcessState::Launching | ProcessState::Running));
        self.drain_reports(out);
    }

    /// Queues a report; it goes out with the next [`Session::drain_reports`].
    pub fn report(&mut self, report: Report) {
        if self.reports.len() >= self.reports_max {
            self.reports.pop_front();
        }
        self.reports.push_back(report);
    }

    /// The queued reports as frames.
    pub fn drain_reports(&mut self, out: &mut BytesMut) {
        for report in self.reports.drain(..) {
            let changed = Message::ExecutorStateChanged {
                app_id: &report.app,
                executor_id: &report.executor,
                state: report.state,
                message: &report.message,
                exit_code: report.exit_code,
            };
            encode(&changed, out, FRAME_SIZE_MAX_DEFAULT);
        }
    }

    /// A heartbeat.
    pub fn heartbeat(&self, id: &str, out: &mut BytesMut) {
        encode(
            &Message::WorkerHeartbeat { worker_id: id },
            out,
            FRAME_SIZE_MAX_DEFAULT,
        );
    }

    /// Whether a failed handshake must stop the worker: a refusal that will not fix itself
    /// (`refused`: not a full table) before it ever registered.
    pub fn handshake_failure_stops(&self, refused: bool) -> bool {
        refused && !self.registered_once
    }

    /// What a message from the master asks.
    pub fn handle_message<'a>(&mut self, message: Message<'a>) -> FromMaster<'a> {
        match message {
            Message::RegisteredWorker {
                heartbeat_interval_ms,
            } => {
                let ms = u64::from(heartbeat_interval_ms.clamp(10, 60_000));
                self.heartbeat_interval = Duration::from_millis(ms);
                self.registered_once = true;
                FromMaster::Registered(self.heartbeat_interval)
            }
            Message::RegisterWorkerFailed { reason } => FromMaster::End {
                why: format!("registration refused: {reason}"),
                stop: !self.registered_once,
            },
            Message::LaunchExecutor {
                app_id,
                executor_id,
                app,
                cores,
                memory_mb,
            } => FromMaster::Launch {
                app_id,
                executor_id,
                app,
                cores,
                memory_mb,
            },
            Message::KillExecutor {
                app_id,
                executor_id,
            } => FromMaster::Kill {
                app_id,
                executor_id,
            },
            Message::ApplicationFinished { app_id } => FromMaster::AppFinished(app_id),
            Message::HeartbeatAck {} => FromMaster::Nothing,
            Message::Shutdown {} => end("the master shut down".into()),
            Message::HandshakeRefused { reason } => {
                end(format!("the master refused the connection: {reason}"))
            }
            other => end(unexpected(&other, "the master")),
        }
    }
}

fn end<'a>(why: String) -> FromMaster<'a> {
    FromMaster::End { why, stop: false }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Frame, Kind};

    fn frames(bytes: &[u8]) -> Vec<Frame> {
        crate::transport::frames_of(bytes)
    }

    fn report(executor: &str, state: ProcessState) -> Report {
        Report {
            app: "app-1".into(),
            executor: executor.into(),
            state,
            message: String::new(),
            exit_code: None,
        }
    }

    const ME: Identity<'static> = Identity {
        id: "w1",
        host: "h",
        port: 1,
        cores: 2,
        memory_mb: 3,
    };

    #[test]
    fn a_registration_announces_running_executors_and_only_how_the_others_ended() {
        let mut session = Session::new(16);
        session.report(report("1", ProcessState::Launching));
        session.report(report("1", ProcessState::Running));
        session.report(report("2", ProcessState::Exited));
        let mut out = BytesMut::new();
        session.registration(&ME, [("app-1", "1")].into_iter(), &mut out);
        let sent = frames(&out);
        let kinds: Vec<u16> = sent.iter().map(Frame::kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::RegisterWorker as u16,
                Kind::ExecutorStateChanged as u16,
                Kind::ExecutorStateChanged as u16
            ]
        );
        assert!(matches!(
            sent[1].message(),
            Ok(Message::ExecutorStateChanged {
                executor_id: "1",
                message: REATTACH_MESSAGE,
                ..
            })
        ));
        assert!(matches!(
            sent[2].message(),
            Ok(Message::ExecutorStateChanged {
                executor_id: "2",
                state: ProcessState::Exited,
                ..
            })
        ));
        let mut again = BytesMut::new();
        session.drain_reports(&mut again);
        assert!(again.is_empty(), "reports went out once");
    }

    #[test]
    fn reports_kept_while_away_are_bounded_and_drop_the_oldest() {
        let mut session = Session::new(2);
        for executor in ["1", "2", "3"] {
            session.report(report(executor, ProcessState::Failed));
        }
        let mut out = BytesMut::new();
        session.drain_reports(&mut out);
        let ids: Vec<String> = frames(&out)
            .iter()
            .map(|f| match f.message() {
                Ok(Message::ExecutorStateChanged { executor_id, .. }) => executor_id.to_owned(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, ["2", "3"]);
    }

    #[test]
    fn a_refusal_stops_the_worker_only_before_its_first_registration() {
        let mut session = Session::new(4);
        let refused = Message::RegisterWorkerFailed { reason: "no" };
        assert!(matches!(
            session.handle_message(refused),
            FromMaster::End { stop: true, .. }
        ));
        assert!(session.handshake_failure_stops(true));
        assert!(
            !session.handshake_failure_stops(false),
            "a full table is retried"
        );
        let registered = Message::RegisteredWorker {
            heartbeat_interval_ms: 1,
        };
        assert!(matches!(
            session.handle_message(registered),
            FromMaster::Registered(d) if d == Duration::from_millis(10)
        ));
        assert!(matches!(
            session.handle_message(refused),
            FromMaster::End { stop: false, .. }
        ));
        assert!(!session.handshake_failure_stops(true));
    }

    #[test]
    fn unexpected_messages_end_the_connection() {
        let mut session = Session::new(4);
        let odd = Message::StatusRequest {};
        assert!(matches!(
            session.handle_message(odd),
            FromMaster::End { stop: false, ref why } if why.contains("unexpected")
        ));
        assert!(matches!(
            session.handle_message(Message::HeartbeatAck {}),
            FromMaster::Nothing
        ));
    }
}
