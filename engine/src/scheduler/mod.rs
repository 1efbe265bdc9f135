//! The driver's scheduling brain as a sans-IO state machine (Spark's `DriverEndpoint`,
//! `TaskSchedulerImpl` and `TaskSetManager` in one deterministic value).
//!
//! # Model
//!
//! A [`Scheduler`] has no IO, no threads and no clock. The driver feeds it events, each with the
//! current time `now_us` (microseconds on any monotonic clock the driver likes):
//!
//! - [`Scheduler::handle_register`] / [`Scheduler::handle_remove`]: executors come and go;
//! - [`Scheduler::handle_submit`] / [`Scheduler::handle_cancel`] / [`Scheduler::handle_kill`]: work;
//! - [`Scheduler::handle_status`]: what executors report about task attempts;
//! - [`Scheduler::handle_timeout`]: time passed (call it at [`Scheduler::poll_timeout`] at the latest).
//!
//! and drains what it must do with [`Scheduler::poll_output`]: [`Output::Launch`] batches (one
//! per executor per call), [`Output::Kill`] requests, and [`Output::Event`]s for its callers:
//! at most one [`Event::TaskResult`] per submitted task (every task's, before a success; a job
//! that fails or is cancelled gives none for the tasks it had not finished) and exactly one
//! [`Event::JobOutcome`] per accepted job, after its tasks' results; a job of one task that
//! keeps no results and succeeds gives both in one [`Event::OneTaskJobSucceeded`] instead
//! ([`Event::split`] gives the two). The executors' part
//! (launches, kills) comes first; a driver may take it alone with [`Scheduler::poll_command`]
//! and the callers' part when it tells them, with [`Scheduler::poll_event`].
//!
//! # Scheduling
//!
//! After every event the scheduler makes offers: it walks the executors that have free cores
//! round-robin (a rotating cursor over an indexable set, so tasks spread over executors as
//! Spark's shuffled offers do) and gives each one task at a time. For an executor, jobs are asked
//! in sharing order (FIFO: priority, then submission; FAIR: pools by running cores over pool
//! weight, then jobs by running cores over job weight), and a job answers from its queues in
//! locality order: tasks preferring this executor, then (once its locality wait allows) this
//! host, then tasks without preferences, then (after the waits) any task, then a straggler to
//! copy. An executor for which nothing fits is set aside ("blocked") until new work appears (a
//! submission, a retry, a wider locality level, a straggler, an exclusion ending) or its own
//! cores come back, so offers never rescan idle executors. Only jobs with something to launch
//! are asked ("runnable" jobs), and a job keeps one set of queues per task size so a task too big
//! for an executor never hides smaller ones. Everything a launch or a completion touches is O(1)
//! amortized (hash maps and queues with lazy deletion) or O(log n) (the ordered sets below).
//!
//! The runnable jobs are kept in sharing order as they change (`order.rs`, B-trees): FIFO, one
//! set by (priority, submission); FAIR, the pools that have runnable jobs by Spark's comparator
//! and each pool's jobs by its own mode, a pool or job re-sorted when its running cores change.
//! Under FIFO, new one-task jobs with nothing that may leave them stuck wait as the order's
//! tail in a plain queue instead (`line.rs`: listed only if a walk or another kind of job
//! needs them to be), so a service's queued request costs a push and a pop.
//! So a job arriving, ending or becoming runnable again costs O(log jobs), under FAIR a launch
//! or a completion re-sorts one job and one pool (O(log)), and an offer finds its first
//! candidate at the leftmost entry (FIFO) or in O(log pools) (FAIR); 100,000 active one-task
//! jobs slow neither assignment nor the timers below (`scheduler_active_jobs` in
//! `bench/benches/scheduler.rs`, whose `+ticks` rows ask `poll_timeout` after every input
//! and tick when due, as the driver does). Usually the
//! first job asked answers. When jobs ahead have nothing for an executor (tasks too big for it,
//! it is excluded for them, they wait for locality), one assignment asks at most 64 jobs: the
//! executor is then set aside until new work or 1 ms later (the tick), and its next walk goes
//! on after the last job it asked. A walk that reaches the end of the order has asked every
//! job once since it began at the start (a cycle): the executor is blocked as above, unless new
//! work appeared, its usable slots grew, or (FAIR) pools or jobs were re-sorted during the
//! cycle, when it walks again from the start at once (jobs passed may answer now, or were
//! missed). So the work per offer is bounded (two walks of 64),
//! and an executor behind N jobs with nothing for it reaches the next one within N/64 ms.
//!
//! What the tick must look at is kept sorted too (`timers.rs`, by time): each job with
//! tasks queued that something may leave stuck (exclusion, or tasks bigger than every
//! executor: `StuckRisk`) has its unschedulable clock (its last progress) and, while at a
//! locality level below "any", the end of its wait; both are set again whenever the job
//! changes (O(log jobs), O(1) when they did not move), and a job whose level has nothing left
//! to wait for (the executors or hosts it prefers went) is listed for the next tick. So
//! [`Scheduler::poll_timeout`] costs O(log jobs) (the driver asks after every input) and a tick
//! looks only at the jobs whose time came. The straggler check (every speculation interval)
//! walks the executors, and the running attempts of those that could hold a straggler (all
//! once some job reached its quantile, else those silent past the least speculation timeout);
//! it works out thresholds only for the jobs of those attempts and brings medians up to date
//! only for jobs with successes since the last check: O(executors + attempts looked at), not
//! O(active jobs). Reusing an idle pool at the pool limit takes the lowest idle one (O(log
//! pools)). An executor joining or leaving updates the valid levels (below) of the jobs with
//! queues preferring it or its host only (`prefs.rs` indexes them), O(log jobs) each.
//!
//! Delay scheduling (Spark's `locality.wait`, one wait per level): a job starts at its best
//! *valid* level and widens after each wait; a launch at a local level restarts the wait, except
//! that once an executor has been turned away for locality the wait keeps running until the job
//! has nothing queued, so a free core never idles longer than the sum of the waits while a job
//! has work for it (Spark's legacy rule could idle it for as long as local launches kept coming).
//! The driver calls [`Scheduler::handle_timeout`] at [`Scheduler::poll_timeout`].
//!
//! Valid levels come from the executors registered now (Spark's `computeValidLocalityLevels`,
//! "skip unsatisfiable locality levels", SPARK-16106): the executor level while some queued
//! task prefers a registered executor, the host level while some queued task prefers a host
//! with a registered executor. Each job counts its preference queues whose executor (host) is
//! registered, kept current on registration and removal (for the jobs that prefer that executor
//! or its host only)
//! and as queues empty, so checking a level is O(1). A level with nothing to wait for is skipped
//! at once.
//!
//! When some job has preferences, an offer first gives every offerable executor the tasks that
//! prefer it (or its host, once allowed) from the first job in sharing order that has work for
//! it, and only then lets executors take tasks at worse levels: a task goes to its preferred
//! executor when that one has a free slot in the same round, whatever the order executors come
//! in (Spark loops over locality levels outside the offers: "Locality should be used for bulk
//! offers even with delay scheduling off").
//!
//! # Pools
//!
//! Under FAIR, jobs belong to pools ([`PoolConfig`], Spark's `fairscheduler.xml`; the `flint`
//! CLI reads them from a TOML file). Pools are ordered by Spark's `FairSchedulingAlgorithm`: a
//! pool running fewer cores than its `min_share` goes first (lowest running over min share),
//! then the lowest running cores over weight, then the name. Inside a pool, jobs go FIFO
//! (priority, then submission) or FAIR (running cores over job weight) as the pool says. Under
//! FIFO sharing pools are ignored.
//!
//! # Failures
//!
//! Each executor indexes its own running attempts, so removing it costs time proportional to its
//! own tasks. A failed attempt is retried until a task has failed `max_failures` times (the
//! job's own, [`JobSpec::max_failures`], or [`Config::max_failures`]); then the job fails with
//! the reasons, its other tasks are killed or dropped, each reported once. Ends that are not the
//! task's fault do not count: a KILLED attempt (Spark's `TaskKilled` does not count towards
//! failures or exclusion), an executor lost, killed, or exited not because of the app. When an
//! exit is the app's, only the attempts the executor had reported RUNNING count (Spark's
//! SPARK-39955: one still launching never ran).
//!
//! An executor whose connection closes is removed as lost before anyone knows why; the cluster
//! manager's exit reason usually comes later. The scheduler remembers the attempts of the last
//! 1024 executors removed as lost, and [`Scheduler::handle_remove`] with a later
//! reason that blames the app charges them then (once), so a task that crashes every executor
//! it runs on fails its job after `max_failures` crashes instead of looping.
//!
//! Counted failures feed exclusion (when the job's exclusion is on): per task (Spark's
//! `maxTaskAttemptsPerExecutor`/`PerNode`: the task avoids that executor, or host, after its
//! limit; queues pass over such a task without losing it), per job (executor and host, for the
//! job's lifetime) and globally (executor, then host once enough of its executors are excluded,
//! both expiring after a timeout). A job that has had tasks queued and launched nothing for
//! `unschedulable_timeout_us`, and has a queued task that no registered executor could ever
//! run (all excluded for it globally, for the job or for the task, or all smaller than it),
//! fails instead of hanging ("abort stage if executor loss results in unschedulability from
//! previously failed tasks"); a job merely starved by others, or waiting for locality while an
//! executor could take its tasks, keeps waiting. Only a job that something may leave stuck
//! has that clock: one whose job-level exclusion holds records, or any job while a global
//! exclusion is in force, or one with tasks bigger than every registered executor. When such
//! a risk begins for a job with tasks queued (a failure, an exclusion, the largest executor
//! leaving), its clock starts then, so it has a whole timeout to make progress (Spark's abort
//! timer also starts when it finds a task set unschedulable).
//!
//! # Speculation
//!
//! With [`SpeculationConfig`] (on by default; per job with [`JobSpec::speculation`]), `handle_timeout`
//! looks for stragglers: once `max(floor(quantile x tasks), 1)` of a job's tasks succeeded
//! (Spark's `minFinishedForSpeculation`), a task running longer than `multiplier` times their
//! median run gets one copy on another executor (every straggler not running on the offered
//! executor may take it, not only the head of the queue). Before that, a task that has run
//! longer than `timeout_us` on an executor that has finished nothing since launching it, while
//! other executors finish theirs or sit idle, is a straggler too. The first attempt to finish
//! wins; the other is killed; the result is reported once.
//!
//! # Stuck executors and slow start
//!
//! An executor may heartbeat and never finish anything (wedged, or not reading its socket). One
//! that holds a straggler and has finished nothing since that attempt was launched is *stalled*:
//! it gets no new work until it reports a final state ([`Scheduler::stalled_executors`] names
//! them, for a warning), and its stragglers are copied elsewhere.
//!
//! A new executor earns its slots (slow start, [`Config::slow_start_slots`]): it may fill a few
//! at first, one more per attempt it finishes successfully, up to its cores. So an executor that
//! claims many cores and never finishes holds a few tasks, not the job.
//!
//! [`Scheduler::starved`] says when work is waiting that no registered executor can take (none
//! registered, or all excluded), so the driver can warn and give up.
//!
//! # Introspection
//!
//! [`Scheduler::job_info`] (locality level, valid levels, task counts, per-job counters) and
//! [`Scheduler::task_info`] (state, failures, running attempts and whether each was reported
//! running, executors it avoids), for tests, a UI and metrics; [`Stats`] for the totals.
//!
//! # Invariants
//!
//! States that cannot happen (an active job's slot empty, an executor's attempt of a task
//! beyond its job, a launch over the free cores) are assertions, not silent returns; the
//! simulator runs with them on. What peers and callers send (unknown executors, tasks, jobs,
//! stale attempts) is checked and ignored or refused.
//!
//! # Defaults that differ from Spark
//!
//! - Speculation is on (Spark: `spark.speculation=false`), with Spark's thresholds (1.5 times the
//!   median once 75% succeeded, at least 100 ms, checked every 100 ms) plus the 30 s timeout
//!   above (Spark has no default for `spark.speculation.task.duration.threshold`): without it an
//!   executor that heartbeats but never finishes stalls a job forever, silently. The cost is
//!   one extra attempt per straggler and the successful run times kept per job (8 bytes a task).
//! - Slow start (16 slots at first) has no Spark equivalent: Spark trusts the cores an executor
//!   registers with; a peer here is not trusted.
//! - [`Config::default`] has exclusion on (Spark: `spark.excludeOnFailure.enabled=false`): a
//!   service with many executors should not keep feeding a broken one. (flint-net's driver
//!   turns it off by default, as Spark does, since with few executors it can leave a job
//!   nowhere to run until the unschedulable timeout; `flint ... --exclusion on`.) A task avoids an executor after 1 failure there and a host
//!   after 2 (Spark's); a job excludes an executor after 2 failures (Spark's) and a host after
//!   4 failures on it (Spark: once 2 of its executors are excluded for the stage); globally an
//!   executor is excluded after 4 failures (Spark: 2) and a host with 2 excluded executors
//!   (Spark's), for an hour (Spark's).
//! - Locality waits are 10 ms per level (Spark: 3 s): a service's tasks last milliseconds, and a
//!   free core waiting seconds for locality costs more than the data it would save moving.
//! - A skipped locality level keeps the wait running (Spark's SPARK-4939 restarts it), and a
//!   job does not move back to a better level when an executor joins (Spark's SPARK-31837): the
//!   joining executor still takes its preferred tasks at once, and the bound on idle cores
//!   (the sum of the waits) holds.
//! - A pool nobody configured (`"default"` included) is FAIR inside (Spark: FIFO), so jobs
//!   that pick FAIR sharing share within the default pool too.
//! - When an executor the app brought down had reported no attempt running, all its attempts
//!   count (Spark counts none): one of them brought it down, and counting none lets a task
//!   that crashes its executor at once loop forever. A late exit reason that takes a task to
//!   `max_failures` fails the job even if a retry runs (that retry would likely crash too).
//! - A job with a task that can run nowhere fails after `unschedulable_timeout_us` (120 s,
//!   Spark's `unschedulableTaskSetTimeout`) without a launch, also when no executor could be
//!   added (Spark aborts at once then): the scheduler does not know whether a cluster manager
//!   will bring one.
//! - `max_failures`, speculation and exclusion can be set per job ([`JobSpec`]; Spark has them
//!   per application only).

//! # Peers are not trusted
//!
//! Status updates are matched against the reporting executor's own running attempts; anything
//! stale, duplicate, or unknown is ignored and counted ([`Stats::ignored_updates`]). Cores come
//! back only with a final update for an attempt the executor actually holds, or with the executor.

mod book;
mod building;
mod clocks;
mod exclusion;
mod fifo;
mod hedge;
mod job;
mod latency;
mod line;
mod order;
pub mod payloads;
mod prefs;
mod runs;
mod slots;
mod spare;
mod speculation;
mod successes;
#[cfg(test)]
mod tests;
mod timers;
mod types;

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use spare::{REMAINS_KEPT, REMAINS_MIN_TASKS};
use speculation::SpecTimeouts;

pub use payloads::Payloads;
pub use spare::Remains;
pub use types::{
    Attempt, AttemptInfo, Config, Event, ExclusionConfig, ExecutorId, ExecutorInfo, HedgeConfig,
    JobId, JobInfo, JobOutcome, JobSetting, JobSpec, JobToken, LocalityLevel, Output, PoolConfig,
    Refusal, RemovalReason, Sharing, SpeculationConfig, Stats, StatusUpdate, SubmitError, TaskId,
    TaskInfo, TaskLaunch, TaskSpec, TaskState, TaskStatus, Tasks, BUILD_CHUNK_TASKS, DEFAULT_POOL,
};

use crate::hash::FxHashMap;
use crate::ids::IdMap;
use book::{Book, Resume, Run};
use building::Builds;
use hedge::Hedging;
use job::{Found, Job, Level, Placed, PrefHosts, Prefs, Status, TaskRec};
use order::{Cursor, FifoKey, Order, PoolKey, Ratio};
use prefs::{PrefIndex, PrefKey};
use slots::JobSlots;
use spare::Spare;
use successes::Successes;
use timers::{Keys, Timers};

/// Longest failure message kept from a peer, in bytes.
const REASON_MAX_BYTES: usize = 4096;
/// Tasks per job whose failure reasons are kept (the rest are counted, not stored).
const REASON_TASKS_MAX: usize = 1024;

/// Executors removed as lost whose attempts are remembered, so that a later exit reason
/// blaming the application can still be charged to them (issue 14 item 7).
const GONE_MAX: usize = 1024;

/// A FAIR pool.
#[derive(Debug)]
struct Pool {
    name: Arc<str>,
    mode: Sharing,
    weight: u32,
    min_share: u32,
    running_cores: u64,
    /// Active jobs in it.
    jobs: u32,
    /// Listed in [`Config::pools`] (kept for good); others are made for a job that names them
    /// and may be reused for another name once they hold no job.
    configured: bool,
    /// Named [`DEFAULT_POOL`]: a job naming the pool by that constant (as [`JobSpec::new`]
    /// does) is matched by this flag, not by comparing the names' text.
    is_default: bool,
}

impl Pool {
    fn new(c: &PoolConfig, configured: bool) -> Pool {
        Pool {
            name: Arc::from(c.name.as_str()),
            mode: c.mode,
            weight: c.weight.max(1),
            min_share: c.min_share,
            running_cores: 0,
            jobs: 0,
            configured,
            is_default: c.name == DEFAULT_POOL,
        }
    }

    /// Its place in the FAIR order now.
    fn key(&self) -> PoolKey {
        PoolKey::new(self.running_cores, self.min_share, self.weight, &self.name)
    }

    /// The place inside it of a job running `running_cores` with `weight`: running cores over
    /// weight in a FAIR pool, none in a FIFO one.
    fn share(&self, running_cores: u64, weight: u32) -> Ratio {
        match self.mode {
            Sharing::Fair => Ratio::new(running_cores, u64::from(weight)),
            Sharing::Fifo => Ratio::ZERO,
        }
    }
}

/// Gives an ended or killed attempt's `cores` back to its job (in `job_slot`) and the job's
/// pool, re-sorting both in the FAIR order.
fn give_back_cores(
    order: &mut Order,
    pools: &mut [Pool],
    job_slot: u32,
    job: &mut Job,
    cores: u64,
) {
    job.running_cores = job.running_cores.saturating_sub(cores);
    let Some(p) = pools.get_mut(job.pool as usize) else {
        unreachable!("job in unknown pool {}", job.pool);
    };
    p.running_cores = p.running_cores.saturating_sub(cores);
    resort(
        order,
        job_slot,
        (job.running_cores, job.weight),
        (job.pool, p),
    );
}

/// Re-sorts job `job_slot` (running `running_cores` with `weight`) and its pool `pool` in the
/// FAIR order after their running cores changed (under FIFO, where shares do not count, a
/// check inlined at the caller and nothing more).
#[inline(always)]
fn resort(
    order: &mut Order,
    job_slot: u32,
    (running_cores, weight): (u64, u32),
    pool: (u32, &Pool),
) {
    if order.fair() {
        resort_fair(order, job_slot, (running_cores, weight), pool);
    }
}

