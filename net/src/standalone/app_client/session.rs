//! The application client's side of the master protocol, sans IO: what it sends when the link
//! opens (a registration, or its application's id again after a master restart), what the
//! master's messages change in its [`AppInfo`], and the requests it makes. The endpoint
//! ([`super`]) does the IO: the link, the caller's messages, the shared info.

use bytes::BytesMut;
use flint_engine::standalone::AppSpec;

use super::{AppInfo, ExecutorExit, EXITS_KEPT};
use crate::standalone::with_description;
use crate::transport::{encode, unexpected};
use crate::wire::{List, Message, ProcessState, FRAME_SIZE_MAX_DEFAULT};

/// The client's protocol state.
#[derive(Debug)]
pub(super) struct AppSession {
    spec: AppSpec,
    /// Executors to ask for (none: as many as its cores allow).
    executors: Option<u32>,
    app_id: Option<String>,
    unregistering: bool,
}

impl AppSession {
    pub fn new(spec: AppSpec, executors: Option<u32>) -> AppSession {
        AppSession {
            spec,
            executors,
            app_id: None,
            unregistering: false,
        }
    }

    /// The handshake is done: register, or name the application again (the master reattaches
    /// it), and unregister again if that was asked.
    pub fn handle_open(&self, out: &mut BytesMut) {
        match &self.app_id {
            Some(app_id) => {
                let total = self.executors.unwrap_or(u32::MAX);
                send(out, &Message::RequestExecutors { app_id, total });
                tracing::info!("reconnected to the master");
                if self.unregistering {
                    self.send_unregister(out);
                }
            }
            None => with_description(&self.spec, |app| {
                send(out, &Message::RegisterApplication { app });
            }),
        }
    }

    /// Whether a failed handshake means the application is refused for good: a refusal that
    /// will not fix itself (`refused`: not a full table) before it ever registered.
    pub fn handshake_failure_is_final(&self, refused: bool) -> bool {
        refused && self.app_id.is_none()
    }

    /// A message from the master: what it changes in `info`, what to answer in `out`; `Err`
    /// ends the connection.
    pub fn handle_message(
        &mut self,
        message: Message<'_>,
        info: &mut AppInfo,
        out: &mut BytesMut,
    ) -> Result<(), String> {
        match message {
            Message::RegisteredApplication { app_id } => {
                self.app_id = Some(app_id.to_owned());
                if let Some(total) = self.executors {
                    send(out, &Message::RequestExecutors { app_id, total });
                }
                if self.unregistering {
                    self.send_unregister(out);
                }
                info.app_id = Some(app_id.to_owned());
            }
            Message::ExecutorAdded {
                executor_id,
                worker_id,
                ..
            } => {
                info.executors_added += 1;
                let entry = (worker_id.to_owned(), ProcessState::Launching);
                info.executors.insert(executor_id.to_owned(), entry);
            }
            Message::ExecutorStateChanged {
                executor_id,
                state,
                message,
                exit_code,
                ..
            } => self.executor_changed(executor_id, (state, exit_code), message, info),
            Message::WorkerRemoved {
                worker_id, reason, ..
            } => {
                tracing::warn!("the master lost worker {worker_id}: {reason}");
                info.workers_removed += 1;
            }
            Message::ApplicationRemoved { reason, .. } => {
                if !self.unregistering {
                    tracing::warn!("the master removed the application: {reason}");
                }
                info.removed = Some(reason.to_owned());
            }
            Message::StatusResponse { applications, .. } => {
                info.syncs += 1;
                let id = self.app_id.as_deref();
                if let Some(mine) = applications.iter().find(|a| Some(a.app_id) == id) {
                    info.waiting = mine.waiting.to_owned();
                }
            }
            Message::Shutdown {} => return Err("the master shut down".into()),
            // The master's table for applications is full: say so and try again later.
            Message::HandshakeRefused { reason } => {
                return Err(format!("the master refused the connection: {reason}"))
            }
            other => return Err(unexpected(&other, "the master")),
        }
        Ok(())
    }

    /// An executor's new state (with its exit code once it has exited).
    fn executor_changed(
        &self,
        executor_id: &str,
        (state, exit_code): (ProcessState, Option<i32>),
        message: &str,
        info: &mut AppInfo,
    ) {
        let is_final = !matches!(state, ProcessState::Launching | ProcessState::Running);
        if is_final && !self.unregistering {
            tracing::warn!("executor {executor_id} {state}: {message}");
        }
        if is_final {
            if info.executors.remove(executor_id).is_some() {
                info.executors_ended += 1;
                if info.exits.len() == EXITS_KEPT {
                    info.exits.pop_front();
                }
                info.exits.push_back(ExecutorExit {
                    id: executor_id.to_owned(),
                    state,
                    exit_code,
                });
            }
        } else if let Some(entry) = info.executors.get_mut(executor_id) {
            entry.1 = state;
        }
    }

    /// Asks for `total` executors in all (now if `out` is there, else on the next opening).
    pub fn request(&mut self, total: u32, out: Option<&mut BytesMut>) {
        self.executors = Some(total);
        if let (Some(app_id), Some(out)) = (&self.app_id, out) {
            send(out, &Message::RequestExecutors { app_id, total });
        }
    }

    /// Asks the master to kill executors (dropped while not connected).
    pub fn kill(&self, ids: &[String], out: Option<&mut BytesMut>) {
        if let (Some(app_id), Some(out)) = (&self.app_id, out) {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let kill = Message::KillExecutors {
                app_id,
                executor_ids: List::from_items(&ids),
            };
            send(out, &kill);
        }
    }

