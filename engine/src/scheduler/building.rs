//! Big jobs of task specs (a job with locality), built a chunk per tick so that no submission
//! holds the caller's loop for long: building a task's record, its preferences and its place in
//! the locality queues costs about 100 ns, so a job of 1,000,000 tasks built at once held the
//! driver's loop about 110 ms, and every other job waited that long.
//!
//! A job of more specs than [`Config::build_chunk_tasks`](super::Config::build_chunk_tasks)
//! (16,384 by default, about 2 ms) gets its first chunk's records at submission
//! ([`Scheduler::build_job`]), in the job table slot it keeps, and waits here. Each tick
//! ([`Scheduler::handle_timeout`], due at once while a job waits here:
//! [`Scheduler::poll_timeout`]) builds the next chunk of the first one waiting, and the last
//! chunk publishes it: from then on it is an active job like any other (found by its id,
//! listed, timed, offered). Until then nothing but its slot knows of it, so no executor, tick
//! or report can see a job half built; its tasks count towards the admission limits and the
//! pending and unfinished figures; cancelling or failing it ends it as it is (nothing of it
//! ran), and a task of it killed meanwhile is killed once it is published, before any offer
//! (in task order). The executors that came or went while it was built are accounted for
//! when it is published ([`Job::recount_live_keys`]), and the host table is not swept
//! meanwhile: the hosts its queues will name are in no index yet.

use std::collections::{BTreeMap, VecDeque};

use super::job::Job;
use super::spare::{Remains, REMAINS_MIN_TASKS};
use super::types::{JobId, SubmitError, TaskId, TaskSpec};
use super::{live_job, oversized_reason, Scheduler, SpecParts};
use crate::scheduler::payloads::Payloads;

/// A job being built (see the module docs).
#[derive(Debug)]
pub(super) struct Building {
    id: JobId,
    /// Its job table slot, which holds the records built so far.
    slot: u32,
    /// All its specs: those from `next` on have no record yet.
    specs: Vec<TaskSpec>,
    next: usize,
    /// Why it fails once built: the first task past the first chunk whose payload is over the
    /// limit or that asks for zero cores (found as its chunk is built).
    refusal: Option<String>,
    /// Its tasks killed meanwhile, with why: killed once it is published (at most one entry
    /// per task).
    kills: BTreeMap<u32, String>,
}

/// The jobs being built, the first one first.
pub(super) type Builds = VecDeque<Building>;

impl Scheduler {
    /// Job `id` in `slot`, its first chunk built, waits for the rest.
    pub(super) fn start_building(&mut self, id: JobId, slot: u32, specs: Vec<TaskSpec>) {
        self.building_tasks += specs.len();
        self.building.push_back(Building {
            id,
            slot,
            specs,
            next: self.build_chunk(),
            refusal: None,
            kills: BTreeMap::new(),
        });
    }

    /// Task records built at once ([`Config::build_chunk_tasks`](super::Config::build_chunk_tasks), at least 1).
    pub(super) fn build_chunk(&self) -> usize {
        self.config.build_chunk_tasks.max(1)
    }

    /// Whether job `id` is being built.
    pub(super) fn is_building(&self, id: JobId) -> bool {
        !self.building.is_empty() && self.building.iter().any(|b| b.id == id)
    }

