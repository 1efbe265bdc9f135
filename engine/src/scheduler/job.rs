//! One job's task set (Spark's `TaskSetManager`): its tasks' states, its pending queues per
//! locality level, its delay-scheduling clock, its exclusion lists and its speculation data.
//!
//! Pending queues use lazy deletion: a task is pushed into every queue it qualifies for (its
//! preferred executors, their and its preferred hosts, and "any"), and an entry is dropped when it
//! reaches the front and the task is no longer pending. Each push is popped at most once, so
//! finding a task is O(1) amortized. There is one set of queues per distinct task size (cores),
//! so a task too big for an executor's free cores never hides smaller ones queued behind it; a
//! job usually has one size.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::Arc;

use super::latency::RecordId;
use super::payloads::Payloads;
use super::prefs::PrefKey;
use super::types::{
    ExclusionConfig, ExecutorId, HedgeConfig, JobId, JobToken, LocalityLevel, SpeculationConfig,
    TaskId, TaskLaunch,
};
use crate::hash::{FxHashMap, FxHashSet};

/// Executors (and hosts) one task remembers failing on; failures beyond are counted against
/// the task but not remembered (a task reaches `max_failures` long before in practice).
pub(crate) const TASK_EXCLUSION_MAX: usize = 64;

/// Locality levels, best first. `NoPref` tasks can run anywhere at once and never move the clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Executor,
    Host,
    Any,
}

impl Level {
    pub fn public(self) -> LocalityLevel {
        match self {
            Level::Executor => LocalityLevel::Executor,
            Level::Host => LocalityLevel::Host,
            Level::Any => LocalityLevel::Any,
        }
    }
}

/// Where a found task came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// A pending task at this locality level (`None`: it has no preferences).
    Pending(u32, Option<Level>),
    /// A running straggler to copy.
    Speculative(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    Running,
    Succeeded,
    /// Failed for good or killed.
    Failed,
}

/// A running attempt, from the task's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Placed {
    pub attempt: u32,
    /// The executor's slot in the book (cleared from here before the slot is freed).
    pub exec: u32,
    /// Where the run is in that executor's running attempts (`runs.rs`), plus one: the zero
    /// it never is makes an empty attempt slot cost no more room than a full one.
    run_1: NonZeroU32,
}

impl Placed {
    pub fn new(attempt: u32, exec: u32, run: u32) -> Placed {
        let Some(run_1) = run.checked_add(1).and_then(NonZeroU32::new) else {
            unreachable!("run index {run} at the top of u32");
        };
        Placed {
            attempt,
            exec,
            run_1,
        }
    }

    /// Where the run is in its executor's running attempts.
    pub fn run(&self) -> u32 {
        self.run_1.get() - 1
    }
}

/// A task's locality preferences (most tasks have none: they are kept per job, in
/// [`Job::prefs`], not in the record every task has).
#[derive(Debug)]
pub(crate) struct Prefs {
    pub executors: Vec<ExecutorId>,
    /// Host indices in the book.
    pub hosts: PrefHosts,
}

/// Preferred hosts a task keeps in place: a block's replicas are three, as a rule.
const HOSTS_INLINE: usize = 3;

/// A task's preferred hosts, as indices in the book: up to [`HOSTS_INLINE`] in place, more
/// in a slice of their own, so a job whose tasks each name their block's hosts allocates
/// nothing per task for them.
#[derive(Debug)]
pub(crate) enum PrefHosts {
    Inline { len: u8, hosts: [u32; HOSTS_INLINE] },
    Many(Box<[u32]>),
}

impl PrefHosts {
    /// The indices of `names`, each found (or added) by `index`.
    pub fn of<S>(names: &[S], mut index: impl FnMut(&S) -> u32) -> PrefHosts {
        if names.len() > HOSTS_INLINE {
            return PrefHosts::Many(names.iter().map(&mut index).collect());
        }
        let mut hosts = [0; HOSTS_INLINE];
        for (slot, name) in hosts.iter_mut().zip(names) {
            *slot = index(name);
        }
        PrefHosts::Inline {
            len: names.len() as u8,
            hosts,
        }
    }
}

impl std::ops::Deref for PrefHosts {
    type Target = [u32];

    fn deref(&self) -> &[u32] {
        match self {
            PrefHosts::Inline { len, hosts } => &hosts[..usize::from(*len)],
            PrefHosts::Many(hosts) => hosts,
        }
    }
}

#[derive(Debug)]
pub(crate) struct TaskRec {
    /// Its function's index in [`Job::functions`] (0, unused, when the job's tasks share one,
    /// [`Job::function`]): four bytes, where a name of its own took sixteen and a reference count.
    pub function: u32,
    /// Where it failed, if it did: boxed apart from the record every task has (a job of
    /// millions of tasks keeps millions of records, few of which fail).
    pub exclusion: Option<Box<TaskExclusion>>,
    pub cores: u32,
    pub status: Status,
    pub next_attempt: u32,
    pub failures: u32,
    /// At most two attempts run at once (the original and one speculative copy).
    pub attempts: [Option<Placed>; 2],
    pub speculated: bool,
}

/// Where one task failed, and which executors and hosts it avoids for that.
#[derive(Debug, Default)]
pub(crate) struct TaskExclusion {
    pub exec_failures: Vec<(ExecutorId, u32)>,
    pub host_failures: Vec<(u32, u32)>,
    pub executors: Vec<ExecutorId>,
    pub hosts: Vec<u32>,
}

/// The function task `t` runs, of a job whose tasks all run `shared` or, when it has none,
/// whose task records name theirs in `functions`.
#[inline]
pub(crate) fn function_of<'a>(
    shared: &'a Option<Arc<str>>,
    functions: &'a [Arc<str>],
    t: &TaskRec,
) -> &'a Arc<str> {
    if let Some(shared) = shared {
        return shared;
    }
    match functions.get(t.function as usize) {
        Some(own) => own,
        None => unreachable!("task function {} beyond the job's table", t.function),
    }
}

