//! The job table: each active job's record in a slot, addressed by the slot's index (the
//! scheduler's `job_slots` find a slot by job id), and each ended job's record left in its
//! slot, vacant, for the next job there to be built over. A record is about 500 bytes: building
//! a new one, dropping every field of the old and passing its small vectors through a spare
//! list cost about a tenth of a one-task job's instructions, where vacating one clears only
//! what the job changed and keeps its small vectors in place.
//!
//! A vacant record holds no task, payload or function, and its counts and flags are those of
//! a new job ([`Job::vacate`]); what a new job sets (its id, pool, tasks, settings, counts of
//! pending tasks) is written over it ([`Scheduler::build_job`](super)). Its last job's
//! settings stay: shared (`Arc`s), most often the scheduler's defaults, which a new job
//! inheriting them keeps there as they are (no count taken and given back, nothing compared
//! when the record says it holds the defaults). Of its last job's classes of queues, a lone
//! one with nothing queued stays, for the next job of one function over payloads to write its
//! own over ([`Job::enqueue_fresh`]): a one-task job pushes and pops none. A vector kept is
//! small (at most [`KEPT_CAPACITY_MAX`] elements): a big job's go back to the
//! allocator. The table never shrinks; its slots are bounded by the active jobs at once.

use std::collections::VecDeque;

use super::job::{Job, JobCounters, Level, Queues};
use super::payloads::Payloads;
use super::types::{JobId, JobToken};

/// The id a vacant record carries: no job's (a job's id is below 2^32).
const VACANT: JobId = JobId(u64::MAX);

/// The largest vector a vacant record keeps, in elements.
pub(super) const KEPT_CAPACITY_MAX: usize = 8;

/// The job table. See the [module documentation](self).
#[derive(Debug, Default)]
pub(crate) struct JobSlots {
    records: Vec<Job>,
}

impl JobSlots {
    /// The active job in `slot`.
    #[inline]
    pub fn get(&self, slot: usize) -> Option<&Job> {
        self.records.get(slot).filter(|job| job.id != VACANT)
    }

    /// The active job in `slot`, to change.
    #[inline]
    pub fn get_mut(&mut self, slot: usize) -> Option<&mut Job> {
        self.records.get_mut(slot).filter(|job| job.id != VACANT)
    }

    /// The job in `slot`, known active by the caller (a slot the scheduler's own records
    /// name: its line, its job index, a launch or a success it books). Only debug builds
    /// check the record is not vacant: a job's path looks its record up several times, and
    /// [`get`](Self::get)'s vacancy check on each is a load and a branch that never fails
    /// there. A slot beyond the table still panics.
    #[inline]
    pub fn live(&self, slot: u32) -> &Job {
        let job = &self.records[slot as usize];
        debug_assert!(
            job.id != VACANT,
            "job slot {slot} of an active job is vacant"
        );
        job
    }

    /// [`live`](Self::live), to change.
    #[inline]
    pub fn live_mut(&mut self, slot: u32) -> &mut Job {
        let job = &mut self.records[slot as usize];
        debug_assert!(
            job.id != VACANT,
            "job slot {slot} of an active job is vacant"
        );
        job
    }

    /// The active jobs, in slot order, with their slots.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Job)> {
        (0u32..)
            .zip(&self.records)
            .filter(|(_, job)| job.id != VACANT)
    }

    /// The slots, active or vacant.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// A new slot at the end, vacant.
    pub fn push_vacant(&mut self) -> u32 {
        self.records.push(Job::vacant());
        u32::try_from(self.records.len() - 1).unwrap_or(u32::MAX)
    }

    /// The vacant record in `slot`, for a new job to be built over.
    #[inline]
    pub fn vacant_mut(&mut self, slot: u32) -> &mut Job {
        match self.records.get_mut(slot as usize) {
            Some(job) if job.id == VACANT => job,
            Some(job) => unreachable!("job slot {slot} is {:?}'s", job.id),
            None => unreachable!("job slot {slot} beyond the table"),
        }
    }
}

/// Empties `v`, keeping its allocation when it is small.
#[inline]
fn clear_small<T>(v: &mut Vec<T>) {
    if v.capacity() > KEPT_CAPACITY_MAX {
        *v = Vec::new();
    } else {
        v.clear();
    }
}

/// [`clear_small`] for elements most of which hold nothing to drop (`bare`): those are let go
/// of without their drop code running (a one-class job's queues hold no allocation), the
/// others dropped.
#[inline]
fn clear_small_bare<T>(v: &mut Vec<T>, bare: impl Fn(&T) -> bool) {
    if v.capacity() > KEPT_CAPACITY_MAX {
        *v = Vec::new();
        return;
    }
    while let Some(x) = v.pop() {
        if bare(&x) {
            std::mem::forget(x);
        }
    }
}

