//! The master's journal: an append-only file in `--state-dir` of the workers and applications
//! it knows, replayed when it starts so a restarted master recovers them (Spark's
//! `FileSystemPersistenceEngine`, as one log instead of a file per object).
//!
//! Records are wire frames of existing messages, so the frame decoder's bounds checks guard the
//! replay:
//!
//! | record | meaning |
//! | --- | --- |
//! | `RegisterWorker` | a worker registered (the latest record per id wins) |
//! | `WorkerRemoved` | the worker is gone |
//! | `RegisteredApplication{app_id}` then `RegisterApplication{app}` | an application registered |
//! | `RequestExecutors` | the application's executor request |
//! | `ExecutorAdded` | an executor was placed (keeps executor numbers unique across restarts) |
//! | `ApplicationRemoved` | the application is over |
//!
//! Records appended while the master handles one event are written and synced together
//! ([`Journal::flush`]) before any frame from that event is sent.
//!
//! A torn or malformed tail (a crash mid-write) ends the replay; what came before it counts. On
//! open the journal is compacted: the live state is written to a new file that replaces the old
//! one, so the file stays proportional to what is live plus what happened since the last start.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use flint_engine::standalone::{AppSpec, RecoveredApp, WorkerSpec};

use crate::handshake::SECRET_ENV;
use crate::standalone::{spec_from_wire, with_description};
use crate::wire::{FrameDecoder, Message, FRAME_SIZE_MAX_DEFAULT};

/// What a replay found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Workers, by id.
    pub workers: Vec<WorkerSpec>,
    /// Applications still registered.
    pub apps: Vec<RecoveredApp>,
}

/// One journal record, as the master's protocol core decides it ([`Journal::record`] writes
/// it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// A worker registered.
    WorkerRegistered(WorkerSpec),
    /// A worker is gone.
    WorkerRemoved(String),
    /// An application registered under this id.
    AppRegistered(String, AppSpec),
    /// An application's executor request.
    ExecutorsRequested(String, u32),
    /// An executor was placed: its application and id.
    ExecutorAdded(String, String),
    /// An application is over.
    AppRemoved(String),
}

/// Why the journal could not be opened: each variant names the path and what the operating
/// system said.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The state directory could not be created.
    #[error("cannot create state dir {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The journal could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The journal file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The compacted journal could not be written.
    #[error("cannot compact {}: {source}", path.display())]
    Compact {
        /// The journal file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The journal could not be opened for appending.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The journal file.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
}

/// The open journal.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    pending: BytesMut,
}

const FILE_NAME: &str = "master.journal";