/// [`resort`] under FAIR.
#[inline(never)]
fn resort_fair(
    order: &mut Order,
    job_slot: u32,
    (running_cores, weight): (u64, u32),
    pool: (u32, &Pool),
) {
    order.set_share(job_slot, pool.1.share(running_cores, weight));
    order.set_pool(pool.0, pool.1.key());
}

/// What may leave a job with tasks queued unable to run anywhere, which the unschedulable
/// check looks for ([`Scheduler::fail_unschedulable`]): exclusion (global, or the job's after
/// its failures), or tasks bigger than every executor. A job none of it touches cannot be
/// stuck, so it needs no unschedulable clock: most jobs, whose clocks would otherwise be filed
/// and dropped as they queue and launch.
#[derive(Clone, Copy, Debug)]
struct StuckRisk {
    /// A global exclusion may be in force.
    excluding: bool,
    /// The cores of the largest registered executor (0 with none).
    max_cores: u32,
}

impl StuckRisk {
    /// The risks now, from the scheduler's next exclusion expiry and its executors.
    #[inline]
    fn of(next_expiry_us: u64, book: &Book) -> StuckRisk {
        StuckRisk {
            excluding: next_expiry_us != u64::MAX,
            max_cores: book.max_cores(),
        }
    }

    /// Whether `job` may be stuck, so that its clock runs while it has tasks queued.
    #[inline]
    fn touches(self, job: &Job) -> bool {
        self.excluding || job.exclusion.is_some() || job.largest_cores() > self.max_cores
    }
}

/// Sets the timers of `job` (in `job_slot`) from its state, with locality `waits_us`: its
/// locality deadline, its unschedulable clock (when `risk` touches it), and a skip when its
/// level has nothing left to wait for.
#[inline(always)]
fn set_timers(timers: &mut Timers, job_slot: u32, job: &Job, waits_us: [u64; 2], risk: StuckRisk) {
    let queued = job.pending > 0;
    timers.set(
        job_slot,
        Keys {
            level_us: job.level_deadline(waits_us),
            progress_us: (queued && risk.touches(job)).then_some(job.last_progress_us),
        },
    );
    let skips = match job.level {
        Level::Executor => job.live_exec_keys == 0,
        Level::Host => job.live_host_keys == 0,
        Level::Any => false,
    };
    if queued && skips {
        timers.mark_skip(job_slot);
    }
}

/// A new job of task specs' records ([`Scheduler::build_tasks`]) and what they say of it.
struct BuiltTasks {
    /// The records built now ([`Job::tasks`]).
    tasks: Vec<TaskRec>,
    /// Every task's payload.
    payloads: Payloads,
    /// The function they all run, if they share one.
    function: Option<Arc<str>>,
    /// Else the functions their records index ([`Job::functions`]).
    functions: Vec<Arc<str>>,
    /// Their preferences ([`Job::prefs`]).
    prefs: Vec<Option<Prefs>>,
    /// Whether any prefers executors.
    has_exec_prefs: bool,
    /// Whether any prefers hosts or executors.
    has_host_prefs: bool,
    /// A big job's specs, spent (their host names), for the caller to free.
    spent: Option<Vec<TaskSpec>>,
    /// A job of more specs than a chunk ([`Config::build_chunk_tasks`]): all of them, those
    /// past the first chunk still to build (`building.rs`).
    rest: Option<Vec<TaskSpec>>,
}

/// A job of task specs' records in the making, as [`Scheduler::add_specs`] adds to them.
struct SpecParts {
    tasks: Vec<TaskRec>,
    /// The payloads of a job of more than one task.
    payloads: Vec<Bytes>,
    /// The payload of a one-task job (no vector).
    one: Option<Bytes>,
    functions: Vec<Arc<str>>,
    prefs: Vec<Option<Prefs>>,
    has_exec_prefs: bool,
    has_host_prefs: bool,
}

/// The host indices one [`Scheduler::add_specs`] looked up, by the address of each name's
/// text: a caller that gives its tasks clones of one `Arc<str>` per host (as
/// [`TaskSpec::preferred_hosts`] asks) has each name hashed once per call, not once per task.
/// Direct-mapped, so a clash of two names only costs a lookup by name. An address stands for
/// its name only while the name lives: this lives for one call, whose specs hold every name
/// it saw.
struct HostsSeen {
    /// (address of a name's text, its host index); address 0: empty.
    slots: Vec<(usize, u32)>,
}

impl HostsSeen {
    /// Slots (a power of two): a few hosts' worth per slot for a job over a big cluster.
    const SLOTS: usize = 1024;
    /// Task specs from which a call looks names up through it (a small job looks each up by
    /// name: fewer lookups than slots to clear).
    const TASKS_MIN: usize = 64;

    fn new() -> HostsSeen {
        HostsSeen {
            slots: vec![(0, 0); Self::SLOTS],
        }
    }

    /// The index of host `name`: the one seen at its address, else found by name.
    #[inline]
    fn index(&mut self, book: &mut Book, name: &Arc<str>) -> u32 {
        let address = name.as_ptr() as usize;
        // Allocations are 16-byte aligned and a few words apart: the bits above the fourth.
        let at = (address >> 4) & (Self::SLOTS - 1);
        let Some(slot) = self.slots.get_mut(at) else {
            unreachable!("slot {at} of {}", Self::SLOTS);
        };
        if slot.0 != address {
            *slot = (address, book.host_index(name));
        }
        slot.1
    }
}

/// An executor removed as lost (no word on whose fault): the attempts it held, in case a
/// later report says the application made it exit.
#[derive(Debug)]
struct Gone {
    id: ExecutorId,
    host: u32,
    /// (task, attempt, reported running)
    attempts: Vec<(Attempt, bool)>,
}

/// Jobs one assignment asks at most before it stops (the executor resumes after the last one
/// asked at its next offer): bounds the work per offer when many jobs ahead in the sharing
/// order have nothing for an executor (tasks too big for it, excluded, waiting for locality).
const OFFER_JOBS_MAX: usize = 64;

/// How long an executor whose assignment stopped at [`OFFER_JOBS_MAX`] waits at most before
/// it is offered again (by [`Scheduler::handle_timeout`]; any new work brings it back sooner).
const OFFER_DEFER_US: u64 = 1_000;

/// Launches held longer than this (the default hedging floor) count as started when they
/// leave ([`Scheduler::release_launches`]); held less, their few microseconds early do not matter.
const RESTAMP_AFTER_US: u64 = 1_000;

/// What one assignment to an executor did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Assigned {
    Launched,
    /// No job asked had anything for the executor, and none is left to ask.
    Nothing,
    /// The [`OFFER_JOBS_MAX`] jobs asked had nothing; later ones were not asked yet.
    Deferred,
}

/// How an attempt ended.
enum End<'a> {
    /// With the result, taken from the report when it is kept or handed on.
    Succeeded(&'a mut Bytes),
    Failed {
        reason: String,
        counts: bool,
    },
}

/// The scheduler state machine. See the [module documentation](self).
#[derive(Debug)]
pub struct Scheduler {
    config: Config,
    /// The configuration's per-job settings, shared with every job that inherits them.
    defaults: Defaults,
    book: Book,
    jobs: JobSlots,
    job_free_slots: Vec<u32>,
    /// Launch batches the driver handed back, kept for new ones (an ended job's vectors stay in
    /// its vacant record: `slots.rs`).
    spare: Spare,
    /// Job id → slot.
    job_slots: IdMap<u32>,
    /// The last (job id, slot) `attempt_ended` looked up: a batch of completions is mostly of
    /// one job. Cleared when that job is removed ([`NO_JOB`] for none).
    job_hint: (u64, u32),
    /// Jobs accepted and without an outcome yet.
    active: usize,
    /// The active jobs that have something to launch, in sharing order: offers look only at
    /// these.
    runnable: Order,
    /// Scratch: jobs whose straggler queue changed during an offer.
    touched: Vec<u32>,
    /// Within an offer round: the job the last assignments launched from, not yet settled,
    /// while it is the first job in FIFO order with work ([`Scheduler::assign_one`]).
    unsettled: Option<u32>,
    /// Every assignment walks (no `fill`, no taking from the front or from a streak): the
    /// reference those shortcuts must match, in tests and the simulator's `--against-walk`.
    #[cfg(any(test, feature = "sim"))]
    walk_only: bool,
    /// A job being submitted while no other job has work: the submission's offers ask it
    /// after the (empty) sharing order without listing it first, so a job launched whole at
    /// once never enters the order ([`Scheduler::handle_submit_with_id`]).
    unlisted_new: Option<u32>,
    /// New one-task jobs waiting while no job is listed as runnable, in FIFO order
    /// (`line.rs`): launched from its front without being listed.
    line: line::Line,
    /// Launches of submissions wait for [`Scheduler::release_launches`]
    /// ([`Scheduler::hold_launches`]).
    holding: bool,
    /// When the launches began to be held.
    held_since_us: u64,
    pools: Vec<Pool>,
    pool_ids: FxHashMap<String, u32>,
    /// The pool [`Self::resolve_pool`] found last (its name may have changed since).
    last_pool: u32,
    next_job: u64,
    /// Tasks pending over all jobs.
    pending_total: usize,
    /// Speculation queue entries over all jobs (may include stale ones).
    speculatable_total: usize,
    /// Tasks accepted and not final.
    unfinished_total: usize,
    /// Launches and kills, for the executors.
    outputs: VecDeque<Output>,
    /// Task results and job outcomes, for the callers, each with its job's token.
    events: VecDeque<(Event, JobToken)>,
    /// Big ended jobs' records and payloads, for [`Scheduler::poll_remains`].
    remains: VecDeque<Remains>,
    /// Big jobs of task specs being built a chunk per tick (`building.rs`), and their tasks.
    building: Builds,
    building_tasks: usize,
    /// Executors with launches batched in this call.
    batched: Vec<u32>,
    stats: Stats,
    next_speculation_us: u64,
    /// Earliest global exclusion expiry (u64::MAX: none).
    next_expiry_us: u64,
    /// When executors whose assignment stopped at [`OFFER_JOBS_MAX`] are offered again
    /// (u64::MAX: none waits).
    deferred_until_us: u64,
    /// When any executor last reported an attempt as final.
    last_finish_us: u64,
    /// Executors recently removed as lost, oldest first (at most [`GONE_MAX`]).
    gone: VecDeque<Gone>,
    /// Active jobs with locality preferences (0: no locality pass).
    pref_jobs: usize,
    /// The jobs with preference queues per executor and host (level upkeep as executors come
    /// and go).
    pref_index: PrefIndex,
    /// Active jobs with speculation on.
    spec_jobs: usize,
    /// The speculation timeouts of the active jobs with speculation on, counted.
    spec_timeouts: SpecTimeouts,
    /// Active jobs with speculation on whose successes reached their quantile (monotonic:
    /// successes only grow).
    quantile_jobs: usize,
    /// Slots of jobs with speculation on with successes since the last straggler check (may
    /// hold slots whose job ended; see [`Job::durations_dirty`]).
    spec_dirty: Vec<u32>,
    /// When each job next needs the tick (locality waits, the unschedulable clock).
    timers: Timers,
    /// Unconfigured pools with no job, reused first at the pool limit (lowest index first).
    /// Kept only once the pools reach that limit (`pools_at_limit`): before it no pool is
    /// reused, so a pool going idle and busy again with every job costs nothing.
    idle_pools: BTreeSet<u32>,
    /// Scratch for the locality pass of an offer.
    scratch: Vec<u32>,
    /// The executor slot being removed (its attempts end one by one after it left the book).
    removing: Option<u32>,
    /// Hedged tasks and suspicion (`hedge.rs`).
    hedge: Hedging,
}

/// The scheduler's per-job settings, shared (a job inheriting one holds a reference).
#[derive(Debug)]
struct Defaults {
    speculation: Option<Arc<SpeculationConfig>>,
    hedging: Option<Arc<HedgeConfig>>,
    exclusion: Option<Arc<ExclusionConfig>>,
}

/// No job's id (ids are below 2^32): an empty [`Scheduler::job_hint`].
const NO_JOB: u64 = u64::MAX;