impl TaskRec {
    /// A pending task that has run no attempt (its payload is the job's: [`Job::payloads`]).
    pub fn new(function: u32, cores: u32) -> Self {
        TaskRec {
            function,
            exclusion: None,
            cores,
            status: Status::Pending,
            next_attempt: 0,
            failures: 0,
            attempts: [None, None],
            speculated: false,
        }
    }

    /// Where it failed, if it avoids anything for it.
    pub fn exclusion(&self) -> Option<&TaskExclusion> {
        self.exclusion.as_deref()
    }

    /// Forgets where it failed (it succeeded).
    pub fn clear_exclusion(&mut self) {
        if self.exclusion.is_some() {
            self.exclusion = None;
        }
    }

    pub fn running_attempts(&self) -> usize {
        self.attempts.iter().flatten().count()
    }

    /// Whether this task avoids `exec` (or its host) after failing there.
    pub fn avoids(&self, exec: ExecutorId, host: u32) -> bool {
        self.exclusion()
            .is_some_and(|x| x.executors.contains(&exec) || x.hosts.contains(&host))
    }

    /// Counts a failure of this task on `exec`/`host`; past the limits it avoids them.
    pub fn record_failure(&mut self, exec: ExecutorId, host: u32, exec_max: u32, host_max: u32) {
        let x = self.exclusion.get_or_insert_with(Box::default);
        bump(&mut x.exec_failures, exec, exec_max, &mut x.executors);
        bump(&mut x.host_failures, host, host_max, &mut x.hosts);
    }
}

/// Adds one failure for `key`; past `max` the key joins `excluded`. Bounded by
/// [`TASK_EXCLUSION_MAX`] keys.
fn bump<K: PartialEq + Copy>(counts: &mut Vec<(K, u32)>, key: K, max: u32, excluded: &mut Vec<K>) {
    let n = if let Some((_, n)) = counts.iter_mut().find(|(k, _)| *k == key) {
        *n = n.saturating_add(1);
        *n
    } else if counts.len() < TASK_EXCLUSION_MAX {
        counts.push((key, 1));
        1
    } else {
        return;
    };
    if n >= max.max(1) && !excluded.contains(&key) {
        excluded.push(key);
    }
}

/// Pending-task queues per locality bucket, for tasks of one size.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    /// Cores of every task in these queues.
    pub cores: u32,
    /// Tasks without preferences never queued yet, in index order, ahead of `no_pref`: a new
    /// job of one function over payloads queues all its tasks at once as this range (no push
    /// per task, no allocation).
    pub fresh: std::ops::Range<u32>,
    pub no_pref: VecDeque<u32>,
    /// The queues of tasks with preferences, made with the first (boxed: most jobs have none,
    /// and a small job's queues are built and dropped with it).
    pub prefs: Option<Box<PrefQueues>>,
}

impl Queues {
    /// Whether the queues hold nothing to drop (no allocation): what a vacant record's kept
    /// class must be (`slots.rs`), for [`Job::enqueue_fresh`] to write a new job's over it.
    #[inline]
    pub fn is_bare(&self) -> bool {
        self.no_pref.capacity() == 0 && self.prefs.is_none()
    }
}

/// Pending-task queues of tasks with preferences, for tasks of one size.
#[derive(Debug, Default)]
pub(crate) struct PrefQueues {
    pub by_exec: FxHashMap<ExecutorId, VecDeque<u32>>,
    pub by_host: FxHashMap<u32, VecDeque<u32>>,
    /// Tasks with preferences, for the "any" level.
    pub any: VecDeque<u32>,
}

/// Per-job exclusion state.
#[derive(Debug, Default)]
pub(crate) struct JobExclusion {
    pub exec_failures: FxHashMap<ExecutorId, u32>,
    pub host_failures: FxHashMap<u32, u32>,
    pub executors: FxHashSet<ExecutorId>,
    pub hosts: FxHashSet<u32>,
}

