//! Latencies counted in an HDR histogram's buckets at the cost of an index and an add.
//!
//! A run records one latency per task result on the driver's loop thread (`flint local`) or in
//! the load harness's observer, and `hdrhistogram`'s `saturating_record` costs about 120
//! instructions a value there (its bucket lookup through the histogram's fields, a clamp that
//! re-runs it, minimum, maximum and total). [`LatencyCounts`] keeps the same buckets (1 us to
//! one hour, 3 significant digits: 2,048 sub-buckets, halves doubling) as a flat array laid
//! out with constants, and builds the [`Histogram`] only when a summary or a log asks for it.
//! The histogram it builds is the one recording every value would have built: the same count
//! in every bucket, so every percentile, minimum, maximum and mean agree (a test checks them).
//! Building, adding and clearing them (once an interval in the load harness) walk only the
//! buckets latencies reached, not all 47,104: the top of those is found a block of counts at a
//! time, so that counting a latency does not track it.

use hdrhistogram::Histogram;

/// The lowest latency tracked, in microseconds.
pub const LOWEST_US: u64 = 1;
/// The highest latency tracked, in microseconds (one hour); longer ones count as this.
pub const HIGHEST_US: u64 = 3_600_000_000;
/// Significant decimal digits kept.
pub const SIGNIFICANT_DIGITS: u8 = 3;

/// log2 of half the sub-buckets of a bucket: 2,048 sub-buckets hold 3 significant digits.
const HALF_MAGNITUDE: u32 = 10;
/// Counts tested together when looking for the highest in use ([`LatencyCounts::used`]).
const USED_BLOCK: usize = 64;
/// Values below this share bucket 0 at unit resolution.
const SUB_BUCKET_MASK: u64 = (1 << (HALF_MAGNITUDE + 1)) - 1;

/// The histogram these counts stand for, empty.
pub fn empty_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)
        .unwrap_or_else(|_| unreachable!("constant bounds are valid"))
}

/// The index of `value`'s bucket in the counts (hdrhistogram's `index_for` with a unit
/// magnitude of 0 and 2,048 sub-buckets).
#[inline(always)]
fn index_of(value: u64) -> usize {
    let bucket = 64 - (HALF_MAGNITUDE + 1) - (value | SUB_BUCKET_MASK).leading_zeros();
    let sub_bucket = value >> bucket;
    (((bucket as u64 + 1) << HALF_MAGNITUDE) + sub_bucket - (1 << HALF_MAGNITUDE)) as usize
}

/// The lowest value of the bucket at `index` (hdrhistogram's `value_for`).
fn value_at(index: usize) -> u64 {
    let half = 1u64 << HALF_MAGNITUDE;
    let bucket = (index >> HALF_MAGNITUDE) as i64 - 1;
    let sub_bucket = (index as u64 & (half - 1)) + half;
    match bucket < 0 {
        true => sub_bucket - half,
        false => sub_bucket << bucket,
    }
}

/// Latency counts in [`empty_histogram`]'s buckets; see the module documentation.
#[derive(Debug, Clone)]
pub struct LatencyCounts {
    counts: Box<[u64]>,
    /// Latencies counted since the last [`clear`](Self::clear).
    total: u64,
}

impl Default for LatencyCounts {
    fn default() -> Self {
        LatencyCounts::new()
    }
}

impl LatencyCounts {
    /// No latencies.
    pub fn new() -> Self {
        // hdrhistogram's counts: a half-bucket below the first bucket and one per bucket.
        let len = (usize::from(empty_histogram().buckets()) + 1) << HALF_MAGNITUDE;
        debug_assert!(index_of(HIGHEST_US) < len);
        LatencyCounts {
            counts: vec![0; len].into_boxed_slice(),
            total: 0,
        }
    }