/// Active jobs up to which debug builds check `poll_timeout` against a walk of every job.
#[cfg(debug_assertions)]
const POLL_TIMEOUT_CHECK_JOBS_MAX: usize = 1024;
impl Scheduler {
    /// A scheduler with no executors and no jobs.
    pub fn new(config: Config) -> Scheduler {
        let mut pools = Vec::new();
        let mut pool_ids = FxHashMap::default();
        let mut runnable = Order::new(config.sharing == Sharing::Fair);
        for c in &config.pools {
            if !pool_ids.contains_key(&c.name) {
                let pool = Pool::new(c, true);
                runnable.set_pool(pools.len() as u32, pool.key());
                pool_ids.insert(c.name.clone(), pools.len() as u32);
                pools.push(pool);
            }
        }
        let spec_timeout_us = (config.speculation.as_ref())
            .map_or(SpeculationConfig::default().timeout_us, |s| s.timeout_us);
        Scheduler {
            book: Book::new(config.seed),
            defaults: Defaults {
                speculation: config.speculation.clone().map(Arc::new),
                hedging: config.hedging.clone().map(Arc::new),
                exclusion: config.exclusion.clone().map(Arc::new),
            },
            hedge: Hedging::new(config.hedging.as_ref()),
            config,
            jobs: JobSlots::default(),
            job_free_slots: Vec::new(),
            spare: Spare::default(),
            job_slots: IdMap::new(),
            job_hint: (NO_JOB, 0),
            active: 0,
            runnable,
            touched: Vec::new(),
            unsettled: None,
            #[cfg(any(test, feature = "sim"))]
            walk_only: false,
            unlisted_new: None,
            line: line::Line::default(),
            holding: false,
            held_since_us: 0,
            pools,
            pool_ids,
            last_pool: 0,
            next_job: 1,
            pending_total: 0,
            speculatable_total: 0,
            unfinished_total: 0,
            outputs: VecDeque::new(),
            events: VecDeque::new(),
            remains: VecDeque::new(),
            building: Builds::new(),
            building_tasks: 0,
            batched: Vec::new(),
            stats: Stats::default(),
            next_speculation_us: 0,
            next_expiry_us: u64::MAX,
            deferred_until_us: u64::MAX,
            last_finish_us: 0,
            gone: VecDeque::new(),
            pref_jobs: 0,
            pref_index: PrefIndex::default(),
            spec_jobs: 0,
            spec_timeouts: SpecTimeouts::new(spec_timeout_us),
            quantile_jobs: 0,
            spec_dirty: Vec::new(),
            timers: Timers::default(),
            idle_pools: BTreeSet::new(),
            scratch: Vec::new(),
            removing: None,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The next output, if any: the launches and kills waiting first, then the task results
    /// and job outcomes, each in the order decided.
    pub fn poll_output(&mut self) -> Option<Output> {
        (self.outputs.pop_front()).or_else(|| self.poll_event().map(Output::Event))
    }

    /// The next launch or kill, if any, leaving results and outcomes for
    /// [`poll_event`](Self::poll_event): a driver carries out the executors' part at once and
    /// tells its callers later, without queueing the results a second time.
    pub fn poll_command(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    /// The next task result or job outcome, if any, in the order decided (a job's results
    /// before its outcome).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front().map(|(event, _)| event)
    }

    /// [`poll_event`](Self::poll_event) with the token of the event's job
    /// ([`JobSpec::token`]).
    pub fn poll_event_with_token(&mut self) -> Option<(Event, JobToken)> {
        self.events.pop_front()
    }

    /// The records and payloads of a big job that ended (of at least 65,536 tasks), for the
    /// caller to free where it does not hold up its loop: freeing 10,000,000 tasks' takes
    /// about 80 ms. Optional: remains nobody takes (at most 4 are kept) are freed in place.
    pub fn poll_remains(&mut self) -> Option<Remains> {
        self.remains.pop_front()
    }

    /// The results and outcomes [`poll_event`](Self::poll_event) has not yet handed out, from
    /// the `skip`th on, oldest first: a driver counts them as they are decided.
    pub fn pending_events(&self, skip: usize) -> impl Iterator<Item = &Event> {
        (self.events.range(skip.min(self.events.len())..)).map(|(event, _)| event)
    }

    /// Moves every pending output into `out`, in [`poll_output`](Self::poll_output)'s order.
    pub fn drain_outputs(&mut self, out: &mut Vec<Output>) {
        out.extend(self.outputs.drain(..));
        out.extend(self.events.drain(..).map(|(event, _)| Output::Event(event)));
    }

    /// Tasks accepted and not yet reported (the quantity `pending_tasks_max` bounds).
    pub fn unfinished_tasks(&self) -> usize {
        self.unfinished_total + self.building_tasks
    }

    /// Tasks waiting for a core (a job being built: all of its).
    pub fn pending_tasks(&self) -> usize {
        self.pending_total + self.building_tasks
    }

    /// Jobs accepted and without an outcome yet (being built or not).
    pub fn active_jobs(&self) -> usize {
        self.active + self.building.len()
    }

    /// Whether `job` was accepted and has no outcome yet.
    pub fn is_active(&self, job: JobId) -> bool {
        self.job_slots.contains_key(job.0) || self.is_building(job)
    }

    /// The jobs accepted and without an outcome yet, each with its token
    /// ([`JobSpec::token`]), in no set order.
    pub fn active_job_tokens(&self) -> impl Iterator<Item = (JobId, JobToken)> + '_ {
        let slots = (self.job_slots.values().copied()).chain(self.building_slots());
        slots.filter_map(|slot| self.jobs.get(slot as usize).map(|job| (job.id, job.token)))
    }

    /// Tasks of `job` waiting for a core (`None` if the job is unknown or ended).
    pub fn job_pending_tasks(&self, job: JobId) -> Option<usize> {
        self.job(job).map(|j| j.pending)
    }

    /// Pools known: the configured ones plus those made for jobs naming others (at most
    /// [`Config::jobs_max`] of those: one with no job is reused for the next new name).
    pub fn pools(&self) -> usize {
        self.pools.len()
    }

    /// Registered executors.
    pub fn executors(&self) -> usize {
        self.book.len()
    }

    /// `(cores, free cores)` of a registered executor.
    pub fn executor_cores(&self, id: ExecutorId) -> Option<(u32, u32)> {
        let e = self.book.get(self.book.slot_of(id)?)?;
        Some((e.cores, e.free))
    }

    /// Drains a registered executor: it is offered nothing from now on while its running
    /// attempts go on (Spark's decommissioning; the lifecycle deletes it once they end). A
    /// state of its own, apart from exclusion and stalls: it never ends, only the removal
    /// follows. Returns false if it is not registered.
    pub fn handle_drain(&mut self, id: ExecutorId) -> bool {
        let Some(slot) = self.book.slot_of(id) else {
            return false;
        };
        self.book.drain(slot);
        debug_assert!(
            !self.book.offerable_contains(slot),
            "a draining executor is never offerable"
        );
        true
    }

    /// Whether a registered executor is draining ([`Scheduler::handle_drain`]).
    pub fn executor_draining(&self, id: ExecutorId) -> Option<bool> {
        Some(self.book.get(self.book.slot_of(id)?)?.draining)
    }

    /// Slots a registered executor may be given now: its free slots within its slow-start
    /// window, none while it is stalled or draining.
    pub fn executor_usable(&self, id: ExecutorId) -> Option<u32> {
        Some(self.book.get(self.book.slot_of(id)?)?.usable())
    }

    /// What a registered executor's attempts show at `now_us`: how many it reported RUNNING,
    /// and how many it never reported that were launched at least `age_us` ago (the driver's
    /// check of executors that do not read their launches). O(its attempts).
    pub fn attempts_heard(&self, id: ExecutorId, now_us: u64, age_us: u64) -> Option<(u64, u64)> {
        let e = self.book.get(self.book.slot_of(id)?)?;
        let (mut reported, mut unread) = (0u64, 0u64);
        for run in e.running.values() {
            if run.reported_running {
                reported += 1;
            } else if run.started_us.saturating_add(age_us) <= now_us {
                unread += 1;
            }
        }
        Some((reported, unread))
    }

    /// Stalled executors (holding a straggler, nothing finished since it was launched; they get
    /// no new work until they report a final state), each with the attempts it holds.
    pub fn stalled_executors(&self) -> Vec<(ExecutorId, usize)> {
        self.book
            .iter()
            .filter(|e| e.stalled)
            .map(|e| (e.id, e.running.len()))
            .collect()
    }

    /// Whether work is waiting (tasks pending, or copies of stragglers queued) that no
    /// registered executor can take at `now_us`: none is registered, or every one is excluded
    /// globally. Stalled executors count as able (they may recover; their stragglers are copied).
    /// O(executors) in the worst case; the driver asks now and then, not per event.
    pub fn starved(&self, now_us: u64) -> bool {
        if self.unfinished_total == 0 || (self.pending_total == 0 && self.speculatable_total == 0) {
            return false;
        }
        !self
            .book
            .iter()
            .any(|e| !self.globally_excluded(now_us, e.excluded_until_us, e.host))
    }

    /// Whether an executor is excluded at `now_us`: globally, or for `job` if given.
    pub fn is_excluded(&self, now_us: u64, id: ExecutorId, job: Option<JobId>) -> bool {
        let Some(e) = self.book.slot_of(id).and_then(|s| self.book.get(s)) else {
            return false;
        };
        if self.globally_excluded(now_us, e.excluded_until_us, e.host) {
            return true;
        }
        job.and_then(|j| self.job(j))
            .is_some_and(|j| j.excludes(id, e.host))
    }

    fn globally_excluded(&self, now_us: u64, exec_until_us: u64, host: u32) -> bool {
        exec_until_us > now_us
            || self
                .book
                .host(host)
                .is_some_and(|h| h.excluded_until_us > now_us)
    }

    fn job(&self, id: JobId) -> Option<&Job> {
        let slot = *self.job_slots.get(id.0)?;
        self.jobs.get(slot as usize)
    }

    /// An active job's state: locality level, task counts, counters (`None` once it ended).
    /// O(1) but for the lists it copies (valid levels, excluded executors).
    pub fn job_info(&self, id: JobId) -> Option<JobInfo> {
        let j = self.job(id)?;
        Some(JobInfo {
            pool: self
                .pools
                .get(j.pool as usize)
                .map_or_else(String::new, |p| p.name.to_string()),
            locality_level: j.level.public(),
            valid_levels: j.valid_levels().into_iter().map(Level::public).collect(),
            tasks: j.task_count,
            pending: j.pending,
            running: j.running,
            succeeded: j.counters.succeeded,
            finished: j.final_count,
            running_cores: j.running_cores,
            launched: j.counters.launched,
            speculative_launched: j.counters.speculative,
            failures: j.counters.failures,
            uncounted_ends: j.counters.uncounted,
            max_failures: j.max_failures,
            speculation: j.speculation.is_some(),
            excluded_executors: {
                let excluded = j.exclusion.iter().flat_map(|x| x.executors.iter());
                let mut v: Vec<ExecutorId> = excluded.copied().collect();
                v.sort_unstable();
                v
            },
        })
    }

    /// A task of an active job: its state, failures and running attempts (`None` once its
    /// job ended or for an unknown task).
    pub fn task_info(&self, task: TaskId) -> Option<TaskInfo> {
        let j = self.job(task.job())?;
        let index = task.index() as usize;
        let Some(t) = j.tasks.get(index) else {
            // A task whose record is not built yet: pending, never run.
            return (index < j.task_count).then(|| TaskInfo {
                status: TaskStatus::Pending,
                failures: 0,
                attempts_launched: 0,
                running: Vec::new(),
                excluded_executors: Vec::new(),
            });
        };
        let running = t
            .attempts
            .iter()
            .flatten()
            .filter_map(|a| {
                let e = self.book.get(a.exec)?;
                let run = e.running.get(a.run(), Attempt::new(task, a.attempt))?;
                Some(AttemptInfo {
                    attempt: a.attempt,
                    executor: e.id,
                    started_us: run.started_us,
                    reported_running: run.reported_running,
                })
            })
            .collect();
        Some(TaskInfo {
            status: match t.status {
                Status::Pending => TaskStatus::Pending,
                Status::Running => TaskStatus::Running,
                Status::Succeeded => TaskStatus::Succeeded,
                Status::Failed => TaskStatus::Failed,
            },
            failures: t.failures,
            attempts_launched: t.next_attempt,
            running,
            excluded_executors: t
                .exclusion()
                .map(|x| x.executors.clone())
                .unwrap_or_default(),
        })
    }

    /// The earliest time `handle_timeout` has work to do (a locality wait ending, a speculation check, an
    /// exclusion expiring, an unschedulable job timing out), if any. O(log jobs): the driver
    /// may ask after every input.
    pub fn poll_timeout(&self) -> Option<u64> {
        let mut t = self.timers.level_first_us().unwrap_or(u64::MAX);
        if self.book.len() > 0 {
            if let Some(p) = self.timers.progress_first_us() {
                t = t.min(p.saturating_add(self.config.unschedulable_timeout_us));
            }
        }
        if self.spec_jobs > 0 {
            t = t.min(self.next_speculation_us);
        }
        t = t.min(self.hedge.next_check_us().unwrap_or(u64::MAX));
        t = t.min(self.next_expiry_us).min(self.deferred_until_us);
        if !self.building.is_empty() {
            // The next chunk of a job being built: at once.
            t = 0;
        }
        let t = (t != u64::MAX).then_some(t);
        // Checked against a walk of the jobs in debug builds, while that walk is short (tests
        // with many thousands of jobs would otherwise go quadratic).
        #[cfg(debug_assertions)]
        if self.active <= POLL_TIMEOUT_CHECK_JOBS_MAX {
            assert_eq!(
                t,
                self.poll_timeout_scan(),
                "the timers agree with the jobs"
            );
            self.check_runs();
        }
        t
    }

    /// Debug builds: every executor's running attempts are consistent, each run not orphaned
    /// is the one its task record points at, and each orphaned one has no task record pointing
    /// at it. O(running attempts).
    #[cfg(debug_assertions)]
    fn check_runs(&self) {
        for (slot, e) in self.book.slots() {
            e.running.check();
            for (index, key, orphan) in e.running.entries() {
                let placed = (self.job_slots.get(key.task.job().0))
                    .and_then(|&job_slot| self.placed_run(job_slot, slot, key));
                match orphan {
                    false => assert_eq!(placed, Some(index), "{key:?} unplaced"),
                    true => assert!(placed.is_none(), "{key:?} orphaned but placed"),
                }
            }
        }
    }

    /// [`Scheduler::poll_timeout`] from a walk of all active jobs (checks the timers in debug
    /// builds).
    #[cfg(debug_assertions)]
    fn poll_timeout_scan(&self) -> Option<u64> {
        let waits = self.waits();
        let mut t = u64::MAX;
        for (slot, job) in self.jobs.iter() {
            if self.is_building(job.id) {
                continue; // no timers until it is published
            }
            if let Some(d) = job.level_deadline(waits) {
                t = t.min(d);
            }
            if job.pending > 0 && self.book.len() > 0 {
                // Filed at or before the job's real progress (it may come due early), when
                // it may be stuck; filed still or not when a risk ended since.
                match self.timers.filed_progress(slot) {
                    Some(filed) => {
                        assert!(filed <= job.last_progress_us, "filed after its progress");
                        t = t.min(filed.saturating_add(self.config.unschedulable_timeout_us));
                    }
                    None => assert!(
                        !self.stuck_risk().touches(job),
                        "a job with tasks queued that may be stuck has a progress entry"
                    ),
                }
            }
        }
        if self.spec_jobs > 0 {
            t = t.min(self.next_speculation_us);
        }
        t = t.min(self.hedge.next_check_us().unwrap_or(u64::MAX));
        t = t.min(self.next_expiry_us).min(self.deferred_until_us);
        if !self.building.is_empty() {
            t = 0;
        }
        (t != u64::MAX).then_some(t)
    }

    fn waits(&self) -> [u64; 2] {
        [
            self.config.locality_wait_executor_us,
            self.config.locality_wait_host_us,
        ]
    }

    /// What may leave a job stuck now ([`StuckRisk`]).
    #[inline]
    fn stuck_risk(&self) -> StuckRisk {
        StuckRisk::of(self.next_expiry_us, &self.book)
    }

    /// Starts the unschedulable clock of every job with tasks queued, after something that
    /// may leave any of them stuck began: a global exclusion, or the largest executor
    /// leaving. O(job slots), on those rare events. (What ends a risk leaves clocks filed
    /// until their jobs' next change.)
    fn start_clocks(&mut self, now_us: u64) {
        // Only jobs nothing may leave stuck wait in the line.
        self.flush_line();
        for slot in 0..self.jobs.len() as u32 {
            if self.jobs.get(slot as usize).is_some() {
                self.start_clock(now_us, slot);
            }
        }
    }

    /// Starts the unschedulable clock of the job in `slot` at `now_us` if it has tasks queued
    /// (and is not being built) and no clock runs for it, now that a risk touches it
    /// ([`StuckRisk`]): it has a whole timeout from then to make progress, as Spark's abort
    /// timer starts once it finds a task set it cannot schedule.
    fn start_clock(&mut self, now_us: u64, slot: u32) {
        let Some(job) = self.jobs.get(slot as usize) else {
            unreachable!("start_clock of empty job slot {slot}");
        };
        let idle = job.pending > 0 && self.timers.filed_progress(slot).is_none();
        if !idle || !self.stuck_risk().touches(job) || self.is_building(job.id) {
            return;
        }
        let job = live_job(&mut self.jobs, slot);
        job.last_progress_us = job.last_progress_us.max(now_us);
        self.sync_timers(slot);
    }

    // ----- inputs -----

    /// Registers an executor, or refuses it (duplicate id, excluded host, zero cores, full).
    pub fn handle_register(&mut self, info: ExecutorInfo, now_us: u64) -> Result<(), Refusal> {
        if self.book.slot_of(info.id).is_some() {
            return Err(Refusal::DuplicateId(info.id));
        }
        if info.cores == 0 {
            return Err(Refusal::ZeroCores);
        }
        if self.book.len() >= self.config.executors_max {
            return Err(Refusal::TooManyExecutors(self.config.executors_max));
        }
        let host = self.book.host_index(&info.host);
        if let Some(h) = self.book.host(host) {
            if h.excluded_until_us > now_us {
                return Err(Refusal::HostExcluded {
                    host: info.host,
                    until_us: h.excluded_until_us,
                });
            }
        }
        let first_on_host = !self.book.host_live(host);
        self.book.insert(
            info.id,
            host,
            info.cores,
            self.config.slow_start_slots,
            now_us,
        );
        self.gone.retain(|g| g.id != info.id);
        self.executor_changed(info.id, host, first_on_host, true);
        self.offer(now_us);
        self.flush();
        Ok(())
    }

    /// Keeps the valid locality levels current after an executor came or went: of the jobs
    /// with queues preferring it (or its host, if that gained its first or lost its last
    /// executor), O(log) each.
    fn executor_changed(&mut self, id: ExecutorId, host: u32, host_changed: bool, joined: bool) {
        if self.pref_jobs == 0 {
            return;
        }
        let mut slots = std::mem::take(&mut self.scratch);
        self.pref_index
            .jobs_into(id, host_changed.then_some(host), &mut slots);
        for &slot in &slots {
            let Some(job) = self.jobs.get_mut(slot as usize) else {
                unreachable!("active job slot {slot} is empty");
            };
            job.executor_changed(id, host, host_changed, joined);
            self.sync_job(slot);
        }
        self.scratch = slots;
    }

    /// Removes an executor; its running attempts go back to pending. They count as failed
    /// attempts only if the reason says the app caused it, and then only those the executor
    /// reported running (Spark's SPARK-39955: a task still launching did not run; when none
    /// had reported running, all count, since one of them brought the executor down).
    /// Returns false if it was not registered.
    ///
    /// An executor already removed as lost (its connection closed before anyone knew why) may
    /// be removed again with the reason a cluster manager learned later: if that reason
    /// blames the application, the attempts it held then are charged now (once), so a task
    /// that crashes every executor it runs on fails its job after `max_failures` crashes
    /// instead of looping (issue 14 item 7). That call also returns false.
    pub fn handle_remove(&mut self, id: ExecutorId, reason: RemovalReason, now_us: u64) -> bool {
        if !self.remove_executor_inner(now_us, id, &reason) {
            if reason.caused_by_app() {
                self.late_exit_reason(now_us, id, &reason);
                self.offer(now_us);
                self.flush();
            } else {
                // Not the app's fault after all: nothing will be charged.
                self.gone.retain(|g| g.id != id);
            }
            return false;
        }
        self.offer(now_us);
        self.flush();
        true
    }

    fn remove_executor_inner(
        &mut self,
        now_us: u64,
        id: ExecutorId,
        reason: &RemovalReason,
    ) -> bool {
        let max_cores = self.book.max_cores();
        let Some((exec_slot, exec)) = self.book.remove(id) else {
            return false;
        };
        if self.book.max_cores() < max_cores {
            // Tasks that fitted only the executors gone may be stuck now.
            self.start_clocks(now_us);
        }
        self.book.host_left(exec.host, self.next_job);
        self.hedge.executor_left(exec_slot, &exec.hedge);
        self.removing = Some(exec_slot);
        if exec.excluded_until_us > now_us {
            let Some(h) = self.book.hosts.get_mut(exec.host as usize) else {
                unreachable!("executor {id:?} on unknown host {}", exec.host);
            };
            h.excluded_executors = h.excluded_executors.saturating_sub(1);
        }
        let last_on_host = !self.book.host_live(exec.host);
        self.executor_changed(id, exec.host, last_on_host, false);
        let blamed = reason.caused_by_app();
        let any_running = exec.running.values().any(|r| r.reported_running);
        let msg = reason.to_string();
        let mut runs: Vec<(Attempt, Run)> = exec.running.into_runs();
        // In attempt order (the slab's follows launches and reports).
        runs.sort_unstable_by_key(|(k, _)| *k);
        if matches!(reason, RemovalReason::Lost(_)) && !runs.is_empty() {
            if self.gone.len() >= GONE_MAX {
                self.gone.pop_front();
            }
            self.gone.push_back(Gone {
                id,
                host: exec.host,
                attempts: runs
                    .iter()
                    .map(|(key, run)| (*key, run.reported_running))
                    .collect(),
            });
        }
        for (key, run) in runs {
            self.attempt_ended(
                now_us,
                (exec.id, exec.host),
                (key, run.started_us),
                End::Failed {
                    reason: msg.clone(),
                    counts: blamed && (run.reported_running || !any_running),
                },
            );
        }
        self.removing = None;
        true
    }

    /// Charges a late exit reason that blames the application to the attempts a lost executor
    /// held (see [`Scheduler::handle_remove`]).
    fn late_exit_reason(&mut self, now_us: u64, id: ExecutorId, reason: &RemovalReason) {
        let Some(pos) = self.gone.iter().position(|g| g.id == id) else {
            return;
        };
        let Some(gone) = self.gone.remove(pos) else {
            unreachable!("position {pos} was just found");
        };
        let any_running = gone.attempts.iter().any(|a| a.1);
        for (Attempt { task, attempt }, running) in gone.attempts {
            if !running && any_running {
                continue;
            }
            let Some(&job_slot) = self.job_slots.get(task.job().0) else {
                continue; // the job ended since
            };
            let Some(job) = self.jobs.get(job_slot as usize) else {
                unreachable!("job slot {job_slot} of an active job is empty");
            };
            let open = job
                .tasks
                .get(task.index() as usize)
                .is_some_and(|t| matches!(t.status, Status::Pending | Status::Running));
            if !open {
                continue;
            }
            self.stats.late_failures += 1;
            let why = format!("{reason} (learned after the executor was lost)");
            self.count_failure(now_us, job_slot, (id, gone.host), task, attempt, &why);
            if self.job_slots.get(task.job().0) != Some(&job_slot) {
                continue; // that failure ended the job
            }
            // A task now over its limit with nothing running fails its job here; one that
            // runs again fails when that attempt ends (attempt_ended checks).
            let over = self
                .jobs
                .get(job_slot as usize)
                .and_then(|j| j.tasks.get(task.index() as usize).map(|t| (j, t)))
                .is_some_and(|(j, t)| t.failures >= j.max_failures && t.status == Status::Pending);
            if over {
                self.fail_task_for_good(job_slot, task.index());
            }
        }
    }

    /// Accepts a job, or refuses it without side effects. A job with a task payload over
    /// `payload_max_bytes` is accepted and fails at once (its outcome names the limit).
    pub fn handle_submit(&mut self, spec: JobSpec, now_us: u64) -> Result<JobId, SubmitError> {
        let id = JobId(self.next_job);
        self.handle_submit_with_id(id, spec, now_us)?;
        Ok(id)
    }

    /// [`handle_submit`](Self::handle_submit) with an id the caller chose (a driver whose callers
    /// allocate ids so that submitting never waits for the scheduler). The id must be below
    /// 2^32 (it is the high half of its tasks' [`TaskId`]s) and not belong to an active job;
    /// later [`handle_submit`](Self::handle_submit) calls pick ids above it. FIFO order is id order.
    ///
    /// Never inlined: into a caller that builds the spec (the engine's example
    /// `one_task_jobs`), the spec's constants would fold, and its count would no longer be the
    /// driver's, whose specs come from its callers.
    #[inline(never)]
    pub fn handle_submit_with_id(
        &mut self,
        id: JobId,
        spec: JobSpec,
        now_us: u64,
    ) -> Result<(), SubmitError> {
        let n = self.check_submission(id, &spec)?;
        self.next_job = self.next_job.max(id.0 + 1);
        if n == 0 {
            let outcome = JobOutcome::Succeeded(Vec::new());
            (self.events).push_back((Event::JobOutcome { job: id, outcome }, spec.token));
            return Ok(());
        }
        let pool = self.resolve_pool(&spec.pool);
        let Some(pool_rec) = self.pools.get_mut(pool as usize) else {
            unreachable!("pool {pool} was just resolved");
        };
        pool_rec.jobs += 1;
        if self.pools_at_limit() {
            self.idle_pools.remove(&pool);
        }
        // Of a job built in chunks, the first chunk's (the others' as they are built).
        let chunk = self.build_chunk();
        let oversized = (spec.tasks).first_payload_over(self.config.payload_max_bytes, chunk);
        let refusal =
            oversized.map(|(i, len)| oversized_reason(i, len, self.config.payload_max_bytes));
        // Not while a job is built: the hosts its queues will name are in no index yet.
        if self.book.hosts_sweep_due() && self.building.is_empty() {
            self.sweep_hosts(now_us);
        }
        let slot = self.free_slot();
        // A job failed at once is built whole.
        let chunk = if refusal.is_some() { usize::MAX } else { chunk };
        match self.build_job(now_us, (id, slot), pool, spec, n, chunk) {
            Some(specs) => self.start_building(id, slot, specs),
            None => self.publish(now_us, slot, refusal),
        }
        if !self.holding {
            self.flush();
        }
        Ok(())
    }

    /// Makes the job built in `slot` active: counted, found by its id, listed and offered,
    /// or failed at once with `refusal` (a payload over the limit, a task of zero cores past
    /// the first chunk of a job built in chunks).
    #[inline(always)]
    fn publish(&mut self, now_us: u64, slot: u32, refusal: Option<String>) {
        let has_prefs = self.register(slot);
        self.list_and_offer(now_us, slot, refusal, has_prefs);
    }

    /// [`Scheduler::publish`] past the registering of the job in `slot` (`has_prefs`: it
    /// has preferences): listed and offered, or failed with `refusal`.
    fn list_and_offer(&mut self, now_us: u64, slot: u32, refusal: Option<String>, has_prefs: bool) {
        if let Some(reason) = refusal {
            self.list_job(slot);
            self.abort_job(slot, JobOutcome::Failed(vec![reason.clone()]), &reason);
        } else {
            // Its timers and (when no other job has work) its listing wait for the offers
            // below: a job they launch whole (a service's small job, usually) enters neither.
            // Alone, it is last in any order; with preferences, the locality pass needs it
            // listed.
            let unlisted = self.runnable.is_empty() && !has_prefs;
            self.book.unblock_all();
            if unlisted && self.launch_alone(now_us, slot) {
                return;
            }
            if !has_prefs && self.may_line_up(slot) {
                self.line_up(now_us, slot);
                return;
            }
            // The jobs in line go before it in the order, as they would have been listed.
            self.flush_line();
            let unlisted = self.runnable.is_empty() && !has_prefs;
            if unlisted {
                self.unlisted_new = Some(slot);
            } else {
                self.list_job(slot);
            }
            self.offer(now_us);
            // A job listed before the offer is listed as it should be after it: whatever
            // launched from it settled it.
            if unlisted {
                self.unlisted_new = None;
                self.list_job(slot);
            } else if cfg!(debug_assertions) {
                let job = self.jobs.get(slot as usize);
                let listed = job.map(|job| (job.in_runnable, job.has_work()));
                debug_assert!(matches!(listed, Some((a, b)) if a == b), "{listed:?}");
            }
            // A job launched whole has no timers to set: none were set in its slot since the
            // last job there ended, or its launches set none.
            if live_job(&mut self.jobs, slot).pending > 0 {
                self.sync_timers(slot);
            } else {
                debug_assert!(self.timers.is_clear(slot), "timers of job slot {slot}");
            }
        }
    }

    /// A new job of one task, submitted while no other task waits (nothing listed, nothing
    /// pending or to copy elsewhere, no job with preferences), launched at once on the next
    /// executor in round-robin order when it may take the task: what the offer that follows
    /// the submission would do (under FIFO, with nothing else to hand out, its first assignment
    /// takes this task and its round ends), without the walk, the listing and the timers that
    /// this job, launched whole, never needs. False, with nothing changed, when any of that
    /// does not hold (the executor resumes a capped walk, is not usable, the task does not
    /// fit): the offer decides. The executors set aside were offered again before (new work).
    #[inline(always)]
    fn launch_alone(&mut self, now_us: u64, job_slot: u32) -> bool {
        #[cfg(any(test, feature = "sim"))]
        if self.walk_only {
            return false;
        }
        if self.pending_total != 1
            || self.speculatable_total != 0
            || self.pref_jobs != 0
            || self.runnable.fair()
        {
            return false;
        }
        let Some(exec_slot) = self.book.next_offerable() else {
            return false;
        };
        if self.book.get(exec_slot).is_none_or(|e| e.resume.is_some()) {
            return false;
        }
        let Some((_, _, free)) = self.usable(now_us, exec_slot) else {
            return false;
        };
        let job = live_job(&mut self.jobs, job_slot);
        // A new job excludes no executor yet, and its one task is its only pending one.
        debug_assert!(job.exclusion.is_none() && job.speculatable.is_empty());
        let Some((range, cores)) = job.unbuilt_run(free).filter(|_| job.pending == 1) else {
            return false;
        };
        self.start_range(now_us, job_slot, exec_slot, range, cores);
        // As the offer's round goes on after a launch, and ends: nothing else waits.
        match self.book.get(exec_slot) {
            Some(e) if e.usable() > 0 => self.book.advance(),
            _ => self.book.unlist(exec_slot),
        }
        debug_assert!(self.pending_total == 0 && self.timers.is_clear(job_slot));
        true
    }

    /// Whether the new job in `job_slot`, not launched at once, may wait in the line
    /// (`line.rs`): sharing is FIFO, no job has preferences, it has one task not built yet, at
    /// the widest level, which nothing may leave stuck, and its key sorts after every listed
    /// job's and the line's.
    #[inline]
    fn may_line_up(&self, job_slot: u32) -> bool {
        #[cfg(any(test, feature = "sim"))]
        if self.walk_only {
            return false;
        }
        let job = self.jobs.live(job_slot);
        debug_assert!(self.unsettled.is_none());
        let key = job.fifo_key();
        job.task_count == 1
            && !self.runnable.fair()
            && self.pref_jobs == 0
            && job.pending == 1
            && job.tasks.is_empty()
            && job.level == Level::Any
            && !self.stuck_risk().touches(job)
            && self.line.takes(key)
            && (self.runnable.is_empty() || self.runnable.last_fifo_key().is_none_or(|l| key > l))
    }

    /// Puts the new job in `job_slot` in the line ([`Scheduler::may_line_up`] said it may) and
    /// offers: the executors free now take the line's first tasks, as they would the first
    /// listed jobs'. It has no timers to set (nothing may leave it stuck, and it waits at the
    /// widest level), as a job launched alone has none.
    fn line_up(&mut self, now_us: u64, job_slot: u32) {
        let job = live_job(&mut self.jobs, job_slot);
        job.in_line = true;
        self.line.push(job.fifo_key(), job_slot);
        if self.line.compact_due() {
            let jobs = &self.jobs;
            self.line.compact(|key, slot| in_line(jobs, key, slot));
        }
        self.offer(now_us);
        debug_assert!(
            self.timers.is_clear(job_slot),
            "timers of job slot {job_slot}"
        );
    }

    /// Empties the line into the runnable order (`line.rs`): its jobs are listed, as they
    /// would have been when they arrived. A check inlined where the line is empty, as it is
    /// for all jobs but one-task ones.
    #[inline(always)]
    fn flush_line(&mut self) {
        if !self.line.is_empty() {
            self.list_the_line();
        }
    }

    /// [`Scheduler::flush_line`] of a line with jobs.
    #[inline(never)]
    fn list_the_line(&mut self) {
        let entries = self.line.take();
        for &(key, slot) in &entries {
            if !in_line(&self.jobs, key, slot) {
                continue;
            }
            live_job(&mut self.jobs, slot).in_line = false;
            debug_assert!(self.timers.is_clear(slot), "timers of job slot {slot}");
            self.list_job(slot);
        }
        self.line.give_back(entries);
    }

    /// The executor in `slot` takes the task of the line's first job, as a walk of the order
    /// would give it (`line.rs`): None, with nothing changed, when that does not apply (the
    /// locality pass, an executor resuming a capped walk, a task that does not fit): the
    /// caller empties the line into the order and walks.
    #[inline]
    fn assign_from_line(&mut self, now_us: u64, slot: u32, local_only: bool) -> Option<Assigned> {
        if local_only || self.book.get(slot)?.resume.is_some() {
            return None;
        }
        debug_assert!(self.runnable.is_empty() && self.unsettled.is_none());
        // As `take_offer` finds it: an executor with no usable slot gets nothing.
        let Some((_, _, free)) = self.usable(now_us, slot) else {
            return Some(Assigned::Nothing);
        };
        if !self.launch_line_front(now_us, slot, free) {
            return None;
        }
        if self.may_fill(false) {
            self.fill_from_line(now_us, slot);
        }
        Some(Assigned::Launched)
    }

    /// Starts the task of the line's first job on the executor in `slot`, which has `free`
    /// usable slots, if it fits there; whether it did.
    #[inline(always)]
    fn launch_line_front(&mut self, now_us: u64, slot: u32, free: u32) -> bool {
        let jobs = &self.jobs;
        let Some((_, job_slot)) = self.line.front(|key, slot| in_line(jobs, key, slot)) else {
            return false;
        };
        let job = live_job(&mut self.jobs, job_slot);
        // A job in line excludes no executor (it never ran) and has its one task queued.
        debug_assert!(job.exclusion.is_none() && job.pending == 1);
        let Some((range, cores)) = job.unbuilt_run(free) else {
            return false;
        };
        job.in_line = false;
        self.line.pop_front();
        self.start_range(now_us, job_slot, slot, range, cores);
        // Nothing to settle: it has nothing queued (no listing), no timers and (FIFO) no place
        // in a FAIR order.
        debug_assert!(self.timers.is_clear(job_slot));
        true
    }

    /// The executor in `slot`, offered alone, takes the tasks of the next jobs in line while
    /// they fit, as the offer's next assignments would give them to it (`fill` for the jobs
    /// in line): without going back through the offer for each.
    fn fill_from_line(&mut self, now_us: u64, slot: u32) {
        loop {
            // What `usable` finds, its exclusion apart: that did not change since the launch.
            let free = self.book.get(slot).map_or(0, |e| e.usable());
            if free == 0 || !self.launch_line_front(now_us, slot, free) {
                return;
            }
        }
    }

    /// Counts the job in `slot` as active and files it by its id (its listing and timers
    /// apart: [`Scheduler::publish`]); whether it has preferences.
    #[inline(always)]
    fn register(&mut self, slot: u32) -> bool {
        let job = self.jobs.live(slot);
        let (id, n) = (job.id, job.task_count);
        let has_prefs = job.has_exec_prefs || job.has_host_prefs;
        if let Some(timeout_us) = job.speculation.as_ref().map(|sc| sc.timeout_us) {
            self.spec_jobs += 1;
            self.spec_timeouts.add(timeout_us);
        }
        self.job_slots.insert(id.0, slot);
        if has_prefs {
            self.pref_jobs += 1;
        }
        self.active += 1;
        self.pending_total += n;
        self.unfinished_total += n;
        has_prefs
    }

    /// Holds the launches of the submissions that follow (from `now_us`) until
    /// [`release_launches`](Self::release_launches): a burst of jobs submitted together leaves
    /// as one [`Output::Launch`] per executor rather than one per job. Any other input emits
    /// what is held with its own launches.
    pub fn hold_launches(&mut self, now_us: u64) {
        self.holding = true;
        self.held_since_us = now_us;
    }

    /// Emits the launches held since [`hold_launches`](Self::hold_launches), at `now_us`. When
    /// holding took longer than `RESTAMP_AFTER_US` (building a job of millions of tasks
    /// takes seconds), the held attempts count as started now, when they leave: stamped with
    /// the burst's start they would look overdue at once (copied, their executors taken for
    /// stalled).
    pub fn release_launches(&mut self, now_us: u64) {
        self.holding = false;
        if now_us.saturating_sub(self.held_since_us) > RESTAMP_AFTER_US {
            self.restamp_batched(now_us);
        }
        self.flush();
    }

    /// Moves the start of every batched attempt's run on to `now_us`.
    fn restamp_batched(&mut self, now_us: u64) {
        for &slot in &self.batched {
            let Some(e) = self.book.get_mut(slot) else {
                unreachable!("batched launches for empty executor slot {slot}");
            };
            for launch in &e.batch {
                let task = launch.task;
                let placed = (self.job_slots.get(task.job().0))
                    .and_then(|&job_slot| self.jobs.get(job_slot as usize))
                    .and_then(|job| job.tasks.get(task.index() as usize))
                    .and_then(|t| {
                        t.attempts
                            .iter()
                            .flatten()
                            .find(|a| a.attempt == launch.attempt)
                    });
                let Some(placed) = placed else {
                    continue; // ended while held (a cancel), its run with it
                };
                let key = Attempt::new(task, launch.attempt);
                if let Some(run) = e.running.get_mut(placed.run(), key) {
                    run.started_us = run.started_us.max(now_us);
                }
            }
        }
    }

    /// The refusals of [`handle_submit_with_id`](Self::handle_submit_with_id), checked before any
    /// side effect: a taken or too-large id, too many tasks, jobs or pending tasks, a task
    /// asking for zero cores. Its number of tasks if none (counted once: the caller's too).
    fn check_submission(&self, id: JobId, spec: &JobSpec) -> Result<usize, SubmitError> {
        // Every job accepted so far has an id below `next_job`: a callers' id past them (their
        // next, usually) belongs to no job, without a lookup.
        let taken =
            id.0 < self.next_job && (self.job_slots.contains_key(id.0) || self.is_building(id));
        if id.0 > u64::from(u32::MAX) || taken {
            return Err(SubmitError::DuplicateJob(id));
        }
        let n = spec.tasks.len();
        if u32::try_from(n).is_err() {
            return Err(SubmitError::TooManyTasks);
        }
        if self.active + self.building.len() >= self.config.jobs_max {
            return Err(SubmitError::TooManyJobs(self.config.jobs_max));
        }
        let unfinished = self.unfinished_total + self.building_tasks;
        if unfinished.saturating_add(n) > self.config.pending_tasks_max {
            return Err(SubmitError::TooManyPending {
                active: unfinished,
                submitted: n,
                limit: self.config.pending_tasks_max,
            });
        }
        // Of a job built in chunks, the first chunk's (the others' as they are built).
        if let Some(i) = spec.tasks.first_without_cores(self.build_chunk()) {
            return Err(SubmitError::ZeroCores(i as u32));
        }
        Ok(n)
    }

    /// The index of the pool named `name`, created if unknown. Bounded: past the configured
    /// pools plus `jobs_max` (more than active jobs can hold), an unconfigured pool with no job
    /// is reused for the new name.
    fn resolve_pool(&mut self, name: &str) -> u32 {
        // Jobs mostly name the pool the one before named: one comparison, no hashing (and for
        // the default pool's name as `JobSpec::new` gives it, the constant itself, a flag: no
        // text compared; another copy of the name's text is compared as any name is).
        let last = self.last_pool;
        let same = |p: &Pool| match std::ptr::eq(name, DEFAULT_POOL) {
            true => p.is_default,
            false => *p.name == *name,
        };
        if self.pools.get(last as usize).is_some_and(same) {
            return last;
        }
        let p = self.find_or_make_pool(name);
        self.last_pool = p;
        p
    }

    /// [`Self::resolve_pool`] past its check of the last pool named.
    fn find_or_make_pool(&mut self, name: &str) -> u32 {
        if let Some(&p) = self.pool_ids.get(name) {
            return p;
        }
        let fresh = Pool::new(&PoolConfig::new(name.to_owned()), false);
        let idle = self
            .pools_at_limit()
            .then(|| self.idle_pools.first().map(|&i| i as usize))
            .flatten();
        let p = match idle {
            Some(i) => {
                self.idle_pools.remove(&(i as u32));
                let Some(old) = self.pools.get_mut(i) else {
                    unreachable!("pool {i} was just found");
                };
                assert_eq!(old.running_cores, 0, "an idle pool runs nothing");
                self.pool_ids.remove(&*old.name);
                self.runnable.set_pool(i as u32, fresh.key());
                *old = fresh;
                i as u32
            }
            None => {
                self.runnable.set_pool(self.pools.len() as u32, fresh.key());
                self.pools.push(fresh);
                if self.pools.len() == self.pools_max() {
                    // At the limit from now on (pools are never removed): idle ones are kept.
                    self.idle_pools = (self.pools.iter().enumerate())
                        .filter(|(_, p)| !p.configured && p.jobs == 0)
                        .map(|(i, _)| i as u32)
                        .collect();
                }
                (self.pools.len() - 1) as u32
            }
        };
        self.pool_ids.insert(name.to_owned(), p);
        p
    }

    /// Whether the pools reached their limit (configured ones plus `jobs_max`), past which a
    /// new pool name takes an idle unconfigured pool.
    fn pools_at_limit(&self) -> bool {
        self.pools.len() >= self.pools_max()
    }

    /// The pools kept at most but for a moment: configured ones plus `jobs_max` (more than
    /// active jobs can hold).
    fn pools_max(&self) -> usize {
        self.config.pools.len() + self.config.jobs_max
    }

    /// The task records of a new job of task `specs` (host preferences interned in the book)
    /// and what they say of it ([`BuiltTasks`]), built into `tasks` (empty). A job of more than
    /// `chunk` specs gets its first `chunk` records, the rest left to `building.rs`.
    fn build_tasks(
        book: &mut Book,
        tasks: Vec<TaskRec>,
        mut specs: Vec<TaskSpec>,
        chunk: usize,
    ) -> BuiltTasks {
        debug_assert!(tasks.is_empty(), "a vacant record's vector comes empty");
        let total = specs.len();
        let mut parts = SpecParts {
            tasks,
            // A one-task job's payload needs no vector.
            payloads: Vec::with_capacity(if total == 1 { 0 } else { total }),
            one: None,
            functions: Vec::new(),
            prefs: Vec::new(),
            has_exec_prefs: false,
            has_host_prefs: false,
        };
        parts.tasks.reserve(total);
        let built = total.min(chunk);
        let Some(first) = specs.get_mut(..built) else {
            unreachable!("{built} specs of {total}");
        };
        Self::add_specs(book, first, total, &mut parts);
        let complete = built == total;
        let SpecParts {
            tasks,
            payloads,
            one,
            mut functions,
            prefs,
            has_exec_prefs,
            has_host_prefs,
        } = parts;
        // All one function: shared, as a job of one function over payloads (a job built in
        // chunks shares it once whole).
        let function = (complete && functions.len() == 1)
            .then(|| functions.pop())
            .flatten();
        let (spent, rest) = match (complete, total >= REMAINS_MIN_TASKS) {
            (false, _) => (None, Some(specs)),
            (true, true) => (Some(specs), None),
            (true, false) => (None, None),
        };
        BuiltTasks {
            tasks,
            payloads: match one {
                Some(payload) => Payloads::from(payload),
                None => Payloads::from(payloads),
            },
            function,
            functions,
            prefs,
            has_exec_prefs,
            has_host_prefs,
            spent,
            rest,
        }
    }

    /// Adds the records of `specs` (of a job of `total`) to `parts`. What the records take is
    /// moved out of the specs; the host names stay in them, to be freed with them (off the
    /// caller's loop for a big job: [`Remains`]).
    fn add_specs(book: &mut Book, specs: &mut [TaskSpec], total: usize, parts: &mut SpecParts) {
        let mut seen = (specs.len() >= HostsSeen::TASKS_MIN).then(HostsSeen::new);
        for t in specs {
            // A run of tasks naming one function (by pointer) shares its entry.
            if !(parts.functions.last()).is_some_and(|f| Arc::ptr_eq(f, &t.function)) {
                parts.functions.push(t.function.clone());
            }
            let function = u32::try_from(parts.functions.len() - 1).unwrap_or(u32::MAX);
            if !t.preferred_executors.is_empty() || !t.preferred_hosts.is_empty() {
                parts.has_exec_prefs |= !t.preferred_executors.is_empty();
                parts.has_host_prefs = true;
                if parts.prefs.is_empty() {
                    parts.prefs.reserve_exact(total);
                    parts.prefs.resize_with(parts.tasks.len(), || None);
                }
                parts.prefs.push(Some(Prefs {
                    executors: std::mem::take(&mut t.preferred_executors),
                    hosts: PrefHosts::of(&t.preferred_hosts, |h| match &mut seen {
                        Some(seen) => seen.index(book, h),
                        None => book.host_index(h),
                    }),
                }));
            } else if !parts.prefs.is_empty() {
                parts.prefs.push(None);
            }
            parts.tasks.push(TaskRec::new(function, t.cores));
            let payload = std::mem::take(&mut t.payload);
            match total {
                1 => parts.one = Some(payload),
                _ => parts.payloads.push(payload),
            }
        }
    }

    /// A new job's record in pool `pool`, its settings resolved against the scheduler's
    /// defaults, every task queued and its locality level chosen: built where it stays, in
    /// the empty job table slot `slot` (a job record is large to move). A job of more than
    /// `chunk` task specs has its first `chunk` built: the specs are returned for
    /// `building.rs` to build the rest. `n`: the spec's tasks, counted by the caller.
    fn build_job(
        &mut self,
        now_us: u64,
        (id, slot): (JobId, u32),
        pool: u32,
        spec: JobSpec,
        n: usize,
        chunk: usize,
    ) -> Option<Vec<TaskSpec>> {
        debug_assert_eq!(n, spec.tasks.len());
        // The record is looked up once: what else the build reads or changes is borrowed apart.
        let Scheduler {
            jobs,
            defaults,
            hedge,
            book,
            config,
            ..
        } = self;
        let job = jobs.vacant_mut(slot);
        debug_assert!(job.is_clean_vacancy(), "job slot {slot}: {job:?}");
        // A job inheriting every setting over a record whose last job did finds them there
        // (the defaults never change): nothing to look at one by one.
        let inherits = matches!(
            (&spec.speculation, &spec.exclusion, &spec.hedging),
            (
                JobSetting::Inherit,
                JobSetting::Inherit,
                JobSetting::Inherit
            )
        );
        if !(inherits && job.inherits_defaults) {
            (spec.speculation).apply_shared(&mut job.speculation, defaults.speculation.as_ref());
            (spec.exclusion).apply_shared(&mut job.exclusion_config, defaults.exclusion.as_ref());
            (spec.hedging).apply_shared(&mut job.hedge, defaults.hedging.as_ref());
            job.inherits_defaults = inherits;
        }
        let hedged = job.hedge.is_some();
        // What it needs apart from its records is written over the vacant record in place
        // (`slots.rs`): a record is large to move, and what this leaves out is a new job's
        // there already (`Job::vacate` names each such field).
        job.id = id;
        job.token = spec.token;
        job.pool = pool;
        job.weight = spec.weight.max(1);
        job.priority = spec.priority;
        job.task_count = n;
        job.keep_results = spec.keep_results;
        job.result_bytes_max = (spec.result_bytes_max).unwrap_or(config.result_bytes_max);
        job.pending = n;
        job.level = Level::Any;
        job.level_since_us = now_us;
        job.last_progress_us = now_us;
        job.max_failures = spec.max_failures.unwrap_or(config.max_failures).max(1);
        let (spent, rest) = match spec.tasks {
            // One function over payloads: every task the same size, none with preferences
            // (so no preference queue, and `Level::Any`), and room for the records only (built
            // as tasks first launch): O(1) whatever its size.
            Tasks::Same {
                function,
                cores,
                payloads,
            } => {
                job.latency = hedged.then(|| hedge.record_of(&function));
                job.tasks.reserve_exact(n);
                // A vacant record's payloads are the default's, which hold no allocation.
                debug_assert!(job.payloads.is_unallocated());
                std::mem::forget(std::mem::replace(&mut job.payloads, payloads));
                job.function = Some(function);
                job.has_exec_prefs = false;
                job.has_host_prefs = false;
                job.enqueue_fresh(n as u32, cores);
                (None, None)
            }
            Tasks::Each(specs) => Self::build_from_specs(job, (book, hedge), specs, chunk),
        };
        if let Some(specs) = spent {
            self.keep_remains(Remains::of_specs(specs));
        }
        rest
    }

    /// [`Scheduler::build_job`]'s records of a job of task `specs` (its first `chunk`), built
    /// into the vacant record `job`, queued, and its locality level chosen; the specs, spent
    /// (a big job's, for the caller to free) or still to build (`building.rs`). Out of line:
    /// the job of one function over payloads that most services submit does not carry it.
    #[inline(never)]
    fn build_from_specs(
        job: &mut Job,
        (book, hedge): (&mut Book, &mut Hedging),
        specs: Vec<TaskSpec>,
        chunk: usize,
    ) -> (Option<Vec<TaskSpec>>, Option<Vec<TaskSpec>>) {
        // The class a vacant record may keep is for `enqueue_fresh` alone.
        job.classes.clear();
        let kept = std::mem::take(&mut job.tasks);
        let built = Self::build_tasks(book, kept, specs, chunk);
        job.latency = match (job.hedge.is_some(), &built.function) {
            (true, Some(function)) => Some(hedge.record_of(function)),
            _ => None,
        };
        job.tasks = built.tasks;
        job.payloads = built.payloads;
        job.function = built.function;
        job.functions = built.functions;
        job.prefs = built.prefs;
        job.has_exec_prefs = built.has_exec_prefs;
        job.has_host_prefs = built.has_host_prefs;
        let book = &*book;
        let host_of = |e: ExecutorId| book.slot_of(e).and_then(|s| book.get(s)).map(|x| x.host);
        for i in 0..job.tasks.len() as u32 {
            job.enqueue(i, host_of, |h| book.host_live(h));
        }
        job.level = job.start_level();
        (built.spent, built.rest)
    }

    /// Frees the host records nothing holds any more ([`Book::sweep_hosts`]): due before a
    /// job is built once the records in use doubled since the last sweep, so its O(hosts +
    /// job slots) is paid once per that many new names. An active job holds the hosts of its
    /// preference queues (filed in the preference index, or new since its last listing); the
    /// executors whose late exit reasons may still be charged hold theirs.
    #[cold]
    fn sweep_hosts(&mut self, now_us: u64) {
        let mut oldest_job = u64::MAX;
        let mut kept: Vec<u32> = self.gone.iter().map(|g| g.host).collect();
        for (_, job) in self.jobs.iter() {
            oldest_job = oldest_job.min(job.id.0);
            kept.extend(job.new_pref_keys.iter().filter_map(|key| match key {
                PrefKey::Host(h) => Some(*h),
                PrefKey::Executor(_) => None,
            }));
        }
        kept.sort_unstable();
        kept.dedup();
        let (index, kept) = (&self.pref_index, &kept);
        let held = |h| index.holds_host(h) || kept.binary_search(&h).is_ok();
        let freed = (self.book).sweep_hosts(now_us, oldest_job, held, self.jobs.len());
        tracing::debug!(
            freed,
            in_use = self.book.hosts_in_use(),
            "host records nothing holds freed"
        );
    }

    /// A free slot of the job table (or a new one), empty, for a new job.
    fn free_slot(&mut self) -> u32 {
        match self.job_free_slots.pop() {
            Some(s) => s,
            None => self.jobs.push_vacant(),
        }
    }

    /// Cancels a job: its running attempts are killed, its pending tasks dropped, and the job
    /// reported cancelled (its unfinished tasks get no result). Returns false if the job is unknown or already ended.
    pub fn handle_cancel(&mut self, job: JobId, now_us: u64) -> bool {
        self.register_unbuilt(job);
        let Some(&slot) = self.job_slots.get(job.0) else {
            return false;
        };
        self.abort_job(slot, JobOutcome::Cancelled, "job cancelled");
        self.offer(now_us);
        self.flush();
        true
    }

    /// Fails a job now for `reason` (its deadline passed, say): like
    /// [`handle_cancel`](Self::handle_cancel), but the outcome is `Failed([reason])`. Returns false if
    /// the job is unknown or already ended.
    pub fn handle_fail(&mut self, job: JobId, reason: &str, now_us: u64) -> bool {
        self.register_unbuilt(job);
        let Some(&slot) = self.job_slots.get(job.0) else {
            return false;
        };
        self.abort_job(slot, JobOutcome::Failed(vec![reason.to_owned()]), reason);
        self.offer(now_us);
        self.flush();
        true
    }

    /// Kills a task for good: its running attempts are killed, it is reported failed ("killed:
    /// reason") and its job will fail. Returns false if the task is unknown or already final.
    /// A task of a job still being built (`building.rs`: nothing of it runs yet) is killed,
    /// and reported, once the job is published.
    pub fn handle_kill(&mut self, task: TaskId, reason: &str, now_us: u64) -> bool {
        if let Some(killed) = self.kill_unbuilt(task, reason) {
            return killed;
        }
        if !self.kill(task, reason) {
            return false;
        }
        self.offer(now_us);
        self.flush();
        true
    }

    /// Kills `task` of an active job ([`Scheduler::handle_kill`] but for the offers that
    /// follow): whether it was a task of an active job, not final yet.
    pub(super) fn kill(&mut self, task: TaskId, reason: &str) -> bool {
        let Some(&slot) = self.job_slots.get(task.job().0) else {
            return false;
        };
        let Some(job) = self.jobs.get_mut(slot as usize) else {
            unreachable!("job slot {slot} of an active job is empty");
        };
        let index = task.index();
        job.build_through(index);
        let Some(t) = job.tasks.get_mut(index as usize) else {
            return false;
        };
        match t.status {
            Status::Succeeded | Status::Failed => return false,
            Status::Pending => {
                job.pending -= 1;
                self.pending_total -= 1;
            }
            Status::Running => job.running -= 1,
        }
        t.status = Status::Failed;
        let msg = format!("killed: {reason}");
        let attempts = std::mem::take(&mut t.attempts);
        let token = job.token;
        if job.reasons.len() < REASON_TASKS_MAX {
            job.reasons
                .entry(index)
                .or_default()
                .push(format!("task {index} {msg}"));
        }
        job.doomed = true;
        job.final_count += 1;
        self.unfinished_total -= 1;
        self.sync_job(slot);
        for a in attempts.into_iter().flatten() {
            self.kill_attempt(slot, task, a, &msg);
        }
        let result = Err(msg);
        self.events
            .push_back((Event::TaskResult { task, result }, token));
        self.maybe_finish_job(slot);
        true
    }

    /// Handles a status report from an executor. Unknown, stale and duplicate reports are
    /// ignored (and counted).
    pub fn handle_status(&mut self, update: StatusUpdate, now_us: u64) {
        self.handle_statuses(std::iter::once(update), now_us);
    }

    /// Handles a batch of status reports (an executor's frame of them, say), then makes offers
    /// once: the slots they free are filled in one pass, so their launches leave as one
    /// `Launch` per executor. Its plain successes are applied as runs (`successes.rs`), the
    /// rest one at a time. Unknown, stale and duplicate reports are ignored (and counted).
    pub fn handle_statuses(
        &mut self,
        updates: impl IntoIterator<Item = StatusUpdate>,
        now_us: u64,
    ) {
        let mut ended = false;
        let mut successes = Successes::default();
        for mut update in updates {
            if self.add_success(now_us, &mut successes, &mut update) {
                // Its result went with its event: what is left holds nothing to drop.
                debug_assert!(update.data.is_empty());
                std::mem::forget(update);
                ended = true;
                continue;
            }
            self.settle_successes(now_us, &mut successes);
            ended |= self.apply_update(now_us, &mut update);
        }
        self.settle_successes(now_us, &mut successes);
        if ended {
            self.offer(now_us);
            self.flush();
        }
    }

    /// One status report, without the offers it makes room for: whether an attempt ended
    /// (or an executor went), so offers are due.
    fn apply_update(&mut self, now_us: u64, update: &mut StatusUpdate) -> bool {
        let Some(slot) = self.book.slot_of(update.executor) else {
            self.stats.ignored_updates += 1;
            return false;
        };
        let key = Attempt::new(update.task, update.attempt);
        let Some(exec) = self.book.get_mut(slot) else {
            unreachable!(
                "slot {slot} of registered executor {:?} is empty",
                update.executor
            );
        };
        if exec.hedge.heard(now_us) {
            // Trusted again: it reported.
            self.book.make_offerable(slot);
        }
        match update.state {
            TaskState::Running => {
                let index = self.run_index(slot, key);
                let Some(exec) = self.book.get_mut(slot) else {
                    unreachable!("slot {slot} emptied while reporting");
                };
                match index.and_then(|i| exec.running.get_mut(i, key)) {
                    Some(run) => run.reported_running = true,
                    None => self.stats.ignored_updates += 1,
                }
                return false;
            }
            TaskState::Lost => {
                if self.run_index(slot, key).is_none() {
                    self.stats.ignored_updates += 1;
                    return false;
                }
                let reason = RemovalReason::Lost(format!(
                    "reported task {} attempt {} lost",
                    update.task, update.attempt
                ));
                self.remove_executor_inner(now_us, update.executor, &reason);
            }
            TaskState::Finished | TaskState::Failed | TaskState::Killed => {
                return self.apply_final(now_us, slot, update);
            }
        }
        true
    }

    /// Where the executor in `slot` keeps the run of `key`, if it holds one: the index its task
    /// record keeps (the job looked up once, then the task by index), else the orphans' (a run
    /// the scheduler killed, or of an ended job). O(1) whatever the executor sends.
    #[inline(always)]
    fn run_index(&mut self, slot: u32, key: Attempt) -> Option<u32> {
        let placed = (self.hinted_job_slot(key.task.job().0))
            .and_then(|job_slot| self.placed_run(job_slot, slot, key));
        match placed {
            Some(index) => {
                debug_assert!(
                    (self.book.get(slot)).is_some_and(|e| e.running.get(index, key).is_some()),
                    "{key:?} placed at {index}"
                );
                Some(index)
            }
            None => self.book.get(slot)?.running.orphan_index(key),
        }
    }

    /// The slot of active job `job`, through the hint of the job reported last (a report
    /// looks its job up once, then its attempt's end finds it in the hint).
    #[inline(always)]
    fn hinted_job_slot(&mut self, job: u64) -> Option<u32> {
        match self.job_hint {
            (id, slot) if id == job => {
                debug_assert_eq!(self.job_slots.get(id), Some(&slot), "a stale job hint");
                Some(slot)
            }
            _ => {
                let slot = *self.job_slots.get(job)?;
                self.job_hint = (job, slot);
                Some(slot)
            }
        }
    }

    /// Where `key`'s task record (in `job_slot`) says its run is on the executor in `slot`, if
    /// it says so.
    #[inline(always)]
    fn placed_run(&self, job_slot: u32, slot: u32, key: Attempt) -> Option<u32> {
        let t = (self.jobs.get(job_slot as usize))?
            .tasks
            .get(key.task.index() as usize)?;
        (t.attempts.iter().flatten())
            .find(|p| p.attempt == key.attempt && p.exec == slot)
            .map(|p| p.run())
    }

    /// A final update (finished, failed, killed) from the executor in `slot`: the attempt's
    /// cores freed, its run time scored for hedging, the attempt ended. False (counted as
    /// ignored) for an attempt the executor does not hold.
    fn apply_final(&mut self, now_us: u64, slot: u32, update: &mut StatusUpdate) -> bool {
        let key = Attempt::new(update.task, update.attempt);
        let index = self.run_index(slot, key);
        let executors = self.book.len();
        // One look at the executor for the whole report (hedging and the stats are fields of
        // their own).
        let Some(exec) = self.book.get_mut(slot) else {
            unreachable!("slot {slot} emptied while reporting");
        };
        let Some(run) = index.and_then(|i| exec.running.remove(i, key)) else {
            self.stats.ignored_updates += 1;
            return false;
        };
        let finished = update.state == TaskState::Finished;
        if finished && run.hedged() && hedge::sampled(key.task.index()) {
            let took_us = now_us.saturating_sub(run.started_us);
            let stats = &mut self.stats;
            (self.hedge).finished(exec, run.record, (now_us, took_us), executors, stats);
        }
        let (id, host) = (exec.id, exec.host);
        self.executor_freed(now_us, slot, run.cores, u32::from(finished));
        let end = match update.state {
            TaskState::Finished => End::Succeeded(&mut update.data),
            // Spark counts a kill neither towards max_failures nor for exclusion
            // (TaskKilled.countTowardsTaskFailures is false).
            TaskState::Killed => {
                self.stats.attempts_killed += 1;
                End::Failed {
                    reason: format!("killed by executor: {}", lossy(&update.data)),
                    counts: false,
                }
            }
            _ => End::Failed {
                reason: lossy(&update.data),
                counts: true,
            },
        };
        self.attempt_ended(now_us, (id, host), (key, run.started_us), end);
        true
    }

    /// The executor in `slot` got `cores` back at `now_us` from attempts that ended, of which
    /// `finished` succeeded: it made progress, its window widens by them, and it is offered
    /// again.
    #[inline]
    fn executor_freed(&mut self, now_us: u64, slot: u32, cores: u32, finished: u32) {
        let Some(exec) = self.book.get_mut(slot) else {
            unreachable!("slot {slot} emptied while reporting");
        };
        if exec.running.is_empty() {
            self.hedge.idle(exec, slot);
        }
        exec.free += cores;
        exec.progress_us = now_us;
        exec.stalled = false;
        exec.window = exec.window.saturating_add(finished).min(exec.cores);
        self.last_finish_us = now_us;
        self.book.make_offerable(slot);
    }

    /// Time passed: widens locality levels, ends exclusions, looks for stragglers, fails
    /// unschedulable jobs, and makes offers.
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.build_next(now_us);
        let mut new_work = self.widen_due(now_us);
        if now_us >= self.next_expiry_us {
            self.expire_exclusions(now_us);
            new_work = true;
        }
        let wake = now_us >= self.deferred_until_us;
        if wake {
            self.deferred_until_us = u64::MAX;
        }
        if self.spec_jobs > 0 && now_us >= self.next_speculation_us {
            new_work |= self.find_stragglers(now_us);
        }
        if self.hedge.next_check_us().is_some_and(|t| t <= now_us) {
            new_work |= self.check_hedges(now_us);
        }
        if new_work {
            self.book.unblock_all();
        } else if wake {
            self.book.wake_all();
        }
        self.offer(now_us);
        self.fail_unschedulable(now_us);
        self.flush();
    }

