//! Rebuilding the master's state from journal records, in time linear in their number: the
//! workers by id, the applications still registered in registration order (each keyed by the
//! sequence number of its latest registration, sorted once at the end).

use std::collections::{BTreeMap, HashMap};

use flint_engine::standalone::{AppSpec, RecoveredApp, WorkerSpec};

use super::{without_secret, Recovered};
use crate::standalone::spec_from_wire;
use crate::wire::Message;

/// The state a replay has rebuilt so far.
#[derive(Default)]
pub(super) struct Replay {
    workers: BTreeMap<String, WorkerSpec>,
    /// Applications by id, with the sequence number of their latest registration.
    apps: HashMap<String, (u64, RecoveredApp)>,
    registrations: u64,
    /// The id of a `RegisteredApplication` record, waiting for its `RegisterApplication`, and
    /// the record's offset.
    pending_app: Option<(String, usize)>,
    /// Applications whose registration was lost to damage (named in the log).
    pub lost: Vec<String>,
    /// Records that were not what a journal holds, by offset.
    pub unexpected: Vec<usize>,
}

impl Replay {
    /// Applies the record at `offset`.
    pub(super) fn apply(&mut self, offset: usize, message: Message<'_>) {
        if !matches!(message, Message::RegisterApplication { .. }) {
            if let Some((id, _)) = self.pending_app.take() {
                // Its description was in bytes that did not survive.
                self.lost.push(id);
            }
        }
        match message {
            Message::RegisterWorker {
                worker_id,
                host,
                port,
                cores,
                memory_mb,
            } => {
                let spec = WorkerSpec {
                    id: worker_id.to_owned(),
                    host: host.to_owned(),
                    port,
                    cores,
                    memory_mb,
                };
                self.workers.insert(worker_id.to_owned(), spec);
            }
            Message::WorkerRemoved { worker_id, .. } => {
                self.workers.remove(worker_id);
            }
            Message::RegisteredApplication { app_id } => {
                self.pending_app = Some((app_id.to_owned(), offset));
            }
            Message::RegisterApplication { app } => match self.pending_app.take() {
                Some((id, _)) => {
                    let spec = without_secret(&spec_from_wire(&app)).into_owned();
                    self.add_app(id, spec);
                }
                None => self.lost.push(format!("(unnamed: {})", app.name)),
            },
            Message::RequestExecutors { app_id, total } => {
                if let Some((_, app)) = self.apps.get_mut(app_id) {
                    app.executor_limit = Some(total);
                }
            }
            Message::ExecutorAdded {
                app_id,
                executor_id,
                ..
            } => {
                let n = executor_id.parse::<u64>();
                if let (Some((_, app)), Ok(n)) = (self.apps.get_mut(app_id), n) {
                    app.next_executor = app.next_executor.max(n.saturating_add(1));
                }
            }
            Message::ApplicationRemoved { app_id, .. } => {
                self.apps.remove(app_id);
            }
            _ => self.unexpected.push(offset),
        }
    }

    /// Registers (or registers again, last in order) application `id`.
    fn add_app(&mut self, id: String, spec: AppSpec) {
        self.registrations += 1;
        let app = RecoveredApp {
            id: id.clone(),
            spec,
            executor_limit: None,
            next_executor: 0,
        };
        self.apps.insert(id, (self.registrations, app));
    }

    /// The workers, and the applications still registered in registration order.
    pub(super) fn recovered(&mut self) -> Recovered {
        if let Some((id, _)) = self.pending_app.take() {
            self.lost.push(id);
        }
        let mut apps: Vec<(u64, RecoveredApp)> = self.apps.drain().map(|(_, app)| app).collect();
        apps.sort_unstable_by_key(|(registration, _)| *registration);
        Recovered {
            workers: std::mem::take(&mut self.workers).into_values().collect(),
            apps: apps.into_iter().map(|(_, app)| app).collect(),
        }
    }
}