#[derive(Debug)]
pub(crate) struct Job {
    pub id: JobId,
    /// The caller's number for it, which its events carry ([`JobToken`]).
    pub token: JobToken,
    pub pool: u32,
    pub weight: u32,
    pub priority: i32,
    /// The records of tasks `0..tasks.len()`. A job of one function over payloads builds a
    /// task's record when it first leaves its fresh queue (or is killed), in index order, so
    /// submitting millions of tasks builds none: tasks `tasks.len()..task_count` are pending,
    /// have never run, prefer nothing, run [`Job::function`] on the one class's cores.
    pub tasks: Vec<TaskRec>,
    /// How many tasks the job has.
    pub task_count: usize,
    /// Each task's payload (by index) until it succeeds; then its result if the job keeps
    /// results, else nothing (a big job's inputs are freed as it runs).
    pub payloads: Payloads,
    /// The function every task runs, when they share one (a job of one function over
    /// payloads, or whose tasks all name one); `None` when each task record names its own.
    pub function: Option<Arc<str>>,
    /// The functions the task records name when the job has no shared one, each once in a
    /// run of tasks naming it (empty otherwise).
    pub functions: Vec<Arc<str>>,
    /// Each task's locality preferences, in task order, for a job whose tasks came as specs
    /// and some of them prefer something (a task past its end prefers nothing); empty
    /// otherwise. One vector for the job, not an allocation per task.
    pub prefs: Vec<Option<Prefs>>,
    /// Whether results are kept for the outcome, and how many bytes at most.
    pub keep_results: bool,
    pub result_bytes_max: u64,
    /// Result bytes kept so far.
    pub result_bytes: u64,
    /// Tasks in `Pending`.
    pub pending: usize,
    /// Tasks in `Running`.
    pub running: usize,
    /// Cores held by this job's live attempts.
    pub running_cores: u64,
    /// Tasks in a final state.
    pub final_count: usize,
    /// Queues per task size, largest first.
    pub classes: Vec<Queues>,
    pub has_exec_prefs: bool,
    pub has_host_prefs: bool,
    /// Executor-preference queues (over all classes) whose executor is registered: the
    /// executor level is valid while this is above 0 (Spark's `computeValidLocalityLevels`).
    pub live_exec_keys: u32,
    /// Host-preference queues whose host has a registered executor: the host level is valid
    /// while this is above 0.
    pub live_host_keys: u32,
    pub level: Level,
    pub level_since_us: u64,
    /// Last launch (or submission): the unschedulable clock.
    pub last_progress_us: u64,
    /// Where the job failed, once it failed somewhere with exclusion on (boxed: most jobs
    /// never do).
    pub exclusion: Option<Box<JobExclusion>>,
    /// Successful run times, kept only with speculation on.
    pub durations_us: Vec<u64>,
    /// Successes were added to `durations_us` since the last straggler check (the job is in
    /// the scheduler's list of jobs whose median to bring up to date).
    pub durations_dirty: bool,
    /// Enough successes for the quantile threshold (counted in the scheduler's
    /// `quantile_jobs`; successes only grow, so this stays).
    pub quantile_reached: bool,
    /// The median of `durations_us` when it held `.0` entries (recomputed as it grows by an
    /// eighth, so a check costs O(1) amortized per success).
    pub median_cache: (usize, u64),
    pub speculatable: VecDeque<u32>,
    /// Reasons of counted failures and kills, bounded per task by `max_failures`.
    pub reasons: FxHashMap<u32, Vec<String>>,
    /// Some task was killed or failed for good: the job cannot succeed.
    pub doomed: bool,
    /// An executor got nothing from this job because of the locality wait. From then until the
    /// job has no pending task left, launches no longer restart the wait or bring the level
    /// back, so a free core idles at most the sum of the waits (Spark's legacy delay scheduling
    /// could idle it for as long as local launches kept coming).
    pub delay_rejected: bool,
    /// The locality level widened since the scheduler last looked: executors set aside for
    /// this job may have work now.
    pub widened: bool,
    /// Listed in the scheduler's runnable jobs (it has pending tasks or stragglers to copy).
    pub in_runnable: bool,
    /// Waiting in the scheduler's line instead (`line.rs`).
    pub in_line: bool,
    /// Counted failures a task may have before the job fails.
    pub max_failures: u32,
    /// Speculation in effect for this job.
    pub speculation: Option<Arc<SpeculationConfig>>,
    /// Hedging in effect for this job (`hedge.rs`).
    pub hedge: Option<Arc<HedgeConfig>>,
    /// The run-time record of the one function all its tasks run, if they share one (else each
    /// launch looks its task's up).
    pub latency: Option<RecordId>,
    /// Exclusion in effect for this job (its per-job and per-task limits).
    pub exclusion_config: Option<Arc<ExclusionConfig>>,
    /// `speculation`, `hedge` and `exclusion_config` are the scheduler's defaults, shared, as
    /// a job inheriting all three has them: kept with them when the record is vacated, so the
    /// next such job built over it has nothing to resolve (`Scheduler::build_job`).
    pub inherits_defaults: bool,
    /// Pending tasks that avoid some executor or host: the candidates for "can run nowhere".
    pub avoiding: Vec<u32>,
    /// Preference queue keys made since the scheduler last filed the job under them
    /// (`prefs.rs`).
    pub new_pref_keys: Vec<PrefKey>,
    /// The keys the job is filed under in the scheduler's preference index (each once).
    pub filed_pref_keys: Vec<PrefKey>,
    pub counters: JobCounters,
}

/// Per-job counters (introspection).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct JobCounters {
    pub launched: u64,
    pub speculative: u64,
    pub failures: u64,
    pub uncounted: u64,
    pub succeeded: usize,
}

/// Pops the first entry of `queue` that is a pending task fitting in `free` cores and not
/// avoiding `exec` on `host`; stale entries are dropped on the way, tasks avoiding this executor
/// go to the back (each entry is looked at once per call). Stops (without popping) at a pending
/// task that does not fit.
fn pop_pending(
    queue: &mut VecDeque<u32>,
    tasks: &[TaskRec],
    free: u32,
    exec: ExecutorId,
    host: u32,
) -> Option<u32> {
    let mut rotated = 0usize;
    while let Some(&i) = queue.front() {
        match tasks.get(i as usize) {
            Some(t) if t.status == Status::Pending => {
                if t.avoids(exec, host) {
                    if rotated >= queue.len() {
                        return None;
                    }
                    queue.rotate_left(1);
                    rotated += 1;
                    continue;
                }
                if t.cores <= free {
                    queue.pop_front();
                    return Some(i);
                }
                return None;
            }
            _ => {
                queue.pop_front();
            }
        }
    }
    None
}

/// Takes the first task of `fresh` (tasks of `cores` cores) that is still pending (one killed
/// since is passed over) if it fits in `free` cores; never-run tasks avoid no executor. A task
/// without a record yet gets it now ([`Job::tasks`]).
fn pop_fresh(
    fresh: &mut std::ops::Range<u32>,
    tasks: &mut Vec<TaskRec>,
    cores: u32,
    free: u32,
) -> Option<u32> {
    while let Some(i) = fresh.clone().next() {
        match tasks.get(i as usize) {
            None => {
                // Records are built in index order, fresh tasks leave in index order.
                debug_assert_eq!(tasks.len(), i as usize, "task {i} built out of order");
                if cores > free {
                    return None;
                }
                fresh.start += 1;
                tasks.push(TaskRec::new(0, cores));
                return Some(i);
            }
            Some(t) if t.status == Status::Pending => {
                if t.cores > free {
                    return None;
                }
                fresh.start += 1;
                return Some(i);
            }
            _ => fresh.start += 1,
        }
    }
    None
}

