//! What "recent high percentile" means for hedging: per task function (its whole name, so
//! `sleep:5` and `sleep:500` are told apart), a small decaying histogram of how long its
//! successful attempts took from launch to result, as the driver saw them (queueing on the
//! executor included). Bounded: at most [`FUNCTIONS_MAX`] functions (later ones share one
//! record), 96 buckets each (4 per power of two from 1 us, so a percentile is known within a
//! quarter), halved every [`DECAY_SAMPLES`] samples so old behaviour fades. Recording is a few
//! instructions; a percentile is worked out once per [`RECOMPUTE_EVERY`] samples, or after a
//! sample over it (so it follows a load spike at once), and cached. So is the threshold hedging
//! makes of it under the settings last asked with (a launch's: [`Latencies::threshold_us`]),
//! until the percentile is worked out again.

use std::sync::Arc;

use super::types::HedgeConfig;
use crate::hash::FxHashMap;

/// Functions with a record of their own; more share the last one.
pub(super) const FUNCTIONS_MAX: usize = 1024;
/// Buckets per record: 4 per power of two, from 1 us to about 2^24 us (17 s), the last open.
const BUCKETS: usize = 96;
/// After this many samples every count is halved: the record is about the last few thousand.
const DECAY_SAMPLES: u32 = 4096;
/// The cached percentile is worked out again after this many samples.
const RECOMPUTE_EVERY: u32 = 64;

/// A record's index in [`Latencies`].
pub(super) type RecordId = u32;

/// One function's recent run times.
#[derive(Debug, Clone)]
struct Record {
    counts: [u32; BUCKETS],
    /// Samples in `counts` (after decay).
    total: u32,
    /// Samples since the percentile was cached.
    since_cached: u32,
    /// The cached percentile's bucket bound in micros, once `total` reached the minimum.
    cached_us: Option<u64>,
    /// The cached median, alongside.
    median_us: u64,
    /// The threshold of the settings last asked with, of the cached percentile (`None` again
    /// when that is worked out again). The settings are held, so the same pointer is the same
    /// settings (they are never changed in place).
    threshold: Option<(Arc<HedgeConfig>, u64)>,
}

impl Record {
    /// Halves every count: old behaviour fades.
    #[cold]
    fn decay(&mut self) {
        self.counts.iter_mut().for_each(|c| *c /= 2);
        self.total = self.counts.iter().sum();
    }

    /// Works the cached `percentile` and median out again (the memoized threshold goes).
    #[inline(never)]
    fn work_out(&mut self, percentile: f64) {
        self.since_cached = 0;
        self.cached_us = Some(percentile_us(&self.counts, self.total, percentile));
        self.median_us = percentile_us(&self.counts, self.total, 0.5);
        self.threshold = None;
    }
}

impl Default for Record {
    fn default() -> Self {
        Record {
            counts: [0; BUCKETS],
            total: 0,
            since_cached: 0,
            cached_us: None,
            median_us: 0,
            threshold: None,
        }
    }
}

/// The bucket of `us`: 4 per power of two (the two bits below the top one pick the quarter).
fn bucket_of(us: u64) -> usize {
    if us < 4 {
        return us as usize;
    }
    let top = 63 - us.leading_zeros() as usize; // >= 2
    let quarter = ((us >> (top - 2)) & 3) as usize;
    (top * 4 + quarter - 4).min(BUCKETS - 1)
}

/// The largest value in bucket `b` (the bound a percentile reports).
fn bucket_bound_us(b: usize) -> u64 {
    if b < 4 {
        return b as u64;
    }
    let (top, quarter) = ((b + 4) / 4, ((b + 4) % 4) as u64);
    ((4 + quarter + 1) << (top - 2)) - 1
}

/// Per-function run times (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Latencies {
    ids: FxHashMap<Arc<str>, RecordId>,
    records: Vec<Record>,
    /// The name asked last and its record: a job of one function over payloads shares one
    /// name, so the next job of that function finds its record by pointer, without hashing
    /// the name.
    last: Option<(Arc<str>, RecordId)>,
}

impl Latencies {
    /// The record of `function`, made if new (past [`FUNCTIONS_MAX`], the shared last one).
    /// The name asked last, by pointer, inlined where it is asked (each job of a hedged
    /// service asks it); the hash apart.
    #[inline]
    pub(super) fn id(&mut self, function: &Arc<str>) -> RecordId {
        if let Some((name, id)) = &self.last {
            if Arc::ptr_eq(name, function) {
                return *id;
            }
        }
        self.id_by_name(function)
    }

    /// [`id`](Self::id) of a name other than the one asked last: found by hashing it, or made.
    #[inline(never)]
    fn id_by_name(&mut self, function: &Arc<str>) -> RecordId {
        if let Some(&id) = self.ids.get(function) {
            self.last = Some((function.clone(), id));
            return id;
        }
        if self.records.len() >= FUNCTIONS_MAX {
            return (FUNCTIONS_MAX - 1) as RecordId;
        }
        let id = self.records.len() as RecordId;
        self.records.push(Record::default());
        self.ids.insert(function.clone(), id);
        self.last = Some((function.clone(), id));
        if self.records.len() == FUNCTIONS_MAX {
            tracing::warn!(
                "{FUNCTIONS_MAX} task functions have latency records: later ones share one"
            );
        }
        id
    }

