//! What a running process shows about itself: the driver's loop keeps a [`LoopTelemetry`]
//! (plain values only the loop touches, so recording costs no atomics and no locks) and answers
//! [`crate::driver::DriverObserver::view`] with a [`DriverView`] built from it and from the
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

pub mod http;
pub mod metrics;
pub mod token;
pub mod ui;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use flint_engine::hash::FxHashMap;
use flint_engine::scheduler::{ExecutorId, JobId, JobOutcome, Stats, TaskId};

use crate::handshake::Secret;
use crate::standalone::{BlockingClient, ClientError};
use crate::wire::{Message, Role, TaskState};

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
/// Bytes of a failure reason kept for the page.
const REASON_KEPT_BYTES: usize = 512;
/// Sampled attempts in flight at once (the oldest are forgotten beyond this).
const SAMPLES_IN_FLIGHT_MAX: usize = 1 << 16;

/// Process-wide network counters, bumped by every connection.
#[derive(Debug, Default)]
pub struct NetCounters {
    /// Frames decoded from peers.
    pub frames_in: AtomicU64,
    /// Bytes read from peers.
    pub bytes_in: AtomicU64,
    /// Bytes written to peers.
    pub bytes_out: AtomicU64,
    /// Write calls that sent bytes (each carries one or more frames).
    pub writes: AtomicU64,
}

/// This process's network counters.
pub static NET: NetCounters = NetCounters {
    frames_in: AtomicU64::new(0),
    bytes_in: AtomicU64::new(0),
    bytes_out: AtomicU64::new(0),
    writes: AtomicU64::new(0),
};

impl NetCounters {
    /// Counts read bytes.
    #[inline]
    pub fn read(&self, bytes: usize) {
        self.bytes_in.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts one decoded frame.
    #[inline]
    pub fn frame(&self) {
        self.frames_in.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one write.
    #[inline]
    pub fn wrote(&self, bytes: usize) {
        self.bytes_out.fetch_add(bytes as u64, Ordering::Relaxed);
        self.writes.fetch_add(1, Ordering::Relaxed);
    }
}

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

/// A job as the driver's page shows it.
#[derive(Debug, Clone)]
pub struct JobView {
    /// Its id.
    pub id: u64,
    /// The function its tasks run.
    pub function: std::sync::Arc<str>,
    /// Its tasks.
    pub tasks: u64,
    /// Tasks with a final result.
    pub tasks_done: u64,
    /// Task attempts that failed (retried or not).
    pub attempts_failed: u64,
    /// `RUNNING`, `SUCCEEDED`, `FAILED` or `CANCELLED`.
    pub state: &'static str,
    /// When it was submitted (Unix milliseconds).
    pub submitted_unix_ms: u64,
    /// How long it ran (to now while it runs).
    pub duration: Duration,
    /// The first failure reasons (of attempts, or the job's own when it failed).
    pub failures: Vec<String>,
}

/// An executor as the driver's page shows it.
#[derive(Debug, Clone)]
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
}

/// A task attempt's failure.
#[derive(Debug, Clone)]
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

/// Everything the driver shows: [`crate::driver::DriverObserver::view`].
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
}

/// Whether a task's timing is sampled: one in [`SAMPLE_EVERY`] by job id plus index, so jobs
/// of one task are sampled one in 16 too.
#[inline]
fn sampled(task: TaskId) -> bool {
    (task.job().0.wrapping_add(u64::from(task.index()))) % u64::from(SAMPLE_EVERY) == 0
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
    tasks: u64,
    tasks_done: u64,
    attempts_failed: u64,
    submitted_us: u64,
    failures: Vec<String>,
}

struct ExecutorTrack {
    view: ExecutorView,
}

/// How a job ended, as [`LoopTelemetry::job_over`] takes it: taken from the outcome before it
/// goes to the job's handle (reasons copied only for a failure), so the handle is told first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Every task succeeded.
    Succeeded,
    /// It failed; the first reasons.
    Failed(Vec<String>),
    /// It was cancelled.
    Cancelled,
}

