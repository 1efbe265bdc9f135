//! What a running process shows about itself: the driver's loop keeps a [`LoopTelemetry`]
//! (plain values only the loop touches, so recording costs no atomics and no locks) and answers
//! the driver's observer (through [`DriverViews`]) with a [`DriverView`] built from it and from the
//! scheduler's own counters; the master and the worker are seen through their status answer
//! ([`cluster_view`]). The metrics ([`metrics`]) and the web UI ([`ui`], over the bounded HTTP
//! responder in [`http`]) render these views.
//!
//! # What is recorded where
//!
//! - Task counts come from the scheduler's [`Stats`] (the loop keeps them anyway).
//! - Per executor: tasks finished and failed, counted as the driver handles each status update
//!   (one add on a value the loop owns); tasks running from the scheduler's free slots.
//! - Per job: tasks done and failed attempts, counted on the result the driver already hands to
//!   the job; the first [`JOB_FAILURES_MAX`] failure reasons.
//! - Timing is sampled: one task in [`SAMPLE_EVERY`] (by task index) has its launch time noted,
//!   giving the queue time (submit to launch) and the round trip (launch to its final status
//!   update at the driver) histograms. Sampling keeps the cost away from the other tasks.
//! - Bytes and frames read and bytes written by every connection of this
//!   process ([`NET`]).

pub mod api;
mod cluster;
pub mod http;
pub mod metrics;
pub mod quantiles;
pub mod series;
pub mod timeline;
pub mod token;
mod tracks;
pub mod ui;

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flint_engine::hash::FxHashMap;
use flint_engine::scheduler::{
    Attempt, ExecutorId, JobId, JobInfo, JobOutcome, LocalityLevel, Stats, TaskId, TaskLaunch,
};
use serde::Serialize;

use quantiles::{Fine, Five, Samples};
use series::{Point, Series};
use timeline::{Bar, Launch, Timeline};
use tracks::Tracks;

pub use crate::conn::{NetCounters, NET};
use crate::wire::TaskState;
pub use cluster::{cluster_view, AppRow, ClusterExecutorRow, ClusterView, WorkerRow};

/// What answers with a driver's view: the driver's `DriverObserver` (a trait here, so that
/// `observe`, which renders views, needs nothing of the driver, which makes them).
pub trait DriverViews: std::fmt::Debug + Send + Sync + 'static {
    /// The driver's view now, or why not (its loop did not answer within `timeout`, or the
    /// driver stopped).
    fn driver_view(&self, timeout: Duration) -> Result<DriverView, String>;
}

/// Where a component's event lines go (executor started, registered, removed): a callback, so
/// library code never prints. Without one, events are logged with `tracing` at info.
#[derive(Clone)]
pub struct EventSink(pub std::sync::Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for EventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventSink")
    }
}

impl EventSink {
    /// A sink calling `f` with each line.
    pub fn new(f: impl Fn(&str) + Send + Sync + 'static) -> EventSink {
        EventSink(std::sync::Arc::new(f))
    }

    /// Hands `line` to `sink`, or logs it at info without one.
    pub fn emit(sink: Option<&EventSink>, line: &str) {
        match sink {
            Some(sink) => (sink.0)(line),
            None => tracing::info!("{line}"),
        }
    }
}

/// One task in this many (by index) has its timing recorded.
pub const SAMPLE_EVERY: u32 = 16;
/// Finished jobs the driver remembers for its page.
pub const RECENT_JOBS_MAX: usize = 50;
/// Task failures the driver remembers for its page.
pub const RECENT_FAILURES_MAX: usize = 50;
/// Failure reasons kept per job.
pub const JOB_FAILURES_MAX: usize = 5;
/// Removed executors the driver remembers for its page.
pub const REMOVED_EXECUTORS_MAX: usize = 50;
/// Active jobs a view lists (the newest; the others are counted).
pub const ACTIVE_JOBS_SHOWN_MAX: usize = 100;
/// Bytes of a failure reason kept for the page.
const REASON_KEPT_BYTES: usize = 512;

/// Upper bounds (microseconds) of the latency histograms' buckets.
pub const BUCKETS_US: [u64; 20] = [
    10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    500_000, 1_000_000, 2_500_000, 5_000_000, 10_000_000, 60_000_000,
];

