//! The executor snapshot store: the one place executor states from every source meet.
//!
//! # The protocol
//!
//! *Producers* (sources: a process watcher, a cluster manager's event stream, a periodic
//! listing) report executor states in two ways:
//!
//! - [`SnapshotStore::update`]: an incremental update, one executor's new state;
//! - [`SnapshotStore::replace_all`]: a full re-sync, the complete set of executors the source
//!   sees now. It replaces the snapshot and corrects missed events. An executor in the current
//!   snapshot but absent from the listing is kept while it was last seen less than
//!   `grace_us` ago (a listing may race with the event that created it) and counts as
//!   [`ExecutorState::Deleted`] after that. Executors already in a terminal state and absent
//!   from a listing are dropped: they were reported, and dropping them keeps the snapshot as
//!   big as the live set.
//!
//! Every change produces a new [`Snapshot`] (the whole state, cheap to clone: a shared map with
//! a sequence number and the time it was taken) and posts it to every subscriber's buffer.
//!
//! *Subscribers* register with [`SnapshotStore::subscribe`] and their own batch interval.
//! [`SnapshotStore::poll_deliveries`] returns, for each subscriber whose interval has passed
//! since its last delivery and whose buffer is not empty, one [`Delivery`] with every buffered
//! snapshot in order. The subscriber is then *busy* until [`SnapshotStore::delivered`] is
//! called for it: no second delivery is handed out meanwhile, so whoever runs the callbacks
//! runs each subscriber's callback on one thread at a time.
//!
//! # Buffering policy
//!
//! Each subscriber's buffer holds at most `buffer_max` snapshots. When a snapshot arrives and
//! the buffer is full (a slow or busy subscriber), the *oldest* buffered snapshot is dropped
//! and counted in [`Delivery::dropped`]: the newest snapshot is always kept, and since each
//! snapshot is the whole state, a subscriber that skips intermediate snapshots still ends up
//! at the current state. Producers never wait for subscribers, and a slow subscriber never
//! delays another one.
//!
//! The store is a plain state machine: no threads, no clock (time comes in as `now_us`).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;

/// An executor's state as a source sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorState {
    /// Requested (a process started, a container scheduled) but not running tasks yet.
    Pending,
    /// Running (registered with the driver).
    Running,
    /// Exited by itself with success (code 0).
    Succeeded,
    /// Exited with an error.
    Failed {
        /// The exit code (128 + the signal number when a signal ended it).
        code: i32,
        /// Whether the application (a task) caused the exit.
        caused_by_app: bool,
    },
    /// Deleted on purpose (by the allocator, or gone from a full re-sync past the grace period).
    Deleted,
    /// The source cannot tell (e.g. its node stopped answering).
    Unknown,
}

impl ExecutorState {
    /// Whether the executor is gone for good (succeeded, failed or deleted).
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            ExecutorState::Succeeded | ExecutorState::Failed { .. } | ExecutorState::Deleted
        )
    }
}

impl fmt::Display for ExecutorState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExecutorState::Pending => write!(f, "pending"),
            ExecutorState::Running => write!(f, "running"),
            ExecutorState::Succeeded => write!(f, "succeeded"),
            ExecutorState::Failed {
                code,
                caused_by_app,
            } => write!(f, "failed (code {code}, caused by app: {caused_by_app})"),
            ExecutorState::Deleted => write!(f, "deleted"),
            ExecutorState::Unknown => write!(f, "unknown"),
        }
    }
}

/// The states of all executors at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// Increases by one with every snapshot the store takes.
    pub seq: u64,
    /// When it was taken (the store's clock, micros).
    pub taken_us: u64,
    /// Whether a full re-sync produced it (rather than an incremental update).
    pub full_sync: bool,
    /// Every executor's state by name.
    pub executors: Arc<BTreeMap<String, ExecutorState>>,
}

