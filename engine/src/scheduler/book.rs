//! The executor book: who is registered, on which host, how many cores each has free, which task
//! attempts run where, and which executors are worth offering to.
//!
//! Executors live in a slab (slots are reused after removal). Each executor keeps its running
//! attempts in its own slab (`runs.rs`), so losing it costs time proportional to its own tasks.
//! Executors with free cores sit in one of two indexable sets:
//!
//! - `offerable`: worth offering; the scheduler walks it round-robin with a rotating cursor;
//! - `blocked`: the last offer found nothing for it (locality wait, exclusion, too few cores).
//!   Blocked executors are re-offered when new work appears (`unblock_all`) or when their own
//!   cores come back.
//!
//! Full executors are in neither set, so an assignment never scans idle or busy executors.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::hedge::ExecHedge;
use super::order::Cursor;
use super::runs::Runs;
use super::types::{ExecutorId, TaskLaunch};
use crate::hash::FxHashMap;

/// One running task attempt, as its executor's book sees it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    /// Cores it holds.
    pub cores: u32,
    /// When it was launched.
    pub started_us: u64,
    /// Its executor reported it RUNNING (before that it is launching: Spark's
    /// `TaskInfo.launching`, SPARK-39955).
    pub reported_running: bool,
    /// The run-time record of its function when its job hedges (`hedge.rs`), else
    /// [`NO_RECORD`]: hedging watches the runs that have one.
    pub record: u32,
    /// Hedging's threshold for it: overdue once it has run this long (micros).
    pub threshold_us: u64,
    /// A hedging check passed it over (counted once in `Stats::hedges_withheld`).
    pub withheld: bool,
}

impl Run {
    /// A run launched at `started_us` holding `cores`, hedged with `(record, threshold_us)`
    /// when its job hedges.
    pub fn new(cores: u32, started_us: u64, hedged: Option<(u32, u64)>) -> Run {
        let (record, threshold_us) = hedged.unwrap_or((NO_RECORD, 0));
        Run {
            cores,
            started_us,
            reported_running: false,
            record,
            threshold_us,
            withheld: false,
        }
    }

    /// Whether hedging watches it.
    pub fn hedged(&self) -> bool {
        self.record != NO_RECORD
    }

    /// When hedging counts it overdue.
    pub fn due_us(&self) -> u64 {
        self.started_us.saturating_add(self.threshold_us)
    }
}

/// [`Run::record`] of an attempt whose job does not hedge.
const NO_RECORD: u32 = u32::MAX;

/// Which offer set an executor is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Membership {
    Unlisted,
    Offerable(usize),
    Blocked(usize),
}

/// A registered executor.
#[derive(Debug)]
pub(crate) struct Exec {
    pub id: ExecutorId,
    pub host: u32,
    pub cores: u32,
    pub free: u32,
    /// Running attempts, each at the index its task record keeps (`runs.rs`).
    pub running: Runs,
    /// Globally excluded until then (0: not excluded).
    pub excluded_until_us: u64,
    /// Counted task failures on it since its last exclusion ended.
    pub failures: u32,
    /// Launches gathered during the current call, flushed as one `Output::Launch`.
    pub batch: Vec<TaskLaunch>,
    /// Slow start: the slots it may fill now (at most `cores`). It starts at
    /// `Config::slow_start_slots` and grows by one per attempt it finishes successfully, so an
    /// executor earns its slots and one that lies about its cores holds little.
    pub window: u32,
    /// When it last reported an attempt it held as final (or registered).
    pub progress_us: u64,
    /// It holds a straggler and has finished nothing since that attempt was launched: no new
    /// work until it reports a final state (see `speculation.rs`).
    pub stalled: bool,
    /// Its last assignment stopped at the cap on jobs asked: where the next one goes on.
    pub resume: Option<Resume>,
    /// What hedging watches of it (`hedge.rs`).
    pub hedge: ExecHedge,
    /// Draining (the lifecycle is about to delete it, or it got SIGTERM): never offered again;
    /// its running attempts go on (Spark's decommissioning). Its own state, apart from
    /// hedging's suspicion: it never ends.
    pub draining: bool,
    membership: Membership,
}

impl Exec {
    /// Slots an offer may fill now: free slots within the slow-start window (an idle executor
    /// may always take one task that fits its cores, so a task larger than the window runs),
    /// none while stalled, suspected or draining, one at a time while on probation.
    pub fn usable(&self) -> u32 {
        if self.stalled || self.hedge.suspected || self.draining {
            return 0;
        }
        let used = self.cores - self.free;
        if self.hedge.probation {
            // One attempt at a time while it is much slower than its peers (`hedge.rs`): all
            // its free cores while idle (an offer launches one task, then it is busy), so a
            // task needing several cores still fits.
            return if used == 0 { self.free } else { 0 };
        }
        if used == 0 {
            self.free
        } else {
            self.free.min(self.window.saturating_sub(used))
        }
    }
}