/// A latency histogram in microseconds with the fixed [`BUCKETS_US`] (plus +Inf).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Observations per bucket (not cumulative); the last is +Inf.
    pub counts: [u64; BUCKETS_US.len() + 1],
    /// Sum of the observations.
    pub sum_us: u64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&mut self, us: u64) {
        let i = BUCKETS_US.partition_point(|&bound| bound < us);
        self.counts[i] += 1;
        self.sum_us = self.sum_us.saturating_add(us);
        self.count += 1;
    }

    /// `(upper bound in seconds, count in that bucket)` pairs, `f64::MAX` standing for +Inf
    /// last, as [`prometheus_client`]'s encoder takes them (it sums them up).
    pub fn buckets_seconds(&self) -> Vec<(f64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .map(|(i, &count)| {
                (
                    BUCKETS_US.get(i).map_or(f64::MAX, |&b| b as f64 / 1e6),
                    count,
                )
            })
            .collect()
    }
}

fn as_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1e3)
}

/// A job as the driver's pages and API show it.
#[derive(Debug, Clone, Serialize)]
pub struct JobView {
    /// Its id.
    pub id: u64,
    /// The function its tasks run.
    pub function: std::sync::Arc<str>,
    /// Its FAIR pool (`default` when it named none).
    pub pool: std::sync::Arc<str>,
    /// Its tasks.
    pub tasks: u64,
    /// Tasks with a final result.
    pub tasks_done: u64,
    /// Task attempts that failed (retried or not, killed included).
    pub attempts_failed: u64,
    /// Copies (speculative attempts) launched.
    pub copies: u64,
    /// `RUNNING`, `SUCCEEDED`, `FAILED` or `CANCELLED`.
    pub state: &'static str,
    /// When it was submitted (Unix milliseconds).
    pub submitted_unix_ms: u64,
    /// How long it ran (to now while it runs).
    #[serde(rename = "duration_ms", serialize_with = "as_ms")]
    pub duration: Duration,
    /// The first failure reasons (of attempts, or the job's own when it failed).
    pub failures: Vec<String>,
    /// Its sampled attempts' durations (launch to final update at the driver).
    pub task_durations: Option<Five>,
    /// Its sampled tasks' scheduler delay (submit to first launch).
    pub scheduler_delays: Option<Five>,
    /// While it runs: what the scheduler says of it.
    pub scheduling: Option<JobScheduling>,
}

/// What the scheduler says of a running job.
#[derive(Debug, Clone, Serialize)]
pub struct JobScheduling {
    /// Attempts launched (retries and copies included).
    pub attempts_launched: u64,
    /// Tasks waiting for a slot.
    pub pending: u64,
    /// Tasks with an attempt running.
    pub running: u64,
    /// Its locality level now (delay scheduling).
    pub locality_level: &'static str,
    /// The levels it may use with the executors registered now, best first.
    pub valid_levels: Vec<&'static str>,
}

fn level(l: LocalityLevel) -> &'static str {
    match l {
        LocalityLevel::Executor => "EXECUTOR",
        LocalityLevel::Host => "HOST",
        LocalityLevel::Any => "ANY",
    }
}

impl JobScheduling {
    /// From the scheduler's answer.
    pub fn of(info: &JobInfo) -> JobScheduling {
        JobScheduling {
            attempts_launched: info.launched,
            pending: info.pending as u64,
            running: info.running as u64,
            locality_level: level(info.locality_level),
            valid_levels: info.valid_levels.iter().map(|l| level(*l)).collect(),
        }
    }
}

/// An executor as the driver's pages and API show it.
#[derive(Debug, Clone, Serialize)]
pub struct ExecutorView {
    /// Its id on the wire (`local` for local mode's).
    pub executor_id: String,
    /// Its host.
    pub host: String,
    /// Cores it registered.
    pub cores: u32,
    /// Tasks running on it now (0 once removed).
    pub tasks_running: u32,
    /// Tasks that finished on it.
    pub tasks_finished: u64,
    /// Task attempts that failed on it.
    pub tasks_failed: u64,
    /// Empty while registered; why it was removed otherwise.
    pub removed: String,
    /// Whether its removal counted as a loss.
    pub lost: bool,
    /// While registered, a remote executor's attempts launched on each of its lanes (one entry
    /// per lane it registered, 0 for a lane not joined); empty otherwise.
    pub lane_launches: Vec<u64>,
    /// While registered, a remote executor's lanes joined, lane 0 included; 0 otherwise.
    pub lanes_joined: u32,
    /// While registered, whether it gets less work or none for now: `stalled`, `suspected`
    /// or `probation` (see `Driver::executor_health`); empty when it is well.
    pub health: String,
}

