//! The sharing order of the runnable jobs, kept sorted as it changes so an offer finds its
//! first candidate at once: under FIFO one ordered set of all runnable jobs by FIFO key
//! (priority, then submission); under FAIR an ordered set of the pools that have runnable jobs,
//! by Spark's `FairSchedulingAlgorithm`, and per pool an ordered set of its runnable jobs (by
//! FIFO key, or by running cores over weight in a FAIR pool).
//!
//! Every set is a B-tree, but for the FIFO set ([`Fifo`]: a queue, with a B-tree for the keys
//! that come out of order): listing or unlisting a job, and re-keying a pool or a job whose
//! running cores changed, costs O(log n) (a handful of node visits at 100,000 jobs; O(1) for
//! the usual FIFO listing at the back and unlisting at the front), never a shift of the jobs
//! behind it; the first candidate is the leftmost entry. Keys are stored here
//! (per pool, and per job slot while listed) so an entry is always removed under the key it was
//! inserted with.

use std::cmp::Ordering;
use std::collections::{btree_set, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

use super::fifo::{self, Fifo};

/// A job's FIFO key: higher priority first (negated), then submission (its id).
pub(crate) type FifoKey = (i64, u64);

/// `num / den`, compared exactly (`den > 0`): no rounding, and equal ratios tie.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ratio {
    pub num: u64,
    pub den: u64,
}

impl Ratio {
    /// Zero: the share key of every job in a FIFO pool.
    pub const ZERO: Ratio = Ratio { num: 0, den: 1 };

    /// `num / den`, with a zero `den` taken as 1.
    pub fn new(num: u64, den: u64) -> Ratio {
        Ratio {
            num,
            den: den.max(1),
        }
    }
}

impl Ord for Ratio {
    fn cmp(&self, other: &Ratio) -> Ordering {
        let a = u128::from(self.num) * u128::from(other.den);
        let b = u128::from(other.num) * u128::from(self.den);
        a.cmp(&b)
    }
}

impl PartialOrd for Ratio {
    fn partial_cmp(&self, other: &Ratio) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ratio {
    fn eq(&self, other: &Ratio) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ratio {}

/// A pool's place in the FAIR order (Spark's `FairSchedulingAlgorithm`): pools running fewer
/// cores than their min share first, by running over min share; then the others by running
/// over weight; then by name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PoolKey {
    /// At or over its min share (`false`, needy, sorts first).
    satisfied: bool,
    share: Ratio,
    name: Arc<str>,
}

impl PoolKey {
    /// The key of a pool running `running_cores` with these settings (`weight` at least 1).
    pub fn new(running_cores: u64, min_share: u32, weight: u32, name: &Arc<str>) -> PoolKey {
        let needy = running_cores < u64::from(min_share);
        PoolKey {
            satisfied: !needy,
            share: if needy {
                Ratio::new(running_cores, u64::from(min_share))
            } else {
                Ratio::new(running_cores, u64::from(weight))
            },
            name: Arc::clone(name),
        }
    }
}

/// A job's place inside its pool: its share (running cores over weight in a FAIR pool, zero in
/// a FIFO pool), then its FIFO key.
pub(crate) type JobKey = (Ratio, FifoKey);

/// A place in the sharing order to resume a walk after (see [`Order::iter_after`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Cursor {
    /// After the job with this FIFO key.
    Fifo(FifoKey),
    /// After this job (key, slot) in this pool (key, id).
    Fair((PoolKey, u32), (JobKey, u32)),
}

/// A walk over the runnable jobs' slots in sharing order ([`Order::iter_after`]): a plain
/// type rather than a chain of adapters, so starting one is a few instructions (every offer
/// starts one).
pub(crate) enum Walk<'a> {
    /// FIFO, from the start or after a key.
    Fifo(fifo::Iter<'a>),
    /// FAIR: the rest of the pool the walk resumes in, then the pools after it, each pool's
    /// jobs in turn.
    Fair {
        order: &'a Order,
        in_pool: Option<btree_set::Range<'a, (JobKey, u32)>>,
        pools: btree_set::Range<'a, (PoolKey, u32)>,
        jobs: Option<btree_set::Iter<'a, (JobKey, u32)>>,
    },
}