    /// Executor `id` sent something at `now_us` that is not a status update (a heartbeat):
    /// a suspected executor is trusted again (see `hedge.rs`).
    pub fn handle_heard(&mut self, id: ExecutorId, now_us: u64) {
        let Some(slot) = self.book.slot_of(id) else {
            return;
        };
        if (self.book.get_mut(slot)).is_some_and(|e| e.hedge.heard(now_us)) {
            self.book.make_offerable(slot);
            self.offer(now_us);
            self.flush();
        }
    }

    /// The suspected executors: they hold overdue attempts and have been silent as long, so
    /// they get no new launches until they send something.
    pub fn suspected_executors(&self) -> Vec<ExecutorId> {
        (self.book.iter())
            .filter(|e| e.hedge.suspected)
            .map(|e| e.id)
            .collect()
    }

    /// The executors on probation: much slower than their peers, so they run one attempt at a
    /// time until they are not (see `hedge.rs`).
    pub fn executors_on_probation(&self) -> Vec<ExecutorId> {
        (self.book.iter())
            .filter(|e| e.hedge.probation)
            .map(|e| e.id)
            .collect()
    }

    /// Runs the hedging checks due at `now_us` (see `hedge.rs`); whether it queued a copy.
    fn check_hedges(&mut self, now_us: u64) -> bool {
        let sweep = (self.hedge).check(
            now_us,
            &mut self.book,
            &self.job_slots,
            &mut self.jobs,
            &mut self.stats,
        );
        self.speculatable_total += sweep.copies;
        for &slot in &sweep.suspected {
            let id = self.book.get(slot).map(|e| e.id);
            tracing::debug!(
                ?id,
                "executor suspected: it holds overdue attempts and is silent"
            );
        }
        self.after_sweep_slots(sweep.suspected, sweep.runnable);
        sweep.copies > 0
    }