impl Job {
    /// Whether a result of `len` bytes fits: the job does not keep results, or its kept
    /// results stay within `result_bytes_max` with it.
    #[inline]
    pub fn may_keep(&self, len: usize) -> bool {
        !self.keep_results || self.result_bytes.saturating_add(len as u64) <= self.result_bytes_max
    }

    /// Builds the records of tasks up to `index` (pending, never run: see [`Job::tasks`]),
    /// so that it has one to change. Only a job of one function over payloads lacks any.
    pub fn build_through(&mut self, index: u32) {
        let cores = match self.classes.as_slice() {
            [q] => q.cores,
            _ => return, // tasks of more than one size: all have records
        };
        let end = (index as usize + 1).min(self.task_count);
        if self.tasks.len() < end {
            let built = self.tasks.len();
            self.tasks
                .extend((built..end).map(|_| TaskRec::new(0, cores)));
        }
    }

    /// The never-run tasks the next `free` cores may take in one go ([`Scheduler::fill`]'s
    /// range), with the cores each needs: of a job whose tasks are all one size and prefer
    /// nothing (one function over payloads), the tasks at the front of its fresh queue that
    /// have no record yet, as many as fit. None when the next task to leave is not one of them
    /// (a retry, a task a kill built, a job of another form): it leaves the usual way.
    ///
    /// [`Scheduler::fill`]: super::Scheduler
    pub fn unbuilt_run(&self, free: u32) -> Option<(std::ops::Range<u32>, u32)> {
        let [q] = self.classes.as_slice() else {
            return None;
        };
        let start = q.fresh.start;
        if self.has_exec_prefs
            || self.has_host_prefs
            || start as usize != self.tasks.len()
            || q.cores == 0
            || q.cores > free
        {
            return None;
        }
        let n = (free / q.cores).min(q.fresh.end - start);
        (n > 0).then_some((start..start + n, q.cores))
    }

    /// Takes `range` ([`Job::unbuilt_run`]) off the fresh queue as launched: counted as
    /// running, its records built by [`Job::push_launched`].
    pub fn take_unbuilt(&mut self, now_us: u64, range: &std::ops::Range<u32>) {
        let Some(q) = self.classes.first_mut() else {
            unreachable!("an unbuilt run of a job without queues");
        };
        debug_assert_eq!(q.fresh.start, range.start, "the run starts the fresh queue");
        q.fresh.start = range.end;
        let n = range.len();
        self.launched_at(now_us, None);
        self.pending -= n;
        if self.pending == 0 {
            self.delay_rejected = false;
        }
        self.running += n;
        self.counters.launched += n as u64;
    }

    /// The record of the next unbuilt task of a range [`Job::take_unbuilt`] took: running its
    /// first attempt as `placed`, a task of `cores` cores.
    pub fn push_launched(&mut self, cores: u32, placed: Placed) {
        let mut t = TaskRec::new(0, cores);
        t.status = Status::Running;
        t.next_attempt = 1;
        t.attempts[0] = Some(placed);
        self.tasks.push(t);
    }

    /// Queues tasks `0..n` of a new job whose tasks all need `cores` cores and prefer nothing
    /// (one function over payloads): one class, its tasks fresh in index order. The class a
    /// vacant record kept (empty queues: `slots.rs`) is written over in place.
    pub fn enqueue_fresh(&mut self, n: u32, cores: u32) {
        if let [q] = self.classes.as_mut_slice() {
            debug_assert!(q.is_bare(), "a kept class is bare");
            (q.cores, q.fresh) = (cores, 0..n);
            return;
        }
        debug_assert!(self.classes.is_empty(), "only a new job queues fresh tasks");
        self.classes.push(Queues {
            cores,
            fresh: 0..n,
            ..Queues::default()
        });
    }

    /// Whether the job has something to launch: pending tasks or stragglers to copy.
    pub fn has_work(&self) -> bool {
        self.pending > 0 || !self.speculatable.is_empty()
    }

    /// The job's FIFO key: higher priority first, then submission order.
    pub fn fifo_key(&self) -> (i64, u64) {
        (-i64::from(self.priority), self.id.0)
    }

    /// The job's best valid locality level given the executors registered now.
    pub fn start_level(&self) -> Level {
        if self.live_exec_keys > 0 {
            Level::Executor
        } else if self.live_host_keys > 0 {
            Level::Host
        } else {
            Level::Any
        }
    }

    /// The levels valid now, best first (Spark's `myLocalityLevels`, without rack and no-pref).
    pub fn valid_levels(&self) -> Vec<Level> {
        let mut v = Vec::with_capacity(3);
        if self.live_exec_keys > 0 {
            v.push(Level::Executor);
        }
        if self.live_host_keys > 0 {
            v.push(Level::Host);
        }
        v.push(Level::Any);
        v
    }