impl Iterator for Walk<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        match self {
            Walk::Fifo(jobs) => jobs.next(),
            Walk::Fair {
                order,
                in_pool,
                pools,
                jobs,
            } => {
                if let Some(rest) = in_pool {
                    if let Some((_, slot)) = rest.next() {
                        return Some(*slot);
                    }
                    *in_pool = None;
                }
                loop {
                    if let Some((_, slot)) = jobs.as_mut().and_then(Iterator::next) {
                        return Some(*slot);
                    }
                    let (_, pool) = pools.next()?;
                    *jobs = order.entries.get(*pool as usize).map(|e| e.jobs.iter());
                }
            }
        }
    }
}

/// One pool's side of the FAIR order.
#[derive(Debug)]
struct PoolEntry {
    /// Its current key (where it sorts in [`Order::pools`] while it has runnable jobs).
    key: PoolKey,
    /// Its runnable jobs: (key, job slot).
    jobs: BTreeSet<(JobKey, u32)>,
}

/// The runnable jobs in sharing order. See the [module documentation](self).
#[derive(Debug)]
pub(crate) struct Order {
    fair: bool,
    /// Every runnable job by FIFO key (the FIFO order; under FAIR, for walks over all of them).
    fifo: Fifo,
    /// FAIR: the pools with runnable jobs, in FAIR order: (key, pool id).
    pools: BTreeSet<(PoolKey, u32)>,
    /// FAIR: by pool id.
    entries: Vec<PoolEntry>,
    /// FAIR: by job slot, the pool and key a listed job is filed under.
    filed: Vec<Option<(u32, JobKey)>>,
    /// Counts the times a listed pool or job moved (FAIR re-sorts; FIFO keys never change): a
    /// walk resumed across a move may have missed a job.
    pub moves: u64,
}

impl Order {
    /// An empty order; `fair` picks FAIR sharing (pools), else FIFO.
    pub fn new(fair: bool) -> Order {
        Order {
            fair,
            fifo: Fifo::default(),
            pools: BTreeSet::new(),
            entries: Vec::new(),
            filed: Vec::new(),
            moves: 0,
        }
    }

    /// Whether this is a FAIR order (pools), not FIFO.
    pub fn fair(&self) -> bool {
        self.fair
    }

