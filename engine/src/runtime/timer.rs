//! Per-loop timers: one-shot and periodic, cancellable, bounded in number.
//!
//! A binary heap of `(deadline, id)` orders the timers; cancelled timers leave a stale heap
//! entry behind that is skipped when it surfaces (and the heap is rebuilt if stale entries pile
//! up), so `cancel` is O(1) and the heap never grows past twice the live timer count plus one.
//! Times are nanoseconds on [`crate::clock`] (a loop reads the clock once per round and
//! compares plain integers, without `Instant`'s `timespec` arithmetic).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use super::IdMap;
use crate::clock;

/// Identifies a timer on its event loop; passed to [`Endpoint::on_timer`](super::Endpoint::on_timer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TimerId(pub u64);

/// Why a timer could not be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimerError {
    /// The loop already holds `timers_max` live timers.
    #[error("too many timers on this loop (limit {timers_max})")]
    TooMany {
        /// The configured limit.
        timers_max: usize,
    },
    /// A periodic timer needs a period above zero.
    #[error("a periodic timer needs a non-zero period")]
    ZeroPeriod,
}

struct Entry {
    endpoint: u64,
    /// Nanoseconds on [`clock::now_ns`]'s clock.
    deadline_ns: u64,
    period_ns: Option<u64>,
}

pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    live: IdMap<Entry>,
    next_id: u64,
    timers_max: usize,
}

impl Timers {
    pub(crate) fn new(timers_max: usize) -> Self {
        Self {
            heap: BinaryHeap::new(),
            live: IdMap::new(),
            next_id: 1,
            timers_max,
        }
    }

    pub(crate) fn add(
        &mut self,
        endpoint: u64,
        delay: Duration,
        period: Option<Duration>,
    ) -> Result<TimerId, TimerError> {
        if period == Some(Duration::ZERO) {
            return Err(TimerError::ZeroPeriod);
        }
        if self.live.len() >= self.timers_max {
            return Err(TimerError::TooMany {
                timers_max: self.timers_max,
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        // Saturating: a delay too large to add (`Duration::MAX`) is a deadline never reached.
        let deadline_ns = clock::now_ns().saturating_add(nanos(delay));
        self.live.insert(
            id,
            Entry {
                endpoint,
                deadline_ns,
                period_ns: period.map(nanos),
            },
        );
        self.heap.push(Reverse((deadline_ns, id)));
        Ok(TimerId(id))
    }

    /// Cancels a timer owned by `endpoint`; false if it was not live (fired, cancelled, or
    /// someone else's).
    pub(crate) fn cancel(&mut self, endpoint: u64, id: TimerId) -> bool {
        match self.live.get(id.0) {
            Some(e) if e.endpoint == endpoint => {
                self.live.remove(id.0);
                self.compact();
                true
            }
            _ => false,
        }
    }

    pub(crate) fn cancel_all(&mut self, endpoint: u64) {
        self.live.retain(|_, e| e.endpoint != endpoint);
        self.compact();
    }

    fn compact(&mut self) {
        if self.heap.len() > 2 * self.live.len() + 64 {
            self.heap = self
                .live
                .iter()
                .map(|(id, e)| Reverse((e.deadline_ns, id)))
                .collect();
        }
    }

    fn skip_stale(&mut self) {
        while let Some(Reverse((deadline_ns, id))) = self.heap.peek() {
            match self.live.get(*id) {
                Some(e) if e.deadline_ns == *deadline_ns => return,
                _ => {
                    self.heap.pop();
                }
            }
        }
    }

    /// The earliest live deadline (nanoseconds on [`clock::now_ns`]'s clock).
    pub(crate) fn next_deadline_ns(&mut self) -> Option<u64> {
        self.skip_stale();
        self.heap.peek().map(|Reverse((d, _))| *d)
    }

    /// Pops one timer due at `now_ns`: `(endpoint, timer)`. Periodic timers are re-armed.
    pub(crate) fn pop_due(&mut self, now_ns: u64) -> Option<(u64, TimerId)> {
        self.skip_stale();
        let Reverse((deadline_ns, id)) = *self.heap.peek()?;
        if deadline_ns > now_ns {
            return None;
        }
        self.heap.pop();
        let entry = self.live.get_mut(id)?;
        let endpoint = entry.endpoint;
        match entry.period_ns {
            Some(period_ns) => {
                let mut next = deadline_ns.saturating_add(period_ns);
                if next <= now_ns {
                    // Fell behind (a long handler): skip the missed ticks instead of bursting.
                    next = now_ns.saturating_add(period_ns);
                }
                entry.deadline_ns = next;
                self.heap.push(Reverse((next, id)));
            }
            None => {
                self.live.remove(id);
            }
        }
        Some((endpoint, TimerId(id)))
    }
}

/// Nanoseconds in `d`, saturating.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_shot_periodic_cancel_and_limit() {
        let mut t = Timers::new(3);
        let a = t.add(1, Duration::ZERO, None).unwrap();
        let b = t
            .add(1, Duration::ZERO, Some(Duration::from_secs(3600)))
            .unwrap();
        let c = t.add(2, Duration::ZERO, None).unwrap();
        assert!(matches!(
            t.add(1, Duration::ZERO, None),
            Err(TimerError::TooMany { timers_max: 3 })
        ));
        assert!(
            !t.cancel(1, c),
            "endpoint 1 cannot cancel endpoint 2's timer"
        );
        assert!(t.cancel(2, c));
        let now = clock::now_ns();
        let mut fired = Vec::new();
        while let Some(f) = t.pop_due(now) {
            fired.push(f);
        }
        fired.sort();
        assert_eq!(fired, vec![(1, a), (1, b)]);
        assert!(t.next_deadline_ns().is_some(), "periodic timer is re-armed");
        t.cancel_all(1);
        assert!(t.next_deadline_ns().is_none());
    }

    #[test]
    fn a_huge_delay_never_fires_and_a_late_period_skips_its_missed_ticks() {
        let mut t = Timers::new(4);
        let never = t.add(1, Duration::MAX, None).unwrap();
        assert_eq!(
            t.next_deadline_ns(),
            Some(u64::MAX),
            "saturated, not wrapped"
        );
        let tick = t
            .add(1, Duration::ZERO, Some(Duration::from_millis(1)))
            .unwrap();
        let late = clock::now_ns() + 10_000_000;
        assert_eq!(t.pop_due(late), Some((1, tick)));
        assert_eq!(t.pop_due(late), None, "one tick, not ten");
        assert_eq!(t.next_deadline_ns(), Some(late + 1_000_000));
        assert!(t.cancel(1, never));
    }
}