    /// A successful attempt of `id`'s function took `us`. Inlined where successes are
    /// applied (a count or three); the decay and the working-out apart, as they are rare.
    #[inline]
    pub(super) fn record(&mut self, id: RecordId, us: u64, percentile: f64, min_samples: u32) {
        let Some(r) = self.records.get_mut(id as usize) else {
            unreachable!("latency record {id} was never made");
        };
        r.counts[bucket_of(us)] += 1;
        r.total += 1;
        r.since_cached += 1;
        if r.total >= DECAY_SAMPLES {
            r.decay();
        }
        // Again after every RECOMPUTE_EVERY samples, and at once after a sample over the
        // cached percentile (rare while nothing changes; quick to follow a load spike).
        let due = r.since_cached >= RECOMPUTE_EVERY || r.cached_us.is_none_or(|p| us > p);
        if due && r.total >= min_samples {
            r.work_out(percentile);
        }
    }

    /// The threshold `config` gives an attempt of `id`'s function: `of` its cached percentile
    /// (`None` before it has one), memoized until the percentile is worked out again or other
    /// settings ask. A service's launches all ask with the scheduler's settings between two
    /// workings-out (64 samples apart, or a sample over it), so `of` runs about once per
    /// working-out rather than per launch.
    #[inline]
    pub(super) fn threshold_us(
        &mut self,
        id: RecordId,
        config: &Arc<HedgeConfig>,
        of: impl FnOnce(Option<u64>) -> u64,
    ) -> u64 {
        let Some(r) = self.records.get_mut(id as usize) else {
            return of(None);
        };
        match &r.threshold {
            Some((asked, us)) if Arc::ptr_eq(asked, config) => *us,
            _ => {
                let us = of(r.cached_us);
                r.threshold = Some((config.clone(), us));
                us
            }
        }
    }

    /// Samples in `function`'s record (after decay), if it has one.
    #[cfg(test)]
    pub(super) fn samples(&self, function: &str) -> Option<u32> {
        let &id = self.ids.get(function)?;
        Some(self.records.get(id as usize)?.total)
    }

    /// The cached `percentile` of `id`'s run times, once it has enough samples.
    #[cfg(test)]
    pub(super) fn percentile_us(&self, id: RecordId) -> Option<u64> {
        self.records.get(id as usize)?.cached_us
    }

    /// The cached median of `id`'s run times, once it has enough samples.
    pub(super) fn median_us(&self, id: RecordId) -> Option<u64> {
        let r = self.records.get(id as usize)?;
        r.cached_us.map(|_| r.median_us)
    }
}

/// The bound of the bucket holding the `p` quantile of `counts` (`total` samples).
fn percentile_us(counts: &[u32; BUCKETS], total: u32, p: f64) -> u64 {
    debug_assert!((0.0..=1.0).contains(&p) && total > 0);
    let rank = ((f64::from(total) * p).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (b, &c) in counts.iter().enumerate() {
        seen += u64::from(c);
        if seen >= rank {
            return bucket_bound_us(b);
        }
    }
    bucket_bound_us(BUCKETS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_bound_what_they_hold() {
        let mut last = 0;
        for us in [
            0u64,
            1,
            3,
            4,
            5,
            7,
            8,
            9,
            15,
            16,
            100,
            1_000,
            65_535,
            1 << 20,
            1 << 23,
        ] {
            let b = bucket_of(us);
            assert!(b >= last, "{us}");
            last = b;
            assert!(bucket_bound_us(b) >= us, "{us} in bucket {b}");
            assert!(
                bucket_bound_us(b) <= us + us / 4 + 1,
                "{us}: a quarter at most"
            );
            if b > 0 {
                assert!(bucket_bound_us(b - 1) < us, "{us}");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn a_percentile_comes_once_there_are_enough_samples_and_follows_recent_ones() {
        let mut l = Latencies::default();
        let id = l.id(&Arc::from("f"));
        assert_eq!(l.id(&Arc::from("f")), id, "one record per name");
        for _ in 0..19 {
            l.record(id, 100, 0.99, 20);
        }
        assert_eq!(l.percentile_us(id), None, "19 samples are too few");
        l.record(id, 100, 0.99, 20);
        let p = l.percentile_us(id).expect("20 samples");
        assert!((100..=125).contains(&p), "{p}");
        // A slower regime takes over as the old samples decay.
        for _ in 0..3 * DECAY_SAMPLES {
            l.record(id, 10_000, 0.99, 20);
        }
        let p = l.percentile_us(id).expect("samples");
        assert!((10_000..=12_500).contains(&p), "{p}");
    }

    #[test]
    fn records_are_bounded() {
        let mut l = Latencies::default();
        for i in 0..FUNCTIONS_MAX + 10 {
            let id = l.id(&Arc::from(format!("f{i}")));
            assert!((id as usize) < FUNCTIONS_MAX);
        }
        assert_eq!(l.records.len(), FUNCTIONS_MAX);
    }

    #[test]
    fn a_name_finds_its_record_by_pointer_or_by_value() {
        let mut l = Latencies::default();
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let (ia, ib) = (l.id(&a), l.id(&b));
        assert_ne!(ia, ib);
        // The same names again, shared (the cached pointer) and copied (by value).
        assert_eq!(l.id(&b), ib);
        assert_eq!(l.id(&Arc::from("a")), ia);
        assert_eq!(l.id(&a), ia);
        assert_eq!(l.id(&Arc::from("b")), ib);
        assert_eq!(l.records.len(), 2);
    }
}