impl Ended {
    /// How `outcome` ended.
    pub fn of(outcome: &JobOutcome) -> Ended {
        match outcome {
            JobOutcome::Succeeded(_) => Ended::Succeeded,
            JobOutcome::Failed(reasons) => {
                Ended::Failed(reasons.iter().take(JOB_FAILURES_MAX).cloned().collect())
            }
            JobOutcome::Cancelled => Ended::Cancelled,
        }
    }
}

/// Why the driver refused a peer.
#[derive(Debug, Clone, Copy)]
pub enum Refusal {
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
    jobs: FxHashMap<JobId, JobTrack>,
    recent_jobs: VecDeque<JobView>,
    executors: FxHashMap<ExecutorId, ExecutorTrack>,
    removed: VecDeque<ExecutorView>,
    failures: VecDeque<FailureView>,
    /// Launch time of sampled attempts in flight, by (task, attempt).
    launched: FxHashMap<(u64, u32), u64>,
    queue_time: Histogram,
    round_trip: Histogram,
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
            jobs: FxHashMap::default(),
            recent_jobs: VecDeque::new(),
            executors: FxHashMap::default(),
            removed: VecDeque::new(),
            failures: VecDeque::new(),
            launched: FxHashMap::default(),
            queue_time: Histogram::default(),
            round_trip: Histogram::default(),
            kills_sent: 0,
            jobs_submitted: 0,
            jobs_over: [0; 3],
            refusals: [0; 3],
        }
    }

    /// A job went into the scheduler: its span opens.
    pub fn job_submitted(
        &mut self,
        now_us: u64,
        job: JobId,
        function: &std::sync::Arc<str>,
        tasks: usize,
    ) {
        let span = tracing::info_span!("job", job = job.0, function = &**function, tasks);
        tracing::info!(parent: &span, "job submitted");
        self.jobs_submitted += 1;
        self.jobs.insert(
            job,
            JobTrack {
                span,
                function: function.clone(),
                tasks: tasks as u64,
                tasks_done: 0,
                attempts_failed: 0,
                submitted_us: now_us,
                failures: Vec::new(),
            },
        );
    }

    /// A task of `job` reached its final result.
    #[inline]
    pub fn task_done(&mut self, job: JobId) {
        if let Some(track) = self.jobs.get_mut(&job) {
            track.tasks_done += 1;
        }
    }

    /// A job ended: logged in its span, moved to the recent jobs.
    pub fn job_over(&mut self, now_us: u64, job: JobId, outcome: Ended) {
        let Some(track) = self.jobs.remove(&job) else {
            return;
        };
        let duration = Duration::from_micros(now_us.saturating_sub(track.submitted_us));
        let (state, slot) = match outcome {
            Ended::Succeeded => ("SUCCEEDED", 0),
            Ended::Failed(_) => ("FAILED", 1),
            Ended::Cancelled => ("CANCELLED", 2),
        };
        self.jobs_over[slot] += 1;
        let mut failures = Vec::new();
        if let Ended::Failed(reasons) = &outcome {
            failures.clone_from(&track.failures);
            let first = reasons.first().map_or("", String::as_str);
            tracing::warn!(parent: &track.span, duration_ms = duration.as_millis() as u64,
                failed_attempts = track.attempts_failed, reason = first, "job failed");
            for reason in reasons.iter().take(JOB_FAILURES_MAX) {
                let reason = cut(reason);
                if !failures.contains(&reason) {
                    failures.push(reason);
                }
            }
            failures.truncate(JOB_FAILURES_MAX * 2);
        } else {
            tracing::info!(parent: &track.span, duration_ms = duration.as_millis() as u64,
                failed_attempts = track.attempts_failed, outcome = state, "job done");
        }
        if self.recent_jobs.len() == RECENT_JOBS_MAX {
            self.recent_jobs.pop_back();
        }
        self.recent_jobs.push_front(JobView {
            id: job.0,
            function: track.function,
            tasks: track.tasks,
            tasks_done: track.tasks_done,
            attempts_failed: track.attempts_failed,
            state,
            submitted_unix_ms: self.epoch_unix_ms + track.submitted_us / 1000,
            duration,
            failures: if failures.is_empty() {
                track.failures
            } else {
                failures
            },
        });
    }

    /// An attempt is being launched (sampled ones have their time noted).
    #[inline]
    pub fn launched(&mut self, now_us: u64, task: TaskId, attempt: u32) {
        if !sampled(task) {
            return;
        }
        self.sample_launch(now_us, task, attempt);
    }

    #[cold]
    fn sample_launch(&mut self, now: u64, task: TaskId, attempt: u32) {
        if let Some(track) = self.jobs.get(&task.job()) {
            if attempt == 0 {
                self.queue_time
                    .observe(now.saturating_sub(track.submitted_us));
            }
        }
        if self.launched.len() >= SAMPLES_IN_FLIGHT_MAX {
            self.launched.clear();
        }
        self.launched.insert((task.0, attempt), now);
    }

    /// The driver asked an executor to kill an attempt.
    pub fn kill_sent(&mut self) {
        self.kills_sent += 1;
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
                },
            },
        );
    }

    /// An executor was removed (the driver logs it).
    pub fn executor_removed(&mut self, id: ExecutorId, reason: &str, lost: bool) {
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
    pub fn refused(&mut self, why: Refusal) {
        self.refusals[why as usize] += 1;
    }

    /// A status update from `executor` (before the scheduler sees it): counts, samples,
    /// and a failure's reason logged in its job's span.
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
            TaskState::Finished => {
                if let Some(track) = self.executors.get_mut(&executor) {
                    track.view.tasks_finished += 1;
                }
            }
            TaskState::Running => return,
            _ => self.attempt_failed(executor, task, attempt, state, data),
        }
        if sampled(task) {
            if let Some(at) = self.launched.remove(&(task.0, attempt)) {
                self.round_trip.observe(now_us.saturating_sub(at));
            }
        }
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
        if let Some(track) = self.jobs.get_mut(&task.job()) {
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

    /// The view, given what only the loop's owner knows: each executor's running tasks.
    pub fn view(&self, mut running: impl FnMut(ExecutorId) -> u32, now_us: u64) -> DriverView {
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
        let mut jobs: Vec<JobView> = self
            .jobs
            .iter()
            .map(|(id, t)| JobView {
                id: id.0,
                function: t.function.clone(),
                tasks: t.tasks,
                tasks_done: t.tasks_done,
                attempts_failed: t.attempts_failed,
                state: "RUNNING",
                submitted_unix_ms: self.epoch_unix_ms + t.submitted_us / 1000,
                duration: Duration::from_micros(now_us.saturating_sub(t.submitted_us)),
                failures: t.failures.clone(),
            })
            .collect();
        jobs.sort_by_key(|j| std::cmp::Reverse(j.id));
        jobs.extend(self.recent_jobs.iter().cloned());
        DriverView {
            uptime: Duration::from_micros(now_us),
            kills_sent: self.kills_sent,
            active_jobs: self.jobs.len() as u64,
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
            failures: self.failures.iter().cloned().collect(),
            ..DriverView::default()
        }
    }
}