    /// Pushes task `i` into its queues. `host_of` maps a preferred executor to its host if it
    /// is registered; `host_live` says whether a host has a registered executor.
    pub fn enqueue(
        &mut self,
        i: u32,
        host_of: impl Fn(ExecutorId) -> Option<u32>,
        host_live: impl Fn(u32) -> bool,
    ) {
        let Some(t) = self.tasks.get(i as usize) else {
            unreachable!("enqueue of task {i} beyond the job");
        };
        let pos = Self::class_for(&mut self.classes, t.cores);
        let Some(q) = self.classes.get_mut(pos) else {
            unreachable!("class {pos} was just found or made");
        };
        match self.prefs.get(i as usize).and_then(Option::as_ref) {
            None => q.no_pref.push_back(i),
            Some(p) => {
                let q = q.prefs.get_or_insert_with(Box::default);
                for &e in &p.executors {
                    let host = host_of(e);
                    let queue = q.by_exec.entry(e).or_insert_with(|| {
                        if host.is_some() {
                            self.live_exec_keys += 1;
                        }
                        self.new_pref_keys.push(PrefKey::Executor(e));
                        VecDeque::new()
                    });
                    queue.push_back(i);
                    if let Some(h) = host {
                        q.by_host
                            .entry(h)
                            .or_insert_with(|| {
                                self.live_host_keys += 1;
                                self.new_pref_keys.push(PrefKey::Host(h));
                                VecDeque::new()
                            })
                            .push_back(i);
                    }
                }
                for &h in p.hosts.iter() {
                    q.by_host
                        .entry(h)
                        .or_insert_with(|| {
                            if host_live(h) {
                                self.live_host_keys += 1;
                            }
                            self.new_pref_keys.push(PrefKey::Host(h));
                            VecDeque::new()
                        })
                        .push_back(i);
                }
                q.any.push_back(i);
            }
        }
    }

    /// The index in `classes` (kept largest first) of the queues of tasks needing `cores`
    /// cores, made if none yet.
    #[inline]
    fn class_for(classes: &mut Vec<Queues>, cores: u32) -> usize {
        match classes.iter().position(|q| q.cores <= cores) {
            Some(p) if classes.get(p).is_some_and(|q| q.cores == cores) => p,
            Some(p) => {
                classes.insert(
                    p,
                    Queues {
                        cores,
                        ..Queues::default()
                    },
                );
                p
            }
            None => {
                classes.push(Queues {
                    cores,
                    ..Queues::default()
                });
                classes.len() - 1
            }
        }
    }

    /// An executor registered (`joined`) or went (`!joined`); `host_changed` says whether its
    /// host gained its first or lost its last registered executor. Keeps the valid levels
    /// current (Spark's `recomputeLocality`, SPARK-16106). Unlike Spark (SPARK-31837), a job
    /// does not move back to a better level that became valid: the executor that joined takes
    /// the tasks preferring it at once anyway (they are always offered first), and the other
    /// executors' free cores do not wait the locality waits over again.
    pub fn executor_changed(
        &mut self,
        exec: ExecutorId,
        host: u32,
        host_changed: bool,
        joined: bool,
    ) {
        let exec_keys = self
            .classes
            .iter()
            .filter_map(|q| q.prefs.as_ref())
            .filter(|q| q.by_exec.contains_key(&exec))
            .count() as u32;
        let host_keys = if host_changed {
            self.classes
                .iter()
                .filter_map(|q| q.prefs.as_ref())
                .filter(|q| q.by_host.contains_key(&host))
                .count() as u32
        } else {
            0
        };
        if joined {
            self.live_exec_keys += exec_keys;
            self.live_host_keys += host_keys;
        } else {
            assert!(self.live_exec_keys >= exec_keys && self.live_host_keys >= host_keys);
            self.live_exec_keys = self.live_exec_keys.saturating_sub(exec_keys);
            self.live_host_keys = self.live_host_keys.saturating_sub(host_keys);
        }
    }

    /// Counts its preference queues whose executor (`exec_live`) or host (`host_live`) has a
    /// registered executor now (a job built over several ticks: executors came and went).
    pub fn recount_live_keys(
        &mut self,
        exec_live: impl Fn(ExecutorId) -> bool,
        host_live: impl Fn(u32) -> bool,
    ) {
        let queues = self.classes.iter().filter_map(|q| q.prefs.as_ref());
        let (mut execs, mut hosts) = (0, 0);
        for q in queues {
            execs += q.by_exec.keys().filter(|&&e| exec_live(e)).count() as u32;
            hosts += q.by_host.keys().filter(|&&h| host_live(h)).count() as u32;
        }
        self.live_exec_keys = execs;
        self.live_host_keys = hosts;
    }

    /// The most distant level the job may launch at now, moving its clock along. A level
    /// with no registered executor to wait for (or no task left for one) is skipped at once.
    /// Unlike Spark (SPARK-4939 restarts the wait when it skips), the next level's wait keeps
    /// running from the skipped level's start, so a free core never idles longer than the sum
    /// of the waits.
    pub fn allowed_level(&mut self, now_us: u64, waits_us: [u64; 2]) -> Level {
        loop {
            let (wait, next, skip) = match self.level {
                Level::Executor => (waits_us[0], Level::Host, self.live_exec_keys == 0),
                Level::Host => (waits_us[1], Level::Any, self.live_host_keys == 0),
                Level::Any => return Level::Any,
            };
            if skip {
                self.level = next;
                self.widened = true;
            } else if now_us.saturating_sub(self.level_since_us) >= wait {
                self.level_since_us = self.level_since_us.saturating_add(wait);
                self.level = next;
                self.widened = true;
            } else {
                return self.level;
            }
        }
    }

    /// The cores of its largest tasks (0 with no tasks): its queues are kept largest first.
    #[inline]
    pub fn largest_cores(&self) -> u32 {
        self.classes.first().map_or(0, |q| q.cores)
    }

    /// When the job's locality level next widens, if it is waiting.
    pub fn level_deadline(&self, waits_us: [u64; 2]) -> Option<u64> {
        if self.pending == 0 {
            return None;
        }
        match self.level {
            Level::Executor => Some(self.level_since_us.saturating_add(waits_us[0])),
            Level::Host => Some(self.level_since_us.saturating_add(waits_us[1])),
            Level::Any => None,
        }
    }