impl Snapshot {
    /// The state of one executor, if the snapshot has it.
    pub fn get(&self, name: &str) -> Option<&ExecutorState> {
        self.executors.get(name)
    }
}

/// A subscriber's handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriberId(pub u32);

/// A batch of snapshots for one subscriber.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Who it is for.
    pub subscriber: SubscriberId,
    /// Every snapshot since the last delivery, oldest first (minus `dropped` ones).
    pub snapshots: Vec<Snapshot>,
    /// Snapshots dropped from this subscriber's buffer since its last delivery (buffer full).
    pub dropped: u64,
}

struct Subscriber {
    batch_interval_us: u64,
    buffer_max: usize,
    buffer: VecDeque<Snapshot>,
    dropped: u64,
    last_delivery_us: Option<u64>,
    busy: bool,
}

/// The store (see the module docs).
pub struct SnapshotStore {
    grace_us: u64,
    current: Snapshot,
    /// When each executor was last reported present (by an update or a listing).
    last_seen_us: BTreeMap<String, u64>,
    subscribers: BTreeMap<SubscriberId, Subscriber>,
    next_subscriber: u32,
}

impl fmt::Debug for SnapshotStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotStore")
            .field("seq", &self.current.seq)
            .field("executors", &self.current.executors.len())
            .field("subscribers", &self.subscribers.len())
            .finish()
    }
}

impl SnapshotStore {
    /// An empty store; executors missing from a full re-sync count as deleted once they were
    /// last seen `grace_us` ago or more.
    pub fn new(grace_us: u64) -> SnapshotStore {
        SnapshotStore {
            grace_us,
            current: Snapshot {
                seq: 0,
                taken_us: 0,
                full_sync: false,
                executors: Arc::new(BTreeMap::new()),
            },
            last_seen_us: BTreeMap::new(),
            subscribers: BTreeMap::new(),
            next_subscriber: 0,
        }
    }

    /// The newest snapshot.
    pub fn current(&self) -> &Snapshot {
        &self.current
    }

    /// Registers a subscriber that wants its snapshots in batches at most every
    /// `batch_interval_us`, buffering at most `buffer_max` (at least 1) meanwhile. It first
    /// receives the current snapshot.
    pub fn subscribe(&mut self, batch_interval_us: u64, buffer_max: usize) -> SubscriberId {
        let id = SubscriberId(self.next_subscriber);
        self.next_subscriber = self.next_subscriber.wrapping_add(1);
        let mut buffer = VecDeque::new();
        buffer.push_back(self.current.clone());
        self.subscribers.insert(
            id,
            Subscriber {
                batch_interval_us,
                buffer_max: buffer_max.max(1),
                buffer,
                dropped: 0,
                last_delivery_us: None,
                busy: false,
            },
        );
        id
    }

    /// Removes a subscriber; its buffered snapshots are dropped.
    pub fn unsubscribe(&mut self, id: SubscriberId) -> bool {
        self.subscribers.remove(&id).is_some()
    }

    /// An incremental update: `name` is now in `state`.
    pub fn update(&mut self, now_us: u64, name: &str, state: ExecutorState) {
        if self.current.get(name) == Some(&state) {
            self.last_seen_us.insert(name.to_owned(), now_us);
            return;
        }
        let mut executors = (*self.current.executors).clone();
        executors.insert(name.to_owned(), state);
        self.last_seen_us.insert(name.to_owned(), now_us);
        self.publish(now_us, false, executors);
    }