    /// Widens the locality levels whose wait ended or that have nothing left to wait for (only
    /// those jobs are looked at: O(log jobs) each); returns whether any widened.
    fn widen_due(&mut self, now_us: u64) -> bool {
        let waits = self.waits();
        let mut due = std::mem::take(&mut self.scratch);
        due.clear();
        self.timers.level_due_into(now_us, &mut due);
        let mut widened = false;
        for &slot in &due {
            // A skip listed for a job that ended since.
            let Some(job) = self.jobs.get_mut(slot as usize) else {
                continue;
            };
            if job.pending > 0 {
                job.allowed_level(now_us, waits);
            }
            widened |= std::mem::take(&mut job.widened);
            self.sync_timers(slot);
        }
        self.scratch = due;
        widened
    }

    /// Fails jobs that have had tasks queued and no launch for `unschedulable_timeout_us`,
    /// when one of their queued tasks can run on no registered
    /// executor: every one is excluded for it (globally, for the job, or for that task after
    /// it failed there) or smaller than it (Spark's `getCompletelyExcludedTaskIfAny`, "abort
    /// stage if executor loss results in unschedulability from previously failed tasks"). A
    /// job merely starved by others, or waiting for locality, keeps waiting.
    fn fail_unschedulable(&mut self, now_us: u64) {
        // With no executor at all there is nothing to be excluded from: the driver's
        // no-executor warning and timeout handle that (Spark looks only once one registered).
        if self.book.len() == 0 {
            return;
        }
        let timeout = self.config.unschedulable_timeout_us;
        // Only the jobs whose clock ran out (the timers keep them by last progress), handled
        // in FIFO order.
        let mut overdue = Vec::new();
        self.timers.overdue_into(now_us, timeout, &mut overdue);
        if overdue.is_empty() {
            return;
        }
        let fifo_key = |s: u32| match self.jobs.get(s as usize) {
            Some(j) => j.fifo_key(),
            None => unreachable!("job slot {s} with a timer is empty"),
        };
        overdue.sort_unstable_by_key(|&s| fifo_key(s));
        for slot in overdue {
            let Some(job) = self.jobs.get(slot as usize) else {
                unreachable!("job slot {slot} with a timer is empty");
            };
            if now_us.saturating_sub(job.last_progress_us) < timeout {
                // Filed early (progress moves on without re-filing): its real clock.
                self.timers.refile_progress(slot, job.last_progress_us);
                continue;
            }
            self.prune_avoiding(slot);
            match self.stuck_reason(now_us, slot, timeout) {
                None => {
                    let Some(job) = self.jobs.get_mut(slot as usize) else {
                        unreachable!("runnable job slot {slot} is empty");
                    };
                    job.last_progress_us = now_us;
                    self.timers.refile_progress(slot, now_us);
                    self.sync_job(slot);
                }
                Some(reason) => self.fail_stuck(slot, reason),
            }
        }
    }