    /// Whether no job is listed.
    pub fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }

    /// Runnable jobs (tests).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.fifo.len()
    }

    /// The runnable jobs' slots in FIFO order (tests).
    #[cfg(test)]
    pub fn fifo(&self) -> impl Iterator<Item = u32> + '_ {
        self.fifo.iter_after(None)
    }

    /// Under FIFO, a key at or after every listed job's (None under FAIR, or with none
    /// listed).
    pub fn last_fifo_key(&self) -> Option<FifoKey> {
        match self.fair {
            true => None,
            false => self.fifo.last_key(),
        }
    }

    /// The first runnable job under FIFO (None under FAIR, or with none listed): what a walk
    /// from the start asks first, without the walk.
    pub fn first_fifo(&self) -> Option<u32> {
        if self.fair {
            return None;
        }
        self.fifo.first()
    }

    /// The runnable jobs' slots in sharing order (FIFO, or FAIR: pools, then jobs per pool),
    /// from the start or after `from`. Finding the first costs O(log n) (from the start under
    /// FIFO, the leftmost leaf). Under FAIR, a walk resumed in a pool that was re-sorted since
    /// goes on after that pool's new place (it may see a job twice or miss one until the next
    /// walk from the start; [`Order::moves`] tells).
    pub fn iter_after(&self, from: Option<&Cursor>) -> Walk<'_> {
        match (self.fair, from) {
            (false, Some(Cursor::Fifo(key))) => Walk::Fifo(self.fifo.iter_after(Some(*key))),
            (false, _) => Walk::Fifo(self.fifo.iter_after(None)),
            (true, from) => {
                let (pool_from, in_pool) = match from {
                    Some(Cursor::Fair(pool, job)) => {
                        let rest = self
                            .entries
                            .get(pool.1 as usize)
                            .map(|e| e.jobs.range((Excluded(*job), Unbounded)));
                        (Excluded(pool.clone()), rest)
                    }
                    _ => (Unbounded, None),
                };
                Walk::Fair {
                    order: self,
                    in_pool,
                    pools: self.pools.range((pool_from, Unbounded)),
                    jobs: None,
                }
            }
        }
    }

    /// Where the listed job `slot` (FIFO key `fifo`) is now, to resume a walk after it.
    pub fn cursor_at(&self, slot: u32, fifo: FifoKey) -> Cursor {
        let filed = self.filed.get(slot as usize).copied().flatten();
        match filed.and_then(|(pool, key)| Some((pool, key, self.entries.get(pool as usize)?))) {
            Some((pool, key, e)) if self.fair => Cursor::Fair((e.key.clone(), pool), (key, slot)),
            _ => Cursor::Fifo(fifo),
        }
    }

    /// Sets pool `pool`'s key (a new pool, or its running cores changed), re-sorting it.
    pub fn set_pool(&mut self, pool: u32, key: PoolKey) {
        if !self.fair {
            return;
        }
        let i = pool as usize;
        if self.entries.len() <= i {
            self.entries.resize_with(i + 1, || PoolEntry {
                key: key.clone(),
                jobs: BTreeSet::new(),
            });
        }
        let Some(e) = self.entries.get_mut(i) else {
            unreachable!("pool {pool} entry was just made");
        };
        if e.key == key {
            return;
        }
        let old = std::mem::replace(&mut e.key, key.clone());
        if !e.jobs.is_empty() {
            let removed = self.pools.remove(&(old, pool));
            assert!(removed, "pool {pool} with runnable jobs is listed");
            self.pools.insert((key, pool));
            self.moves = self.moves.wrapping_add(1);
        }
    }

    /// Lists a job (slot `slot`, FIFO key `fifo`, in `pool` with share `share`) as runnable.
    /// Its pool's key must have been set.
    pub fn insert(&mut self, slot: u32, fifo: FifoKey, pool: u32, share: Ratio) {
        let fresh = self.fifo.insert(fifo, slot);
        assert!(fresh, "job slot {slot} listed twice");
        if !self.fair {
            return;
        }
        let Some(e) = self.entries.get_mut(pool as usize) else {
            unreachable!("job slot {slot} in pool {pool} without a key");
        };
        if e.jobs.is_empty() {
            self.pools.insert((e.key.clone(), pool));
        }
        e.jobs.insert(((share, fifo), slot));
        let i = slot as usize;
        if self.filed.len() <= i {
            self.filed.resize(i + 1, None);
        }
        if let Some(f) = self.filed.get_mut(i) {
            *f = Some((pool, (share, fifo)));
        }
    }

    /// Unlists a runnable job.
    pub fn remove(&mut self, slot: u32, fifo: FifoKey) {
        let had = self.fifo.remove(fifo);
        assert_eq!(had, Some(slot), "job slot {slot} listed under its FIFO key");
        if !self.fair {
            return;
        }
        let Some((pool, key)) = self.filed.get_mut(slot as usize).and_then(Option::take) else {
            unreachable!("listed job slot {slot} has no pool");
        };
        let Some(e) = self.entries.get_mut(pool as usize) else {
            unreachable!("job slot {slot} filed in unknown pool {pool}");
        };
        let removed = e.jobs.remove(&(key, slot));
        assert!(removed, "job slot {slot} filed in its pool");
        if e.jobs.is_empty() {
            self.pools.remove(&(e.key.clone(), pool));
        }
    }

    /// A job's share changed (its running cores): re-sorts it in its pool if it is listed.
    pub fn set_share(&mut self, slot: u32, share: Ratio) {
        let Some(Some((pool, key))) = self.filed.get_mut(slot as usize) else {
            return;
        };
        if key.0 == share {
            return;
        }
        let old = std::mem::replace(key, (share, key.1));
        let Some(e) = self.entries.get_mut(*pool as usize) else {
            unreachable!("job slot {slot} filed in unknown pool {pool}");
        };
        let removed = e.jobs.remove(&(old, slot));
        assert!(removed, "job slot {slot} filed in its pool");
        e.jobs.insert(((share, old.1), slot));
        self.moves = self.moves.wrapping_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn ratios_compare_exactly_and_equal_ratios_tie() {
        assert_eq!(Ratio::new(1, 3), Ratio::new(2, 6));
        assert!(Ratio::new(1, 3) < Ratio::new(1, 2));
        assert!(Ratio::new(u64::MAX - 1, u64::MAX) < Ratio::new(1, 1));
        assert_eq!(
            Ratio::new(5, 0),
            Ratio::new(5, 1),
            "a zero denominator counts as 1"
        );
    }

    #[test]
    fn needy_pools_go_first_then_by_share_then_by_name() {
        let needy = PoolKey::new(1, 4, 1, &name("z"));
        let idle = PoolKey::new(0, 0, 1, &name("b"));
        let idle_a = PoolKey::new(0, 0, 1, &name("a"));
        let busy = PoolKey::new(3, 0, 2, &name("a"));
        assert!(needy < idle_a, "under its min share");
        assert!(idle_a < idle, "same share: by name");
        assert!(idle < busy, "0/1 < 3/2");
        assert!(PoolKey::new(3, 0, 4, &name("x")) < PoolKey::new(1, 0, 1, &name("a")));
    }

    #[test]
    fn fifo_order_is_priority_then_id_whatever_the_insertion_order() {
        let mut o = Order::new(false);
        o.insert(0, (0, 5), 0, Ratio::ZERO);
        o.insert(1, (0, 2), 0, Ratio::ZERO);
        o.insert(2, (-1, 9), 0, Ratio::ZERO);
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [2, 1, 0]);
        o.remove(1, (0, 2));
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [2, 0]);
        o.insert(1, (0, 2), 0, Ratio::ZERO);
        assert_eq!(
            o.iter_after(None).collect::<Vec<_>>(),
            [2, 1, 0],
            "listed again in place"
        );
    }

    #[test]
    fn fair_order_follows_pool_and_job_shares_as_they_change() {
        let mut o = Order::new(true);
        o.set_pool(0, PoolKey::new(0, 0, 1, &name("a")));
        o.set_pool(1, PoolKey::new(0, 0, 1, &name("b")));
        o.insert(10, (0, 1), 0, Ratio::ZERO);
        o.insert(11, (0, 2), 0, Ratio::ZERO);
        o.insert(20, (0, 3), 1, Ratio::ZERO);
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [10, 11, 20]);
        // Job 10 runs a core: it sorts after job 11 in pool a, and pool a after pool b.
        o.set_share(10, Ratio::new(1, 1));
        o.set_pool(0, PoolKey::new(1, 0, 1, &name("a")));
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [20, 11, 10]);
        // Pool b empties: it leaves the order, and comes back when a job is listed again.
        o.remove(20, (0, 3));
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [11, 10]);
        o.set_pool(1, PoolKey::new(5, 0, 1, &name("b")));
        o.insert(20, (0, 3), 1, Ratio::ZERO);
        assert_eq!(o.iter_after(None).collect::<Vec<_>>(), [11, 10, 20]);
        assert_eq!(o.fifo().collect::<Vec<_>>(), [10, 11, 20]);
        o.set_share(99, Ratio::ZERO); // not listed: nothing to do
        assert_eq!(o.len(), 3);
    }

    #[test]
    fn a_walk_resumes_after_its_cursor_in_both_orders() {
        let mut o = Order::new(false);
        for (slot, id) in [(0, 1), (1, 2), (2, 3)] {
            o.insert(slot, (0, id), 0, Ratio::ZERO);
        }
        let c = o.cursor_at(0, (0, 1));
        assert_eq!(o.iter_after(Some(&c)).collect::<Vec<_>>(), [1, 2]);
        o.remove(0, (0, 1));
        assert_eq!(
            o.iter_after(Some(&c)).collect::<Vec<_>>(),
            [1, 2],
            "a cursor at a job gone since still resumes after its key"
        );
        let mut o = Order::new(true);
        o.set_pool(0, PoolKey::new(0, 0, 1, &name("a")));
        o.set_pool(1, PoolKey::new(0, 0, 1, &name("b")));
        o.insert(10, (0, 1), 0, Ratio::ZERO);
        o.insert(11, (0, 2), 0, Ratio::ZERO);
        o.insert(20, (0, 3), 1, Ratio::ZERO);
        let c = o.cursor_at(10, (0, 1));
        assert_eq!(o.iter_after(Some(&c)).collect::<Vec<_>>(), [11, 20]);
        let c = o.cursor_at(11, (0, 2));
        assert_eq!(
            o.iter_after(Some(&c)).collect::<Vec<_>>(),
            [20],
            "on to the next pool"
        );
        let c = o.cursor_at(20, (0, 3));
        assert_eq!(o.iter_after(Some(&c)).count(), 0);
    }
}