impl Job {
    /// A vacant record (see the [module documentation](self)).
    pub(super) fn vacant() -> Job {
        Job {
            id: VACANT,
            token: JobToken(0),
            pool: 0,
            weight: 1,
            priority: 0,
            tasks: Vec::new(),
            task_count: 0,
            payloads: Payloads::default(),
            function: None,
            functions: Vec::new(),
            prefs: Vec::new(),
            keep_results: false,
            result_bytes_max: 0,
            result_bytes: 0,
            pending: 0,
            running: 0,
            running_cores: 0,
            final_count: 0,
            classes: Vec::new(),
            has_exec_prefs: false,
            has_host_prefs: false,
            live_exec_keys: 0,
            live_host_keys: 0,
            level: Level::Any,
            level_since_us: 0,
            last_progress_us: 0,
            exclusion: None,
            durations_us: Vec::new(),
            durations_dirty: false,
            quantile_reached: false,
            median_cache: (0, 0),
            speculatable: VecDeque::new(),
            reasons: Default::default(),
            doomed: false,
            delay_rejected: false,
            widened: false,
            in_runnable: false,
            in_line: false,
            max_failures: 1,
            speculation: None,
            hedge: None,
            latency: None,
            exclusion_config: None,
            inherits_defaults: false,
            avoiding: Vec::new(),
            new_pref_keys: Vec::new(),
            filed_pref_keys: Vec::new(),
            counters: JobCounters::default(),
        }
    }

    /// Leaves the record of a job that ended vacant: what it holds is dropped (its small
    /// vectors emptied and kept), its counts and flags are a new job's. Every field is named,
    /// so a field added to [`Job`] must say here what a new job finds in it.
    pub(super) fn vacate(&mut self) {
        let Job {
            id,
            // Set by every new job.
            token: _,
            pool: _,
            weight: _,
            priority: _,
            tasks,
            task_count: _,
            payloads,
            function,
            functions,
            prefs,
            keep_results: _,
            result_bytes_max: _,
            result_bytes,
            pending,
            running,
            running_cores,
            final_count,
            classes,
            has_exec_prefs: _,
            has_host_prefs: _,
            live_exec_keys,
            live_host_keys,
            level: _,
            level_since_us: _,
            last_progress_us: _,
            exclusion,
            durations_us,
            durations_dirty,
            quantile_reached,
            median_cache,
            speculatable,
            reasons,
            doomed,
            delay_rejected,
            widened,
            in_runnable,
            in_line,
            max_failures: _,
            // Kept: shared settings, which the next job keeps when it inherits the same
            // ones (`JobSetting::apply_shared`) and sets otherwise.
            speculation: _,
            hedge: _,
            latency: _,
            exclusion_config,
            inherits_defaults: _,
            avoiding,
            new_pref_keys,
            filed_pref_keys,
            counters,
        } = self;
        *id = VACANT;
        // A task record holds an allocation only in its exclusion, which a task gets only in a
        // job under exclusion (`Scheduler::count_failure`): without it, the records are let
        // go of without their drop code running (a loop over them that finds nothing).
        if tasks.capacity() > KEPT_CAPACITY_MAX {
            *tasks = Vec::new();
        } else if exclusion_config.is_none() {
            debug_assert!(tasks.iter().all(|t| t.exclusion.is_none()), "{tasks:?}");
            // SAFETY: a length of 0 is within the capacity, with no element to initialise; the
            // records let go of own nothing (see above), so nothing leaks either.
            unsafe { tasks.set_len(0) };
        } else {
            tasks.clear();
        }
        *payloads = Payloads::default();
        *function = None;
        (
            *result_bytes,
            *pending,
            *running,
            *running_cores,
            *final_count,
        ) = (0, 0, 0, 0, 0);
        // A one-class job's class is kept when its queues hold nothing to drop: the next job
        // of one function over payloads writes its own over it (`Job::enqueue_fresh`).
        if !matches!(classes.as_slice(), [q] if q.is_bare()) {
            clear_small_bare(classes, Queues::is_bare);
        }
        (*live_exec_keys, *live_host_keys) = (0, 0);
        if exclusion.is_some() {
            *exclusion = None;
        }
        clear_small(durations_us);
        (*durations_dirty, *quantile_reached, *median_cache) = (false, false, (0, 0));
        if speculatable.capacity() > KEPT_CAPACITY_MAX {
            *speculatable = VecDeque::new();
        } else {
            speculatable.clear();
        }
        if !reasons.is_empty() || reasons.capacity() > KEPT_CAPACITY_MAX {
            *reasons = Default::default();
        }
        (*doomed, *delay_rejected, *widened) = (false, false, false);
        (*in_runnable, *in_line) = (false, false);
        // What only jobs with preferences or exclusions use: most jobs never allocated any of
        // it, which one test finds.
        let used = functions.capacity()
            | prefs.capacity()
            | avoiding.capacity()
            | new_pref_keys.capacity()
            | filed_pref_keys.capacity();
        if used != 0 {
            clear_small(functions);
            clear_small(prefs);
            clear_small(avoiding);
            clear_small(new_pref_keys);
            clear_small(filed_pref_keys);
        }
        *counters = JobCounters::default();
    }