    /// Drops from the job's `avoiding` list the tasks no longer queued.
    fn prune_avoiding(&mut self, slot: u32) {
        let Some(job) = self.jobs.get_mut(slot as usize) else {
            unreachable!("runnable job slot {slot} is empty");
        };
        let tasks = &job.tasks;
        job.avoiding.retain(|&i| {
            tasks
                .get(i as usize)
                .is_some_and(|t| t.status == Status::Pending)
        });
    }

    /// Why the job in `slot` cannot progress, if it cannot: its largest queued task fits no
    /// executor it may use, or a task that avoids some executors may use none.
    fn stuck_reason(&self, now_us: u64, slot: u32, timeout: u64) -> Option<String> {
        let Some(job) = self.jobs.get(slot as usize) else {
            unreachable!("runnable job slot {slot} is empty");
        };
        // Rare (once per timeout per stuck job), so scans are fine here: the largest
        // queued task, and every queued task that avoids some executor.
        let unbuilt = (job.tasks.len() < job.task_count)
            .then(|| job.classes.first().map(|q| q.cores))
            .flatten();
        let largest = job
            .tasks
            .iter()
            .filter(|t| t.status == Status::Pending)
            .map(|t| t.cores)
            .chain(unbuilt)
            .max()
            .unwrap_or(1);
        let runs_somewhere = |cores: u32, task: Option<&TaskRec>| {
            self.book.iter().any(|e| {
                e.cores >= cores
                    && !self.globally_excluded(now_us, e.excluded_until_us, e.host)
                    && !job.excludes(e.id, e.host)
                    && !task.is_some_and(|t| t.avoids(e.id, e.host))
            })
        };
        if !runs_somewhere(largest, None) {
            return Some(format!(
                "no executor could run the job's tasks for {timeout} us (all excluded for \
                 it, or all smaller than its largest queued task of {largest} cores)"
            ));
        }
        job.avoiding
            .iter()
            .find(|&&i| {
                job.tasks
                    .get(i as usize)
                    .is_some_and(|t| !runs_somewhere(t.cores, Some(t)))
            })
            .map(|i| {
                format!(
                    "task {i} cannot run anywhere: every registered executor is \
                     excluded for it after its failures (Spark: aborting because a task \
                     cannot run anywhere due to node and executor exclusion)"
                )
            })
    }

    /// Fails the stuck job in `slot` with `reason` first, then the failures its tasks saw.
    fn fail_stuck(&mut self, slot: u32, reason: String) {
        let mut reasons = vec![reason.clone()];
        if let Some(job) = self.jobs.get(slot as usize) {
            let mut keys: Vec<u32> = job.reasons.keys().copied().collect();
            keys.sort_unstable();
            for k in keys {
                reasons.extend(job.reasons.get(&k).into_iter().flatten().cloned());
            }
        }
        tracing::warn!(job = slot, "{reason}");
        self.abort_job(slot, JobOutcome::Failed(reasons), &reason);
    }

    // ----- internals -----

    /// Makes offers until no offerable executor or no runnable task is left. With jobs that
    /// have locality preferences, a first pass gives each offerable executor the tasks that
    /// prefer it (or its host, once allowed) before any executor takes tasks at a worse level,
    /// so a task goes to its preferred executor when that one has a free slot in the same
    /// round, whatever the order executors are offered in (Spark's resourceOffers loops over
    /// locality levels outside the offers: "Locality should be used for bulk offers even with
    /// delay scheduling off").
    fn offer(&mut self, now_us: u64) {
        // No executor to offer (every one full, say, while jobs wait in line): nothing to do.
        if self.book.offerable_len() == 0 && self.unsettled.is_none() {
            return;
        }
        if self.pref_jobs > 0 && self.pending_total > 0 {
            let mut slots = std::mem::take(&mut self.scratch);
            slots.clear();
            self.book.offerable_into(&mut slots);
            for &slot in &slots {
                while self.pending_total > 0
                    && self.book.get(slot).is_some_and(|e| e.usable() > 0)
                    && self.assign_one(now_us, slot, true) == Assigned::Launched
                {}
            }
            self.scratch = slots;
        }
        while self.pending_total > 0 || self.speculatable_total > 0 {
            let Some(slot) = self.book.next_offerable() else {
                break;
            };
            match self.assign_one(now_us, slot, false) {
                Assigned::Launched => match self.book.get(slot) {
                    Some(e) if e.usable() > 0 => self.book.advance(),
                    _ => self.book.unlist(slot),
                },
                Assigned::Deferred => {
                    // Set aside like a blocked executor; the tick brings it back at the latest.
                    self.book.block(slot);
                    let at = now_us.saturating_add(OFFER_DEFER_US);
                    self.deferred_until_us = self.deferred_until_us.min(at);
                }
                Assigned::Nothing if self.book.get(slot).is_some_and(|e| e.usable() > 0) => {
                    self.book.block(slot);
                }
                // Full within its window, or stalled: back when a final update comes.
                Assigned::Nothing => self.book.unlist(slot),
            }
        }
        if self.unsettled.is_some() {
            self.settle_streak();
        }
    }

    /// Settles the job the last assignments launched from without settling it, if any.
    #[inline(never)]
    fn settle_streak(&mut self) {
        if let Some(job_slot) = self.unsettled.take() {
            self.settle(job_slot);
        }
    }

    /// Gives one task to the executor in `slot`, if any job has one for it. With
    /// `local_only`, only the first job (in sharing order) with work the executor may take is
    /// asked, and only for tasks preferring this executor or its host.
    ///
    /// At most [`OFFER_JOBS_MAX`] jobs are asked: past them the walk stops with
    /// [`Assigned::Deferred`], and the executor's next walk goes on after the last job asked.
    /// A walk that began at the start of the order and reaches its end is a cycle: every job
    /// was asked once. If new work appeared during the cycle, the executor has more usable
    /// slots than when it began, or (FAIR) the order was re-sorted, jobs passed may answer now
    /// (or were missed), so one more walk starts at once from the start. `local_only` walks
    /// (the locality pass) are capped too but leave the cursor alone: the full pass that
    /// follows decides.
    fn assign_one(&mut self, now_us: u64, slot: u32, local_only: bool) -> Assigned {
        // The line is the order's tail: asked here once nothing is listed before it.
        if !self.line.is_empty() && self.runnable.is_empty() {
            if let Some(assigned) = self.assign_from_line(now_us, slot, local_only) {
                return assigned;
            }
            self.flush_line();
        }
        if self.unsettled.is_some() {
            if let Some(assigned) = self.assign_from_streak(now_us, slot, local_only) {
                return assigned;
            }
            // A walk sees the order and timers as they are.
            self.settle_streak();
        }
        if !local_only && self.may_fill(false) {
            if let Some(assigned) = self.assign_from_front(now_us, slot) {
                return assigned;
            }
        }
        // A walk may go past the listed jobs: those in line are listed first, where it finds
        // them.
        self.flush_line();
        let Some((id, host, free, resume)) = self.take_offer(now_us, slot, local_only) else {
            return Assigned::Nothing;
        };
        let mut touched = std::mem::take(&mut self.touched);
        let (work_seq, usable, moves) = resume
            .as_ref()
            .map_or((self.book.work_seq, free, self.runnable.moves), |r| {
                (r.work_seq, r.usable, r.moves)
            });
        let after = resume.as_ref().map(|r| &r.after);
        let from_front = after.is_none();
        let (launched, capped_at, first_with_work) = self.walk_jobs(
            now_us,
            slot,
            (id, host, free),
            local_only,
            after,
            &mut touched,
        );
        let mut assigned = Assigned::Nothing;
        if let Some((job_slot, found)) = launched {
            self.start(now_us, job_slot, slot, found);
            if self.may_fill(local_only) {
                self.fill(now_us, job_slot, slot, (id, host), local_only);
            }
            if !local_only && from_front && first_with_work && self.may_streak(job_slot) {
                // The next executors of this round take its tasks without a walk; it is
                // settled once, when the round ends or a walk needs it settled.
                self.unsettled = Some(job_slot);
            } else {
                self.settle(job_slot);
            }
            assigned = Assigned::Launched;
        } else if let Some(last) = capped_at.filter(|_| !local_only) {
            self.defer_walk(slot, last, work_seq, usable, moves);
            assigned = Assigned::Deferred;
        }
        for job_slot in touched.drain(..) {
            self.sync_job(job_slot);
        }
        self.touched = touched;
        let stale = self.book.work_seq != work_seq || free > usable || self.runnable.moves != moves;
        if assigned == Assigned::Nothing && resume.is_some() && stale {
            // A resumed walk ended its cycle: walk again from the start (it has no cursor, so
            // this recurses once at most).
            return self.assign_one(now_us, slot, false);
        }
        assigned
    }

    /// Under FIFO, with the executor in `slot` the only one offered (one completion frame's
    /// slots to fill, say, from jobs waiting in line): the first job in order (the new job not
    /// listed yet, when no job is listed) gives it a task without a walk when a walk would take
    /// one from that job, as it does when the job has queued tasks and no stragglers queued
    /// and does not exclude the executor, the executor has no walk to resume, and a task fits
    /// at the level the job's wait allows. None when that does not hold: the walk decides (and
    /// sees a level this widened, as its own asking would have).
    fn assign_from_front(&mut self, now_us: u64, slot: u32) -> Option<Assigned> {
        if self.book.get(slot)?.resume.is_some() {
            return None;
        }
        // A new job not listed yet comes after every listed one, as in a walk.
        let job_slot = self.runnable.first_fifo().or(self.unlisted_new)?;
        let (id, host, free) = self.usable(now_us, slot)?;
        let waits = self.waits();
        let job = live_job(&mut self.jobs, job_slot);
        if job.pending == 0 || !job.speculatable.is_empty() || job.excludes(id, host) {
            return None;
        }
        if let Some((range, cores)) = job.unbuilt_run(free) {
            // A task with no record yet, the one `find_pending` would give, started without
            // building one first (a service's one-task job, usually). One only: what an idle
            // executor may take after its first launch is less than its free cores when its
            // window or probation says so, and `fill` asks that.
            let first = range.start..range.start + 1;
            self.start_range(now_us, job_slot, slot, first, cores);
        } else {
            let found = job.find_pending(now_us, waits, (id, host), free, false)?;
            reoffer_if_widened(&mut self.book, job);
            self.start(now_us, job_slot, slot, found);
        }
        if self.may_fill(false) {
            self.fill(now_us, job_slot, slot, (id, host), false);
        }
        self.settle(job_slot);
        Some(Assigned::Launched)
    }

    /// Asks the runnable jobs after `after`, in sharing order, for a task for the executor in
    /// `slot` offering `(id, host, free)`, pushing onto `touched` the jobs whose straggler queue
    /// shrank. Returns the task found (and its job), and the last job asked when the walk
    /// stopped at [`OFFER_JOBS_MAX`].
    #[inline]
    fn walk_jobs(
        &mut self,
        now_us: u64,
        slot: u32,
        (id, host, free): (ExecutorId, u32, u32),
        local_only: bool,
        after: Option<&Cursor>,
        touched: &mut Vec<u32>,
    ) -> (Option<(u32, Found)>, Option<u32>, bool) {
        let waits = self.waits();
        let mut last_asked = None;
        // No job asked before the one found had work (for any executor).
        let mut first_with_work = true;
        let jobs = self.runnable.iter_after(after).chain(self.unlisted_new);
        for (asked, job_slot) in jobs.enumerate() {
            if asked == OFFER_JOBS_MAX {
                return (None, last_asked, false);
            }
            last_asked = Some(job_slot);
            let Some(job) = self.jobs.get_mut(job_slot as usize) else {
                unreachable!("runnable job slot {job_slot} is empty");
            };
            if !job.has_work() {
                continue;
            }
            if job.excludes(id, host) {
                first_with_work = false;
                continue;
            }
            if local_only && !(job.has_exec_prefs || job.has_host_prefs) {
                break;
            }
            let spec_before = job.speculatable.len();
            let found = job.find_task(now_us, waits, id, slot, host, free, local_only);
            reoffer_if_widened(&mut self.book, job);
            let popped = spec_before - job.speculatable.len();
            if popped > 0 {
                self.speculatable_total = self.speculatable_total.saturating_sub(popped);
                touched.push(job_slot);
            }
            if let Some(found) = found {
                // Its timers are set once it launched (`settle`).
                return (Some((job_slot, found)), None, first_with_work);
            }
            first_with_work = false;
            // Asking may have moved its locality level along (or emptied a preference queue).
            let risk = StuckRisk::of(self.next_expiry_us, &self.book);
            set_timers(&mut self.timers, job_slot, job, waits, risk);
            if local_only {
                break;
            }
        }
        (None, None, false)
    }

    /// Whether the job in `job_slot`, which just launched as the first job in the sharing
    /// order with work, may give the next executors of this offer round tasks without a walk
    /// ([`Scheduler::assign_from_streak`]): under FIFO (where it stays first while it has
    /// work: nothing is submitted or requeued within a round), when it has tasks queued, and
    /// when other executors wait their turn.
    fn may_streak(&self, job_slot: u32) -> bool {
        #[cfg(any(test, feature = "sim"))]
        if self.walk_only {
            return false;
        }
        let job = self.jobs.get(job_slot as usize);
        !self.runnable.fair() && self.book.offerable_len() > 1 && job.is_some_and(|j| j.pending > 0)
    }

    /// The executor in `slot` takes a task from the round's unsettled job, which is first in
    /// FIFO order with work, as a walk from the front would give it: a queued task (a
    /// walk asks queued tasks before stragglers). None (with the job still unsettled) when
    /// that does not apply here: the executor resumes a capped walk, the job excludes it or
    /// has nothing queued that fits; the caller settles it and walks.
    #[inline(never)]
    fn assign_from_streak(&mut self, now_us: u64, slot: u32, local_only: bool) -> Option<Assigned> {
        let job_slot = self.unsettled.filter(|_| !local_only)?;
        if self.book.get(slot)?.resume.is_some() {
            return None;
        }
        let Some((id, host, free)) = self.usable(now_us, slot) else {
            return Some(Assigned::Nothing);
        };
        let waits = self.waits();
        let job = live_job(&mut self.jobs, job_slot);
        if job.pending == 0 || job.excludes(id, host) {
            return None;
        }
        let found = job.find_pending(now_us, waits, (id, host), free, false)?;
        reoffer_if_widened(&mut self.book, job);
        self.start(now_us, job_slot, slot, found);
        if self.may_fill(false) {
            self.fill(now_us, job_slot, slot, (id, host), false);
        }
        Some(Assigned::Launched)
    }

