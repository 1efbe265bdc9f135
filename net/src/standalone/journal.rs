//! The master's journal: an append-only file in `--state-dir` of the workers and applications
//! it knows, replayed when it starts so a restarted master recovers them (Spark's
//! `FileSystemPersistenceEngine`, as one log instead of a file per object).
//!
//! Records hold wire messages (the bytes are in [`format`]: each record says where it starts and
//! whether it is whole):
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
//! One master per state directory: [`Journal::open`] first takes an exclusive lock on
//! `master.lock` there (held while the journal is open), so a second master refuses before it
//! reads or writes anything. Then it replays (`replay`, linear in the records) every record
//! that checks out, damage anywhere costing only the records it touches; it logs each damaged
//! range (offset, bytes) and every application whose registration was lost, and keeps the
//! damaged file beside the new one (`master.journal.damaged-SECONDS`). Last it compacts: the
//! live state is written to a new file that replaces the old one, so the file stays
//! proportional to what is live plus what happened since the last start.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::BytesMut;
use flint_engine::standalone::{AppSpec, RecoveredApp, WorkerSpec};

use crate::handshake::SECRET_ENV;
use crate::standalone::with_description;
use crate::wire::Message;

mod format;
mod replay;

use format::{encode_record, Damage, FILE_MAGIC};

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
    /// Another master holds the state directory.
    #[error(
        "another master uses state dir {} (it holds {}); stop it, or give this one another \
         --state-dir",
        dir.display(),
        lock.display()
    )]
    Locked {
        /// The state directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// The lock file could not be opened or locked.
    #[error("cannot lock {}: {source}", path.display())]
    Lock {
        /// The lock file.
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

/// The open journal (and the state directory's lock, held while it is open).
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    pending: BytesMut,
    _lock: File,
}

const FILE_NAME: &str = "master.journal";
const LOCK_NAME: &str = "master.lock";

impl Journal {
    /// Locks the state directory `dir` (creating it), replays its journal, keeps a damaged one
    /// aside, compacts, and returns the journal with what it held.
    pub fn open(dir: &Path) -> Result<(Journal, Recovered), JournalError> {
        std::fs::create_dir_all(dir).map_err(|source| JournalError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let lock = lock(dir)?;
        let path = dir.join(FILE_NAME);
        let (recovered, damaged) = match std::fs::read(&path) {
            Ok(bytes) => {
                let (recovered, damage) = replay_reporting(&bytes);
                (recovered, !damage.is_empty())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Recovered::default(), false),
            Err(source) => return Err(JournalError::Read { path, source }),
        };
        if damaged {
            keep_damaged(&path);
        }
        compact(dir, &path, &recovered).map_err(|source| JournalError::Compact {
            path: path.clone(),
            source,
        })?;
        let file = match OpenOptions::new().append(true).open(&path) {
            Ok(file) => file,
            Err(source) => return Err(JournalError::Open { path, source }),
        };
        let journal = Journal {
            file,
            path,
            pending: BytesMut::new(),
            _lock: lock,
        };
        Ok((journal, recovered))
    }

    /// Appends a record (written with the next [`Journal::flush`]).
    pub fn record(&mut self, record: &Record) {
        let out = &mut self.pending;
        match record {
            Record::WorkerRegistered(spec) => encode_worker(spec, out),
            Record::WorkerRemoved(worker_id) => encode_record(
                &Message::WorkerRemoved {
                    worker_id,
                    host: "",
                    reason: "",
                },
                out,
            ),
            Record::AppRegistered(app_id, spec) => encode_app(app_id, spec, out),
            Record::ExecutorsRequested(app_id, total) => encode_record(
                &Message::RequestExecutors {
                    app_id,
                    total: *total,
                },
                out,
            ),
            Record::ExecutorAdded(app_id, executor) => encode_executor(app_id, executor, out),
            Record::AppRemoved(app_id) => {
                encode_record(&Message::ApplicationRemoved { app_id, reason: "" }, out)
            }
        }
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

/// Takes the state directory's lock: `master.lock`, locked exclusively without waiting.
fn lock(dir: &Path) -> Result<File, JournalError> {
    let path = dir.join(LOCK_NAME);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| JournalError::Lock {
            path: path.clone(),
            source,
        })?;
    use std::os::fd::AsRawFd;
    // SAFETY: `flock` reads only its arguments; the descriptor is `file`'s, open for the call.
    // (`File::try_lock` does the same from Rust 1.89, above this crate's minimum.)
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked == 0 {
        return Ok(file);
    }
    match std::io::Error::last_os_error() {
        error if error.raw_os_error() == Some(libc::EWOULDBLOCK) => Err(JournalError::Locked {
            dir: dir.to_owned(),
            lock: path,
        }),
        source => Err(JournalError::Lock { path, source }),
    }
}

/// Keeps a damaged journal beside the one compaction is about to write, under a name of its
/// own (`master.journal.damaged-SECONDS`, `-N` added if taken).
fn keep_damaged(path: &Path) {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.damaged-{seconds}", path.display());
    let kept = (0..100)
        .map(|n| match n {
            0 => PathBuf::from(&base),
            n => PathBuf::from(format!("{base}-{n}")),
        })
        .find(|candidate| std::fs::hard_link(path, candidate).is_ok());
    match kept {
        Some(kept) => tracing::warn!("journal: the damaged journal is kept as {}", kept.display()),
        None => tracing::error!(
            "journal: could not keep the damaged journal {} aside; compaction replaces it",
            path.display()
        ),
    }
}

/// Writes the live state to a new journal that replaces the one at `path`.
fn compact(dir: &Path, path: &Path, recovered: &Recovered) -> std::io::Result<()> {
    let mut out = BytesMut::from(&FILE_MAGIC[..]);
    for worker in &recovered.workers {
        encode_worker(worker, &mut out);
    }
    for app in &recovered.apps {
        encode_app(&app.id, &app.spec, &mut out);
        if let Some(total) = app.executor_limit {
            let app_id = &app.id;
            encode_record(&Message::RequestExecutors { app_id, total }, &mut out);
        }
        if app.next_executor > 0 {
            let last = (app.next_executor - 1).to_string();
            encode_executor(&app.id, &last, &mut out);
        }
    }
    let tmp = dir.join(format!("{FILE_NAME}.tmp"));
    let mut file = File::create(&tmp)?;
    file.write_all(&out)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    File::open(dir)?.sync_all()
}

fn encode_worker(worker: &WorkerSpec, out: &mut BytesMut) {
    encode_record(
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
    encode_record(&Message::RegisteredApplication { app_id }, out);
    with_description(&without_secret(spec), |app| {
        encode_record(&Message::RegisterApplication { app }, out);
    });
}

fn encode_executor(app_id: &str, executor_id: &str, out: &mut BytesMut) {
    encode_record(
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

/// Replays journal bytes: every record that checks out, in order.
pub fn replay(bytes: &[u8]) -> Recovered {
    replay_reporting(bytes).0
}

/// Replays journal bytes, logging each damaged range, each application whose registration was
/// lost and each record that is no journal record; what it rebuilt and the damage.
fn replay_reporting(bytes: &[u8]) -> (Recovered, Vec<Damage>) {
    let mut replay = replay::Replay::default();
    let damage = format::read(bytes, |offset, message| replay.apply(offset, message));
    let recovered = replay.recovered();
    for Damage { offset, len } in &damage {
        tracing::warn!("journal: dropped {len} damaged bytes at offset {offset}");
    }
    for id in &replay.lost {
        tracing::warn!("journal: application {id} is lost: its registration was damaged");
    }
    for offset in &replay.unexpected {
        tracing::warn!("journal: ignored a record at offset {offset} that is no journal record");
    }
    if !damage.is_empty() {
        let dropped: usize = damage.iter().map(|d| d.len).sum();
        tracing::warn!(
            "journal: {dropped} damaged bytes in {} ranges; recovered {} workers and {} applications \
             from the records around them",
            damage.len(),
            recovered.workers.len(),
            recovered.apps.len()
        );
    }
    (recovered, damage)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("flint-journal-test-{}-{name}", std::process::id(),));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    proptest::proptest! {
        #[test]
        fn replaying_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..512)) {
            let _ = replay(&bytes);
            let mut journal = FILE_MAGIC.to_vec();
            journal.extend_from_slice(&bytes);
            let _ = replay(&journal);
        }
    }

    fn app(name: &str) -> AppSpec {
        AppSpec {
            name: name.into(),
            cores_per_executor: 1,
            ..AppSpec::default()
        }
    }

    #[test]
    fn every_prefix_of_a_journal_replays_to_a_prefix_of_its_history() {
        let mut out = BytesMut::from(&FILE_MAGIC[..]);
        encode_app("app-1", &app("a"), &mut out);
        encode_executor("app-1", "0", &mut out);
        let removed = Message::ApplicationRemoved {
            app_id: "app-1",
            reason: "",
        };
        encode_record(&removed, &mut out);
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
        let dir = dir("secret");
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
            journal.record(&Record::AppRegistered("app-1".into(), spec.clone()));
            journal.flush();
        }
        // An older journal written with the secret: replay drops it, compaction forgets it.
        let mut old = BytesMut::new();
        let encode = |message: &Message<'_>, out: &mut BytesMut| {
            message.encode(out, 1 << 20).expect("encodes");
        };
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
        let dir = dir("live");
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
            for record in [
                Record::WorkerRegistered(worker.clone()),
                Record::WorkerRegistered(WorkerSpec {
                    id: "w2".into(),
                    ..worker.clone()
                }),
                Record::WorkerRemoved("w2".into()),
                Record::AppRegistered("app-1".into(), spec.clone()),
                Record::AppRegistered("app-2".into(), spec.clone()),
                Record::ExecutorsRequested("app-1".into(), 2),
                Record::ExecutorAdded("app-1".into(), "0".into()),
                Record::ExecutorAdded("app-1".into(), "1".into()),
                Record::AppRemoved("app-2".into()),
            ] {
                journal.record(&record);
            }
            // A torn record at the end.
            journal
                .pending
                .extend_from_slice(&[0xF1, 0x1A, 0x7E, 0xC0, 40, 0]);
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
        // The torn journal was kept aside once; the compacted one has no damage.
        let kept: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().contains(".damaged-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_second_journal_on_the_same_directory_is_refused_until_the_first_closes() {
        let dir = dir("lock");
        let (mut first, _) = Journal::open(&dir).unwrap();
        first.record(&Record::AppRegistered("app-1".into(), app("a")));
        first.flush();
        let before = std::fs::read(dir.join(FILE_NAME)).unwrap();
        let second = Journal::open(&dir);
        assert!(
            matches!(second, Err(JournalError::Locked { .. })),
            "{second:?}"
        );
        assert_eq!(std::fs::read(dir.join(FILE_NAME)).unwrap(), before);
        drop(first);
        let (_again, recovered) = Journal::open(&dir).unwrap();
        assert_eq!(recovered.apps.len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_application_registered_again_goes_last_and_removals_keep_the_order() {
        let mut out = BytesMut::from(&FILE_MAGIC[..]);
        for id in ["a", "b", "c"] {
            encode_app(id, &app(id), &mut out);
        }
        encode_app("a", &app("a"), &mut out);
        let removed = Message::ApplicationRemoved {
            app_id: "b",
            reason: "",
        };
        encode_record(&removed, &mut out);
        let ids: Vec<String> = replay(&out).apps.into_iter().map(|a| a.id).collect();
        assert_eq!(ids, ["c", "a"]);
    }
}
