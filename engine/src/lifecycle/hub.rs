//! Runs a [`SnapshotStore`] for threaded code: producers call [`SnapshotHub::update`] and
//! [`SnapshotHub::replace_all`] from any thread; each subscriber's callback runs on that
//! subscriber's own thread, one batch at a time.
//!
//! One delivering thread waits for the store's next due batch ([`SnapshotStore::poll_timeout`],
//! woken early by producers and by subscribers finishing a batch) and hands each batch to its
//! subscriber's thread through a channel of capacity one. The store hands out a subscriber's
//! next batch only after its callback has returned ([`SnapshotStore::delivered`]), so a
//! callback never runs on two threads at once and the channel never holds more than one batch.
//! A slow callback holds up only its own subscriber, whose buffer coalesces meanwhile (the
//! store's buffering policy); producers only take the store's lock for an in-memory update.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::snapshot::{Delivery, ExecutorState, Snapshot, SnapshotStore, SubscriberId};

/// The longest the delivering thread sleeps without being woken.
const IDLE_WAIT: Duration = Duration::from_millis(100);

struct State {
    store: SnapshotStore,
    senders: BTreeMap<SubscriberId, SyncSender<Delivery>>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
    epoch: Instant,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }
}

/// A snapshot store with a delivering thread and a thread per subscriber (see the module docs).
pub struct SnapshotHub {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for SnapshotHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotHub")
            .field("threads", &self.threads.len())
            .finish()
    }
}