/// Where an executor's walk over the runnable jobs stopped at the cap on jobs asked, and what
/// held when the walk began at the start of the order (a cycle).
#[derive(Clone, Debug)]
pub(crate) struct Resume {
    /// The next walk goes on after this job.
    pub after: Cursor,
    /// [`Book::work_seq`] when the cycle began: new work since may make jobs already passed
    /// answer.
    pub work_seq: u64,
    /// The executor's usable slots when the cycle began: with more, jobs passed may fit now.
    pub usable: u32,
    /// `Order::moves` when the cycle began: a FAIR re-sort since may have hidden a job.
    pub moves: u64,
}

/// A host that executors run on (or that a task prefers), by index: jobs, executors and
/// exclusions keep the index, never the name. An index stays its host's while anything may
/// hold it; after that [`Book::sweep_hosts`] frees the record for another name, so the table
/// is bounded by what is in use, not by every name a job or an executor ever gave.
#[derive(Debug)]
pub(crate) struct Host {
    /// Globally excluded until then (0: not excluded).
    pub excluded_until_us: u64,
    /// Its executors currently excluded globally.
    pub excluded_executors: u32,
    /// Its registered executors.
    pub live: u32,
    /// The name it is interned under; `None` while the record is free.
    name: Option<Arc<str>>,
    /// Jobs with ids below this may hold its index in their exclusions: the next job id when
    /// an executor on it left (a task failing on an executor takes the executor's host index).
    held_below: u64,
}

impl Host {
    /// The name it is interned under; `None` while the record is free.
    #[cfg(test)]
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// Whether no executor and no exclusion holds it now.
    fn idle(&self, now_us: u64) -> bool {
        self.live == 0 && self.excluded_executors == 0 && self.excluded_until_us <= now_us
    }
}

/// Host records in use below which [`Book::sweep_hosts`] is never due.
pub(crate) const HOSTS_SWEEP_MIN: usize = 1024;

/// The executor book.
#[derive(Debug, Default)]
pub(crate) struct Book {
    execs: Vec<Option<Exec>>,
    free_slots: Vec<u32>,
    ids: FxHashMap<ExecutorId, u32>,
    /// The executor last found by id, and its slot: a batch of status updates comes from one
    /// executor, so most lookups skip the hash (cleared when that executor goes).
    last_found: Cell<Option<(ExecutorId, u32)>>,
    pub hosts: Vec<Host>,
    host_ids: FxHashMap<Arc<str>, u32>,
    /// Free host records, for the next new names.
    free_hosts: Vec<u32>,
    /// Host records at which a sweep is due ([`Book::hosts_sweep_due`]): at least
    /// [`HOSTS_SWEEP_MIN`], twice those in use after the last sweep, and past the table's
    /// length then (so its free records are taken first).
    hosts_sweep_at: usize,
    offerable: Vec<u32>,
    blocked: Vec<u32>,
    cursor: usize,
    /// Counts the times new work appeared ([`Book::unblock_all`]).
    pub work_seq: u64,
    /// Registered executors by their cores: cores to how many.
    by_cores: BTreeMap<u32, u32>,
    /// The largest key of `by_cores` (0 without executors).
    max_cores: u32,
}

impl Book {
    /// An empty book whose round-robin starts at a seeded offset.
    pub fn new(seed: u64) -> Book {
        Book {
            cursor: (seed % 1024) as usize,
            hosts_sweep_at: HOSTS_SWEEP_MIN,
            ..Book::default()
        }
    }

    /// Registered executors.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The cores of the largest registered executor (0 with none).
    #[inline]
    pub fn max_cores(&self) -> u32 {
        self.max_cores
    }

    /// The slot of a registered executor.
    #[inline]
    pub fn slot_of(&self, id: ExecutorId) -> Option<u32> {
        match self.last_found.get() {
            Some((last, slot)) if last == id => Some(slot),
            _ => {
                let slot = self.ids.get(&id).copied()?;
                self.last_found.set(Some((id, slot)));
                Some(slot)
            }
        }
    }

    /// The executor in `slot`.
    pub fn get(&self, slot: u32) -> Option<&Exec> {
        self.execs.get(slot as usize).and_then(Option::as_ref)
    }