    /// The offer the executor in `slot` makes: its id, host and usable slots, and (unless
    /// `local_only`) the walk it left off, taken. None if it has no usable slot or is excluded
    /// everywhere.
    #[inline]
    fn take_offer(
        &mut self,
        now_us: u64,
        slot: u32,
        local_only: bool,
    ) -> Option<(ExecutorId, u32, u32, Option<Resume>)> {
        let Some(e) = self.book.get_mut(slot) else {
            unreachable!("offerable slot {slot} is empty");
        };
        assert!(!e.draining, "draining executor {:?} offered", e.id);
        let resume = if local_only { None } else { e.resume.take() };
        let (id, host, free) = self.usable(now_us, slot)?;
        Some((id, host, free, resume))
    }

    /// The executor in `slot` as an offer: its id, host and usable slots; None if it has no
    /// usable slot or is excluded everywhere.
    #[inline]
    fn usable(&self, now_us: u64, slot: u32) -> Option<(ExecutorId, u32, u32)> {
        let e = self.book.get(slot)?;
        let free = e.usable();
        if free == 0 || self.globally_excluded(now_us, e.excluded_until_us, e.host) {
            return None;
        }
        Some((e.id, e.host, free))
    }

    /// Saves where a capped walk of the executor in `slot` stopped (after job `last`), with the
    /// marks of the cycle it belongs to, so its next walk goes on from there.
    fn defer_walk(&mut self, slot: u32, last: u32, work_seq: u64, usable: u32, moves: u64) {
        // Where the walk stopped, taken before `touched` jobs may leave the order.
        let key = self.jobs.get(last as usize).map(Job::fifo_key);
        let Some(key) = key else {
            unreachable!("runnable job slot {last} is empty");
        };
        let after = self.runnable.cursor_at(last, key);
        if let Some(e) = self.book.get_mut(slot) {
            e.resume = Some(Resume {
                after,
                work_seq,
                usable,
                moves,
            });
        }
    }

    /// Sets a job's timers from its state (call after any change to its queues, its level or
    /// its last progress): O(log jobs) when they moved, O(1) when not.
    fn sync_timers(&mut self, job_slot: u32) {
        let Some(job) = self.jobs.get(job_slot as usize) else {
            unreachable!("sync_timers of empty job slot {job_slot}");
        };
        let risk = self.stuck_risk();
        if job.pending == 0 || (job.level == Level::Any && !risk.touches(job)) {
            // Nothing queued, or queued at the widest level and in no risk of being stuck:
            // no deadline, no clock and no skip (what `set_timers` finds).
            self.timers.set(job_slot, Keys::default());
            return;
        }
        let waits = self.waits();
        set_timers(&mut self.timers, job_slot, job, waits, risk);
    }

    /// Files `job` (in `job_slot`) in the preference index under the queue keys it made since
    /// last time.
    fn file_pref_keys(pref_index: &mut PrefIndex, job_slot: u32, job: &mut Job) {
        for key in job.new_pref_keys.drain(..) {
            if pref_index.add(job_slot, key) {
                job.filed_pref_keys.push(key);
            }
        }
    }

    /// Keeps a job's entries current after it changed: its timers, and whether it is listed
    /// as runnable (after its pending or straggler queues changed).
    fn sync_job(&mut self, job_slot: u32) {
        self.sync_timers(job_slot);
        self.list_job(job_slot);
    }

    /// Files a job's new preference keys and lists it as runnable, or unlists it, after its
    /// queues changed (its timers apart: [`Scheduler::sync_job`] does both).
    fn list_job(&mut self, job_slot: u32) {
        let job = live_job(&mut self.jobs, job_slot);
        if !job.new_pref_keys.is_empty() {
            Self::file_pref_keys(&mut self.pref_index, job_slot, job);
        }
        let want = job.has_work();
        if want == job.in_runnable {
            return;
        }
        if want && !self.line.comes_after(job.fifo_key()) {
            // The jobs in line come before it in the order, as they would have been listed.
            self.flush_line();
            return self.list_job(job_slot);
        }
        job.in_runnable = want;
        if want {
            if self.unlisted_new == Some(job_slot) {
                // Listed now: walks find it in the order.
                self.unlisted_new = None;
            }
            let Some(pool) = self.pools.get(job.pool as usize) else {
                unreachable!("job in unknown pool {}", job.pool);
            };
            let share = pool.share(job.running_cores, job.weight);
            self.runnable
                .insert(job_slot, job.fifo_key(), job.pool, share);
        } else {
            self.runnable.remove(job_slot, job.fifo_key());
        }
    }

    /// Simulator only: makes every assignment walk, the reference the shortcuts that spare
    /// walks (`fill`, taking from the front, streaks) must match.
    #[cfg(feature = "sim")]
    #[doc(hidden)]
    pub fn set_walk_only(&mut self, on: bool) {
        self.walk_only = on;
    }

    /// Whether an executor just given a task may take more from the same job at once
    /// ([`Scheduler::fill`]): under FIFO (where that job stays first as long as it has work),
    /// and when it is the only executor offered (so no other waits its round-robin turn) or
    /// in the locality pass (`local_only`, which serves one executor at a time anyway).
    #[inline(always)]
    fn may_fill(&self, local_only: bool) -> bool {
        #[cfg(any(test, feature = "sim"))]
        if self.walk_only {
            return false;
        }
        !self.runnable.fair() && (local_only || self.book.offerable_len() == 1)
    }

    /// Gives the executor in `exec_slot` (`id` on `host`) more tasks of the job in `job_slot`,
    /// which just gave it one, while it has usable slots and the job has queued tasks that
    /// fit at the locality level its wait allows: what one assignment after another would
    /// do (a walk from the front asks this job first, and asks its queued tasks first), with
    /// the walk, the timers and the sharing order looked at once for them all (`settle`).
    /// A level that widens here as a task is found gives the executors set aside a chance
    /// at the job's tasks, as after a walk: they are offered again and the round goes on
    /// walking; one that widens as nothing is found is left for the walk that follows.
    /// In the locality pass (`local_only`), only tasks preferring the executor or its host,
    /// as the pass's walk asks.
    #[inline(always)]
    fn fill(
        &mut self,
        now_us: u64,
        job_slot: u32,
        exec_slot: u32,
        (id, host): (ExecutorId, u32),
        local_only: bool,
    ) {
        let waits = self.waits();
        loop {
            // A job with nothing queued (a one-task job just launched) first: no executor to ask.
            if live_job(&mut self.jobs, job_slot).pending == 0 {
                return;
            }
            let free = self.book.get(exec_slot).map_or(0, |e| e.usable());
            let job = live_job(&mut self.jobs, job_slot);
            if free == 0 {
                return;
            }
            if let Some((range, cores)) = job.unbuilt_run(free).filter(|_| !local_only) {
                self.start_range(now_us, job_slot, exec_slot, range, cores);
                continue;
            }
            // Nothing found: a level this widened is left for the walk that asks this
            // executor next, as after its own asking.
            let found = job.find_pending(now_us, waits, (id, host), free, local_only);
            let Some(found) = found else {
                return;
            };
            let widened = reoffer_if_widened(&mut self.book, job);
            self.start(now_us, job_slot, exec_slot, found);
            if widened {
                return;
            }
        }
    }