    /// A full re-sync: `listing` is every executor the source sees now (see the module docs for
    /// executors it lacks).
    pub fn replace_all(
        &mut self,
        now_us: u64,
        listing: impl IntoIterator<Item = (String, ExecutorState)>,
    ) {
        let mut executors: BTreeMap<String, ExecutorState> = listing.into_iter().collect();
        for name in executors.keys() {
            self.last_seen_us.insert(name.clone(), now_us);
        }
        for (name, state) in self.current.executors.iter() {
            if executors.contains_key(name) || state.is_terminal() {
                continue;
            }
            let last_seen_us = self.last_seen_us.get(name).copied().unwrap_or(0);
            if now_us.saturating_sub(last_seen_us) >= self.grace_us {
                executors.insert(name.clone(), ExecutorState::Deleted);
            } else {
                executors.insert(name.clone(), state.clone());
            }
        }
        self.last_seen_us
            .retain(|name, _| executors.contains_key(name));
        self.publish(now_us, true, executors);
    }

    fn publish(
        &mut self,
        now_us: u64,
        full_sync: bool,
        executors: BTreeMap<String, ExecutorState>,
    ) {
        self.current = Snapshot {
            seq: self.current.seq + 1,
            taken_us: now_us,
            full_sync,
            executors: Arc::new(executors),
        };
        for subscriber in self.subscribers.values_mut() {
            if subscriber.buffer.len() >= subscriber.buffer_max {
                subscriber.buffer.pop_front();
                subscriber.dropped += 1;
            }
            subscriber.buffer.push_back(self.current.clone());
        }
    }

    /// The batches due at `now_us`: one per subscriber that is not busy, has snapshots
    /// buffered, and whose batch interval has passed since its last delivery. Each such
    /// subscriber is busy until [`SnapshotStore::delivered`].
    pub fn poll_deliveries(&mut self, now_us: u64) -> Vec<Delivery> {
        let mut due = Vec::new();
        for (id, subscriber) in self.subscribers.iter_mut() {
            if subscriber.busy || subscriber.buffer.is_empty() {
                continue;
            }
            let ready = match subscriber.last_delivery_us {
                None => true,
                Some(last) => now_us.saturating_sub(last) >= subscriber.batch_interval_us,
            };
            if !ready {
                continue;
            }
            subscriber.busy = true;
            subscriber.last_delivery_us = Some(now_us);
            due.push(Delivery {
                subscriber: *id,
                snapshots: subscriber.buffer.drain(..).collect(),
                dropped: std::mem::take(&mut subscriber.dropped),
            });
        }
        due
    }

    /// The subscriber's callback has returned: it may receive its next batch.
    pub fn delivered(&mut self, id: SubscriberId) {
        if let Some(subscriber) = self.subscribers.get_mut(&id) {
            subscriber.busy = false;
        }
    }