/// A worker as the master reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerRow {
    /// Its id.
    pub id: String,
    /// `host:port`.
    pub address: String,
    /// `ALIVE`, `DEAD`, `UNKNOWN`.
    pub state: String,
    /// Cores it offers.
    pub cores: u32,
    /// Cores in use.
    pub cores_used: u32,
    /// Memory it offers (MiB).
    pub memory_mb: u64,
    /// Memory in use (MiB).
    pub memory_used_mb: u64,
}

/// An application as the master reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppRow {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// `WAITING`, `RUNNING`, `FINISHED`, `FAILED`, `KILLED`.
    pub state: String,
    /// Cores its executors hold.
    pub cores_granted: u32,
    /// Executors it asked for.
    pub executors_requested: u32,
    /// Why it waits (empty: it does not).
    pub waiting: String,
}

/// An executor as the master (or a worker) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterExecutorRow {
    /// Its application.
    pub app: String,
    /// Its id.
    pub id: String,
    /// Its worker.
    pub worker: String,
    /// Its cores.
    pub cores: u32,
    /// Its state (`LAUNCHING`, `RUNNING`, ...).
    pub state: String,
}

/// What a master (or a worker, about itself) answers to a status request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    /// Workers, alive first.
    pub workers: Vec<WorkerRow>,
    /// Applications.
    pub apps: Vec<AppRow>,
    /// Executors.
    pub executors: Vec<ClusterExecutorRow>,
}