    /// Starts an attempt of job `job_slot`'s task `found` on executor `exec_slot`: booked and
    /// batched; the job's entries (timers, sharing order) wait for [`Scheduler::settle`].
    fn start(&mut self, now_us: u64, job_slot: u32, exec_slot: u32, found: Found) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("launch for empty job slot {job_slot}");
        };
        let Some(e) = self.book.get(exec_slot) else {
            unreachable!("launch on empty executor slot {exec_slot}");
        };
        let on_probation = e.hedge.probation;
        let (launch, speculative) =
            job.start_attempt(now_us, (exec_slot, e.running.vacant()), found);
        // A hedged run keeps its function's record and its threshold.
        let hedged = job.hedge.as_ref().map(|config| {
            if !speculative {
                self.hedge.earn(config.copy_ratio, config.burst);
            }
            let record = match job.latency {
                Some(record) => record,
                None => self.hedge.record_of(&launch.function),
            };
            // An executor on probation is much slower than its peers: what it runs is copied
            // after the floor, not after the percentile it would exceed anyway.
            let threshold_us = match on_probation {
                true => config.floor_us,
                false => self.hedge.threshold_us(config, record),
            };
            (record, threshold_us)
        });
        if speculative {
            self.stats.speculative_launched += 1;
        } else {
            self.pending_total -= 1;
        }
        let cores = launch.cores;
        job.running_cores += u64::from(cores);
        let Some(p) = self.pools.get_mut(job.pool as usize) else {
            unreachable!("job in unknown pool {}", job.pool);
        };
        p.running_cores += u64::from(cores);
        self.batch_launch(now_us, exec_slot, launch, hedged);
        self.stats.launched += 1;
    }

    /// Starts the first attempt of each task of `range` (of `cores` cores each) of job
    /// `job_slot` on executor `exec_slot`, as many [`start`](Self::start)s would, in one go:
    /// the tasks have no record yet ([`Job::unbuilt_run`]), so each needs only its record, its
    /// run and its launch; the job's and the executor's counts, hedging's threshold and tokens
    /// are worked out once for the range.
    fn start_range(
        &mut self,
        now_us: u64,
        job_slot: u32,
        exec_slot: u32,
        range: std::ops::Range<u32>,
        cores: u32,
    ) {
        let n = range.len() as u32;
        let job = live_job(&mut self.jobs, job_slot);
        let Some(e) = self.book.get_mut(exec_slot) else {
            unreachable!("launch on empty executor slot {exec_slot}");
        };
        assert!(e.free >= n * cores, "launches over the free cores");
        let Some(function) = &job.function else {
            unreachable!("a run of unbuilt tasks in a job of many functions");
        };
        // As `start` works it out for each launch: nothing it reads changes within the range.
        let hedged = job.hedge.as_ref().map(|config| {
            for _ in 0..n {
                self.hedge.earn(config.copy_ratio, config.burst);
            }
            let record = match job.latency {
                Some(record) => record,
                None => self.hedge.record_of(function),
            };
            let threshold_us = match e.hedge.probation {
                true => config.floor_us,
                false => self.hedge.threshold_us(config, record),
            };
            (record, threshold_us)
        });
        job.take_unbuilt(now_us, &range);
        let total_cores = u64::from(n * cores);
        job.running_cores += total_cores;
        e.free -= n * cores;
        Self::batch_of(&mut self.batched, &mut self.spare, e, exec_slot).reserve(n as usize);
        let run = Run::new(cores, now_us, hedged);
        for index in range {
            let task = TaskId::new(job.id, index);
            let at = (e.running).insert(Attempt::new(task, 0), run);
            job.push_launched(cores, Placed::new(0, exec_slot, at));
            let (Some(payload), Some(function)) = (job.payloads.get(index as usize), &job.function)
            else {
                unreachable!("task {index} without a payload or a function");
            };
            e.batch.push(TaskLaunch {
                task,
                attempt: 0,
                function: function.clone(),
                payload: payload.clone(),
                cores,
                speculative: false,
            });
        }
        if run.hedged() {
            self.hedge.launched(e, exec_slot, run.due_us());
        }
        let Some(p) = self.pools.get_mut(job.pool as usize) else {
            unreachable!("job in unknown pool {}", job.pool);
        };
        p.running_cores += total_cores;
        self.pending_total -= n as usize;
        self.stats.launched += u64::from(n);
    }

    /// Files job `job_slot` again after launches: its timers and runnable listing, then its
    /// place in the FAIR order.
    #[inline(always)]
    fn settle(&mut self, job_slot: u32) {
        // Unlisted first if it has nothing left, so only a job still listed is re-sorted.
        self.sync_job(job_slot);
        let job = self.jobs.live(job_slot);
        let Some(p) = self.pools.get(job.pool as usize) else {
            unreachable!("job in unknown pool {}", job.pool);
        };
        resort(
            &mut self.runnable,
            job_slot,
            (job.running_cores, job.weight),
            (job.pool, p),
        );
    }

    /// Books `launch` on the executor in `exec_slot` (its cores taken, the run recorded from
    /// `now_us`, hedged with `(record, threshold_us)` when its job hedges) and batches it for
    /// the next [`flush`](Self::flush).
    #[inline]
    fn batch_launch(
        &mut self,
        now_us: u64,
        exec_slot: u32,
        launch: TaskLaunch,
        hedged: Option<(u32, u64)>,
    ) {
        let cores = launch.cores;
        let Some(e) = self.book.get_mut(exec_slot) else {
            unreachable!("launch on empty executor slot {exec_slot}");
        };
        assert!(e.free >= cores, "launch over the free cores");
        e.free -= cores;
        let run = Run::new(cores, now_us, hedged);
        e.running
            .insert(Attempt::new(launch.task, launch.attempt), run);
        if hedged.is_some() {
            self.hedge.launched(e, exec_slot, run.due_us());
        }
        Self::batch_of(&mut self.batched, &mut self.spare, e, exec_slot).push(launch);
    }

    /// The batch of launches of executor `e` (in `exec_slot`), listed in `batched` if it was
    /// empty, with a vector to push into: one the driver handed back, or one for as many as
    /// it can take now (its free cores, with the launches about to be pushed taken off).
    #[inline]
    fn batch_of<'e>(
        batched: &mut Vec<u32>,
        spare: &mut Spare,
        e: &'e mut book::Exec,
        exec_slot: u32,
    ) -> &'e mut Vec<TaskLaunch> {
        if e.batch.is_empty() {
            batched.push(exec_slot);
            if e.batch.capacity() == 0 {
                let empty = std::mem::replace(&mut e.batch, spare.launches(e.free as usize + 1));
                // It holds no allocation: nothing to drop.
                std::mem::forget(empty);
            }
        }
        &mut e.batch
    }

    /// Hands back the vector of an [`Output::Launch`] once its tasks are sent (what it still
    /// holds is dropped), so that later batches reuse it instead of allocating. Optional:
    /// a driver that drops the vector loses only the reuse.
    pub fn recycle_launches(&mut self, tasks: Vec<TaskLaunch>) {
        self.spare.keep_launches(tasks);
    }

    /// Emits the batched launches, one `Launch` per executor.
    fn flush(&mut self) {
        for slot in self.batched.drain(..) {
            let Some(e) = self.book.get_mut(slot) else {
                unreachable!("batched launches for empty executor slot {slot}");
            };
            if !e.batch.is_empty() {
                // The executor's next batch takes a vector when it begins (`batch_launch`):
                // one an executor launched to once does not hold one idle.
                self.outputs.push_back(Output::Launch {
                    executor: e.id,
                    tasks: std::mem::take(&mut e.batch),
                });
            }
        }
    }

    /// Asks the executor holding `a` to kill it; the job no longer counts its cores.
    fn kill_attempt(&mut self, job_slot: u32, task: TaskId, a: Placed, reason: &str) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("kill for empty job slot {job_slot}");
        };
        let Some(t) = job.tasks.get(task.index() as usize) else {
            unreachable!("kill of {task} beyond its job");
        };
        let cores = u64::from(t.cores);
        give_back_cores(&mut self.runnable, &mut self.pools, job_slot, job, cores);
        let Some(e) = self.book.get_mut(a.exec) else {
            // Only the executor being removed right now has left the book with attempts still
            // on tasks (they end one by one): nothing to ask it.
            assert_eq!(
                self.removing,
                Some(a.exec),
                "attempt {} of {task} on empty executor slot {}",
                a.attempt,
                a.exec
            );
            return;
        };
        // Its run stays booked until the executor reports it, found by key from now on.
        e.running.orphan(a.run(), Attempt::new(task, a.attempt));
        self.outputs.push_back(Output::Kill {
            executor: e.id,
            task,
            attempt: a.attempt,
            reason: reason.to_string(),
        });
    }

    /// An attempt `(task, attempt, started_us)` that executor `(id, host)` held has ended (its
    /// cores are already back).
    fn attempt_ended(
        &mut self,
        now_us: u64,
        (exec, host): (ExecutorId, u32),
        (Attempt { task, attempt }, started_us): (Attempt, u64),
        end: End,
    ) {
        // An executor keeps attempts of ended jobs until they report (their kill was sent).
        let Some(job_slot) = self.hinted_job_slot(task.job().0) else {
            return;
        };
        if !self.release_attempt(job_slot, task, attempt) {
            return;
        }
        match end {
            End::Succeeded(data) => {
                self.attempt_succeeded(now_us, job_slot, task, started_us, data)
            }
            End::Failed { reason, counts } => self.attempt_failed(
                now_us,
                job_slot,
                (exec, host),
                Attempt::new(task, attempt),
                &reason,
                counts,
            ),
        }
    }

    /// Takes `attempt` off `task` (in `job_slot`) and gives its cores back to the job and its
    /// pool. False if it was taken off already (killed): nothing more to do.
    #[inline]
    fn release_attempt(&mut self, job_slot: u32, task: TaskId, attempt: u32) -> bool {
        let job = live_job(&mut self.jobs, job_slot);
        let Some(t) = job.tasks.get_mut(task.index() as usize) else {
            unreachable!("an executor held {task}, beyond its job");
        };
        let Some(slot) = t
            .attempts
            .iter_mut()
            .find(|a| a.is_some_and(|a| a.attempt == attempt))
        else {
            return false;
        };
        *slot = None;
        assert_eq!(
            t.status,
            Status::Running,
            "a live attempt of a running task"
        );
        let cores = u64::from(t.cores);
        give_back_cores(&mut self.runnable, &mut self.pools, job_slot, job, cores);
        true
    }

    /// A released attempt of `task` (started at `started_us`) succeeded with `data`: the task
    /// succeeds (its other attempt killed), or the job fails if the result takes its kept
    /// results over their limit.
    #[inline]
    fn attempt_succeeded(
        &mut self,
        now_us: u64,
        job_slot: u32,
        task: TaskId,
        started_us: u64,
        data: &mut Bytes,
    ) {
        let job = live_job(&mut self.jobs, job_slot);
        if !job.may_keep(data.len()) {
            let limit = job.result_bytes_max;
            self.fail_results_over(job_slot, task.index(), data.len(), limit);
            return;
        }
        let others = self.task_succeeded(now_us, job_slot, task, started_us, data);
        // Most tasks have no other attempt: a look at both slots, no array iterator.
        if others != [None, None] {
            for &other in others.iter().flatten() {
                self.kill_attempt(job_slot, task, other, "another attempt succeeded");
            }
        }
        self.maybe_finish_job(job_slot);
    }

    /// Task `task` (in `job_slot`, its attempt that started at `started_us` released, its
    /// result of `data` within the job's limit) succeeded: its record, payload and counts say
    /// so, hedging and speculation learn its run time, and its result is queued. Returns its
    /// other attempts, still running, for the caller to kill; whether the job ended is the
    /// caller's to see. Always inline, in its two callers (`add_success`, `attempt_succeeded`):
    /// the driver's build of `handle_statuses` (generic, built in `flint_net`) called it, and
    /// its call and saved registers were about a fifth of it.
    #[inline(always)]
    fn task_succeeded(
        &mut self,
        now_us: u64,
        job_slot: u32,
        task: TaskId,
        started_us: u64,
        data: &mut Bytes,
    ) -> [Option<Placed>; 2] {
        let index = task.index();
        let job = live_job(&mut self.jobs, job_slot);
        let Some(t) = job.tasks.get_mut(index as usize) else {
            unreachable!("an executor held {task}, beyond its job");
        };
        t.status = Status::Succeeded;
        // The payload is no longer needed; the result replaces it if the job keeps it.
        match job.keep_results {
            true => {
                job.result_bytes += data.len() as u64;
                job.payloads.replace(index as usize, data.clone());
            }
            // A one-task job ends with its task: vacating its record drops the payload
            // (`Job::vacate`), without writing an empty one in its place to drop there.
            false if job.task_count == 1 => {}
            false => job.payloads.release(index as usize),
        }
        t.clear_exclusion();
        let others = std::mem::take(&mut t.attempts);
        job.running -= 1;
        job.final_count += 1;
        job.counters.succeeded += 1;
        if let Some(config) = job.hedge.as_deref().filter(|_| hedge::sampled(index)) {
            let record = match job.latency {
                Some(record) => record,
                None => (self.hedge).record_of(job::function_of(&job.function, &job.functions, t)),
            };
            (self.hedge).succeeded(config, record, now_us.saturating_sub(started_us));
        }
        // A job whose last task this was has nothing left to speculate on.
        if job.speculation.is_some() && job.final_count < job.task_count {
            job.durations_us.push(now_us.saturating_sub(started_us));
            if !std::mem::replace(&mut job.durations_dirty, true) {
                self.spec_dirty.push(job_slot);
            }
        }
        self.unfinished_total -= 1;
        self.stats.succeeded += 1;
        // A job of one task that keeps no results ends with it (`maybe_finish_job`, which
        // its caller calls next): one event says both.
        let token = job.token;
        if job.task_count == 1 && !job.keep_results {
            let result = std::mem::take(data);
            (self.events).push_back((Event::OneTaskJobSucceeded { task, result }, token));
        } else {
            let result = Ok(std::mem::take(data));
            (self.events).push_back((Event::TaskResult { task, result }, token));
        }
        others
    }

    /// Fails the job in `job_slot`: task `index`'s result of `len` bytes takes its kept
    /// results over `limit` bytes.
    fn fail_results_over(&mut self, job_slot: u32, index: u32, len: usize, limit: u64) {
        let reason = format!(
            "task {index}'s result of {len} bytes takes the job's kept results over \
             result_bytes_max = {limit} bytes (Spark's spark.driver.maxResultSize): \
             return less, raise the limit, or do not keep results"
        );
        let msg = format!("job failed: results over {limit} bytes");
        self.stats.attempts_failed += 1;
        self.abort_job(job_slot, JobOutcome::Failed(vec![reason]), &msg);
    }

    /// A released `attempt` of `task` on `(exec, host)` failed for `reason`: counted against
    /// the task if `counts`, then the task is requeued, failed for good, or left to its other
    /// running attempt.
    #[inline]
    fn attempt_failed(
        &mut self,
        now_us: u64,
        job_slot: u32,
        (exec, host): (ExecutorId, u32),
        Attempt { task, attempt }: Attempt,
        reason: &str,
        counts: bool,
    ) {
        let index = task.index();
        self.stats.attempts_failed += 1;
        let job = live_job(&mut self.jobs, job_slot);
        let Some(t) = job.tasks.get_mut(index as usize) else {
            unreachable!("an executor held {task}, beyond its job");
        };
        let still_running = t.running_attempts() > 0;
        // The attempt left running may straggle too (a copy that failed beside an
        // original on a deaf executor): it may be copied again.
        t.speculated = false;
        if !counts {
            job.counters.uncounted += 1;
            if !still_running {
                self.requeue(now_us, job_slot, index);
            }
            return;
        }
        self.count_failure(now_us, job_slot, (exec, host), task, attempt, reason);
        let Some(job) = self.jobs.get(job_slot as usize) else {
            unreachable!("job slot {job_slot} emptied by counting a failure");
        };
        let Some(t) = job.tasks.get(index as usize) else {
            unreachable!("task {index} vanished from its job");
        };
        if t.running_attempts() > 0 {
            return;
        }
        if t.failures >= job.max_failures {
            self.fail_task_for_good(job_slot, index);
            return;
        }
        self.requeue(now_us, job_slot, index);
    }

    /// Counts a failure of `task`'s `attempt` on `(exec, host)`: the task's count and reasons,
    /// and exclusion for the task, the job and (if the job's exclusion is on) globally.
    fn count_failure(
        &mut self,
        now_us: u64,
        job_slot: u32,
        (exec, host): (ExecutorId, u32),
        task: TaskId,
        attempt: u32,
        reason: &str,
    ) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("count_failure for empty job slot {job_slot}");
        };
        let index = task.index();
        let Some(t) = job.tasks.get_mut(index as usize) else {
            unreachable!("count_failure of {task} beyond its job");
        };
        t.failures += 1;
        job.counters.failures += 1;
        if let Some(x) = &job.exclusion_config {
            let avoided_before = t.exclusion().is_some();
            t.record_failure(
                exec,
                host,
                x.task_executor_failures_max,
                x.task_host_failures_max,
            );
            if !avoided_before {
                job.avoiding.push(index);
            }
        }
        if job.reasons.len() < REASON_TASKS_MAX || job.reasons.contains_key(&index) {
            let list = job.reasons.entry(index).or_default();
            // Bounded: a task's list holds at most max_failures entries (one per failure).
            if list.len() < job.max_failures as usize {
                list.push(format!(
                    "task {index} attempt {attempt} on executor {}: {reason}",
                    exec.0
                ));
            }
        }
        let excluding_before = job.exclusion.is_some();
        let global = match job.exclusion_config.as_deref() {
            Some(x) => {
                let (em, hm) = (x.job_executor_failures_max, x.job_host_failures_max);
                job.record_exclusion_failure(exec, host, em, hm);
                true
            }
            None => false,
        };
        if global {
            self.record_global_failure(now_us, exec);
        }
        if global && !excluding_before {
            // Its exclusion may leave it stuck now ([`StuckRisk`]).
            self.start_clock(now_us, job_slot);
        }
    }

    /// Fails a job because task `index` reached its `max_failures`.
    fn fail_task_for_good(&mut self, job_slot: u32, index: u32) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("fail_task_for_good for empty job slot {job_slot}");
        };
        let failures = job.tasks.get(index as usize).map_or(0, |t| t.failures);
        let mut reasons = vec![format!(
            "task {index} failed {failures} times (max_failures = {})",
            job.max_failures
        )];
        reasons.extend(job.reasons.remove(&index).unwrap_or_default());
        let msg = format!("job failed: task {index} failed {failures} times");
        // The task that failed the job has a result of its own (the others end without one).
        if let Some(t) = job.tasks.get_mut(index as usize) {
            if !matches!(t.status, Status::Succeeded | Status::Failed) {
                t.status = Status::Failed;
                job.final_count += 1;
                self.unfinished_total -= 1;
                let (task, token) = (TaskId::new(job.id, index), job.token);
                for a in std::mem::take(&mut t.attempts).into_iter().flatten() {
                    self.kill_attempt(job_slot, task, a, &msg);
                }
                let result = Err(msg.clone());
                (self.events).push_back((Event::TaskResult { task, result }, token));
            }
        }
        self.abort_job(job_slot, JobOutcome::Failed(reasons), &msg);
    }

    /// Puts a task whose last attempt ended back in its queues.
    fn requeue(&mut self, now_us: u64, job_slot: u32, index: u32) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("requeue for empty job slot {job_slot}");
        };
        let Some(t) = job.tasks.get_mut(index as usize) else {
            unreachable!("requeue of task {index} beyond its job");
        };
        assert_eq!(t.running_attempts(), 0, "requeue with an attempt running");
        t.status = Status::Pending;
        t.speculated = false;
        job.running -= 1;
        job.pending += 1;
        job.last_progress_us = now_us;
        self.pending_total += 1;
        let book = &self.book;
        job.enqueue(
            index,
            |e| book.slot_of(e).and_then(|s| book.get(s)).map(|x| x.host),
            |h| book.host_live(h),
        );
        self.sync_job(job_slot);
        self.book.unblock_all();
    }

    /// Ends the job once all its tasks are final ([`end_job`](Self::end_job)). Inlined where
    /// tasks end: most calls find the job unfinished.
    #[inline]
    fn maybe_finish_job(&mut self, job_slot: u32) {
        let job = self.jobs.live(job_slot);
        if job.final_count < job.task_count {
            return;
        }
        self.end_job(job_slot);
    }

    /// Ends the job in `job_slot`, all of whose tasks are final: a one-task job that keeps no
    /// results and did not fail is only removed (its task's `OneTaskJobSucceeded` said its
    /// end: `task_succeeded`); any other reports its outcome apart
    /// ([`finish_job`](Self::finish_job)).
    #[inline(always)]
    fn end_job(&mut self, job_slot: u32) {
        let job = self.jobs.live(job_slot);
        if job.task_count == 1 && !job.doomed && !job.keep_results {
            self.remove_job(job_slot);
        } else {
            self.finish_job(job_slot);
        }
    }

    /// Reports the outcome of the job in `job_slot`, all of whose tasks are final (but that of
    /// a one-task job that keeps no results: [`end_job`](Self::end_job)), and removes it.
    #[inline(never)]
    fn finish_job(&mut self, job_slot: u32) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("finish_job for empty job slot {job_slot}");
        };
        debug_assert!(job.final_count >= job.task_count);
        let outcome = if job.doomed {
            let mut keys: Vec<u32> = job.reasons.keys().copied().collect();
            keys.sort_unstable();
            let reasons = keys
                .iter()
                .filter_map(|k| job.reasons.get(k))
                .flatten()
                .cloned()
                .collect();
            JobOutcome::Failed(reasons)
        } else if job.keep_results {
            // Every task succeeded: its result took its payload's place.
            JobOutcome::Succeeded(std::mem::take(&mut job.payloads).into_vec())
        } else {
            debug_assert!(job.task_count != 1, "a one-task job is only removed");
            JobOutcome::Succeeded(Vec::new())
        };
        let (id, token) = (job.id, job.token);
        self.remove_job(job_slot);
        (self.events).push_back((Event::JobOutcome { job: id, outcome }, token));
    }

    /// Ends a job now: kills its running attempts, reports every unfinished task with `task_msg`,
    /// then the outcome.
    fn abort_job(&mut self, job_slot: u32, outcome: JobOutcome, task_msg: &str) {
        let Some(job) = self.jobs.get_mut(job_slot as usize) else {
            unreachable!("abort of empty job slot {job_slot}");
        };
        let (id, token) = (job.id, job.token);
        // Every task not final ends here without a result: the outcome says why. (One result
        // per task made cancelling a job of millions hold the loop for seconds.) The records
        // go with the job, their statuses as they are.
        let unfinished = job.task_count - job.final_count;
        let kills = self.take_running_attempts(job_slot);
        let job = live_job(&mut self.jobs, job_slot);
        self.pending_total -= job.pending;
        self.speculatable_total = self
            .speculatable_total
            .saturating_sub(job.speculatable.len());
        self.unfinished_total -= unfinished;
        job.pending = 0;
        for (task, a) in kills {
            self.kill_attempt(job_slot, task, a, task_msg);
        }
        self.remove_job(job_slot);
        (self.events).push_back((Event::JobOutcome { job: id, outcome }, token));
    }

    /// The running attempts of the job in `job_slot`, taken off their task records: found
    /// through its records or through the executors' runs, whichever are fewer to look at. A
    /// big job near its end has millions of records and a few hundred attempts running; a
    /// small one a few records among thousands of runs.
    fn take_running_attempts(&mut self, job_slot: u32) -> Vec<(TaskId, Placed)> {
        let job = live_job(&mut self.jobs, job_slot);
        let id = job.id;
        let mut kills = Vec::new();
        // What a walk of the executors' runs would look at, summed only when it matters.
        let runs = || self.book.iter().map(|e| e.running.span()).sum::<usize>();
        if job.running == 0 {
            debug_assert!(
                (job.tasks.iter()).all(|t| t.attempts == [None, None]),
                "{id:?} runs no task, yet an attempt is placed"
            );
        } else if job.tasks.len() <= runs() {
            for (i, t) in (0u32..).zip(job.tasks.iter_mut()) {
                if t.attempts != [None, None] {
                    let task = TaskId::new(id, i);
                    let taken = std::mem::take(&mut t.attempts);
                    kills.extend(taken.into_iter().flatten().map(|a| (task, a)));
                }
            }
        } else {
            let mut placed = Vec::new();
            for e in self.book.iter() {
                for (_, key, orphan) in e.running.entries() {
                    if orphan || key.task.job() != id {
                        continue;
                    }
                    let Some(t) = job.tasks.get_mut(key.task.index() as usize) else {
                        unreachable!("{key:?} runs beyond its job");
                    };
                    let Some(at) = (t.attempts.iter())
                        .position(|a| a.is_some_and(|a| a.attempt == key.attempt))
                    else {
                        unreachable!("{key:?} runs, placed on no attempt of its task");
                    };
                    placed.push((key.task, at));
                }
            }
            // In the records' order, as the other way finds them.
            placed.sort_unstable();
            for (task, at) in placed {
                let Some(t) = job.tasks.get_mut(task.index() as usize) else {
                    unreachable!("{task} runs beyond its job");
                };
                let Some(place) = t.attempts.get_mut(at) else {
                    unreachable!("attempt place {at} of two");
                };
                kills.extend(place.take().map(|a| (task, a)));
            }
            // Only the executor being removed right now (whose runs left the book) holds
            // attempts still placed; the job goes before their ends come to it.
            debug_assert!(
                (job.tasks.iter().flat_map(|t| t.attempts.iter().flatten()))
                    .all(|a| self.removing == Some(a.exec)),
                "{id:?}: an attempt placed on its task record is not among the runs"
            );
        }
        kills
    }

    /// Removes the ended job in `job_slot` from everything that lists it (order, line, pool,
    /// indexes, timers, its id), leaving its record vacant for the next job there. Inline
    /// where the compiler sees fit (where a batch's successes end one-task jobs: its call and
    /// saved registers were a tenth of it).
    #[inline]
    fn remove_job(&mut self, job_slot: u32) {
        let track_idle = self.pools_at_limit();
        // Worked on where it is and left there, vacant: a job record is large to move.
        let job = live_job(&mut self.jobs, job_slot);
        let key = job.fifo_key();
        if job.in_runnable {
            self.runnable.remove(job_slot, key);
        }
        if job.in_line {
            // Its entry stays behind, dead (`line.rs`).
            self.line.left();
        }
        let Some(p) = self.pools.get_mut(job.pool as usize) else {
            unreachable!("job in unknown pool {}", job.pool);
        };
        p.running_cores = p.running_cores.saturating_sub(job.running_cores);
        if self.runnable.fair() {
            self.runnable.set_pool(job.pool, p.key());
        }
        assert!(p.jobs > 0, "pool {} counts its jobs", p.name);
        p.jobs -= 1;
        if p.jobs == 0 && !p.configured && track_idle {
            self.idle_pools.insert(job.pool);
        }
        if job.has_exec_prefs || job.has_host_prefs {
            self.pref_jobs -= 1;
        }
        for &key in &job.filed_pref_keys {
            self.pref_index.remove(job_slot, key);
        }
        self.timers.remove(job_slot);
        if let Some(sc) = &job.speculation {
            self.spec_jobs -= 1;
            self.quantile_jobs -= usize::from(job.quantile_reached);
            self.spec_timeouts.remove(sc.timeout_us);
        }
        if self.job_hint.0 == job.id.0 {
            self.job_hint = (NO_JOB, 0);
        }
        let removed = self.job_slots.remove(job.id.0);
        if removed != Some(job_slot) {
            unlisted_job(job.id, job_slot, removed);
        }
        assert!(self.active > 0, "an active job is counted");
        self.active -= 1;
        self.job_free_slots.push(job_slot);
        let remains = Remains::take_from(job);
        job.vacate();
        if let Some(remains) = remains {
            self.keep_remains(remains);
        }
    }

    /// Keeps `remains` for [`poll_remains`](Self::poll_remains); past [`REMAINS_KEPT`], nobody
    /// takes them, and the oldest are freed here.
    fn keep_remains(&mut self, remains: Remains) {
        if self.remains.len() >= REMAINS_KEPT {
            self.remains.pop_front();
        }
        self.remains.push_back(remains);
    }

    /// The speculation check period: the scheduler's, or the default's when only some jobs
    /// turned speculation on.
    fn speculation_interval_us(&self) -> u64 {
        self.config
            .speculation
            .as_ref()
            .map_or(SpeculationConfig::default().interval_us, |s| s.interval_us)
            .max(1)
    }
}

/// Panics: the active job `id` in `slot` was not listed by its id (`listed`: the slot it was
/// listed under). Out of line, so that [`Scheduler::remove_job`]'s check costs a comparison.
#[cold]
#[inline(never)]
fn unlisted_job(id: JobId, slot: u32, listed: Option<u32>) -> ! {
    panic!("an active job is listed by its id: {id:?} in slot {slot}, listed as {listed:?}");
}

/// Why a job whose task `i`'s payload is `len` bytes, over `max`, fails.
fn oversized_reason(i: usize, len: usize, max: usize) -> String {
    format!("task {i} payload is {len} bytes, over payload_max_bytes = {max}")
}

/// A peer's message as text, bounded.
fn lossy(data: &Bytes) -> String {
    let end = data.len().min(REASON_MAX_BYTES);
    String::from_utf8_lossy(data.get(..end).unwrap_or_default()).into_owned()
}

/// Takes whether `job`'s locality level widened since it was last looked at: if it did, the
/// executors set aside are offered again, as after new work (its tasks may suit them now).
fn reoffer_if_widened(book: &mut Book, job: &mut Job) -> bool {
    let widened = std::mem::take(&mut job.widened);
    if widened {
        book.unblock_all();
    }
    widened
}

/// The job in `job_slot`, which an attempt being ended or released shows is live.
/// Whether the line's entry (`key`, `slot`) is live: its slot holds a job in the line under
/// that key (`line.rs`).
#[inline]
fn in_line(jobs: &JobSlots, key: FifoKey, slot: u32) -> bool {
    jobs.get(slot as usize)
        .is_some_and(|job| job.in_line && job.fifo_key() == key)
}

/// The active job in `job_slot`, to change ([`JobSlots::live_mut`]: vacancy checked in
/// debug builds only).
#[inline]
fn live_job(jobs: &mut JobSlots, job_slot: u32) -> &mut Job {
    jobs.live_mut(job_slot)
}
