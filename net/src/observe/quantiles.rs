//! Quantiles for the pages and the API, from what the driver's loop records: [`Fine`], a
//! log-linear histogram of microseconds (8 buckets per doubling, so a quantile is within 9%),
//! whose difference between two moments gives the quantiles of that interval (the live charts),
//! and [`Samples`], a bounded reservoir of one job's sampled times (its page's min, quartiles
//! and max, as Spark's stage page shows them).

use serde::Serialize;

/// Buckets per doubling.
const SUB: usize = 8;
/// Doublings covered (2^40 us is 12 days; longer lands in the last bucket).
const DOUBLINGS: usize = 40;
const BUCKETS: usize = SUB * DOUBLINGS;

/// A log-linear histogram of microseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fine {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl Default for Fine {
    fn default() -> Fine {
        Fine {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }
}

/// The bucket of `us`: below [`SUB`], `us` itself; from there, [`SUB`] buckets per doubling,
/// `(log2(us) - 2) * SUB` plus the three bits after the leading one. Without a branch (it runs
/// for every job): shifting `us` right by `shift = log2(us) - 3` leaves `SUB + those bits`, so
/// the bucket is `shift * SUB + (us >> shift)`, which is `us` itself when `shift` is 0.
#[inline]
fn bucket(us: u64) -> usize {
    let log = 63 - (us | 1).leading_zeros() as usize;
    let shift = log.saturating_sub(3);
    (shift * SUB + (us >> shift) as usize).min(BUCKETS - 1)
}

/// The middle of a bucket's range, in microseconds.
fn middle(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let log = i / SUB + 2;
    let sub = (i % SUB) as u64;
    let low = (SUB as u64 + sub) << (log - 3);
    low + (1u64 << (log - 3)) / 2
}

impl Fine {
    /// Records one observation.
    pub fn observe(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.total += 1;
    }

    /// Observations recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `q` quantile (0 to 1) of what was recorded since `earlier` (a copy of this one
    /// taken before), or `None` if nothing was.
    pub fn quantile_since(&self, earlier: &Fine, q: f64) -> Option<u64> {
        let total = self.total.checked_sub(earlier.total)?;
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (i, (now, then)) in self.counts.iter().zip(earlier.counts.iter()).enumerate() {
            seen += now - then;
            if seen >= rank {
                return Some(middle(i));
            }
        }
        None
    }

    /// p50, p90, p99 and the maximum since `earlier`.
    pub fn summary_since(&self, earlier: &Fine) -> Option<Summary> {
        Some(Summary {
            p50_us: self.quantile_since(earlier, 0.5)?,
            p90_us: self.quantile_since(earlier, 0.9)?,
            p99_us: self.quantile_since(earlier, 0.99)?,
            max_us: self.quantile_since(earlier, 1.0)?,
        })
    }
}

/// An interval's latencies (bucket middles, within 9%).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The median.
    pub p50_us: u64,
    /// The 90th percentile.
    pub p90_us: u64,
    /// The 99th percentile.
    pub p99_us: u64,
    /// The slowest.
    pub max_us: u64,
}

/// Values kept per job.
pub const SAMPLES_MAX: usize = 512;

/// A bounded reservoir of microsecond values (every value while there are at most
/// [`SAMPLES_MAX`], then a uniform sample of them).
#[derive(Debug, Clone, Default)]
pub struct Samples {
    values: Vec<u64>,
    seen: u64,
}

impl Samples {
    /// Empties the sample, keeping its room.
    pub fn clear(&mut self) {
        self.values.clear();
        self.seen = 0;
    }

    /// Whether no value was offered.
    pub fn is_empty(&self) -> bool {
        self.seen == 0
    }

    /// Offers one value; `salt` (the task's id, say) picks the slot it may replace.
    pub fn offer(&mut self, us: u64, salt: u64) {
        self.seen += 1;
        if self.values.len() < SAMPLES_MAX {
            self.values.push(us);
            return;
        }
        // Algorithm R with a hash of the salt for the random draw.
        let draw = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) % self.seen;
        if let Some(slot) = self.values.get_mut(draw as usize) {
            *slot = us;
        }
    }

    /// Min, quartiles and max of the sample, or `None` if it is empty.
    pub fn five(&self) -> Option<Five> {
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
        (!sorted.is_empty()).then(|| Five {
            min_us: at(0.0),
            p25_us: at(0.25),
            p50_us: at(0.5),
            p75_us: at(0.75),
            max_us: at(1.0),
            sampled: self.seen,
        })
    }
}

/// Min, quartiles and max of a sample, as Spark's stage page shows task times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Five {
    /// The least.
    pub min_us: u64,
    /// The 25th percentile.
    pub p25_us: u64,
    /// The median.
    pub p50_us: u64,
    /// The 75th percentile.
    pub p75_us: u64,
    /// The most.
    pub max_us: u64,
    /// Values it was drawn from.
    pub sampled: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets as first written (a branch for the small values).
    fn bucket_by_parts(us: u64) -> usize {
        if us < SUB as u64 {
            return us as usize;
        }
        let log = 63 - us.leading_zeros() as usize; // >= 3
        let sub = ((us >> (log - 3)) & (SUB as u64 - 1)) as usize;
        ((log - 2) * SUB + sub).min(BUCKETS - 1)
    }

    #[test]
    fn buckets_are_log_linear_without_a_branch() {
        let edges = (0..64).flat_map(|bit| {
            let power = 1u64 << bit;
            [
                power - 1,
                power,
                power + 1,
                power | (power >> 1),
                power | (power - 1),
            ]
        });
        for us in (0..100_000).chain(edges).chain([u64::MAX]) {
            assert_eq!(bucket(us), bucket_by_parts(us), "{us}");
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn fine_quantiles_are_within_nine_percent() {
        for us in [0, 1, 7, 8, 9, 15, 16, 100, 999, 1_000, 123_456, 10_000_000] {
            let mid = middle(bucket(us));
            let error = mid.abs_diff(us) as f64 / us.max(1) as f64;
            assert!(error <= 0.09 || us < 8 && mid == us, "{us} -> {mid}");
        }
        let mut h = Fine::default();
        let before = h.clone();
        for us in 1..=1000 {
            h.observe(us);
        }
        let s = h.summary_since(&before).unwrap();
        assert!((460..=540).contains(&s.p50_us), "{s:?}");
        assert!((900..=1000).contains(&s.p90_us), "{s:?}");
        assert!((950..=1050).contains(&s.max_us), "{s:?}");
        assert_eq!(h.summary_since(&h.clone()), None, "nothing since");
        h.observe(u64::MAX);
        assert_eq!(h.count(), 1001);
    }

    #[test]
    fn samples_stay_bounded_and_give_five_numbers() {
        let mut s = Samples::default();
        assert_eq!(s.five(), None);
        for i in 0..10_000u64 {
            s.offer(i, i);
        }
        assert_eq!(s.values.len(), SAMPLES_MAX);
        let five = s.five().unwrap();
        assert_eq!(five.sampled, 10_000);
        assert!(five.min_us < 500 && five.max_us > 9_500, "{five:?}");
        assert!((3_500..=6_500).contains(&five.p50_us), "{five:?}");
    }
}