/// Asks the master or worker at `addr` for its status, as `flint status` does (a loopback
/// address stands in for an unspecified one).
pub fn cluster_view(
    addr: SocketAddr,
    secret: Option<Secret>,
    timeout: Duration,
) -> Result<ClusterView, ClientError> {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let mut client = BlockingClient::connect(addr, Role::Client, secret, timeout)?;
    client.send(&Message::StatusRequest {})?;
    let frame = client.next_frame()?;
    let message = frame.message().map_err(ClientError::Malformed)?;
    let Message::StatusResponse {
        workers,
        applications,
        executors,
    } = message
    else {
        return Err(ClientError::Unexpected(message.kind().name()));
    };
    Ok(ClusterView {
        workers: workers
            .iter()
            .map(|w| WorkerRow {
                id: w.worker_id.to_owned(),
                address: format!("{}:{}", w.host, w.port),
                state: w.state.to_string().to_uppercase(),
                cores: w.cores,
                cores_used: w.cores_used,
                memory_mb: w.memory_mb,
                memory_used_mb: w.memory_used_mb,
            })
            .collect(),
        apps: applications
            .iter()
            .map(|a| AppRow {
                id: a.app_id.to_owned(),
                name: a.name.to_owned(),
                state: a.state.to_string().to_uppercase(),
                cores_granted: a.cores_granted,
                executors_requested: a.executors_requested,
                waiting: a.waiting.to_owned(),
            })
            .collect(),
        executors: executors
            .iter()
            .map(|e| ClusterExecutorRow {
                app: e.app_id.to_owned(),
                id: e.executor_id.to_owned(),
                worker: e.worker_id.to_owned(),
                cores: e.cores,
                state: e.state.to_string().to_uppercase(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_end_at_inf() {
        let mut h = Histogram::default();
        h.observe(5);
        h.observe(10);
        h.observe(11);
        h.observe(u64::MAX / 4);
        let c = h.buckets_seconds();
        assert_eq!(c[0], (10e-6, 2));
        assert_eq!(c[1], (25e-6, 1));
        assert_eq!(*c.last().unwrap(), (f64::MAX, 1));
        assert_eq!(h.count, 4);
    }

    #[test]
    fn failures_are_counted_per_job_and_executor() {
        let mut t = LoopTelemetry::new(Instant::now());
        let job = JobId(7);
        t.job_submitted(0, job, &std::sync::Arc::from("hash"), 2);
        t.executor_registered(ExecutorId(1), "e1", "h", 2);
        let task = TaskId::new(job, 9); // sampled: 7 + 9 = 16
        t.launched(50, task, 0);
        t.status_update(100, ExecutorId(1), task, 0, TaskState::Failed, b"boom");
        t.status_update(
            200,
            ExecutorId(1),
            TaskId::new(job, 1),
            0,
            TaskState::Finished,
            b"",
        );
        let view = t.view(|_| 1, 300);
        assert_eq!(view.executors[0].tasks_failed, 1);
        assert_eq!(view.executors[0].tasks_finished, 1);
        assert_eq!(view.executors[0].tasks_running, 1);
        assert_eq!(view.jobs[0].attempts_failed, 1);
        assert_eq!(view.jobs[0].failures, vec!["boom".to_owned()]);
        assert_eq!(view.failures[0].reason, "boom");
        assert_eq!(view.round_trip.count, 1);
        let outcome = JobOutcome::Failed(vec!["task 0 failed 4 times".into()]);
        t.job_over(400, job, Ended::of(&outcome));
        let view = t.view(|_| 0, 500);
        assert_eq!(view.jobs[0].state, "FAILED");
        assert_eq!(view.jobs_over, [0, 1, 0]);
        assert_eq!(view.active_jobs, 0);
    }
}
