//! Hedged tasks and fast suspicion of sick executors ([`HedgeConfig`]; "The Tail at Scale",
//! Dean and Barroso). Spark's speculation (`speculation.rs`) waits for a quantile of a job's
//! tasks and 100 ms; a service's 4-task job that normally ends in 50 us never meets either, so
//! one frozen executor holds its requests until the heartbeat timeout. Hedging works per
//! attempt, for a job of any size:
//!
//! - Each launch is watched on its executor with a threshold, which its
//!   [`Run`](super::book::Run) keeps: the recent `percentile` of its function's successful
//!   run times times `factor`, at least `floor_us` (`cold_us` until the function has
//!   `min_samples` successes; `latency.rs` keeps the run times). An attempt still running
//!   past it is *overdue*.
//! - An overdue attempt gets one copy (queued as a speculative copy: the first result wins, the
//!   other attempt is killed), while tokens last: each first launch adds `copy_ratio` of one,
//!   up to `burst`, so copies stay a small fraction of attempts in steady state.
//! - An executor holding an overdue attempt that has sent nothing (no status of any kind, no
//!   heartbeat: [`ExecHedge::heard`]) for that attempt's threshold (and `silence_min_us`, 20 ms
//!   by default: a process preempted on a busy machine is silent that long without being sick)
//!   is *suspected*: it gets no new
//!   launches and its overdue attempts are copied even while the cluster looks slow, until it
//!   is heard again. Losing it for good still takes the heartbeat timeout (the driver's).
//! - Outliers: each executor has a score, the moving average over 10 ms periods of how many
//!   times slower than their function's median its successes were. An executor scoring over 4 while its
//!   peers do not (at most half of the executors) is on *probation*: one attempt at a time, so
//!   a slow executor (a noisy neighbour, a throttled container) takes little of the work, and
//!   what it takes is copied after `floor_us` rather than the percentile threshold, instead of
//!   a third of every job waiting on it (Envoy's outlier detection is the model). Under 2 it is
//!   off probation.
//! - An executor holding an overdue attempt that has finished nothing since it was launched
//!   (wedged, though it may still heartbeat) is *stalled*, as speculation's rule says, only
//!   sooner: no new work until it reports a final state.
//! - No copy storms: a load spike slows every attempt, and the percentile follows it (it moves
//!   once a hundredth of the recent successes are slower); until it has, while more than half
//!   of the executors hold overdue attempts the cluster is slow (a load spike, not a sick
//!   executor), and copies of attempts on executors that are not suspected are withheld: they
//!   would only add load.
//!
//! Cost: a launch books its threshold in its run (the executor's slab of running attempts,
//! `runs.rs`, which it is booked in anyway) and, when its executor has no check pending, files
//! one in the check set ([`Checks`]); a success records one sample and moves its executor's
//! score, if it is a sample ([`sampled`]: every success of a job's first 64 tasks, one in 8
//! past them, so a big job's millions of successes a second cost an eighth as much here and a
//! record still holds thousands of recent ones). Checks run only at the earliest watched
//! deadline: each looks at the running attempts of the executors whose check is due
//! (O(attempts running there), bounded by their slots), copies the overdue ones and files the
//! next check at the earliest deadline of the others. An executor whose attempts end in time
//! is looked at about once per threshold, whatever number of attempts it ran meanwhile.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use super::book::Book;
use super::job::Job;
use super::latency::{Latencies, RecordId};
use super::runs::Runs;
use super::slots::JobSlots;
use super::speculation::queue_copy;
use super::types::{ExecutorId, HedgeConfig, Stats, TaskId};
use crate::ids::IdMap;

/// An executor's successes are averaged per period of this long (micros), and its score is
/// the moving average of those periods: a burst of late successes (a preempted process on a
/// busy machine finishing its queue) is one sample, a sustained slowness is many.
const SCORE_PERIOD_US: u64 = 10_000;
/// Periods an executor's score is averaged over.
const SCORE_WINDOW: f64 = 16.0;
/// Periods before a score counts.
const SCORE_MIN: u32 = 8;
/// One slow success counts as at most this many times the median.
const SCORE_RATIO_MAX: f64 = 16.0;