impl SnapshotHub {
    /// Starts the delivering thread; see [`SnapshotStore::new`] for `grace`.
    pub fn new(grace: Duration) -> std::io::Result<SnapshotHub> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                store: SnapshotStore::new(grace.as_micros() as u64),
                senders: BTreeMap::new(),
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let deliverer = shared.clone();
        let thread = std::thread::Builder::new()
            .name("flint-snapshots".into())
            .spawn(move || deliver(&deliverer))?;
        Ok(SnapshotHub {
            shared,
            threads: vec![thread],
        })
    }

    /// Adds a subscriber: `callback` receives every snapshot since its last call (and how many
    /// were dropped because its buffer of `buffer_max` was full), at most every
    /// `batch_interval`, on a thread of its own.
    pub fn subscribe(
        &mut self,
        batch_interval: Duration,
        buffer_max: usize,
        mut callback: impl FnMut(&[Snapshot], u64) + Send + 'static,
    ) -> std::io::Result<SubscriberId> {
        let (sender, receiver) = sync_channel::<Delivery>(1);
        let id = {
            let mut state = self.shared.lock();
            let id = state
                .store
                .subscribe(batch_interval.as_micros() as u64, buffer_max);
            state.senders.insert(id, sender);
            id
        };
        let shared = self.shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("flint-subscriber-{}", id.0))
            .spawn(move || {
                while let Ok(delivery) = receiver.recv() {
                    callback(&delivery.snapshots, delivery.dropped);
                    shared.lock().store.delivered(delivery.subscriber);
                    shared.wake.notify_all();
                }
            });
        match thread {
            Ok(thread) => {
                self.threads.push(thread);
                self.shared.wake.notify_all();
                Ok(id)
            }
            Err(error) => {
                let mut state = self.shared.lock();
                state.senders.remove(&id);
                state.store.unsubscribe(id);
                Err(error)
            }
        }
    }

    /// An incremental update (see [`SnapshotStore::update`]).
    pub fn update(&self, name: &str, state: ExecutorState) {
        let now_us = self.shared.now_us();
        self.shared.lock().store.update(now_us, name, state);
        self.shared.wake.notify_all();
    }

    /// A full re-sync (see [`SnapshotStore::replace_all`]).
    pub fn replace_all(&self, listing: impl IntoIterator<Item = (String, ExecutorState)>) {
        let now_us = self.shared.now_us();
        self.shared.lock().store.replace_all(now_us, listing);
        self.shared.wake.notify_all();
    }

    /// The newest snapshot.
    pub fn current(&self) -> Snapshot {
        self.shared.lock().store.current().clone()
    }

    /// Stops delivering and joins every thread (waiting for running callbacks to return).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.lock().senders.clear();
        self.shared.wake.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl Drop for SnapshotHub {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The delivering thread's loop.
fn deliver(shared: &Shared) {
    let mut state = shared.lock();
    while !shared.stop.load(Ordering::SeqCst) {
        let now_us = shared.now_us();
        for delivery in state.store.poll_deliveries(now_us) {
            let id = delivery.subscriber;
            let gone = match state.senders.get(&id) {
                // Capacity one is enough: the store hands out one batch per subscriber at a time.
                Some(sender) => matches!(
                    sender.try_send(delivery),
                    Err(TrySendError::Disconnected(_))
                ),
                None => true,
            };
            if gone {
                state.senders.remove(&id);
                state.store.unsubscribe(id);
            }
        }
        let wait = match state.store.poll_timeout() {
            Some(due_us) => Duration::from_micros(due_us.saturating_sub(shared.now_us()))
                .min(IDLE_WAIT)
                .max(Duration::from_micros(100)),
            None => IDLE_WAIT,
        };
        state = match shared.wake.wait_timeout(state, wait) {
            Ok((state, _)) => state,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use std::sync::mpsc::channel;

    fn wait_until(mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_stuck_subscriber_blocks_neither_producers_nor_others() {
        let mut hub = SnapshotHub::new(Duration::from_secs(1)).expect("hub");
        let (release, released) = channel::<()>();
        let stuck_seen = Arc::new(AtomicU64::new(0));
        let stuck_entered = Arc::new(AtomicBool::new(false));
        let (seen, entered) = (stuck_seen.clone(), stuck_entered.clone());
        let released = Mutex::new(released);
        hub.subscribe(Duration::ZERO, 4, move |snapshots, _| {
            if let Some(last) = snapshots.last() {
                seen.store(last.seq, Ordering::SeqCst);
            }
            entered.store(true, Ordering::SeqCst);
            // The first batch blocks until the test releases it.
            let _ = released.lock().map(|r| r.recv());
        })
        .expect("subscribe");
        let fast_seen = Arc::new(AtomicU64::new(0));
        let seen = fast_seen.clone();
        hub.subscribe(Duration::from_millis(1), 4, move |snapshots, _| {
            if let Some(last) = snapshots.last() {
                seen.store(last.seq, Ordering::SeqCst);
            }
        })
        .expect("subscribe");
        // The stuck subscriber is inside its first callback (the initial snapshot, seq 0).
        wait_until(|| stuck_entered.load(Ordering::SeqCst));
        for i in 0..1_000 {
            hub.update(&format!("e{i}"), ExecutorState::Running);
        }
        wait_until(|| fast_seen.load(Ordering::SeqCst) == 1_000);
        assert_eq!(
            stuck_seen.load(Ordering::SeqCst),
            0,
            "still in its first callback"
        );
        release.send(()).expect("release");
        drop(release);
        wait_until(|| stuck_seen.load(Ordering::SeqCst) == 1_000);
        hub.shutdown();
    }

    #[test]
    fn a_callback_never_runs_on_two_threads_at_once() {
        let mut hub = SnapshotHub::new(Duration::from_secs(1)).expect("hub");
        let inside = Arc::new(AtomicBool::new(false));
        let overlaps = Arc::new(AtomicU64::new(0));
        let last = Arc::new(AtomicU64::new(0));
        let (i, o, l) = (inside.clone(), overlaps.clone(), last.clone());
        hub.subscribe(Duration::ZERO, 8, move |snapshots, _| {
            if i.swap(true, Ordering::SeqCst) {
                o.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_micros(200));
            for s in snapshots {
                // Ordered: sequence numbers only grow.
                assert!(s.seq > l.load(Ordering::SeqCst) || s.seq == 0);
                l.store(s.seq, Ordering::SeqCst);
            }
            i.store(false, Ordering::SeqCst);
        })
        .expect("subscribe");
        let hub = Arc::new(Mutex::new(hub));
        let producers: Vec<_> = (0..4)
            .map(|p| {
                let hub = hub.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let h = hub.lock().unwrap_or_else(|e| e.into_inner());
                        h.update(&format!("p{p}-{i}"), ExecutorState::Pending);
                    }
                })
            })
            .collect();
        for p in producers {
            p.join().expect("producer");
        }
        wait_until(|| last.load(Ordering::SeqCst) == 800);
        assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    }
}