    /// Finds a task for an executor (`exec`, `exec_slot`, on `host`, with `free` cores), best
    /// locality first, then a straggler to copy. The task is taken off its queue. With
    /// `local_only`, only tasks preferring this executor or (once the wait allows) its host.
    #[allow(clippy::too_many_arguments)]
    pub fn find_task(
        &mut self,
        now_us: u64,
        waits_us: [u64; 2],
        exec: ExecutorId,
        exec_slot: u32,
        host: u32,
        free: u32,
        local_only: bool,
    ) -> Option<Found> {
        if self.pending > 0 {
            let found = self.find_pending(now_us, waits_us, (exec, host), free, local_only);
            if found.is_some() {
                return found;
            }
        }
        if local_only {
            return None;
        }
        self.find_straggler(exec, exec_slot, host, free)
    }

    /// A queued task for executor `(exec, host)` with `free` cores, best locality the wait
    /// allows first; with `local_only`, only one preferring the executor or its host. Notes a
    /// task held back by the wait (`delay_rejected`).
    #[inline]
    pub fn find_pending(
        &mut self,
        now_us: u64,
        waits_us: [u64; 2],
        (exec, host): (ExecutorId, u32),
        free: u32,
        local_only: bool,
    ) -> Option<Found> {
        // Classes are largest first: big tasks that fit go before small ones. A queue for
        // the asking executor (registered) or its host would be a live key: with none live,
        // there is none to look up.
        if cfg!(debug_assertions) {
            let (exec_queue, host_queue) = self.queues_for(exec, host);
            debug_assert!(
                self.live_exec_keys > 0 || !exec_queue,
                "{exec:?} is registered"
            );
            debug_assert!(
                self.live_host_keys > 0 || !host_queue,
                "host {host} is live"
            );
        }
        if self.has_exec_prefs && self.live_exec_keys > 0 {
            if let Some(i) = self.pop_by_exec(exec, host, free) {
                return Some(Found::Pending(i, Some(Level::Executor)));
            }
        }
        let mut allowed = self.allowed_level(now_us, waits_us);
        if allowed >= Level::Host && self.has_host_prefs && self.live_host_keys > 0 {
            if let Some(i) = self.pop_by_host(exec, host, free) {
                return Some(Found::Pending(i, Some(Level::Host)));
            }
            // Its last live host queue may have just emptied of stale entries: a level with
            // no task left to wait for ends now, not at the next call (so a call that finds
            // nothing leaves what the next one finds as it was).
            if allowed == Level::Host && self.live_host_keys == 0 {
                allowed = self.allowed_level(now_us, waits_us);
            }
        }
        if local_only {
            return None;
        }
        let Job { classes, tasks, .. } = &mut *self;
        for q in classes.iter_mut().filter(|q| q.cores <= free) {
            let found = pop_fresh(&mut q.fresh, tasks, q.cores, free)
                .or_else(|| pop_pending(&mut q.no_pref, tasks, free, exec, host));
            if let Some(i) = found {
                return Some(Found::Pending(i, None));
            }
        }
        if allowed >= Level::Any {
            let fitting = classes.iter_mut().filter(|q| q.cores <= free);
            for q in fitting.filter_map(|q| q.prefs.as_mut()) {
                if let Some(i) = pop_pending(&mut q.any, tasks, free, exec, host) {
                    return Some(Found::Pending(i, Some(Level::Any)));
                }
            }
        } else if (classes.iter().filter_map(|q| q.prefs.as_ref())).any(|q| !q.any.is_empty()) {
            self.delay_rejected = true;
        }
        None
    }

    /// Whether any of its classes has a queue of tasks preferring executor `exec`, and one
    /// preferring `host` (for the debug builds' checks).
    fn queues_for(&self, exec: ExecutorId, host: u32) -> (bool, bool) {
        let queues = || self.classes.iter().filter_map(|q| q.prefs.as_ref());
        (
            queues().any(|q| q.by_exec.contains_key(&exec)),
            queues().any(|q| q.by_host.contains_key(&host)),
        )
    }