/// A task attempt's failure.
#[derive(Debug, Clone, Serialize)]
pub struct FailureView {
    /// When (Unix milliseconds).
    pub unix_ms: u64,
    /// Its job.
    pub job: u64,
    /// Its index in the job.
    pub index: u32,
    /// Its attempt.
    pub attempt: u32,
    /// The id on the wire of the executor it ran on.
    pub executor_id: String,
    /// The reason it gave (cut to 512 bytes).
    pub reason: String,
}

/// Everything the driver shows: what [`DriverViews::driver_view`] answers.
#[derive(Debug, Clone, Default)]
pub struct DriverView {
    /// Seconds since the driver started.
    pub uptime: Duration,
    /// The scheduler's counters.
    pub stats: Stats,
    /// Task attempts the driver asked executors to kill.
    pub kills_sent: u64,
    /// Tasks waiting for a slot.
    pub pending_tasks: u64,
    /// Task attempts running.
    pub running_tasks: u64,
    /// Jobs submitted and not over.
    pub active_jobs: u64,
    /// Jobs submitted since the start.
    pub jobs_submitted: u64,
    /// Jobs over, by outcome: succeeded, failed, cancelled.
    pub jobs_over: [u64; 3],
    /// Executors registered since the start.
    pub executors_registered: u64,
    /// Executors lost since the start (not stopped on purpose).
    pub executors_lost: u64,
    /// Connections or registrations refused, by reason.
    pub refusals: Vec<(&'static str, u64)>,
    /// Sampled queue time (submit to launch).
    pub queue_time: Histogram,
    /// Sampled round trip (launch to final status at the driver).
    pub round_trip: Histogram,
    /// Registered executors, then recently removed ones.
    pub executors: Vec<ExecutorView>,
    /// Active jobs (newest first), then recently finished ones.
    pub jobs: Vec<JobView>,
    /// Recent task failures, newest first.
    pub failures: Vec<FailureView>,
    /// Active jobs not listed in `jobs` (beyond [`ACTIVE_JOBS_SHOWN_MAX`]).
    pub jobs_not_shown: u64,
    /// The task timeline's bars, oldest first.
    pub timeline: Vec<Bar>,
    /// The live charts' points, oldest first.
    pub series: Vec<Point>,
}

/// Whether a task's timing is sampled: one in [`SAMPLE_EVERY`] by job id plus index, so jobs
/// of one task are sampled one in 16 too.
#[inline]
fn sampled(task: TaskId) -> bool {
    (task.job().0.wrapping_add(u64::from(task.index()))) % u64::from(SAMPLE_EVERY) == 0
}

/// Makes `kept` name `new`, unless it is that very name already (no reference count changes).
#[inline]
fn keep_or_share(kept: &mut std::sync::Arc<str>, new: &std::sync::Arc<str>) {
    if !std::sync::Arc::ptr_eq(kept, new) {
        *kept = new.clone();
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn cut(reason: &str) -> String {
    if reason.len() <= REASON_KEPT_BYTES {
        return reason.to_owned();
    }
    let mut end = REASON_KEPT_BYTES;
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &reason[..end])
}

struct JobTrack {
    span: tracing::Span,
    function: std::sync::Arc<str>,
    pool: std::sync::Arc<str>,
    tasks: u64,
    tasks_done: u64,
    attempts_failed: u64,
    copies: u64,
    submitted_us: u64,
    failures: Vec<String>,
    durations: Samples,
    delays: Samples,
}

/// What a job's record starts from ([`LoopTelemetry::job_submitted`]), but for its span (made
/// in its place); the names are borrowed, so a record that names the same ones as the record
/// before it in its slot keeps them (no reference count changes).
struct NewJob<'a> {
    function: &'a std::sync::Arc<str>,
    pool: &'a std::sync::Arc<str>,
    tasks: u64,
    submitted_us: u64,
}

impl JobTrack {
    /// An empty record naming `function` and `pool`, for a new slot to take its first job's
    /// record over ([`JobTrack::refill`]).
    fn empty(function: &std::sync::Arc<str>, pool: &std::sync::Arc<str>) -> JobTrack {
        JobTrack {
            span: tracing::Span::none(),
            function: function.clone(),
            pool: pool.clone(),
            tasks: 0,
            tasks_done: 0,
            attempts_failed: 0,
            copies: 0,
            submitted_us: 0,
            failures: Vec::new(),
            durations: Samples::default(),
            delays: Samples::default(),
        }
    }

