//! Feeds a cluster manager's view of executors into the snapshot store and removes executors
//! it reports gone from the driver's scheduler: the lifecycle handler for executors that
//! something else (a standalone master, an external launcher) creates.
//!
//! An [`ExecutorSource`] gives two views: [`ExecutorSource::changes`], the state changes it saw
//! since the last call (the watch source: each becomes an incremental update), and
//! [`ExecutorSource::full_listing`], every executor it knows now (the poll source: asked every
//! `sync_interval`, it replaces the snapshot, and an executor it lacks counts as deleted after
//! `sync_grace`). A thread drives the [`SnapshotStore`]; its batches go through [`Removals`]
//! to `on_removal` (in `flint`, [`crate::driver::Driver::remove_executor`]), once per executor,
//! with the exit reason.
//!
//! A source that reports states by diffing what it sees between calls misses an executor that
//! comes and goes within one `watch_interval`; the driver still removes such an executor when
//! its connection closes, so the mirror is a backstop that adds the exit reason.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::lifecycle::{ExecutorState, Removals, SnapshotStore};
use flint_engine::scheduler::RemovalReason;

use super::Background;

/// Where executor states come from.
pub trait ExecutorSource: Send + 'static {
    /// State changes since the last call, in the order they happened.
    fn changes(&mut self) -> Vec<(String, ExecutorState)>;
    /// Every executor the cluster manager knows now, or `None` if it cannot say (e.g. not
    /// connected); may block briefly to ask.
    fn full_listing(&mut self) -> Option<Vec<(String, ExecutorState)>>;
}

/// How the mirror runs.
#[derive(Debug, Clone)]
pub struct MirrorConfig {
    /// How often changes are taken.
    pub watch_interval: Duration,
    /// How often a full listing re-syncs the store.
    pub sync_interval: Duration,
    /// An executor missing from listings this long counts as deleted.
    pub sync_grace: Duration,
    /// Report each state change and removal as `{prefix}: executor NAME STATE` to `on_event`
    /// (or the log at info without one).
    pub events_prefix: Option<String>,
    /// Where event lines go (see [`events_prefix`](Self::events_prefix)).
    pub on_event: Option<crate::observe::EventSink>,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            watch_interval: Duration::from_millis(20),
            sync_interval: Duration::from_secs(1),
            sync_grace: Duration::from_secs(2),
            events_prefix: None,
            on_event: None,
        }
    }
}

/// The mirror's thread (see the module docs).
pub struct SourceMirror {
    removed: Arc<AtomicU64>,
    background: Background,
}

impl std::fmt::Debug for SourceMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceMirror")
            .field("removed", &self.removed())
            .finish_non_exhaustive()
    }
}

impl SourceMirror {
    /// Starts mirroring `source`; `on_removal` is called once per executor that is gone.
    pub fn start(
        config: MirrorConfig,
        mut source: impl ExecutorSource,
        mut on_removal: impl FnMut(&str, RemovalReason) + Send + 'static,
    ) -> std::io::Result<SourceMirror> {
        let removed = Arc::new(AtomicU64::new(0));
        let removed_count = removed.clone();
        let background = Background::spawn("flint-executor-source", move |stop_flag| {
            let epoch = Instant::now();
            let now_us = || epoch.elapsed().as_micros() as u64;
            let mut store = SnapshotStore::new(config.sync_grace.as_micros() as u64);
            let subscriber = store.subscribe(0, 64);
            let mut removals = Removals::new();
            let mut last_sync: Option<Instant> = None;
            while !stop_flag.load(Ordering::SeqCst) {
                for (name, state) in source.changes() {
                    if let Some(prefix) = &config.events_prefix {
                        crate::observe::EventSink::emit(
                            config.on_event.as_ref(),
                            &format!("{prefix}: executor {name} {state}"),
                        );
                    }
                    store.update(now_us(), &name, state);
                }
                if last_sync.is_none_or(|t| t.elapsed() >= config.sync_interval) {
                    last_sync = Some(Instant::now());
                    if let Some(listing) = source.full_listing() {
                        store.replace_all(now_us(), listing);
                    }
                }
                for delivery in store.poll_deliveries(now_us()) {
                    for snapshot in &delivery.snapshots {
                        for (name, reason) in removals.on_snapshot(snapshot) {
                            removed_count.fetch_add(1, Ordering::SeqCst);
                            if let Some(prefix) = &config.events_prefix {
                                crate::observe::EventSink::emit(
                                    config.on_event.as_ref(),
                                    &format!("{prefix}: executor {name} removed: {reason}"),
                                );
                            }
                            on_removal(&name, reason);
                        }
                    }
                    store.delivered(subscriber);
                }
                std::thread::sleep(config.watch_interval);
            }
        })?;
        Ok(SourceMirror {
            removed,
            background,
        })
    }

    /// Executors removed so far.
    pub fn removed(&self) -> u64 {
        self.removed.load(Ordering::SeqCst)
    }

    /// Stops the thread.
    pub fn stop(mut self) {
        self.background.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver};
    use std::sync::Mutex;

    type Listing = Arc<Mutex<Option<Vec<(String, ExecutorState)>>>>;

    /// A source the test scripts: changes come from a channel, listings from a shared slot.
    struct Scripted {
        changes: Receiver<(String, ExecutorState)>,
        listing: Listing,
    }

    impl ExecutorSource for Scripted {
        fn changes(&mut self) -> Vec<(String, ExecutorState)> {
            self.changes.try_iter().collect()
        }

        fn full_listing(&mut self) -> Option<Vec<(String, ExecutorState)>> {
            self.listing.lock().ok()?.clone()
        }
    }

    fn wait_for<T>(receiver: &Receiver<T>) -> T {
        receiver
            .recv_timeout(Duration::from_secs(20))
            .expect("in time")
    }

    #[test]
    fn changes_and_listings_become_removals_once_with_their_reasons() {
        let (change, changes) = channel();
        let listing = Arc::new(Mutex::new(None));
        let (removal, removals) = channel();
        let mirror = SourceMirror::start(
            MirrorConfig {
                watch_interval: Duration::from_millis(1),
                sync_interval: Duration::from_millis(5),
                sync_grace: Duration::from_millis(50),
                events_prefix: None,
                on_event: None,
            },
            Scripted {
                changes,
                listing: listing.clone(),
            },
            move |name: &str, reason| {
                let _ = removal.send((name.to_owned(), reason));
            },
        )
        .expect("start");
        for name in ["a", "b"] {
            change
                .send((name.to_string(), ExecutorState::Running))
                .expect("send");
        }
        let failed = ExecutorState::Failed {
            code: 134,
            caused_by_app: true,
        };
        change.send(("a".to_string(), failed)).expect("send");
        assert_eq!(
            wait_for(&removals),
            (
                "a".to_string(),
                RemovalReason::Exited {
                    code: 134,
                    caused_by_app: true
                }
            )
        );
        // The watch misses b's end; listings without it delete it after the grace period.
        *listing.lock().expect("lock") = Some(Vec::new());
        assert_eq!(
            wait_for(&removals),
            ("b".to_string(), RemovalReason::Killed)
        );
        assert!(
            removals.recv_timeout(Duration::from_millis(100)).is_err(),
            "each executor once"
        );
        assert_eq!(mirror.removed(), 2);
        mirror.stop();
    }
}