    /// When [`SnapshotStore::poll_deliveries`] next has something to hand out (micros), if
    /// any subscriber is waiting with snapshots buffered.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.subscribers
            .values()
            .filter(|s| !s.busy && !s.buffer.is_empty())
            .map(|s| match s.last_delivery_us {
                None => 0,
                Some(last) => last.saturating_add(s.batch_interval_us),
            })
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(snapshot: &Snapshot) -> Vec<(String, ExecutorState)> {
        snapshot
            .executors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    #[test]
    fn updates_arrive_in_order_in_one_batch() {
        let mut store = SnapshotStore::new(1_000);
        let sub = store.subscribe(100, 16);
        assert_eq!(store.poll_deliveries(0).len(), 1, "the initial snapshot");
        store.delivered(sub);
        store.update(10, "a", ExecutorState::Pending);
        store.update(20, "a", ExecutorState::Running);
        store.update(30, "b", ExecutorState::Pending);
        assert!(store.poll_deliveries(50).is_empty(), "interval not passed");
        assert_eq!(store.poll_timeout(), Some(100));
        let batch = store.poll_deliveries(100);
        assert_eq!(batch.len(), 1);
        let seqs: Vec<u64> = batch[0].snapshots.iter().map(|s| s.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert_eq!(
            batch[0].snapshots[0].get("a"),
            Some(&ExecutorState::Pending)
        );
        assert_eq!(
            batch[0].snapshots[1].get("a"),
            Some(&ExecutorState::Running)
        );
        assert_eq!(batch[0].snapshots[2].executors.len(), 2);
    }

    #[test]
    fn an_unchanged_state_makes_no_snapshot() {
        let mut store = SnapshotStore::new(1_000);
        store.update(1, "a", ExecutorState::Running);
        store.update(2, "a", ExecutorState::Running);
        assert_eq!(store.current().seq, 1);
    }

    #[test]
    fn subscribers_have_their_own_intervals() {
        let mut store = SnapshotStore::new(1_000);
        let fast = store.subscribe(10, 16);
        let slow = store.subscribe(1_000, 16);
        for d in store.poll_deliveries(0) {
            store.delivered(d.subscriber);
        }
        store.update(5, "a", ExecutorState::Running);
        let due = store.poll_deliveries(10);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].subscriber, fast);
        store.delivered(fast);
        let due = store.poll_deliveries(1_000);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].subscriber, slow);
        assert_eq!(due[0].snapshots.len(), 1);
    }

    #[test]
    fn a_busy_subscriber_gets_nothing_until_delivered() {
        let mut store = SnapshotStore::new(1_000);
        let sub = store.subscribe(0, 16);
        assert_eq!(store.poll_deliveries(0).len(), 1);
        store.update(1, "a", ExecutorState::Running);
        assert!(store.poll_deliveries(2).is_empty(), "still busy");
        assert_eq!(store.poll_timeout(), None);
        store.delivered(sub);
        let due = store.poll_deliveries(3);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].snapshots.len(), 1);
    }

    #[test]
    fn a_full_buffer_drops_the_oldest_and_keeps_the_newest() {
        let mut store = SnapshotStore::new(1_000);
        let sub = store.subscribe(0, 3);
        assert_eq!(store.poll_deliveries(0).len(), 1);
        // Busy: everything buffers.
        for i in 0..10 {
            store.update(i, &format!("e{i}"), ExecutorState::Running);
        }
        store.delivered(sub);
        let due = store.poll_deliveries(20);
        assert_eq!(due[0].dropped, 7);
        let seqs: Vec<u64> = due[0].snapshots.iter().map(|s| s.seq).collect();
        assert_eq!(seqs, vec![8, 9, 10]);
        assert_eq!(
            due[0].snapshots[2].executors.len(),
            10,
            "newest is the whole state"
        );
    }

    #[test]
    fn a_full_sync_replaces_and_marks_the_long_missing_deleted() {
        let mut store = SnapshotStore::new(100);
        store.update(0, "old", ExecutorState::Running);
        store.update(0, "done", ExecutorState::Succeeded);
        store.update(950, "new", ExecutorState::Pending);
        store.replace_all(1_000, vec![("other".to_string(), ExecutorState::Running)]);
        let snap = store.current().clone();
        assert!(snap.full_sync);
        assert_eq!(
            names(&snap),
            vec![
                ("new".to_string(), ExecutorState::Pending),
                ("old".to_string(), ExecutorState::Deleted),
                ("other".to_string(), ExecutorState::Running),
            ],
            "old is past the grace period, new is within it, done was reported and is dropped"
        );
        // The next listing without "new" (now past the grace period) deletes it; the deleted
        // "old" is terminal and is dropped.
        store.replace_all(1_100, vec![("other".to_string(), ExecutorState::Running)]);
        assert_eq!(
            names(store.current()),
            vec![
                ("new".to_string(), ExecutorState::Deleted),
                ("other".to_string(), ExecutorState::Running),
            ]
        );
    }

    #[test]
    fn a_full_sync_corrects_a_missed_event() {
        let mut store = SnapshotStore::new(100);
        store.update(0, "a", ExecutorState::Running);
        store.replace_all(
            10,
            vec![(
                "a".to_string(),
                ExecutorState::Failed {
                    code: 137,
                    caused_by_app: false,
                },
            )],
        );
        assert!(store
            .current()
            .get("a")
            .is_some_and(ExecutorState::is_terminal));
    }
}