    /// Becomes `new`'s record where this one lies (its slot freed), keeping its vectors' room
    /// and, when the job before named the same function or pool (most do), its names: a job's
    /// record is written field by field, and its samples allocate nothing after the first jobs.
    #[inline(always)]
    fn refill(&mut self, new: NewJob<'_>) {
        keep_or_share(&mut self.function, new.function);
        keep_or_share(&mut self.pool, new.pool);
        self.tasks = new.tasks;
        self.tasks_done = 0;
        self.attempts_failed = 0;
        self.copies = 0;
        self.submitted_us = new.submitted_us;
        self.failures.clear();
        self.durations.clear();
        self.delays.clear();
    }

    /// Its view: `state`, ended at `now_us` or running then.
    fn view(&self, id: JobId, state: &'static str, epoch_unix_ms: u64, now_us: u64) -> JobView {
        JobView {
            id: id.0,
            function: self.function.clone(),
            pool: self.pool.clone(),
            tasks: self.tasks,
            tasks_done: self.tasks_done,
            attempts_failed: self.attempts_failed,
            copies: self.copies,
            state,
            submitted_unix_ms: epoch_unix_ms + self.submitted_us / 1000,
            duration: Duration::from_micros(now_us.saturating_sub(self.submitted_us)),
            failures: self.failures.clone(),
            task_durations: self.durations.five(),
            scheduler_delays: self.delays.five(),
            scheduling: None,
        }
    }
}

/// A failed job's end in its record (`job_over`): logged in its span, its first reasons kept.
#[cold]
#[inline(never)]
fn job_failed(track: &mut JobTrack, duration_ms: u64, reasons: &[String]) {
    let first = reasons.first().map_or("", String::as_str);
    tracing::warn!(parent: &track.span, duration_ms,
        failed_attempts = track.attempts_failed, reason = first, "job failed");
    for reason in reasons.iter().take(JOB_FAILURES_MAX) {
        let reason = cut(reason);
        if !track.failures.contains(&reason) {
            track.failures.push(reason);
        }
    }
    track.failures.truncate(JOB_FAILURES_MAX * 2);
}

/// Whether `span` is one to enter or close: a subscriber's, or one that logs `log` records
/// (a span of neither, tracing off, is [`tracing::Span::none`]).
#[inline(always)]
fn is_live(span: &tracing::Span) -> bool {
    !span.is_none() || span.metadata().is_some()
}

/// A job's span closes at its end (one not [`is_live`] has nothing to close), leaving its
/// record none for the next job in its slot; the record is kept as it is, a view made of it
/// when asked.
#[inline(always)]
fn close_span(track: &mut JobTrack) {
    if is_live(&track.span) {
        drop(std::mem::replace(&mut track.span, tracing::Span::none()));
    }
}

struct ExecutorTrack {
    name: std::sync::Arc<str>,
    view: ExecutorView,
}

/// How a job ended, as [`LoopTelemetry::job_over`] takes it: borrowed from the outcome while
/// it waits for the job's handle, so nothing is copied (a failure's reasons are cut and kept
/// by `job_over` itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobEnd<'a> {
    /// Every task succeeded.
    Succeeded,
    /// It failed; its reasons.
    Failed(&'a [String]),
    /// It was cancelled.
    Cancelled,
}

impl JobEnd<'_> {
    /// How `outcome` ended.
    pub fn of(outcome: &JobOutcome) -> JobEnd<'_> {
        match outcome {
            JobOutcome::Succeeded(_) => JobEnd::Succeeded,
            JobOutcome::Failed(reasons) => JobEnd::Failed(reasons),
            JobOutcome::Cancelled => JobEnd::Cancelled,
        }
    }
}

/// Why the driver refused a peer.
#[derive(Debug, Clone, Copy)]
pub enum PeerRefusal {
    /// The connection table was full.
    TableFull,
    /// The handshake failed (wrong secret, bad bytes).
    Handshake,
    /// The registration was refused (duplicate id, too many cores, stopping).
    Registration,
}