/// A score over this (successes this many times slower than their functions' medians) puts
/// an executor on probation; under [`PROBATION_BELOW`] takes it off.
const PROBATION_ABOVE: f64 = 4.0;
const PROBATION_BELOW: f64 = 2.0;
/// While an executor holds overdue attempts it is looked at again this often (micros).
const RECHECK_US: u64 = 10_000;

/// Every task of a job below this index is a sample of its function's run times and its
/// executor's score ([`sampled`]); past it, one in [`SAMPLE_EVERY`].
const SAMPLE_ALL: u32 = 64;
/// Past [`SAMPLE_ALL`] tasks, one task in this many is a sample.
const SAMPLE_EVERY: u32 = 8;

/// Whether the success of the task at `index` in its job is a sample: it teaches its function's
/// run-time record (`latency.rs`) and moves its executor's score. Every task of a small job is
/// one (a service's jobs), one in [`SAMPLE_EVERY`] of a big one: its tasks end by the million
/// while a record keeps the last few thousand samples, so the rest would tell it little more.
/// Which ones is a multiplicative hash of the index, not `index % 8`: tasks handed out in turn
/// to 8 executors would make every sample one executor's, and the others' scores never move.
pub(super) fn sampled(index: u32) -> bool {
    const _: () = assert!(SAMPLE_EVERY == 8, "the hash keeps 3 bits");
    index < SAMPLE_ALL || index.wrapping_mul(0x9E37_79B9) >> 29 == 0
}

/// The threshold of an attempt under `config` of a function whose recent `percentile` of run
/// times is `p` (`None` before it has enough samples): `factor` times it, or `cold_us`, and at
/// least `floor_us`.
fn threshold_of(config: &HedgeConfig, p: Option<u64>) -> u64 {
    match p {
        Some(p) => f64_us(us_f64(p) * config.factor).max(config.floor_us),
        None => config.cold_us.max(config.floor_us),
    }
}

/// Micros as `f64`, through `i64`: one instruction on x86-64 where `u64` takes six, and run
/// times are far below 2^63 micros (larger ones count as 2^63).
fn us_f64(us: u64) -> f64 {
    us.min(i64::MAX as u64) as i64 as f64
}

/// `f64` micros back, through `i64` (negative and NaN give 0, too large gives 2^63).
fn f64_us(us: f64) -> u64 {
    (us as i64).max(0) as u64
}

/// What hedging keeps per executor.
#[derive(Debug)]
pub(crate) struct ExecHedge {
    /// When it last sent anything the scheduler hears of (a status update, a heartbeat).
    heard_us: u64,
    /// Holds overdue attempts and was silent as long: no new launches (see the module docs).
    pub suspected: bool,
    /// Its last check found overdue attempts (counted in [`Hedging::overdue_execs`]).
    overdue: bool,
    /// How much slower than their function's median its recent successes took: a moving
    /// average over about [`SCORE_WINDOW`] periods of [`SCORE_PERIOD_US`], of each period's
    /// mean ratio; the periods counted; the current period's start, sum and count.
    score: f64,
    scored: u32,
    period: (u64, f64, u32),
    /// Much slower than its peers: one attempt at a time until it is not (see the module docs).
    pub probation: bool,
}

impl ExecHedge {
    /// An executor registered at `now_us`.
    pub fn new(now_us: u64) -> ExecHedge {
        ExecHedge {
            heard_us: now_us,
            suspected: false,
            overdue: false,
            score: 1.0,
            scored: 0,
            period: (now_us, 0.0, 0),
            probation: false,
        }
    }

    /// Whether an attempt it runs is overdue at `now_us`.
    fn any_overdue(running: &Runs, now_us: u64) -> bool {
        running.values().any(|r| r.hedged() && r.due_us() <= now_us)
    }

    /// The executor sent something at `now_us`; whether that ended a suspicion.
    pub fn heard(&mut self, now_us: u64) -> bool {
        self.heard_us = self.heard_us.max(now_us);
        std::mem::replace(&mut self.suspected, false)
    }
}