    /// The job table slots of the jobs being built.
    pub(super) fn building_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.building.iter().map(|b| b.slot)
    }

    /// Builds the next chunk of the first job being built (a tick's share), and publishes it
    /// if that was its last.
    pub(super) fn build_next(&mut self, now_us: u64) {
        if !self.building.is_empty() {
            self.build_more(now_us, 0, self.build_chunk());
        }
    }

    /// Makes job `id`, if it is being built, active as it is, for the caller to end at once
    /// (cancel, fail): a job that ran nothing needs no more records, and building the rest
    /// would hold the loop for it. Its tasks without a record are pending ones (as a job of
    /// one function over payloads has), its unbuilt specs left for the caller to free.
    pub(super) fn register_unbuilt(&mut self, id: JobId) {
        let Some(at) = self.building.iter().position(|b| b.id == id) else {
            return;
        };
        let Some(b) = self.building.remove(at) else {
            unreachable!("job being built {at} was just found");
        };
        self.building_tasks -= b.specs.len();
        if b.specs.len() >= REMAINS_MIN_TASKS {
            self.keep_remains(Remains::of_specs(b.specs));
        }
        self.register(b.slot);
    }

    /// Kills `task` once its job, being built, is published ([`Scheduler::handle_kill`]
    /// then): whether it is a task of that job not killed yet. None if its job is not being
    /// built.
    pub(super) fn kill_unbuilt(&mut self, task: TaskId, reason: &str) -> Option<bool> {
        let b = self.building.iter_mut().find(|b| b.id == task.job())?;
        let index = task.index();
        if index as usize >= b.specs.len() || b.kills.contains_key(&index) {
            return Some(false);
        }
        b.kills.insert(index, reason.to_owned());
        Some(true)
    }

    /// Builds up to `max` more tasks of the `at`-th job being built; publishes it once whole.
    fn build_more(&mut self, now_us: u64, at: usize, max: usize) {
        let Some(b) = self.building.get_mut(at) else {
            unreachable!("job being built {at} beyond the list");
        };
        let total = b.specs.len();
        let (start, end) = (b.next, b.next.saturating_add(max).min(total));
        let job = live_job(&mut self.jobs, b.slot);
        debug_assert_eq!(job.tasks.len(), start, "built through the last chunk");
        let mut parts = take_parts(job);
        let Some(specs) = b.specs.get_mut(start..end) else {
            unreachable!("specs {start}..{end} of {total}");
        };
        if b.refusal.is_none() {
            b.refusal = refusal(specs, start, self.config.payload_max_bytes);
        }
        Self::add_specs(&mut self.book, specs, total, &mut parts);
        put_parts(job, parts);
        let book = &self.book;
        let host_of = |e| book.slot_of(e).and_then(|s| book.get(s)).map(|x| x.host);
        for i in start as u32..end as u32 {
            job.enqueue(i, host_of, |h| book.host_live(h));
        }
        b.next = end;
        if end < total {
            return;
        }
        let Some(b) = self.building.remove(at) else {
            unreachable!("job being built {at} was just found");
        };
        self.building_tasks -= total;
        self.finish_building(now_us, b);
    }

    /// Job `b`, built whole: its function shared if it has one, its locality counts and level
    /// as of now, its spent specs left for the caller to free, then published.
    fn finish_building(&mut self, now_us: u64, b: Building) {
        let job = live_job(&mut self.jobs, b.slot);
        if job.functions.len() == 1 {
            job.function = job.functions.pop();
            if let (Some(_), Some(function)) = (&job.hedge, &job.function) {
                job.latency = Some(self.hedge.record_of(function));
            }
        }
        let book = &self.book;
        job.recount_live_keys(|e| book.slot_of(e).is_some(), |h| book.host_live(h));
        job.level = job.start_level();
        job.level_since_us = now_us;
        job.last_progress_us = now_us;
        if b.specs.len() >= REMAINS_MIN_TASKS {
            self.keep_remains(Remains::of_specs(b.specs));
        }
        let has_prefs = self.register(b.slot);
        if b.refusal.is_none() {
            // Its tasks killed meanwhile, before any offer can launch them.
            for (index, reason) in b.kills {
                self.kill(TaskId::new(b.id, index), &reason);
            }
            if !self.job_slots.contains_key(b.id.0) {
                return; // every task of it killed: it ended
            }
        }
        self.list_and_offer(now_us, b.slot, b.refusal, has_prefs);
    }
}

/// Why a job fails for `specs` (from task `start` on), if it does: the first payload over
/// `bytes_max` or task of zero cores (made one core: the job fails before it runs).
fn refusal(specs: &mut [TaskSpec], start: usize, bytes_max: usize) -> Option<String> {
    let mut found = None;
    for (i, t) in (start..).zip(specs.iter_mut()) {
        if found.is_none() && t.payload.len() > bytes_max {
            found = Some(oversized_reason(i, t.payload.len(), bytes_max));
        }
        if t.cores == 0 {
            let zero = SubmitError::ZeroCores(u32::try_from(i).unwrap_or(u32::MAX));
            found.get_or_insert_with(|| zero.to_string());
            t.cores = 1;
        }
    }
    found
}

/// The records `job` has built so far, taken out for [`Scheduler::add_specs`].
fn take_parts(job: &mut Job) -> SpecParts {
    SpecParts {
        tasks: std::mem::take(&mut job.tasks),
        // A job built in chunks holds its payloads in a vector: moved out, not copied.
        payloads: std::mem::take(&mut job.payloads).into_vec(),
        one: None,
        functions: std::mem::take(&mut job.functions),
        prefs: std::mem::take(&mut job.prefs),
        has_exec_prefs: job.has_exec_prefs,
        has_host_prefs: job.has_host_prefs,
    }
}

/// Puts back what [`take_parts`] took, a chunk's records added.
fn put_parts(job: &mut Job, parts: SpecParts) {
    debug_assert!(parts.one.is_none(), "a job built in chunks has many tasks");
    job.tasks = parts.tasks;
    job.payloads = Payloads::from(parts.payloads);
    job.functions = parts.functions;
    job.prefs = parts.prefs;
    job.has_exec_prefs = parts.has_exec_prefs;
    job.has_host_prefs = parts.has_host_prefs;
}