/// The driver loop's record (see the module docs). Only the loop touches it.
pub struct LoopTelemetry {
    /// The origin of the loop's clock (its `now_us` counts from there) in Unix milliseconds.
    epoch_unix_ms: u64,
    /// The active and recent jobs' records.
    jobs: Tracks,
    /// Tasks of one job done since its record was last counted up: results come in runs of
    /// one job, so a task's result costs no lookup ([`LoopTelemetry::task_done`]).
    done_pending: (JobId, u64),
    /// The default pool's name, shared by every job in it.
    default_pool: std::sync::Arc<str>,
    /// The function name a job of no tasks shows (none), shared by every such job.
    no_function: std::sync::Arc<str>,
    executors: FxHashMap<ExecutorId, ExecutorTrack>,
    removed: VecDeque<ExecutorView>,
    failures: VecDeque<FailureView>,
    /// Sampled attempts and copies in flight, and the bars.
    timeline: Timeline,
    queue_time: Histogram,
    round_trip: Histogram,
    /// Every job's latency (submit to end) and the sampled round trips, finer, for the charts.
    job_latency: Fine,
    trips: Fine,
    series: Series,
    kills_sent: u64,
    jobs_submitted: u64,
    jobs_over: [u64; 3],
    refusals: [u64; 3],
}

impl LoopTelemetry {
    /// Nothing recorded yet; `epoch` is the origin of the loop's clock.
    pub fn new(epoch: Instant) -> LoopTelemetry {
        LoopTelemetry {
            epoch_unix_ms: unix_ms().saturating_sub(epoch.elapsed().as_millis() as u64),
            jobs: Tracks::default(),
            done_pending: (JobId(u64::MAX), 0),
            default_pool: std::sync::Arc::from("default"),
            no_function: std::sync::Arc::from(""),
            executors: FxHashMap::default(),
            removed: VecDeque::new(),
            failures: VecDeque::new(),
            timeline: Timeline::default(),
            queue_time: Histogram::default(),
            round_trip: Histogram::default(),
            job_latency: Fine::default(),
            trips: Fine::default(),
            series: Series::default(),
            kills_sent: 0,
            jobs_submitted: 0,
            jobs_over: [0; 3],
            refusals: [0; 3],
        }
    }

    /// A job went into the scheduler (in `pool`): its span opens. `function` is `None` for a
    /// job of no tasks (it shows none).
    pub fn job_submitted(
        &mut self,
        now_us: u64,
        job: JobId,
        function: Option<&std::sync::Arc<str>>,
        tasks: usize,
        pool: &str,
    ) {
        self.job_submitted_to(now_us, job, function, tasks, Some(pool));
    }

    /// [`LoopTelemetry::job_submitted`], the pool `None` for a job that named none (most: it
    /// runs in the default pool, and no name is compared). Always inline: once a job, from
    /// the driver core's submission of a job without settings (the hint alone was not taken
    /// once a job with settings of its own called it from a function of its own).
    #[inline(always)]
    pub(crate) fn job_submitted_to(
        &mut self,
        now_us: u64,
        job: JobId,
        function: Option<&std::sync::Arc<str>>,
        tasks: usize,
        pool: Option<&str>,
    ) {
        let function = function.unwrap_or(&self.no_function);
        self.jobs_submitted += 1;
        let named;
        let pool = match pool {
            None | Some("default") => &self.default_pool,
            Some(other) => {
                named = std::sync::Arc::from(other);
                &named
            }
        };
        let new = NewJob {
            function,
            pool,
            tasks: tasks as u64,
            submitted_us: now_us,
        };
        // The span is not moved in with the rest: that copied it through the stack twice per
        // job. A record opens with no span (a new one has none, a job's end leaves none), so
        // one of nothing (tracing off: in a process that never sets a subscriber, a constant)
        // is not written at all.
        let record = self.jobs.open(job, new);
        debug_assert!(!is_live(&record.span), "a record opens with no span");
        let span = tracing::info_span!("job", job = job.0, function = &**function, tasks);
        if is_live(&span) {
            record.span = span;
        }
        tracing::info!(parent: &record.span, "job submitted");
    }

    /// A task of `job` reached its final result.
    #[inline]
    pub fn task_done(&mut self, job: JobId) {
        if self.done_pending.0 == job {
            self.done_pending.1 += 1;
        } else {
            self.count_done();
            self.done_pending = (job, 1);
        }
    }