/// What a check found: jobs given a first copy to queue (to list as runnable), executors newly
/// suspected (to set aside), whether any copy was queued.
#[derive(Debug, Default)]
pub(super) struct Sweep {
    pub runnable: Vec<u32>,
    pub suspected: Vec<u32>,
    pub copies: usize,
}

/// The scheduler's hedging state (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Hedging {
    /// Run times per function.
    latencies: Latencies,
    /// When executors' running attempts are next looked at.
    checks: Checks,
    /// Copy tokens (see [`HedgeConfig::copy_ratio`]); the bucket starts full.
    tokens: Option<f64>,
    /// Executors whose last check found overdue attempts.
    overdue_execs: usize,
    /// Executors on probation.
    probation_execs: usize,
    /// The least silence that suspects an executor ([`HedgeConfig::silence_min_us`]).
    silence_min_us: u64,
}

impl Hedging {
    /// Hedging under the scheduler's `config` (jobs may bring their own settings; the
    /// executor-wide ones come from here, or the defaults).
    pub fn new(config: Option<&HedgeConfig>) -> Hedging {
        let defaults = HedgeConfig::default();
        Hedging {
            silence_min_us: config.unwrap_or(&defaults).silence_min_us,
            ..Hedging::default()
        }
    }

    /// The record of `function`'s run times.
    #[inline]
    pub fn record_of(&mut self, function: &Arc<str>) -> RecordId {
        self.latencies.id(function)
    }

    /// Samples in `function`'s run-time record (after decay), if it has one.
    #[cfg(test)]
    pub fn samples(&self, function: &str) -> Option<u32> {
        self.latencies.samples(function)
    }

    /// The threshold of an attempt of a function with record `record` under `config`
    /// ([`threshold_of`], memoized in the record: `latency.rs`).
    #[inline]
    pub fn threshold_us(&mut self, config: &Arc<HedgeConfig>, record: RecordId) -> u64 {
        (self.latencies).threshold_us(record, config, |p| threshold_of(config, p))
    }

    /// A successful attempt of record `record`'s function took `us`.
    #[inline]
    pub fn succeeded(&mut self, config: &HedgeConfig, record: RecordId, us: u64) {
        (self.latencies).record(record, us, config.percentile, config.min_samples);
    }

    /// An attempt launched on executor `e` (in `slot`), overdue at `due_us`, is watched: the
    /// executor's check is filed for then, unless one comes sooner.
    pub fn launched(&mut self, e: &super::book::Exec, slot: u32, due_us: u64) {
        if self.checks.at(slot).is_none_or(|check| check > due_us) {
            self.checks.file(slot, e.id, due_us);
        }
    }

    /// A launch that is not a copy adds `ratio` of a copy token, up to `burst`.
    pub fn earn(&mut self, ratio: f64, burst: u32) {
        let burst = f64::from(burst);
        let tokens = self.tokens.get_or_insert(burst);
        *tokens = (*tokens + ratio).min(burst);
    }
    /// When the next check is due.
    pub fn next_check_us(&self) -> Option<u64> {
        self.checks.first()
    }

    /// Executor `e` (in `slot`) runs nothing now: nothing of it to watch, no check to wake
    /// for (an idle driver sleeps).
    pub fn idle(&mut self, e: &mut super::book::Exec, slot: u32) {
        debug_assert!(e.running.is_empty());
        self.checks.clear(slot);
        self.count_overdue(&mut e.hedge, false);
    }

    /// The executor that was in `slot` left: it has no check, and no longer counts as overdue
    /// or on probation.
    pub fn executor_left(&mut self, slot: u32, h: &ExecHedge) {
        self.checks.clear(slot);
        self.overdue_execs -= usize::from(h.overdue);
        self.probation_execs -= usize::from(h.probation);
    }