impl Journal {
    /// Opens (creating) the journal in `dir`, replays it, compacts it, and returns it with what
    /// it held.
    pub fn open(dir: &Path) -> Result<(Journal, Recovered), JournalError> {
        std::fs::create_dir_all(dir).map_err(|source| JournalError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(FILE_NAME);
        let recovered = match std::fs::read(&path) {
            Ok(bytes) => replay(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Recovered::default(),
            Err(source) => return Err(JournalError::Read { path, source }),
        };
        let tmp = dir.join(format!("{FILE_NAME}.tmp"));
        let mut out = BytesMut::new();
        for worker in &recovered.workers {
            encode_worker(worker, &mut out);
        }
        for app in &recovered.apps {
            encode_app(&app.id, &app.spec, &mut out);
            if let Some(total) = app.executor_limit {
                encode(
                    &Message::RequestExecutors {
                        app_id: &app.id,
                        total,
                    },
                    &mut out,
                );
            }
            if app.next_executor > 0 {
                let last = (app.next_executor - 1).to_string();
                encode_executor(&app.id, &last, &mut out);
            }
        }
        let write = || -> std::io::Result<()> {
            let mut file = File::create(&tmp)?;
            file.write_all(&out)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            Ok(())
        };
        if let Err(source) = write() {
            return Err(JournalError::Compact { path, source });
        }
        let file = match OpenOptions::new().append(true).open(&path) {
            Ok(file) => file,
            Err(source) => return Err(JournalError::Open { path, source }),
        };
        Ok((
            Journal {
                file,
                path,
                pending: BytesMut::new(),
            },
            recovered,
        ))
    }

    /// Appends a record (written with the next [`Journal::flush`]).
    pub fn record(&mut self, record: &Record) {
        match record {
            Record::WorkerRegistered(spec) => self.worker_registered(spec),
            Record::WorkerRemoved(worker) => self.worker_removed(worker),
            Record::AppRegistered(app_id, spec) => self.app_registered(app_id, spec),
            Record::ExecutorsRequested(app_id, total) => self.executors_requested(app_id, *total),
            Record::ExecutorAdded(app_id, executor) => self.executor_added(app_id, executor),
            Record::AppRemoved(app_id) => self.app_removed(app_id),
        }
    }

    /// Records a worker's registration.
    pub fn worker_registered(&mut self, worker: &WorkerSpec) {
        let mut out = BytesMut::new();
        encode_worker(worker, &mut out);
        self.append(&out);
    }

    /// Records a worker's removal.
    pub fn worker_removed(&mut self, worker: &str) {
        let mut out = BytesMut::new();
        encode(
            &Message::WorkerRemoved {
                worker_id: worker,
                host: "",
                reason: "",
            },
            &mut out,
        );
        self.append(&out);
    }

    /// Records an application's registration.
    pub fn app_registered(&mut self, app_id: &str, spec: &AppSpec) {
        let mut out = BytesMut::new();
        encode_app(app_id, spec, &mut out);
        self.append(&out);
    }

    /// Records an application's executor request.
    pub fn executors_requested(&mut self, app_id: &str, total: u32) {
        let mut out = BytesMut::new();
        encode(&Message::RequestExecutors { app_id, total }, &mut out);
        self.append(&out);
    }

    /// Records a placed executor.
    pub fn executor_added(&mut self, app_id: &str, executor_id: &str) {
        let mut out = BytesMut::new();
        encode_executor(app_id, executor_id, &mut out);
        self.append(&out);
    }

    /// Records an application's removal.
    pub fn app_removed(&mut self, app_id: &str) {
        let mut out = BytesMut::new();
        encode(
            &Message::ApplicationRemoved { app_id, reason: "" },
            &mut out,
        );
        self.append(&out);
    }

    fn append(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Writes the records appended since the last call and makes them durable: the master calls
    /// it once per event, before any frame that event produced goes out, so a peer never hears
    /// of something a restarted master would not know.
    pub fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let result = self
            .file
            .write_all(&self.pending)
            .and_then(|()| self.file.sync_data());
        self.pending.clear();
        if let Err(error) = result {
            tracing::error!("journal {}: write failed: {error}", self.path.display());
        }
    }
}

fn encode(message: &Message<'_>, out: &mut BytesMut) {
    if let Err(error) = message.encode(out, FRAME_SIZE_MAX_DEFAULT) {
        tracing::error!(
            "journal record {} not written: {error}",
            message.kind().name()
        );
    }
}

fn encode_worker(worker: &WorkerSpec, out: &mut BytesMut) {
    encode(
        &Message::RegisterWorker {
            worker_id: &worker.id,
            host: &worker.host,
            port: worker.port,
            cores: worker.cores,
            memory_mb: worker.memory_mb,
        },
        out,
    );
}

/// `spec` without a shared secret in its environment: secrets never reach the journal (an
/// older journal that holds one loses it at the next compaction).
fn without_secret(spec: &AppSpec) -> std::borrow::Cow<'_, AppSpec> {
    if spec.env.iter().any(|(key, _)| key == SECRET_ENV) {
        let mut clean = spec.clone();
        clean.env.retain(|(key, _)| key != SECRET_ENV);
        std::borrow::Cow::Owned(clean)
    } else {
        std::borrow::Cow::Borrowed(spec)
    }
}

fn encode_app(app_id: &str, spec: &AppSpec, out: &mut BytesMut) {
    encode(&Message::RegisteredApplication { app_id }, out);
    with_description(&without_secret(spec), |app| {
        encode(&Message::RegisterApplication { app }, out);
    });
}

fn encode_executor(app_id: &str, executor_id: &str, out: &mut BytesMut) {
    encode(
        &Message::ExecutorAdded {
            app_id,
            executor_id,
            worker_id: "",
            host_port: "",
            cores: 0,
            memory_mb: 0,
        },
        out,
    );
}

/// Replays journal bytes; stops at the first torn or malformed record.
pub fn replay(bytes: &[u8]) -> Recovered {
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(bytes);
    let mut replay = Replay::default();
    while let Ok(Some(frame)) = decoder.next_frame() {
        let Ok(message) = frame.message() else {
            tracing::warn!("journal: malformed record; replay stops there");
            break;
        };
        replay.apply(message);
    }
    replay.recovered()
}

/// The state a replay has rebuilt so far.
#[derive(Default)]
struct Replay {
    workers: BTreeMap<String, WorkerSpec>,
    apps: BTreeMap<String, RecoveredApp>,
    /// Application ids in registration order.
    order: Vec<String>,
    /// The id of a `RegisteredApplication` record, waiting for its `RegisterApplication`.
    pending_app: Option<String>,
}

impl Replay {
    /// Applies one journal record.
    fn apply(&mut self, message: Message<'_>) {
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
                self.pending_app = Some(app_id.to_owned());
            }
            Message::RegisterApplication { app } => {
                if let Some(id) = self.pending_app.take() {
                    let spec = without_secret(&spec_from_wire(&app)).into_owned();
                    self.add_app(id, spec);
                }
            }
            Message::RequestExecutors { app_id, total } => {
                if let Some(app) = self.apps.get_mut(app_id) {
                    app.executor_limit = Some(total);
                }
            }
            Message::ExecutorAdded {
                app_id,
                executor_id,
                ..
            } => {
                if let (Some(app), Ok(n)) = (self.apps.get_mut(app_id), executor_id.parse::<u64>())
                {
                    app.next_executor = app.next_executor.max(n.saturating_add(1));
                }
            }
            Message::ApplicationRemoved { app_id, .. } => {
                self.apps.remove(app_id);
            }
            other => {
                tracing::warn!("journal: unexpected record {}", other.kind().name());
            }
        }
    }

    /// Registers (or registers again, last in order) application `id`.
    fn add_app(&mut self, id: String, spec: AppSpec) {
        self.order.retain(|known| *known != id);
        self.order.push(id.clone());
        let app = RecoveredApp {
            id: id.clone(),
            spec,
            executor_limit: None,
            next_executor: 0,
        };
        self.apps.insert(id, app);
    }

    /// The workers, and the applications still registered in registration order.
    fn recovered(mut self) -> Recovered {
        Recovered {
            workers: self.workers.into_values().collect(),
            apps: self
                .order
                .into_iter()
                .filter_map(|id| self.apps.remove(&id))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "flint-journal-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    proptest::proptest! {
        #[test]
        fn replaying_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..512)) {
            let _ = replay(&bytes);
        }
    }

    #[test]
    fn every_prefix_of_a_journal_replays_to_a_prefix_of_its_history() {
        let mut out = BytesMut::new();
        let spec = AppSpec {
            name: "a".into(),
            cores_per_executor: 1,
            ..AppSpec::default()
        };
        encode_app("app-1", &spec, &mut out);
        encode_executor("app-1", "0", &mut out);
        encode(
            &Message::ApplicationRemoved {
                app_id: "app-1",
                reason: "",
            },
            &mut out,
        );
        let full = replay(&out);
        assert!(full.apps.is_empty());
        for len in 0..out.len() {
            let partial = replay(&out[..len]);
            assert!(partial.apps.len() <= 1);
            if let Some(app) = partial.apps.first() {
                assert_eq!(app.id, "app-1");
                assert!(app.next_executor <= 1);
            }
        }
    }

    #[test]
    fn a_secret_in_an_applications_environment_is_never_journaled() {
        let dir = dir().with_extension("secret");
        let _ = std::fs::remove_dir_all(&dir);
        let spec = AppSpec {
            name: "leaky".into(),
            env: vec![
                (SECRET_ENV.into(), "s3cret-value".into()),
                ("K".into(), "V".into()),
            ],
            ..AppSpec::default()
        };
        {
            let (mut journal, _) = Journal::open(&dir).unwrap();
            journal.app_registered("app-1", &spec);
            journal.flush();
        }
        // An older journal written with the secret: replay drops it, compaction forgets it.
        let mut old = BytesMut::new();
        encode(
            &Message::RegisteredApplication { app_id: "app-2" },
            &mut old,
        );
        with_description(&spec, |app| {
            encode(&Message::RegisterApplication { app }, &mut old);
        });
        let recovered = replay(&old);
        assert_eq!(recovered.apps[0].spec.env, vec![("K".into(), "V".into())]);
        let (_journal, recovered) = Journal::open(&dir).unwrap();
        assert_eq!(recovered.apps[0].spec.env, vec![("K".into(), "V".into())]);
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let bytes = std::fs::read(entry.path()).unwrap();
            assert!(!bytes.windows(12).any(|w| w == b"s3cret-value"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_journal_replays_live_state_and_survives_a_torn_tail() {
        let dir = dir();
        let worker = WorkerSpec {
            id: "w1".into(),
            host: "127.0.0.2".into(),
            port: 1,
            cores: 4,
            memory_mb: 1024,
        };
        let spec = AppSpec {
            name: "job".into(),
            driver_addr: "127.0.0.1:9".into(),
            args: vec!["--x".into()],
            env: vec![("K".into(), "V".into())],
            cores_per_executor: 2,
            max_cores: 4,
            ..AppSpec::default()
        };
        {
            let (mut journal, recovered) = Journal::open(&dir).unwrap();
            assert_eq!(recovered, Recovered::default());
            journal.worker_registered(&worker);
            journal.worker_registered(&WorkerSpec {
                id: "w2".into(),
                ..worker.clone()
            });
            journal.worker_removed("w2");
            journal.app_registered("app-1", &spec);
            journal.app_registered("app-2", &spec);
            journal.executors_requested("app-1", 2);
            journal.executor_added("app-1", "0");
            journal.executor_added("app-1", "1");
            journal.app_removed("app-2");
            // A torn record at the end.
            journal.append(&[40, 0, 0, 0, 32, 0]);
            journal.flush();
        }
        for _ in 0..2 {
            let (_journal, recovered) = Journal::open(&dir).unwrap();
            assert_eq!(recovered.workers, vec![worker.clone()]);
            assert_eq!(
                recovered.apps,
                vec![RecoveredApp {
                    id: "app-1".into(),
                    spec: spec.clone(),
                    executor_limit: Some(2),
                    next_executor: 2,
                }]
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