    /// Adds the pending run of done tasks to its job's record (none is pending once its job's
    /// end took it: no lookup then).
    fn count_done(&mut self) {
        let job = self.done_pending.0;
        let done = std::mem::take(&mut self.done_pending.1);
        if done == 0 {
            return;
        }
        if let Some(track) = self.jobs.get_mut(job) {
            track.tasks_done += done;
        }
    }

    /// Tasks of `job` done and not yet added to its record.
    fn done_pending(&self, job: JobId) -> u64 {
        if self.done_pending.0 == job {
            self.done_pending.1
        } else {
            0
        }
    }

    /// A job ended: logged in its span, moved to the recent jobs.
    pub fn job_over(&mut self, now_us: u64, job: JobId, outcome: JobEnd<'_>) {
        let (state, slot) = match outcome {
            JobEnd::Succeeded => ("SUCCEEDED", 0),
            JobEnd::Failed(_) => ("FAILED", 1),
            JobEnd::Cancelled => ("CANCELLED", 2),
        };
        let Some((track, duration_us)) = self.end(now_us, job, state, slot, 0) else {
            return;
        };
        let duration_ms = duration_us / 1000;
        match outcome {
            JobEnd::Failed(reasons) => job_failed(track, duration_ms, reasons),
            _ => tracing::info!(parent: &track.span, duration_ms,
                failed_attempts = track.attempts_failed, outcome = state, "job done"),
        }
        close_span(track);
    }

    /// A job of one task succeeded with that task's result (the scheduler's
    /// `Event::OneTaskJobSucceeded`): [`LoopTelemetry::task_done`] then
    /// [`LoopTelemetry::job_over`] in one. Its task is added to its record as its end finds it,
    /// so no run of done tasks starts (nor is another job's pending run counted up), and the
    /// outcome is known, so nothing is matched on.
    #[inline]
    pub fn one_task_job_succeeded(&mut self, now_us: u64, job: JobId) {
        let Some((track, duration_us)) = self.end(now_us, job, "SUCCEEDED", 0, 1) else {
            return;
        };
        tracing::info!(parent: &track.span, duration_ms = duration_us / 1000,
            failed_attempts = track.attempts_failed, outcome = "SUCCEEDED", "job done");
        close_span(track);
    }

    /// The common part of a job's end: its record moved to the recent jobs, `state` and its
    /// end counted (`slot` of `jobs_over`), its latency observed, `done` tasks and its own
    /// pending ones added. Its record and latency, or `None` if it is not active.
    #[inline(always)]
    fn end(
        &mut self,
        now_us: u64,
        job: JobId,
        state: &'static str,
        slot: usize,
        done: u64,
    ) -> Option<(&mut JobTrack, u64)> {
        // Its own done tasks still pending go onto the record its end finds anyway (one lookup,
        // not two); another job's stay pending, counted when their run ends.
        let pending = match self.done_pending.0 == job {
            true => std::mem::take(&mut self.done_pending.1),
            false => 0,
        };
        let track = self.jobs.close(job, state, now_us)?;
        track.tasks_done += done + pending;
        self.jobs_over[slot] += 1;
        let duration_us = now_us.saturating_sub(track.submitted_us);
        self.job_latency.observe(duration_us);
        Some((track, duration_us))
    }

    /// An attempt is being launched on `executor`, to the lane `lane` gives (asked only for
    /// the attempts tracked: sampled ones and copies, for their times and the timeline).
    #[inline]
    pub fn launched(
        &mut self,
        now_us: u64,
        launch: &TaskLaunch,
        executor: ExecutorId,
        lane: impl FnOnce() -> u32,
    ) {
        if !sampled(launch.task) && !launch.speculative {
            return;
        }
        self.track_launch(now_us, launch, executor, lane());
    }

    #[cold]
    fn track_launch(&mut self, now: u64, launch: &TaskLaunch, executor: ExecutorId, lane: u32) {
        let (task, attempt) = (launch.task, launch.attempt);
        let is_sampled = sampled(task);
        if let Some(track) = self.jobs.get_mut(task.job()) {
            track.copies += u64::from(launch.speculative);
            if attempt == 0 && is_sampled {
                let queued = now.saturating_sub(track.submitted_us);
                self.queue_time.observe(queued);
                track.delays.offer(queued, task.0);
            }
        }
        let Some(name) = self.executors.get(&executor).map(|e| e.name.clone()) else {
            return;
        };
        let l = Launch {
            task,
            attempt,
            executor,
            name: &name,
            lane,
            copy: launch.speculative,
        };
        self.timeline.launched(now, l, is_sampled);
    }