    /// An attempt of record `record`'s function succeeded on `e` after `took_us`, with
    /// `executors` registered: its score moves, and it goes on probation (or off it).
    pub fn finished(
        &mut self,
        e: &mut super::book::Exec,
        record: RecordId,
        (now_us, took_us): (u64, u64),
        executors: usize,
        stats: &mut Stats,
    ) {
        let Some(median_us) = self.latencies.median_us(record) else {
            return;
        };
        let h = &mut e.hedge;
        let ratio = us_f64(took_us) / us_f64(median_us.max(1));
        let (start_us, sum, n) = &mut h.period;
        *sum += ratio.min(SCORE_RATIO_MAX);
        *n += 1;
        if now_us < start_us.saturating_add(SCORE_PERIOD_US) {
            return;
        }
        let mean = *sum / f64::from(*n);
        h.period = (now_us, 0.0, 0);
        h.score += (mean - h.score) / SCORE_WINDOW;
        h.scored = h.scored.saturating_add(1);
        if !h.probation && h.scored >= SCORE_MIN && h.score > PROBATION_ABOVE {
            // At most half of the executors: a cluster that is slow everywhere has no outlier.
            if (self.probation_execs + 1) * 2 <= executors {
                h.probation = true;
                self.probation_execs += 1;
                stats.probations += 1;
                tracing::debug!(executor = ?e.id, score = h.score, "executor on probation");
            }
        } else if h.probation && h.score < PROBATION_BELOW {
            h.probation = false;
            self.probation_execs -= 1;
        }
    }

    /// Looks at the executors whose check is due at `now_us`: copies their overdue attempts
    /// (within the tokens, unless the cluster is slow), suspects the silent ones. Which of them
    /// hold overdue attempts is settled for all first, so the first one looked at at the onset
    /// of a cluster-wide slowdown is not copied before the others count.
    pub fn check(
        &mut self,
        now_us: u64,
        book: &mut Book,
        job_slots: &IdMap<u32>,
        jobs: &mut JobSlots,
        stats: &mut Stats,
    ) -> Sweep {
        let mut due = Vec::new();
        while let Some((slot, id)) = self.checks.pop_due(now_us) {
            let Some(e) = book.get_mut(slot).filter(|e| e.id == id) else {
                unreachable!("a check of executor {id:?} that left slot {slot}");
            };
            let overdue = ExecHedge::any_overdue(&e.running, now_us);
            self.count_overdue(&mut e.hedge, overdue);
            due.push(slot);
        }
        let mut sweep = Sweep::default();
        let executors = book.len();
        for slot in due {
            let Some(e) = book.get_mut(slot) else {
                unreachable!("executor slot {slot} emptied during a check");
            };
            let found = self.check_executor(now_us, e, executors, (job_slots, jobs), stats);
            // Only attempts of active jobs count.
            self.count_overdue(&mut e.hedge, found.overdue > 0);
            if found.suspected || found.stalled {
                sweep.suspected.push(slot);
            }
            sweep.copies += found.copies.len();
            sweep.runnable.extend(found.copies.into_iter().flatten());
            // While it holds overdue attempts of active jobs it is looked at again: tokens may
            // have come back, and it must stop counting as overdue once they end. Its silence
            // is looked at again when it would be long enough to suspect it (so an executor
            // that keeps talking while holding an ended job's attempt wakes no idle driver).
            let recheck = (found.overdue > 0).then(|| now_us.saturating_add(RECHECK_US));
            let wake = [found.next_due_us, recheck, found.suspect_at_us];
            if let Some(next) = wake.into_iter().flatten().min() {
                debug_assert!(next > now_us, "a check due in the past");
                self.checks.file(slot, e.id, next);
            }
        }
        sweep
    }

    fn count_overdue(&mut self, h: &mut ExecHedge, overdue: bool) {
        match (h.overdue, overdue) {
            (false, true) => self.overdue_execs += 1,
            (true, false) => self.overdue_execs -= 1,
            _ => {}
        }
        h.overdue = overdue;
    }