    /// Whether the record is vacant, with nothing a new job would find out of place (debug
    /// builds check it before building one over it).
    pub(super) fn is_clean_vacancy(&self) -> bool {
        self.id == VACANT
            && self.tasks.is_empty()
            && self.payloads.is_unallocated()
            && self.function.is_none()
            && self.functions.is_empty()
            && self.prefs.is_empty()
            && (self.result_bytes, self.pending, self.running) == (0, 0, 0)
            && (self.running_cores, self.final_count) == (0, 0)
            && self.classes.iter().all(Queues::is_bare)
            && self.classes.len() <= 1
            && (self.live_exec_keys, self.live_host_keys) == (0, 0)
            && self.exclusion.is_none()
            && self.durations_us.is_empty()
            && !self.durations_dirty
            && !self.quantile_reached
            && self.median_cache == (0, 0)
            && self.speculatable.is_empty()
            && self.reasons.is_empty()
            && !(self.doomed || self.delay_rejected || self.widened)
            && !(self.in_runnable || self.in_line)
            && self.avoiding.is_empty()
            && self.new_pref_keys.is_empty()
            && self.filed_pref_keys.is_empty()
            && matches!(
                self.counters,
                JobCounters {
                    launched: 0,
                    speculative: 0,
                    failures: 0,
                    uncounted: 0,
                    succeeded: 0
                }
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::job::TaskRec;
    use crate::scheduler::prefs::PrefKey;
    use std::sync::Arc;

    #[test]
    fn clearing_drops_what_holds_something_and_lets_the_bare_go() {
        use std::cell::Cell;
        struct Counted<'a>(&'a Cell<u32>, bool);
        impl Drop for Counted<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let dropped = Cell::new(0);
        let mut v: Vec<Counted> = [true, false, true, false, false]
            .map(|bare| Counted(&dropped, bare))
            .into();
        clear_small_bare(&mut v, |c| c.1);
        assert!(
            v.is_empty() && v.capacity() >= 5,
            "emptied, allocation kept"
        );
        assert_eq!(
            dropped.get(),
            3,
            "the three that hold something were dropped"
        );
        let mut big: Vec<Counted> = (0..=KEPT_CAPACITY_MAX)
            .map(|_| Counted(&dropped, false))
            .collect();
        clear_small_bare(&mut big, |c| c.1);
        assert_eq!(
            (big.capacity(), dropped.get()),
            (0, 3 + KEPT_CAPACITY_MAX as u32 + 1)
        );
    }

    #[test]
    fn a_vacated_record_is_clean_keeps_small_vectors_and_frees_big_ones() {
        let mut table = JobSlots::default();
        let slot = table.push_vacant();
        assert!(table.get(slot as usize).is_none(), "vacant: no job");
        assert!(table.vacant_mut(slot).is_clean_vacancy());
        let job = table.vacant_mut(slot);
        job.id = JobId(7);
        job.tasks.push(TaskRec::new(0, 1));
        job.durations_us = Vec::with_capacity(KEPT_CAPACITY_MAX + 1);
        job.durations_us.push(5);
        job.function = Some(Arc::from("f"));
        (job.pending, job.final_count, job.doomed, job.in_runnable) = (1, 1, true, true);
        job.reasons.insert(0, vec!["lost".to_string()]);
        job.speculatable.push_back(0);
        job.counters.launched = 3;
        // What only jobs with preferences or exclusions use.
        job.avoiding.push(0);
        job.new_pref_keys.push(PrefKey::Host(1));
        assert_eq!(
            table.iter().map(|(s, j)| (s, j.id)).collect::<Vec<_>>(),
            [(0, JobId(7))]
        );
        let Some(job) = table.get_mut(slot as usize) else {
            panic!("an active job in its slot");
        };
        job.vacate();
        assert!(job.is_clean_vacancy(), "{job:?}");
        assert!(job.tasks.capacity() >= 1, "a small vector is kept");
        assert_eq!(job.durations_us.capacity(), 0, "a big one is freed");
        assert_eq!(job.counters.launched, 0);
        assert!(table.get(slot as usize).is_none() && table.iter().next().is_none());
    }
}