    /// The driver asked an executor to kill an attempt.
    pub fn kill_sent(&mut self, now_us: u64, attempt: Attempt) {
        self.kills_sent += 1;
        self.timeline.kill_sent(now_us, attempt);
    }

    /// An executor registered.
    pub fn executor_registered(
        &mut self,
        id: ExecutorId,
        executor_id: &str,
        host: &str,
        cores: u32,
    ) {
        self.executors.insert(
            id,
            ExecutorTrack {
                name: std::sync::Arc::from(executor_id),
                view: ExecutorView {
                    executor_id: executor_id.to_owned(),
                    host: host.to_owned(),
                    cores,
                    tasks_running: 0,
                    tasks_finished: 0,
                    tasks_failed: 0,
                    removed: String::new(),
                    lost: false,
                    lane_launches: Vec::new(),
                    lanes_joined: 0,
                    health: String::new(),
                },
            },
        );
    }

    /// An executor was removed at `now_us` (the driver logs it); its attempts on the timeline
    /// end lost.
    pub fn executor_removed(&mut self, now_us: u64, id: ExecutorId, reason: &str, lost: bool) {
        self.timeline.executor_removed(now_us, id);
        if let Some(track) = self.executors.remove(&id) {
            let mut view = track.view;
            view.removed = cut(reason);
            view.lost = lost;
            if self.removed.len() == REMOVED_EXECUTORS_MAX {
                self.removed.pop_back();
            }
            self.removed.push_front(view);
        }
    }

    /// A peer was refused.
    pub fn refused(&mut self, why: PeerRefusal) {
        self.refusals[why as usize] += 1;
    }

    /// A status update from `executor` (before the scheduler sees it): samples, and a
    /// failure's reason logged in its job's span. The finished ones of a batch are counted
    /// once for it, by [`LoopTelemetry::tasks_finished`].
    #[inline]
    pub fn status_update(
        &mut self,
        now_us: u64,
        executor: ExecutorId,
        task: TaskId,
        attempt: u32,
        state: TaskState,
        data: &[u8],
    ) {
        match state {
            TaskState::Finished => {}
            TaskState::Running => return,
            _ => self.attempt_failed(executor, task, attempt, state, data),
        }
        let is_sampled = sampled(task);
        if self.timeline.may_track(is_sampled) {
            self.tracked_ended(now_us, task, attempt, state, is_sampled);
        }
    }

    /// `executor` reported `finished` attempts finished (a batch's worth).
    pub fn tasks_finished(&mut self, executor: ExecutorId, finished: u64) {
        if finished == 0 {
            return;
        }
        if let Some(track) = self.executors.get_mut(&executor) {
            track.view.tasks_finished += finished;
        }
    }

    #[cold]
    fn tracked_ended(
        &mut self,
        now: u64,
        task: TaskId,
        attempt: u32,
        state: TaskState,
        is_sampled: bool,
    ) {
        let Some(at) = self.timeline.ended(now, Attempt::new(task, attempt), state) else {
            return;
        };
        if !is_sampled {
            return; // a copy of a task whose timing is not sampled
        }
        let trip = now.saturating_sub(at);
        self.round_trip.observe(trip);
        self.trips.observe(trip);
        if state == TaskState::Finished {
            if let Some(track) = self.jobs.get_mut(task.job()) {
                track.durations.offer(trip, task.0);
            }
        }
    }

    /// Whether a point of the live charts is due (see [`series`]): the loop then calls
    /// [`LoopTelemetry::take_point`].
    #[inline]
    pub fn point_due(&self, now_us: u64) -> bool {
        self.series.due(now_us)
    }

    /// Takes a point of the live charts at `now_us` from the scheduler's counters and gauges.
    #[cold]
    pub fn take_point(&mut self, now_us: u64, stats: &Stats, pending: u64, running: u64) {
        let point = Point {
            t_us: now_us,
            launched: stats.launched,
            succeeded: stats.succeeded,
            attempts_failed: stats.attempts_failed,
            copies: stats.speculative_launched,
            kills_sent: self.kills_sent,
            running,
            pending,
            jobs_active: self.jobs.active() as u64,
            job_latency: None,
            round_trip: None,
        };
        self.series.take(point, &self.job_latency, &self.trips);
    }