    /// A queued task preferring executor `exec` (on `host`) that fits `free` cores, taken off
    /// its queue; a queue left empty is dropped.
    #[inline]
    fn pop_by_exec(&mut self, exec: ExecutorId, host: u32, free: u32) -> Option<u32> {
        let Job {
            classes,
            tasks,
            live_exec_keys,
            ..
        } = &mut *self;
        let fitting = classes.iter_mut().filter(|q| q.cores <= free);
        for q in fitting.filter_map(|q| q.prefs.as_mut()) {
            let Some(queue) = q.by_exec.get_mut(&exec) else {
                continue;
            };
            let found = pop_pending(queue, tasks, free, exec, host);
            if queue.is_empty() {
                q.by_exec.remove(&exec);
                assert!(*live_exec_keys > 0, "a registered executor's queue");
                *live_exec_keys = live_exec_keys.saturating_sub(1);
            }
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// A queued task preferring `host` that fits `free` cores of executor `exec`, taken off its
    /// queue; a queue left empty is dropped.
    #[inline]
    fn pop_by_host(&mut self, exec: ExecutorId, host: u32, free: u32) -> Option<u32> {
        let Job {
            classes,
            tasks,
            live_host_keys,
            ..
        } = &mut *self;
        let fitting = classes.iter_mut().filter(|q| q.cores <= free);
        for q in fitting.filter_map(|q| q.prefs.as_mut()) {
            let Some(queue) = q.by_host.get_mut(&host) else {
                continue;
            };
            let found = pop_pending(queue, tasks, free, exec, host);
            if queue.is_empty() {
                q.by_host.remove(&host);
                assert!(*live_host_keys > 0, "a registered executor's host");
                *live_host_keys = live_host_keys.saturating_sub(1);
            }
            if found.is_some() {
                return found;
            }
        }
        None
    }

    /// A straggler to copy onto executor `exec` (in `exec_slot`, on `host`, with `free` cores),
    /// taken off the speculatable queue.
    #[inline]
    fn find_straggler(
        &mut self,
        exec: ExecutorId,
        exec_slot: u32,
        host: u32,
        free: u32,
    ) -> Option<Found> {
        // The whole queue, not only its head: a straggler running on this executor (or too big
        // for it, or avoiding it) must not hide the ones behind it (issue 14 item 1, Spark's
        // SPARK-26755). Stale entries are dropped on the way; skipped ones keep their place.
        let mut k = 0;
        while let Some(&i) = self.speculatable.get(k) {
            let live = self
                .tasks
                .get(i as usize)
                .filter(|t| t.status == Status::Running && t.running_attempts() == 1);
            let Some(t) = live else {
                self.speculatable.remove(k);
                continue;
            };
            let here = t.attempts.iter().flatten().any(|a| a.exec == exec_slot);
            if here || t.cores > free || t.avoids(exec, host) {
                k += 1;
                continue;
            }
            self.speculatable.remove(k);
            return Some(Found::Speculative(i));
        }
        None
    }

    /// Starts an attempt of the task `found` on executor slot `exec_slot`, its run to be booked
    /// at index `run` of that executor's running attempts: the attempt slot taken, the task
    /// (if pending) marked running and the job's counts moved along. Returns
    /// the launch to send and whether it is a speculative copy.
    #[inline]
    pub fn start_attempt(
        &mut self,
        now_us: u64,
        (exec_slot, run): (u32, u32),
        found: Found,
    ) -> (TaskLaunch, bool) {
        let (index, speculative) = match found {
            Found::Pending(i, level) => {
                self.launched_at(now_us, level);
                (i, false)
            }
            Found::Speculative(i) => (i, true),
        };
        let Some(t) = self.tasks.get_mut(index as usize) else {
            unreachable!("found task {index} beyond the job");
        };
        let Some(free_attempt) = t.attempts.iter_mut().find(|a| a.is_none()) else {
            unreachable!("task {index} found with both attempt slots taken");
        };
        let attempt = t.next_attempt;
        *free_attempt = Some(Placed::new(attempt, exec_slot, run));
        t.next_attempt += 1;
        self.counters.launched += 1;
        if speculative {
            assert_eq!(t.status, Status::Running, "only running tasks are copied");
            self.counters.speculative += 1;
        } else {
            assert_eq!(t.status, Status::Pending, "only pending tasks launch");
            t.status = Status::Running;
            self.pending -= 1;
            if self.pending == 0 {
                self.delay_rejected = false;
            }
            self.running += 1;
        }
        let launch = TaskLaunch {
            task: TaskId::new(self.id, index),
            attempt,
            function: function_of(&self.function, &self.functions, t).clone(),
            payload: match self.payloads.get(index as usize) {
                Some(payload) => payload.clone(),
                None => unreachable!("task {index} without a payload"),
            },
            cores: t.cores,
            speculative,
        };
        (launch, speculative)
    }

    /// Records a launch at `level` for delay scheduling: it restarts the wait at that level
    /// unless an executor was turned away meanwhile. No-preference launches do not count.
    pub fn launched_at(&mut self, now_us: u64, level: Option<Level>) {
        self.last_progress_us = now_us;
        if let Some(level) = level {
            if !self.delay_rejected {
                self.level = level;
                self.level_since_us = now_us;
            }
        }
    }

    /// Whether this executor (or its host) is excluded for this job.
    pub fn excludes(&self, exec: ExecutorId, host: u32) -> bool {
        self.exclusion.as_ref().is_some_and(|x| {
            (!x.executors.is_empty() && x.executors.contains(&exec))
                || (!x.hosts.is_empty() && x.hosts.contains(&host))
        })
    }

    /// Counts a failure on `exec`/`host` against this job; excludes them past the limits.
    pub fn record_exclusion_failure(
        &mut self,
        exec: ExecutorId,
        host: u32,
        exec_max: u32,
        host_max: u32,
    ) {
        let x = self.exclusion.get_or_insert_with(Box::default);
        let n = x.exec_failures.entry(exec).or_insert(0);
        *n += 1;
        if *n >= exec_max {
            x.executors.insert(exec);
        }
        let n = x.host_failures.entry(host).or_insert(0);
        *n += 1;
        if *n >= host_max {
            x.hosts.insert(host);
        }
    }

    /// The speculation threshold: `multiplier` times the median successful run, once `quantile`
    /// of the tasks succeeded.
    pub fn speculation_threshold_us(
        &mut self,
        quantile: f64,
        multiplier: f64,
        min_runtime_us: u64,
    ) -> Option<u64> {
        if !self.quantile_met(quantile) {
            return None;
        }
        let median = self.median_us()?;
        let threshold = (median as f64 * multiplier) as u64;
        Some(threshold.max(min_runtime_us))
    }

    /// Whether `quantile` of the tasks succeeded: Spark's `minFinishedForSpeculation`,
    /// floor(quantile x tasks), at least 1 (SPARK-37580).
    pub fn quantile_met(&self, quantile: f64) -> bool {
        let needed = ((quantile * self.task_count as f64).floor() as usize).max(1);
        self.durations_us.len() >= needed
    }

    /// The median successful run so far, if any task succeeded.
    pub fn median_us(&mut self) -> Option<u64> {
        let n = self.durations_us.len();
        if n == 0 {
            return None;
        }
        let (cached_n, cached) = self.median_cache;
        if cached_n > 0 && n < cached_n.saturating_add(cached_n / 8).max(cached_n + 1) {
            return Some(cached);
        }
        let (_, median, _) = self.durations_us.select_nth_unstable(n / 2);
        let median = *median;
        self.median_cache = (n, median);
        Some(median)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn task(status: Status, cores: u32) -> TaskRec {
        TaskRec {
            function: 0,
            exclusion: None,
            cores,
            status,
            next_attempt: 0,
            failures: 0,
            attempts: [None, None],
            speculated: false,
        }
    }

    #[test]
    fn pop_pending_skips_stale_entries_and_stops_at_a_task_that_does_not_fit() {
        let tasks = vec![
            task(Status::Running, 1),
            task(Status::Succeeded, 1),
            task(Status::Pending, 2),
            task(Status::Pending, 1),
        ];
        let mut q: VecDeque<u32> = [0, 1, 9, 2, 3].into_iter().collect();
        let e = ExecutorId(1);
        assert_eq!(
            pop_pending(&mut q, &tasks, 1, e, 0),
            None,
            "task 2 needs 2 cores"
        );
        assert_eq!(q, [2, 3], "stale and unknown entries dropped");
        assert_eq!(pop_pending(&mut q, &tasks, 2, e, 0), Some(2));
        assert_eq!(pop_pending(&mut q, &tasks, 2, e, 0), Some(3));
        assert_eq!(pop_pending(&mut q, &tasks, 2, e, 0), None);
    }

    #[test]
    fn pop_pending_passes_over_a_task_that_avoids_the_executor_and_keeps_it() {
        let mut tasks = vec![task(Status::Pending, 1), task(Status::Pending, 1)];
        tasks[0].record_failure(ExecutorId(1), 0, 1, 2);
        let mut q: VecDeque<u32> = [0, 1].into_iter().collect();
        assert_eq!(pop_pending(&mut q, &tasks, 1, ExecutorId(1), 0), Some(1));
        assert_eq!(q, [0], "kept for other executors");
        assert_eq!(pop_pending(&mut q, &tasks, 1, ExecutorId(1), 0), None);
        assert_eq!(pop_pending(&mut q, &tasks, 1, ExecutorId(2), 0), Some(0));
    }

    #[test]
    fn preferred_hosts_up_to_three_are_kept_in_place_and_more_apart_each_in_order() {
        for n in 0..=6u32 {
            let names: Vec<String> = (0..n).map(|i| format!("h{i}")).collect();
            let hosts = PrefHosts::of(&names, |name| 10 + name[1..].parse::<u32>().unwrap());
            assert_eq!(&hosts[..], (10..10 + n).collect::<Vec<_>>(), "{n} names");
            let in_place = matches!(hosts, PrefHosts::Inline { .. });
            assert_eq!(in_place, n as usize <= HOSTS_INLINE, "{n} names");
        }
    }

    fn job(has_exec_prefs: bool, has_host_prefs: bool) -> Job {
        Job {
            id: JobId(1),
            tasks: vec![task(Status::Pending, 1)],
            task_count: 1,
            payloads: Payloads::from(Bytes::new()),
            keep_results: true,
            result_bytes_max: u64::MAX,
            pending: 1,
            has_exec_prefs,
            has_host_prefs,
            live_exec_keys: u32::from(has_exec_prefs),
            live_host_keys: u32::from(has_host_prefs),
            level: Level::Executor,
            max_failures: 4,
            ..Job::vacant()
        }
    }

    #[test]
    fn locality_level_widens_after_each_wait_and_skips_levels_without_preferences() {
        let mut j = job(true, true);
        assert_eq!(j.allowed_level(99, [100, 50]), Level::Executor);
        assert_eq!(j.level_deadline([100, 50]), Some(100));
        assert_eq!(j.allowed_level(100, [100, 50]), Level::Host);
        assert!(j.widened);
        assert_eq!(j.allowed_level(149, [100, 50]), Level::Host);
        assert_eq!(j.allowed_level(150, [100, 50]), Level::Any);
        assert_eq!(j.level_deadline([100, 50]), None);
        let mut j = job(false, false);
        assert_eq!(
            j.allowed_level(0, [100, 50]),
            Level::Any,
            "nothing to wait for"
        );
    }

    #[test]
    fn a_turned_away_executor_stops_local_launches_from_restarting_the_wait() {
        let mut j = job(true, true);
        j.launched_at(10, Some(Level::Executor));
        assert_eq!(j.level_since_us, 10);
        j.delay_rejected = true;
        j.launched_at(20, Some(Level::Executor));
        assert_eq!(j.level_since_us, 10, "the wait keeps running");
        assert_eq!(j.allowed_level(110, [100, 50]), Level::Host);
    }

    #[test]
    fn exclusion_counts_per_executor_and_host() {
        let mut j = job(false, false);
        j.record_exclusion_failure(ExecutorId(1), 7, 2, 3);
        assert!(!j.excludes(ExecutorId(1), 7));
        j.record_exclusion_failure(ExecutorId(1), 7, 2, 3);
        assert!(j.excludes(ExecutorId(1), 7));
        assert!(!j.excludes(ExecutorId(2), 7));
        j.record_exclusion_failure(ExecutorId(2), 7, 2, 3);
        assert!(j.excludes(ExecutorId(3), 7), "host 7 had 3 failures");
    }

    #[test]
    fn speculation_threshold_needs_the_quantile_and_uses_the_median() {
        let mut j = job(false, false);
        j.tasks = (0..4).map(|_| task(Status::Running, 1)).collect();
        j.task_count = 4;
        j.durations_us = vec![100];
        assert_eq!(
            j.speculation_threshold_us(0.5, 1.5, 0),
            None,
            "1 of 4 < 50%"
        );
        // floor(0.75 x 4) = 3, floor(0.6 x 4) = 2 (ceil would be 3).
        j.durations_us = vec![100, 100];
        assert_eq!(j.speculation_threshold_us(0.6, 1.5, 0), Some(150));
        j.durations_us = vec![300, 100];
        j.median_cache = (0, 0);
        assert_eq!(j.speculation_threshold_us(0.5, 1.5, 0), Some(450));
        assert_eq!(j.speculation_threshold_us(0.5, 1.5, 1000), Some(1000));
    }
}