    /// Asks for the status (answered in order, so the master handled what came before).
    pub fn sync(&self, out: Option<&mut BytesMut>) {
        if let Some(out) = out {
            send(out, &Message::StatusRequest {});
        }
    }

    /// Unregisters (now if connected, else once connected again).
    pub fn unregister(&mut self, out: Option<&mut BytesMut>) {
        self.unregistering = true;
        if let Some(out) = out {
            self.send_unregister(out);
        }
    }

    fn send_unregister(&self, out: &mut BytesMut) {
        if let Some(app_id) = &self.app_id {
            send(out, &Message::UnregisterApplication { app_id });
        }
    }
}

fn send(out: &mut BytesMut, message: &Message<'_>) {
    encode(message, out, FRAME_SIZE_MAX_DEFAULT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{AppState, AppStatus, Frame, Kind};

    fn frames(bytes: &[u8]) -> Vec<Frame> {
        crate::transport::frames_of(bytes)
    }

    fn kinds(bytes: &[u8]) -> Vec<u16> {
        frames(bytes).iter().map(Frame::kind).collect()
    }

    fn registered(session: &mut AppSession, info: &mut AppInfo) -> BytesMut {
        let mut out = BytesMut::new();
        let answer = Message::RegisteredApplication { app_id: "app-1" };
        session
            .handle_message(answer, info, &mut out)
            .expect("registered");
        out
    }

    #[test]
    fn it_registers_then_names_its_application_again_after_a_reconnection() {
        let mut session = AppSession::new(AppSpec::default(), Some(3));
        let mut info = AppInfo::default();
        let mut out = BytesMut::new();
        session.handle_open(&mut out);
        assert_eq!(kinds(&out), [Kind::RegisterApplication as u16]);
        let out = registered(&mut session, &mut info);
        assert_eq!(info.app_id.as_deref(), Some("app-1"));
        assert!(matches!(
            frames(&out)[0].message(),
            Ok(Message::RequestExecutors {
                app_id: "app-1",
                total: 3
            })
        ));
        let mut again = BytesMut::new();
        session.handle_open(&mut again);
        assert!(matches!(
            frames(&again)[0].message(),
            Ok(Message::RequestExecutors {
                app_id: "app-1",
                total: 3
            })
        ));
        assert!(!session.handshake_failure_is_final(true), "registered once");
    }

    #[test]
    fn an_unregister_asked_while_away_goes_out_on_the_next_opening() {
        let mut session = AppSession::new(AppSpec::default(), None);
        let mut info = AppInfo::default();
        let _ = registered(&mut session, &mut info);
        session.unregister(None);
        let mut out = BytesMut::new();
        session.handle_open(&mut out);
        assert_eq!(
            kinds(&out),
            [
                Kind::RequestExecutors as u16,
                Kind::UnregisterApplication as u16
            ]
        );
    }

    #[test]
    fn executors_are_followed_until_they_end() {
        let mut session = AppSession::new(AppSpec::default(), None);
        let mut info = AppInfo::default();
        let mut out = BytesMut::new();
        let added = Message::ExecutorAdded {
            app_id: "app-1",
            executor_id: "1",
            worker_id: "w1",
            host_port: "h:1",
            cores: 1,
            memory_mb: 1,
        };
        session
            .handle_message(added, &mut info, &mut out)
            .expect("ok");
        let running = Message::ExecutorStateChanged {
            app_id: "app-1",
            executor_id: "1",
            state: ProcessState::Running,
            message: "",
            exit_code: None,
        };
        session
            .handle_message(running, &mut info, &mut out)
            .expect("ok");
        assert_eq!(
            info.executors.get("1"),
            Some(&("w1".to_owned(), ProcessState::Running))
        );
        let exited = Message::ExecutorStateChanged {
            app_id: "app-1",
            executor_id: "1",
            state: ProcessState::Exited,
            message: "",
            exit_code: Some(0),
        };
        session
            .handle_message(exited, &mut info, &mut out)
            .expect("ok");
        assert!(info.executors.is_empty());
        assert_eq!((info.executors_added, info.executors_ended), (1, 1));
        assert!(out.is_empty(), "nothing to answer");
    }

    #[test]
    fn a_status_answer_counts_a_sync_and_records_why_the_application_waits() {
        let mut session = AppSession::new(AppSpec::default(), None);
        let mut info = AppInfo::default();
        let _ = registered(&mut session, &mut info);
        let rows = [AppStatus {
            app_id: "app-1",
            name: "job",
            state: AppState::Waiting,
            cores_granted: 0,
            executors_requested: 1,
            waiting: "no alive worker",
        }];
        let status = Message::StatusResponse {
            workers: List::empty(),
            applications: List::from_items(&rows),
            executors: List::empty(),
        };
        let mut out = BytesMut::new();
        session
            .handle_message(status, &mut info, &mut out)
            .expect("ok");
        assert_eq!(info.syncs, 1);
        assert_eq!(info.waiting, "no alive worker");
    }

    #[test]
    fn a_refusal_before_registering_is_final_and_odd_messages_end_the_connection() {
        let mut session = AppSession::new(AppSpec::default(), None);
        assert!(session.handshake_failure_is_final(true));
        assert!(
            !session.handshake_failure_is_final(false),
            "a full table is retried"
        );
        let mut info = AppInfo::default();
        let mut out = BytesMut::new();
        let odd = Message::HeartbeatAck {};
        assert!(session.handle_message(odd, &mut info, &mut out).is_err());
    }
}