    /// The executor in `slot`, mutably.
    pub fn get_mut(&mut self, slot: u32) -> Option<&mut Exec> {
        self.execs.get_mut(slot as usize).and_then(Option::as_mut)
    }

    /// All registered executors.
    pub fn iter(&self) -> impl Iterator<Item = &Exec> {
        self.execs.iter().flatten()
    }

    /// Every registered executor with its slot.
    #[cfg(debug_assertions)]
    pub fn slots(&self) -> impl Iterator<Item = (u32, &Exec)> {
        (0u32..)
            .zip(&self.execs)
            .filter_map(|(s, e)| Some((s, e.as_ref()?)))
    }

    /// All registered executors, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Exec> {
        self.execs.iter_mut().flatten()
    }

    /// The index of `name`, interning it (in a free record, if any).
    pub fn host_index(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.host_ids.get(name) {
            return i;
        }
        let name: Arc<str> = Arc::from(name);
        let record = Host {
            excluded_until_us: 0,
            excluded_executors: 0,
            live: 0,
            name: Some(name.clone()),
            held_below: 0,
        };
        let i = match self.free_hosts.pop() {
            Some(i) => {
                let Some(free) = self.hosts.get_mut(i as usize) else {
                    unreachable!("free host record {i} beyond the table");
                };
                debug_assert!(free.name.is_none(), "host record {i} listed free is in use");
                *free = record;
                i
            }
            None => {
                self.hosts.push(record);
                u32::try_from(self.hosts.len() - 1).expect("fewer than 2^32 hosts")
            }
        };
        self.host_ids.insert(name, i);
        i
    }

    /// An executor on host `i` left while the next job id was `next_job`: the jobs before it
    /// may hold the index (taken from the executor), so it is kept until they end.
    pub fn host_left(&mut self, i: u32, next_job: u64) {
        if let Some(h) = self.hosts.get_mut(i as usize) {
            h.held_below = h.held_below.max(next_job);
        }
    }

    /// Host records in use.
    pub fn hosts_in_use(&self) -> usize {
        self.hosts.len() - self.free_hosts.len()
    }

    /// Whether enough host records came into use since the last sweep for another (the
    /// table grew past its mark: its free records, if any, were all taken first).
    #[inline]
    pub fn hosts_sweep_due(&self) -> bool {
        self.hosts.len() >= self.hosts_sweep_at
    }

    /// Frees every host record nothing may hold any more: no executor registered on it, no
    /// exclusion in force, no active job that may hold it in its exclusions (`oldest_job`:
    /// the lowest active job id, `u64::MAX` with none), and not `held` by anything the caller
    /// knows of (the jobs' preference queues). The next sweep is due once twice the records
    /// left in use, and at least `next_at_least`, are in use. Returns the records freed.
    /// O(hosts).
    pub fn sweep_hosts(
        &mut self,
        now_us: u64,
        oldest_job: u64,
        held: impl Fn(u32) -> bool,
        next_at_least: usize,
    ) -> usize {
        let mut freed = 0;
        for (i, h) in (0u32..).zip(self.hosts.iter_mut()) {
            if h.name.is_none() || !h.idle(now_us) || h.held_below > oldest_job || held(i) {
                continue;
            }
            if let Some(name) = h.name.take() {
                self.host_ids.remove(&name);
            }
            *h = Host {
                excluded_until_us: 0,
                excluded_executors: 0,
                live: 0,
                name: None,
                held_below: 0,
            };
            self.free_hosts.push(i);
            freed += 1;
        }
        // Reused lowest first: the table's front stays dense.
        self.free_hosts.sort_unstable_by(|a, b| b.cmp(a));
        self.hosts_sweep_at = (2 * self.hosts_in_use())
            .max(next_at_least)
            .max(HOSTS_SWEEP_MIN)
            .max(self.hosts.len() + 1);
        freed
    }

    /// The host record for an index.
    pub fn host(&self, i: u32) -> Option<&Host> {
        self.hosts.get(i as usize)
    }

    /// Adds an executor (the caller checked the id is new) with a slow-start window of
    /// `window` slots and lists it as offerable.
    pub fn insert(
        &mut self,
        id: ExecutorId,
        host: u32,
        cores: u32,
        window: u32,
        now_us: u64,
    ) -> u32 {
        let exec = Exec {
            id,
            host,
            cores,
            free: cores,
            running: Runs::default(),
            excluded_until_us: 0,
            failures: 0,
            batch: Vec::new(),
            window: window.clamp(1, cores.max(1)),
            progress_us: now_us,
            stalled: false,
            resume: None,
            hedge: ExecHedge::new(now_us),
            membership: Membership::Unlisted,
            draining: false,
        };
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                if let Some(entry) = self.execs.get_mut(slot as usize) {
                    *entry = Some(exec);
                }
                slot
            }
            None => {
                self.execs.push(Some(exec));
                (self.execs.len() - 1) as u32
            }
        };
        self.ids.insert(id, slot);
        *self.by_cores.entry(cores).or_insert(0) += 1;
        self.max_cores = self.max_cores.max(cores);
        if let Some(h) = self.hosts.get_mut(host as usize) {
            h.live += 1;
        }
        self.make_offerable(slot);
        slot
    }

    /// Whether a host has a registered executor.
    pub fn host_live(&self, host: u32) -> bool {
        self.hosts.get(host as usize).is_some_and(|h| h.live > 0)
    }

    /// Removes an executor, returning its slot and record.
    pub fn remove(&mut self, id: ExecutorId) -> Option<(u32, Exec)> {
        let slot = self.ids.remove(&id)?;
        if self.last_found.get().is_some_and(|(last, _)| last == id) {
            self.last_found.set(None);
        }
        self.unlist(slot);
        let exec = self.execs.get_mut(slot as usize)?.take()?;
        match self.by_cores.get_mut(&exec.cores) {
            Some(1) => drop(self.by_cores.remove(&exec.cores)),
            Some(n) => *n -= 1,
            None => unreachable!("executor {id:?} of {} cores uncounted", exec.cores),
        }
        self.max_cores = self
            .by_cores
            .last_key_value()
            .map_or(0, |(&cores, _)| cores);
        if let Some(h) = self.hosts.get_mut(exec.host as usize) {
            assert!(h.live > 0, "host of a registered executor");
            h.live = h.live.saturating_sub(1);
        }
        self.free_slots.push(slot);
        Some((slot, exec))
    }

    fn set_membership(&mut self, slot: u32, m: Membership) {
        if let Some(e) = self.get_mut(slot) {
            e.membership = m;
        }
    }

    /// Takes the executor out of both offer sets.
    pub fn unlist(&mut self, slot: u32) {
        let Some(m) = self.get(slot).map(|e| e.membership) else {
            return;
        };
        let (set, pos) = match m {
            Membership::Unlisted => return,
            Membership::Offerable(p) => (&mut self.offerable, p),
            Membership::Blocked(p) => (&mut self.blocked, p),
        };
        if pos >= set.len() {
            return;
        }
        set.swap_remove(pos);
        let moved = set.get(pos).copied();
        let offerable = matches!(m, Membership::Offerable(_));
        if let Some(moved) = moved {
            let mm = if offerable {
                Membership::Offerable(pos)
            } else {
                Membership::Blocked(pos)
            };
            self.set_membership(moved, mm);
        }
        self.set_membership(slot, Membership::Unlisted);
    }

    /// Marks the executor draining and takes it out of both offer sets for good.
    pub fn drain(&mut self, slot: u32) {
        self.unlist(slot);
        if let Some(e) = self.get_mut(slot) {
            e.draining = true;
        }
    }

    /// Lists the executor as offerable (its cores came back, or it is new), unless it drains.
    pub fn make_offerable(&mut self, slot: u32) {
        match self.get(slot).map(|e| (e.membership, e.draining)) {
            Some((Membership::Offerable(_), _) | (_, true)) | None => {}
            Some(_) => {
                self.unlist(slot);
                self.offerable.push(slot);
                let pos = self.offerable.len() - 1;
                self.set_membership(slot, Membership::Offerable(pos));
            }
        }
    }

    /// Moves the executor to the blocked set (nothing to offer it for now).
    pub fn block(&mut self, slot: u32) {
        match self.get(slot).map(|e| (e.membership, e.draining)) {
            Some((Membership::Blocked(_), _) | (_, true)) | None => {}
            Some(_) => {
                self.unlist(slot);
                self.blocked.push(slot);
                let pos = self.blocked.len() - 1;
                self.set_membership(slot, Membership::Blocked(pos));
            }
        }
    }

    /// New work appeared: every blocked executor is worth offering again.
    pub fn unblock_all(&mut self) {
        self.work_seq = self.work_seq.wrapping_add(1);
        self.wake_all();
    }

    /// Offers every blocked executor again without new work (those set aside with a cursor
    /// go on with their walks).
    pub fn wake_all(&mut self) {
        while let Some(slot) = self.blocked.pop() {
            self.offerable.push(slot);
            let pos = self.offerable.len() - 1;
            self.set_membership(slot, Membership::Offerable(pos));
        }
    }

    /// Executors offerable now.
    pub fn offerable_len(&self) -> usize {
        self.offerable.len()
    }

    /// The next executor in round-robin order, if any is offerable.
    pub fn next_offerable(&mut self) -> Option<u32> {
        if self.offerable.is_empty() {
            return None;
        }
        if self.cursor >= self.offerable.len() {
            self.cursor %= self.offerable.len();
        }
        self.offerable.get(self.cursor).copied()
    }

    /// Whether the executor in `slot` is in the offerable set.
    pub fn offerable_contains(&self, slot: u32) -> bool {
        self.get(slot)
            .is_some_and(|e| matches!(e.membership, Membership::Offerable(_)))
    }

    /// Appends the offerable executors to `out`, from the cursor on (the round-robin order).
    pub fn offerable_into(&self, out: &mut Vec<u32>) {
        let n = self.offerable.len();
        if n == 0 {
            return;
        }
        let start = self.cursor % n;
        out.extend(self.offerable.iter().skip(start));
        out.extend(self.offerable.iter().take(start));
    }

    /// Moves the round-robin cursor past the current executor.
    pub fn advance(&mut self) {
        self.cursor = self.cursor.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sets(b: &Book) -> (Vec<u32>, Vec<u32>) {
        let mut o = b.offerable.clone();
        let mut k = b.blocked.clone();
        o.sort_unstable();
        k.sort_unstable();
        (o, k)
    }

    #[test]
    fn offer_sets_move_executors_and_keep_positions_consistent() {
        let mut b = Book::new(0);
        let h = b.host_index("h");
        let slots: Vec<u32> = (0..4)
            .map(|i| b.insert(ExecutorId(i), h, 2, 2, 0))
            .collect();
        assert_eq!(sets(&b), (vec![0, 1, 2, 3], vec![]));
        b.block(slots[1]);
        b.block(slots[3]);
        assert_eq!(sets(&b), (vec![0, 2], vec![1, 3]));
        b.unlist(slots[0]);
        assert_eq!(sets(&b), (vec![2], vec![1, 3]));
        b.make_offerable(slots[3]);
        assert_eq!(sets(&b), (vec![2, 3], vec![1]));
        b.unblock_all();
        assert_eq!(sets(&b), (vec![1, 2, 3], vec![]));
        // Every member's recorded position points back at it.
        for (pos, &s) in b.offerable.iter().enumerate() {
            assert_eq!(
                b.get(s).map(|e| e.membership),
                Some(Membership::Offerable(pos))
            );
        }
        // Removal frees the slot for reuse and drops the executor from the sets.
        let (slot, exec) = b.remove(ExecutorId(2)).expect("registered");
        assert_eq!((slot, exec.id), (2, ExecutorId(2)));
        assert_eq!(sets(&b), (vec![1, 3], vec![]));
        assert_eq!(b.insert(ExecutorId(9), h, 1, 1, 0), 2, "slot reused");
        assert_eq!(b.slot_of(ExecutorId(9)), Some(2));
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn a_gone_executor_is_not_found_by_its_id_even_just_after_a_lookup() {
        let mut b = Book::new(0);
        let h = b.host_index("h");
        for i in 0..3 {
            b.insert(ExecutorId(i), h, 1, 1, 0);
        }
        assert_eq!(b.slot_of(ExecutorId(2)), Some(2));
        assert_eq!(b.slot_of(ExecutorId(2)), Some(2), "found again");
        b.remove(ExecutorId(2)).expect("registered");
        assert_eq!(b.slot_of(ExecutorId(2)), None, "gone");
        // Its slot goes to another executor; it comes back in a new one.
        assert_eq!(b.insert(ExecutorId(7), h, 1, 1, 0), 2);
        assert_eq!(b.slot_of(ExecutorId(2)), None);
        assert_eq!(b.insert(ExecutorId(2), h, 1, 1, 0), 3);
        for _ in 0..2 {
            assert_eq!(b.slot_of(ExecutorId(2)), Some(3));
            assert_eq!(b.slot_of(ExecutorId(7)), Some(2));
            assert_eq!(b.slot_of(ExecutorId(0)), Some(0));
        }
        b.remove(ExecutorId(0)).expect("registered");
        assert_eq!(b.slot_of(ExecutorId(0)), None);
        assert_eq!(b.slot_of(ExecutorId(7)), Some(2), "others stay");
    }

    #[test]
    fn round_robin_visits_every_offerable_executor() {
        let mut b = Book::new(5);
        let h = b.host_index("h");
        for i in 0..3 {
            b.insert(ExecutorId(i), h, 1, 1, 0);
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            seen.push(b.next_offerable().expect("non-empty"));
            b.advance();
        }
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2]);
    }
}
