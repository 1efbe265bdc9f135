//! The monotonic clock read cheaply, for what is timed once per task: nanoseconds as a plain
//! `u64`, on the same clock as [`std::time::Instant`] (`CLOCK_MONOTONIC`).
//!
//! `Instant::now` reads the same clock, but each `duration_since` between two readings
//! normalises a pair of `timespec`s into a `Duration` through checked arithmetic: about 60
//! instructions per task where a task is timed (callgrind, `ci/cost`), a twentieth of an
//! executor's cost for a no-op task. Here a reading is one `clock_gettime` (a vDSO call, no
//! system call) and a multiply-add, and the time between two readings one subtraction.

/// Nanoseconds on the monotonic clock since an arbitrary origin (the same for every thread of
/// the process). Never goes back; two readings subtract to the time between them.
#[inline]
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable `timespec` that outlives the call, and
    // CLOCK_MONOTONIC is a clock every supported kernel has; `clock_gettime` writes only `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    (ts.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts.tv_nsec as u64)
}

/// Nanoseconds from `since` (a [`now_ns`] reading) to now; 0 if `since` is later.
#[inline]
pub fn elapsed_ns(since: u64) -> u64 {
    now_ns().saturating_sub(since)
}

/// Whole microseconds from `since` (a [`now_ns`] reading) to now: the `now_us` a sans-IO core
/// is fed, counted from an endpoint's epoch.
#[inline]
pub fn elapsed_us(since: u64) -> u64 {
    elapsed_ns(since) / 1_000
}

/// The earliest of some deadlines (`None`: that one is not set), `None` if none is. A plain
/// loop: an array's `into_iter().flatten().min()` costs about 90 instructions for four, and
/// loops ask this once per round.
#[inline]
pub fn earliest(deadlines: &[Option<u64>]) -> Option<u64> {
    let mut first = None;
    for &deadline in deadlines {
        first = match (first, deadline) {
            (Some(a), Some(b)) => Some(u64::min(a, b)),
            (a, b) => a.or(b),
        };
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn readings_never_go_back_and_agree_with_instant() {
        let (a, instant) = (now_ns(), Instant::now());
        let mut last = a;
        while instant.elapsed() < Duration::from_millis(5) {
            let now = now_ns();
            assert!(now >= last, "the clock went back: {now} after {last}");
            last = now;
        }
        let by_instant = instant.elapsed().as_nanos() as u64;
        let by_us = elapsed_ns(a);
        // The same clock: both spans cover the loop; they differ by the reads' own time.
        assert!(by_us >= 5_000_000, "{by_us} ns measured over at least 5 ms");
        assert!(
            by_us.abs_diff(by_instant) < 50_000_000,
            "{by_us} ns here against {by_instant} ns by Instant"
        );
        assert_eq!(elapsed_ns(u64::MAX), 0);
        assert_eq!(elapsed_us(u64::MAX), 0);
        assert!(elapsed_us(a) >= 5_000, "microseconds of the same span");
    }

    #[test]
    fn the_earliest_deadline_is_the_least_one_set() {
        assert_eq!(earliest(&[]), None);
        assert_eq!(earliest(&[None, None]), None);
        assert_eq!(earliest(&[None, Some(7), Some(3), None]), Some(3));
        assert_eq!(earliest(&[Some(0), Some(u64::MAX)]), Some(0));
    }
}