    /// One executor's check (see [`Hedging::check`]).
    fn check_executor(
        &mut self,
        now_us: u64,
        e: &mut super::book::Exec,
        executors: usize,
        (job_slots, jobs): (&IdMap<u32>, &mut JobSlots),
        stats: &mut Stats,
    ) -> Overdue {
        let super::book::Exec {
            running,
            hedge: h,
            progress_us,
            stalled,
            ..
        } = e;
        // The cluster is slow when more than half of the executors hold overdue attempts.
        let slow_cluster = self.overdue_execs * 2 > executors;
        let silent_us = now_us.saturating_sub(h.heard_us);
        let silence_min_us = self.silence_min_us;
        let mut found = Overdue::default();
        for (key, run) in running.iter_mut() {
            if !run.hedged() {
                continue;
            }
            if run.due_us() > now_us {
                let due_us = run.due_us();
                found.next_due_us = Some(found.next_due_us.map_or(due_us, |t| t.min(due_us)));
                continue;
            }
            // Any attempt it holds past its threshold counts for suspicion, also one whose job
            // ended (its kill unanswered): the executor still has not spoken.
            let silence_us = run.threshold_us.max(silence_min_us);
            if !h.suspected && silent_us >= silence_us {
                h.suspected = true;
                found.suspected = true;
                stats.suspicions += 1;
            } else if !h.suspected {
                let at = h.heard_us.saturating_add(silence_us);
                found.suspect_at_us = Some(found.suspect_at_us.map_or(at, |t: u64| t.min(at)));
            }
            let task = key.task;
            let Some(job) = job_of(job_slots, jobs, task) else {
                continue; // an ended job's attempt: its kill was sent, nothing to copy
            };
            found.overdue += 1;
            // It has finished nothing since this attempt was launched (a wedged executor that
            // still heartbeats): stalled, no new work until it reports a final state.
            if *progress_us <= run.started_us && !std::mem::replace(stalled, true) {
                found.stalled = true;
            }
            let Some(t) = job.tasks.get(task.index() as usize) else {
                unreachable!("an executor holds {task}, beyond its job");
            };
            if t.speculated || t.running_attempts() > 1 {
                continue;
            }
            let tokens = self.tokens.get_or_insert(0.0);
            if (slow_cluster && !h.suspected) || *tokens < 1.0 {
                if !std::mem::replace(&mut run.withheld, true) {
                    stats.hedges_withheld += 1;
                }
                continue;
            }
            if let Some((slot, listed)) = queue_copy(job_slots, jobs, task) {
                *tokens -= 1.0;
                stats.hedges += 1;
                found.copies.push((!listed).then_some(slot));
            }
        }
        found
    }
}

/// Stale entries [`Checks`] keeps beyond as many as its live ones before it compacts: few, so
/// that its heap stays about as small as the executors checked (each push and pop walks it).
const STALE_CHECKS_MAX: usize = 16;

/// When each executor's running attempts are next looked at: at most one check per executor
/// slot. A binary heap of (time, slot, id) orders them; moving or clearing a slot's check
/// leaves its old entry behind, stale (`filed` says which entry of a slot is live), and stale
/// entries leave when they come to the top, so the top is always live (an idle driver is
/// woken by no check it cleared), or at a compaction once they outnumber the live ones (as
/// the runtime's timers do, `runtime/timer.rs`). Filing and clearing cost a heap push and
/// pops of a heap about as large as the executors checked, where an ordered set cost two
/// B-tree updates for each executor that idles between small jobs.
#[derive(Debug, Default)]
struct Checks {
    heap: BinaryHeap<Reverse<(u64, u32, ExecutorId)>>,
    /// Per executor slot: its live check's time and the executor's id.
    filed: Vec<Option<(u64, ExecutorId)>>,
    /// Slots with a live check.
    live: usize,
}

impl Checks {
    /// When slot `slot`'s check is due, if it has one.
    fn at(&self, slot: u32) -> Option<u64> {
        self.filed
            .get(slot as usize)
            .copied()
            .flatten()
            .map(|(at, _)| at)
    }