    /// Counts one latency of `us` microseconds; one past the counts' last bucket counts as
    /// [`HIGHEST_US`], as hdrhistogram's `saturating_record` does.
    #[inline]
    pub fn record_us(&mut self, us: u64) {
        let mut index = index_of(us);
        if index >= self.counts.len() {
            index = index_of(HIGHEST_US);
        }
        // A u64 count does not overflow at one latency per nanosecond for 500 years.
        self.counts[index] += 1;
        self.total += 1;
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// A bound on the counts in use: every count at or above it is 0. The end of the highest
    /// block of [`USED_BLOCK`] counts with a count in it (a block's test is one vectorised OR).
    fn used(&self) -> usize {
        if self.total == 0 {
            return 0;
        }
        let top = (self.counts.chunks(USED_BLOCK))
            .rposition(|block| block.iter().fold(0, |any, &count| any | count) != 0);
        top.map_or(0, |block| ((block + 1) * USED_BLOCK).min(self.counts.len()))
    }

    /// Counts `other`'s latencies here too, as if each had been recorded here.
    pub fn add(&mut self, other: &LatencyCounts) {
        let used = other.used();
        for (count, &more) in self.counts[..used].iter_mut().zip(&other.counts[..used]) {
            *count += more;
        }
        self.total += other.total;
    }

    /// The histogram recording each counted latency would have built.
    pub fn to_histogram(&self) -> Histogram<u64> {
        let mut histogram = empty_histogram();
        for (index, &count) in self.counts[..self.used()].iter().enumerate() {
            if count > 0 {
                histogram.saturating_record_n(value_at(index), count);
            }
        }
        histogram
    }

    /// Forgets every latency.
    pub fn clear(&mut self) {
        let used = self.used();
        self.counts[..used].fill(0);
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values at and around every power of two, every value of the first buckets, and a spread
    /// of others, up to past the last bucket.
    fn values() -> Vec<u64> {
        let mut values: Vec<u64> = (0..5_000).collect();
        for shift in 0..40 {
            let p = 1u64 << shift;
            values.extend([p - 1, p, p + 1, p + p / 3]);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(x % (HIGHEST_US * 2));
        }
        values.extend([HIGHEST_US - 1, HIGHEST_US, HIGHEST_US + 1, u64::MAX]);
        values
    }

    #[test]
    fn counts_build_the_histogram_that_recording_each_value_builds() {
        let mut direct = empty_histogram();
        let mut counts = LatencyCounts::new();
        for v in values() {
            direct.saturating_record(v);
            counts.record_us(v);
        }
        let built = counts.to_histogram();
        assert_eq!(built.len(), direct.len());
        assert_eq!(pairs(&built), pairs(&direct), "bucket by bucket");
        for q in [0.0, 0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(
                built.value_at_quantile(q),
                direct.value_at_quantile(q),
                "q {q}"
            );
        }
        assert_eq!((built.min(), built.max()), (direct.min(), direct.max()));
        assert_eq!(built.mean(), direct.mean());
    }

    /// The buckets and counts of `h`, in order.
    fn pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
        (h.iter_recorded())
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    #[test]
    fn added_counts_build_the_histogram_of_every_value_in_either() {
        let mut expected = empty_histogram();
        let mut parts = [
            LatencyCounts::new(),
            LatencyCounts::new(),
            LatencyCounts::new(),
        ];
        for (i, v) in values().into_iter().enumerate() {
            // Parts 0 and 2 small values, part 1 any: added in order, the sum's used part grows
            // with part 1 and must not shrink with part 2.
            let part = i % 3;
            let v = if part == 1 { v } else { v % 1_000 };
            expected.saturating_record(v);
            parts[part].record_us(v);
        }
        let mut sum = LatencyCounts::new();
        for part in &parts {
            sum.add(part);
        }
        let built = sum.to_histogram();
        assert_eq!(pairs(&built), pairs(&expected), "bucket by bucket");
        assert_eq!((built.len(), built.max()), (expected.len(), expected.max()));
        sum.clear();
        assert!(sum.is_empty());
        assert!(
            sum.counts.iter().all(|&c| c == 0),
            "clear empties every count"
        );
    }

    #[test]
    fn the_counts_in_use_cover_every_count() {
        let mut counts = LatencyCounts::new();
        assert_eq!(counts.used(), 0);
        for v in [1, 63, 64, 65, 2_047, 2_048, 70_000, HIGHEST_US, u64::MAX] {
            counts.record_us(v);
            let highest = counts.counts.iter().rposition(|&c| c > 0).unwrap();
            let used = counts.used();
            assert!(highest < used && used <= counts.counts.len(), "{v}: {used}");
            assert!(used - highest <= USED_BLOCK, "{v}: {used} for {highest}");
        }
        counts.clear();
        assert_eq!(counts.used(), 0);
        assert!(counts.counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn every_bucket_value_maps_back_to_its_index() {
        let len = LatencyCounts::new().counts.len();
        for index in 0..len {
            assert_eq!(index_of(value_at(index)), index, "index {index}");
        }
    }

    #[test]
    fn clear_forgets_and_counting_starts_again() {
        let mut counts = LatencyCounts::new();
        assert!(counts.is_empty());
        assert!(counts.to_histogram().is_empty());
        counts.record_us(7);
        counts.record_us(70_000);
        assert!(!counts.is_empty());
        counts.clear();
        assert!(counts.is_empty());
        assert!(counts.counts.iter().all(|&c| c == 0));
        counts.record_us(9);
        let h = counts.to_histogram();
        assert_eq!((h.len(), h.max()), (1, 9));
    }
}