    #[cold]
    fn attempt_failed(
        &mut self,
        executor: ExecutorId,
        task: TaskId,
        attempt: u32,
        state: TaskState,
        data: &[u8],
    ) {
        let executor_id = match self.executors.get_mut(&executor) {
            Some(track) => {
                track.view.tasks_failed += 1;
                track.view.executor_id.clone()
            }
            None => format!("#{}", executor.0),
        };
        let reason = cut(&String::from_utf8_lossy(data));
        let reason = if state == TaskState::Killed {
            format!("killed: {reason}")
        } else {
            reason
        };
        if let Some(track) = self.jobs.get_mut(task.job()) {
            track.attempts_failed += 1;
            tracing::info!(parent: &track.span, task = task.index(), attempt,
                %executor_id, reason = %reason, "task attempt failed");
            if track.failures.len() < JOB_FAILURES_MAX && !track.failures.contains(&reason) {
                track.failures.push(reason.clone());
            }
        }
        if self.failures.len() == RECENT_FAILURES_MAX {
            self.failures.pop_back();
        }
        self.failures.push_front(FailureView {
            unix_ms: unix_ms(),
            job: task.job().0,
            index: task.index(),
            attempt,
            executor_id,
            reason,
        });
    }

    /// The view, given what only the loop's owner knows: each executor's running tasks and
    /// what the scheduler says of a running job.
    pub fn view(
        &self,
        mut running: impl FnMut(ExecutorId) -> u32,
        scheduling: impl Fn(JobId) -> Option<JobInfo>,
        now_us: u64,
    ) -> DriverView {
        let mut executors: Vec<(ExecutorId, ExecutorView)> = self
            .executors
            .iter()
            .map(|(id, t)| {
                let mut view = t.view.clone();
                view.tasks_running = running(*id);
                (*id, view)
            })
            .collect();
        executors.sort_by_key(|(id, _)| id.0);
        let (mut jobs, jobs_not_shown) = self.active_jobs(now_us);
        for job in &mut jobs {
            job.scheduling = scheduling(JobId(job.id)).as_ref().map(JobScheduling::of);
        }
        let epoch_unix_ms = self.epoch_unix_ms;
        jobs.extend(
            (self.jobs.recent())
                .map(|(id, track, state, ended_us)| track.view(id, state, epoch_unix_ms, ended_us)),
        );
        DriverView {
            uptime: Duration::from_micros(now_us),
            kills_sent: self.kills_sent,
            active_jobs: self.jobs.active() as u64,
            jobs_submitted: self.jobs_submitted,
            jobs_over: self.jobs_over,
            refusals: vec![
                ("table_full", self.refusals[0]),
                ("handshake", self.refusals[1]),
                ("registration", self.refusals[2]),
            ],
            queue_time: self.queue_time.clone(),
            round_trip: self.round_trip.clone(),
            executors: executors
                .into_iter()
                .map(|(_, v)| v)
                .chain(self.removed.iter().cloned())
                .collect(),
            jobs,
            jobs_not_shown,
            failures: self.failures.iter().cloned().collect(),
            timeline: self.timeline.bars(),
            series: self.series.points(),
            ..DriverView::default()
        }
    }

    /// The newest [`ACTIVE_JOBS_SHOWN_MAX`] active jobs, newest first, and how many more run.
    fn active_jobs(&self, now_us: u64) -> (Vec<JobView>, u64) {
        let mut ids: Vec<JobId> = self.jobs.active_ids().collect();
        let shown = ids.len().min(ACTIVE_JOBS_SHOWN_MAX);
        if ids.len() > shown {
            ids.select_nth_unstable_by_key(shown, |id| std::cmp::Reverse(id.0));
            ids.truncate(shown);
        }
        ids.sort_unstable_by_key(|id| std::cmp::Reverse(id.0));
        let views = ids
            .iter()
            .filter_map(|id| {
                let track = self.jobs.get(*id)?;
                let mut view = track.view(*id, "RUNNING", self.epoch_unix_ms, now_us);
                view.tasks_done += self.done_pending(*id);
                Some(view)
            })
            .collect();
        (views, (self.jobs.active() - shown) as u64)
    }
}

#[cfg(test)]
mod tests;