    /// The earliest check's time.
    fn first(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Files executor `id`'s check (in `slot`) at `at`, in place of the one it had.
    fn file(&mut self, slot: u32, id: ExecutorId, at: u64) {
        let i = slot as usize;
        if self.filed.len() <= i {
            self.filed.resize(i + 1, None);
        }
        if self.filed[i].replace((at, id)).is_none() {
            self.live += 1;
        }
        self.heap.push(Reverse((at, slot, id)));
        if self.heap.len() > 2 * self.live + STALE_CHECKS_MAX {
            let filed = &self.filed;
            (self.heap).retain(|Reverse((at, slot, id))| Self::is_live(filed, *at, *slot, *id));
        }
        // The entry it replaced, if any, was later (a check only moves earlier): the top is
        // still live.
        debug_assert!(self
            .heap
            .peek()
            .is_some_and(|Reverse((at, slot, id))| Self::is_live(&self.filed, *at, *slot, *id)));
    }

    /// Slot `slot` has no check any more (its executor idles or left).
    fn clear(&mut self, slot: u32) {
        if let Some(f) = self.filed.get_mut(slot as usize) {
            if f.take().is_some() {
                self.live -= 1;
                self.drop_stale();
            }
        }
    }

    /// The slot and executor of a check due at `now_us`, taken (the slot has none after).
    fn pop_due(&mut self, now_us: u64) -> Option<(u32, ExecutorId)> {
        let &Reverse((at, slot, id)) = self.heap.peek()?;
        if at > now_us {
            return None;
        }
        self.heap.pop();
        debug_assert!(
            Self::is_live(&self.filed, at, slot, id),
            "a stale check on top"
        );
        self.filed[slot as usize] = None;
        self.live -= 1;
        self.drop_stale();
        Some((slot, id))
    }

    fn is_live(filed: &[Option<(u64, ExecutorId)>], at: u64, slot: u32, id: ExecutorId) -> bool {
        filed.get(slot as usize) == Some(&Some((at, id)))
    }

    /// Pops stale entries off the top.
    fn drop_stale(&mut self) {
        while let Some(&Reverse((at, slot, id))) = self.heap.peek() {
            if Self::is_live(&self.filed, at, slot, id) {
                break;
            }
            self.heap.pop();
        }
    }
}

/// What one executor's check found.
#[derive(Debug, Default)]
struct Overdue {
    /// Overdue attempts still running.
    overdue: usize,
    /// Copies queued now, each with its job's slot if that job was not listed as runnable.
    copies: Vec<Option<u32>>,
    /// When its first attempt not yet overdue becomes so.
    next_due_us: Option<u64>,
    /// It was suspected by this check.
    suspected: bool,
    /// It was found stalled by this check (holds an overdue attempt, finished nothing since
    /// it was launched).
    stalled: bool,
    /// It holds an overdue attempt and is not suspected (yet): when its silence would be long
    /// enough to suspect it, if it stays silent.
    suspect_at_us: Option<u64>,
}

/// The job of `task`, if active.
fn job_of<'a>(job_slots: &IdMap<u32>, jobs: &'a mut JobSlots, task: TaskId) -> Option<&'a mut Job> {
    let slot = *job_slots.get(task.job().0)?;
    jobs.get_mut(slot as usize)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{f64_us, sampled, threshold_of, us_f64, Checks, Hedging, SAMPLE_ALL};
    use crate::scheduler::types::{ExecutorId, HedgeConfig};

    #[test]
    fn a_memoized_threshold_is_the_one_worked_out_whatever_settings_ask_in_turn() {
        let mut h = Hedging::default();
        let record = h.record_of(&Arc::from("f"));
        let a = Arc::new(HedgeConfig::default());
        let b = Arc::new(HedgeConfig {
            factor: 3.5,
            floor_us: 700,
            cold_us: 90_000,
            min_samples: 5,
            ..HedgeConfig::default()
        });
        // The same settings in another allocation: memoized apart, the same thresholds.
        let a2 = Arc::new(HedgeConfig::clone(&a));
        let expected =
            |h: &Hedging, c: &HedgeConfig| threshold_of(c, h.latencies.percentile_us(record));
        // Cold, then a percentile moved by slow samples (at once) and by decay and every 64
        // samples (between them), asked by each in turn, some more than once.
        for i in 0..5_000u64 {
            let us = match i % 97 {
                0 => 50_000 + i,
                _ => 100 + (i % 13) * 40 + (i / 1_000) * 300,
            };
            h.succeeded(&b, record, us);
            for c in [&a, &b, &a, &a2, &b, &a] {
                let want = expected(&h, c);
                assert_eq!(h.threshold_us(c, record), want, "sample {i}");
            }
        }
        assert_ne!(
            h.threshold_us(&a, record),
            h.threshold_us(&b, record),
            "the settings give different thresholds"
        );
    }

    #[test]
    fn samples_are_one_in_eight_past_the_first_tasks_whichever_executors_take_them_in_turn() {
        assert!((0..SAMPLE_ALL).all(sampled), "every task of a small job");
        // Tasks handed out in turn to `n` executors: each executor's share is sampled about
        // one in 8, so every executor's score moves.
        for n in 1..=16u32 {
            for executor in 0..n {
                let taken = (SAMPLE_ALL..SAMPLE_ALL + 64_000).filter(|i| i % n == executor);
                let (count, samples) =
                    taken.fold((0u32, 0u32), |(c, s), i| (c + 1, s + u32::from(sampled(i))));
                let share = f64::from(samples) / f64::from(count);
                assert!(
                    (0.10..=0.15).contains(&share),
                    "executor {executor} of {n}: {samples} of {count} sampled"
                );
            }
        }
    }

    #[test]
    fn checks_come_due_in_time_order_and_a_moved_or_cleared_one_never_does() {
        let (a, b) = (ExecutorId(1), ExecutorId(2));
        let mut c = Checks::default();
        c.file(0, a, 10);
        c.file(1, b, 20);
        c.clear(0);
        assert_eq!(c.first(), Some(20), "a cleared check is not the first");
        c.file(0, a, 30);
        c.file(0, a, 5);
        assert_eq!((c.at(0), c.first()), (Some(5), Some(5)), "moved earlier");
        assert_eq!(c.pop_due(4), None);
        assert_eq!(c.pop_due(5), Some((0, a)));
        assert_eq!(c.at(0), None, "taken");
        assert_eq!(c.pop_due(100), Some((1, b)));
        assert_eq!(c.pop_due(100), None, "the check moved from 30 never comes");
        assert_eq!(c.first(), None, "nothing left to wake for");
        // The slot's next executor.
        c.file(0, b, 40);
        c.clear(0);
        assert_eq!(c.first(), None);
    }

    #[test]
    fn stale_checks_behind_a_live_one_stay_bounded() {
        let mut c = Checks::default();
        c.file(0, ExecutorId(1), 1);
        // An executor idling between small jobs: its check filed and cleared, over and over,
        // each behind the first.
        for t in 0..10_000 {
            c.file(1, ExecutorId(2), 10 + t);
            c.clear(1);
            // At most twice the live checks (two at most here) plus the stale allowance.
            assert!(
                c.heap.len() <= 2 * 2 + super::STALE_CHECKS_MAX,
                "{} entries",
                c.heap.len()
            );
        }
        assert_eq!(c.pop_due(u64::MAX), Some((0, ExecutorId(1))));
        assert_eq!((c.first(), c.heap.len()), (None, 0));
    }

    #[test]
    fn micros_go_to_f64_and_back_within_range_and_saturate_outside_it() {
        for us in [0, 1, 999, 1_000_000, 1 << 40] {
            assert_eq!(f64_us(us_f64(us)), us);
        }
        assert_eq!(
            us_f64(u64::MAX),
            i64::MAX as f64,
            "past 2^63 counts as 2^63"
        );
        assert_eq!(f64_us(-5.0), 0);
        assert_eq!(f64_us(f64::NAN), 0);
        assert_eq!(f64_us(1e30), i64::MAX as u64);
        assert_eq!(f64_us(2.5 * 1_000.0), 2_500);
    }
}
