//! The load generators: a closed loop (a fixed number of tasks in flight) and an open loop (a
//! fixed arrival rate), both driving a [`Driver`] through its public job API.
//!
//! # What the API allows, and so what is measured
//!
//! The driver takes whole jobs (`Driver::submit` is a blocking ask to the driver's loop) and
//! reports each task's result to the job's observer on the driver's loop. The generators
//! therefore submit many small jobs from one submitter thread (the caller's):
//!
//! * closed loop: `--in-flight N` tasks are kept outstanding; as results arrive (the observer
//!   counts them and unparks the submitter) new jobs of `batch` tasks (default 1) are submitted.
//!   A task's latency runs from just before its job's `submit` call to its result on the
//!   driver's loop, so it includes the submit ask, scheduling, the network both ways and the
//!   executor.
//! * open loop: task `i` is due at `i / rate`; whenever the submitter wakes it submits every
//!   task already due as one job, and a task's latency runs from its *intended* send time, so a
//!   submitter that falls behind (a slow `submit`, a descheduled thread) is charged to latency
//!   rather than silently lowering the rate (coordinated omission is corrected).
//!
//! A warm-up runs the same load first; tasks sent before it ends are neither counted nor
//! recorded. A job whose outcome is not success has its tasks without a result counted as
//! failed, so `succeeded + failed == tasks` always holds at the end.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write as _};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_cli::latency::LatencyCounts;
use flint_cli::summary::{indexed_payload, latency_us_of, Recorder, Summary};
use flint_engine::clock;
use flint_net::driver::Driver;
use flint_net::job::{Job, JobHandle, JobOutcome, Payloads as JobPayloads, SharedResultObserver};
use hdrhistogram::Histogram;

/// Width of a throughput-over-time bucket.
pub const BUCKET: Duration = Duration::from_millis(100);
/// Length of one interval histogram in the HDR log.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// [`BUCKET`] in nanoseconds.
const BUCKET_NS: u64 = BUCKET.as_nanos() as u64;
// An interval is whole buckets, so a result in the current bucket is in the current interval.
const _: () = assert!(INTERVAL.as_nanos() % BUCKET.as_nanos() == 0);
/// Most tasks one open-loop job carries.
const OPEN_BATCH_MAX: u64 = 4096;
/// A run with results outstanding and none arriving for this long is stuck.
const STALL: Duration = Duration::from_secs(60);

/// How load is offered.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// Keep `in_flight` tasks outstanding, submitting jobs of `batch` tasks.
    Closed {
        /// Tasks outstanding.
        in_flight: u64,
        /// Tasks per submitted job.
        batch: u32,
    },
    /// Send tasks at a fixed rate.
    Open {
        /// Tasks per second.
        rate_per_s: f64,
    },
}

impl Mode {
    /// The name in the JSON and the report.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Closed { .. } => "closed",
            Mode::Open { .. } => "open",
        }
    }
}

/// When a run stops sending.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// After this many measured tasks.
    Tasks(u64),
    /// After this long of measurement.
    Duration(Duration),
}

/// One load run.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    /// Closed or open loop.
    pub mode: Mode,
    /// The function each task runs (`noop`, `spin:US`, `sleep:MS`, `echo`, `hash`, ...).
    pub task: std::sync::Arc<str>,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// When to stop sending.
    pub limit: Limit,
    /// Load before measurement starts.
    pub warmup: Duration,
    /// Outstanding tasks at which an open loop gives up (the system is past saturation).
    pub outstanding_max: u64,
    /// Outstanding jobs the submitter keeps at most (below the driver's job limit); an open
    /// loop that reaches it waits and sends the tasks that fell due as one bigger job.
    pub jobs_max: usize,
    /// Draw a progress bar on stderr (only if it is a terminal).
    pub progress: bool,
    /// Submitter threads; the in-flight window, the rate, the task count and `jobs_max` are
    /// split evenly between them.
    pub submitters: usize,
    /// A job of this many `noop` tasks, one function over empty payloads at a priority below
    /// the load's, submitted as warm-up ends and run beside it: what a service's requests see
    /// while a big batch job starts, runs and ends on the same driver.
    pub beside_tasks: Option<u64>,
    /// Keep a latency histogram per [`INTERVAL`] ([`RunResult::intervals`], for a report's
    /// HDR log); without them the run's latencies are counted once, for the whole run.
    pub intervals: bool,
}

/// One interval histogram of the HDR log.
#[derive(Debug, Clone)]
pub struct Interval {
    /// Its start, from the start of measurement.
    pub start: Duration,
    /// Its length.
    pub length: Duration,
    /// Latencies (us) of the results that arrived in it.
    pub histogram: Histogram<u64>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    /// The summary (same fields as `flint driver`).
    pub summary: Summary,
    /// Every measured latency (us).
    pub histogram: Histogram<u64>,
    /// Per-second histograms for the HDR interval log (empty unless
    /// [`LoadSpec::intervals`]).
    pub intervals: Vec<Interval>,
    /// Results per [`BUCKET`] from the start of measurement.
    pub timeline: Vec<u64>,
    /// The open loop's rate, if any.
    pub offered_per_s: Option<f64>,
    /// True if an open loop stopped early because `outstanding_max` tasks were outstanding.
    pub saturated: bool,
    /// The job beside the load ([`LoadSpec::beside_tasks`]): from its submission to its
    /// outcome, or `None` if it had not ended when the load did (it is cancelled then).
    pub beside: Option<Option<Duration>>,
}

/// What the observer (on the driver's loop) and the submitter share.
struct Shared {
    /// One for the whole run, shared by every submitter's lane.
    meter: Arc<Mutex<Meter>>,
    /// Results (and tasks counted failed) so far, warm-up included. Written only with the
    /// meter locked ([`Shared::add_completed`]), so a load and a store count it exactly; read
    /// without the lock.
    completed: AtomicU64,
    /// The observer wakes the submitter once `completed` reaches this (so a closed loop that
    /// waits for a whole batch of free slots is woken once, not once per result).
    wake_at: AtomicU64,
    submitter: Thread,
    wake_submitter: bool,
}

/// Every measured result: its outcome in `recorder` as it arrives, its latency in the current
/// interval's counts only (one histogram record a result), which are added to `recorder`'s
/// when the interval closes. Without interval histograms to keep, the run is one interval,
/// closed at its end: no histogram is built and no counts are walked while it runs.
struct Meter {
    measure_from_ns: u64,
    /// Whether each [`INTERVAL`] closes with a histogram of its own ([`LoadSpec::intervals`]).
    keep_intervals: bool,
    /// Outcomes, checksum, and the latencies of the closed intervals.
    recorder: Recorder,
    /// Results per [`BUCKET`] from `measure_from_ns`, up to the current (last) bucket.
    timeline: Vec<u64>,
    /// Where the timeline's last bucket starts (ns from the epoch).
    bucket_start_ns: u64,
    /// Latencies (us) of the results in the current interval, not yet in `recorder`.
    interval: LatencyCounts,
    interval_start_ns: u64,
    intervals: Vec<Interval>,
    last_result_ns: u64,
}

impl Meter {
    /// A meter counting the results of tasks sent from `measure_from_ns` on, keeping interval
    /// histograms if `keep_intervals`.
    fn new(measure_from_ns: u64, keep_intervals: bool) -> Meter {
        Meter {
            measure_from_ns,
            keep_intervals,
            recorder: Recorder::new(),
            timeline: Vec::new(),
            bucket_start_ns: measure_from_ns,
            interval: LatencyCounts::new(),
            interval_start_ns: measure_from_ns,
            intervals: Vec::new(),
            last_result_ns: measure_from_ns,
        }
    }

    /// One result of a task sent at `sent_ns`, arrived at `now_ns` (inlined into the observer:
    /// it runs once a result).
    #[inline]
    fn record(&mut self, sent_ns: u64, now_ns: u64, result: Result<&[u8], &str>) {
        if sent_ns < self.measure_from_ns {
            return;
        }
        self.recorder.record_outcome(result);
        match self.timeline.last_mut() {
            // In the current bucket, so in the current interval: one comparison.
            Some(count) if now_ns.wrapping_sub(self.bucket_start_ns) < BUCKET_NS => *count += 1,
            _ => self.count_elsewhere(now_ns),
        }
        (self.interval).record_us(latency_us_of(now_ns.saturating_sub(sent_ns)));
        self.last_result_ns = self.last_result_ns.max(now_ns);
    }

    /// Counts a result at `now_ns` outside the current bucket: in a later one (which becomes
    /// the current bucket, the intervals that ended before it closed) or, read a little
    /// before a result counted already, in an earlier one.
    #[cold]
    fn count_elsewhere(&mut self, now_ns: u64) {
        let since_ns = now_ns.saturating_sub(self.measure_from_ns);
        let bucket = (since_ns / BUCKET_NS) as usize;
        if self.timeline.len() <= bucket {
            self.timeline.resize(bucket + 1, 0);
            self.bucket_start_ns = self.measure_from_ns + bucket as u64 * BUCKET_NS;
        }
        self.timeline[bucket] += 1;
        self.rotate(now_ns);
    }

    /// Closes interval histograms that ended before `now_ns` (none without them: the run is
    /// one interval).
    fn rotate(&mut self, now_ns: u64) {
        if !self.keep_intervals {
            return;
        }
        let length_ns = INTERVAL.as_nanos() as u64;
        while now_ns >= self.interval_start_ns + length_ns {
            self.close_interval(length_ns);
            self.interval_start_ns += length_ns;
        }
    }

    /// Closes the last interval, cut at the last result; that result's time.
    fn finish(&mut self) -> u64 {
        let end_ns = self.last_result_ns;
        self.rotate(end_ns);
        let tail_ns = end_ns.saturating_sub(self.interval_start_ns).max(1);
        self.close_interval(tail_ns);
        end_ns
    }

    /// Closes the current interval (of `length_ns`), adding its latencies to the recorder's;
    /// an empty one, or one not kept, leaves no histogram.
    fn close_interval(&mut self, length_ns: u64) {
        if self.interval.is_empty() {
            return;
        }
        self.recorder.add_latencies(&self.interval);
        if self.keep_intervals {
            self.intervals.push(Interval {
                start: Duration::from_nanos(self.interval_start_ns - self.measure_from_ns),
                length: Duration::from_nanos(length_ns),
                histogram: self.interval.to_histogram(),
            });
        }
        self.interval.clear();
    }
}

impl Shared {
    fn meter(&self) -> MutexGuard<'_, Meter> {
        self.meter.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `tasks` more completed; the count now. `_locked` is the meter, locked: every
    /// writer holds its lock (one for all lanes), so no read-modify-write is needed.
    #[inline]
    fn add_completed(&self, _locked: &mut Meter, tasks: u64) -> u64 {
        let done = self.completed.load(Ordering::Relaxed) + tasks;
        self.completed.store(done, Ordering::Release);
        done
    }

    /// Nanoseconds since `epoch` (a [`clock::now_ns`] reading): read once per task result, so
    /// the cheap clock, not `Instant` (see `flint_engine::clock`).
    fn now_ns(&self, epoch: u64) -> u64 {
        clock::elapsed_ns(epoch)
    }
}

/// A submitted job not yet seen to end (its tasks: `handle.tasks()`).
struct Pending {
    handle: JobHandle,
    /// When its first task was (meant to be) sent, in ns from the run's epoch: the earliest
    /// (the observer knows each task's).
    first_sent_ns: u64,
}

/// The payloads of a job: the same bytes shared by every task, except for `hash`, whose
/// checksum needs task `i`'s payload to be `indexed_payload(i, len)`.
struct Payloads {
    shared: Bytes,
    indexed: bool,
    len: usize,
    next_index: u64,
    /// The last list of shared payloads handed out, for the next job of as many tasks.
    list: Option<Arc<[Bytes]>>,
}

impl Payloads {
    fn new(task: &str, len: usize) -> Self {
        Payloads {
            shared: Bytes::from(vec![0xA5; len]),
            indexed: task == "hash" || task.starts_with("hash:"),
            len,
            next_index: 0,
            list: None,
        }
    }

    /// The payloads of a job of `count` tasks: without an index in them, one list shared by
    /// every job of that size (as a service submits the same inputs with every request), and a
    /// one-task job's single payload; no vector per job either way.
    #[inline]
    fn take(&mut self, count: u64) -> JobPayloads {
        if count == 1 && !self.indexed {
            return JobPayloads::from(self.shared.clone());
        }
        self.take_many(count)
    }

    /// [`Payloads::take`] but for a one-task job's shared payload (out of its way).
    #[inline(never)]
    fn take_many(&mut self, count: u64) -> JobPayloads {
        if self.indexed {
            return (0..count).map(|_| self.next_indexed()).collect();
        }
        match &self.list {
            Some(list) if list.len() as u64 == count => JobPayloads::from(list.clone()),
            _ => {
                let list: Arc<[Bytes]> = (0..count).map(|_| self.shared.clone()).collect();
                self.list = Some(list.clone());
                JobPayloads::from(list)
            }
        }
    }

    fn next_indexed(&mut self) -> Bytes {
        let index = self.next_index;
        self.next_index += 1;
        Bytes::from(indexed_payload(index, self.len))
    }
}

/// Progress on stderr, redrawn at most five times a second.
struct Progress {
    enabled: bool,
    last: Instant,
    drawn: bool,
}

impl Progress {
    fn new(enabled: bool) -> Self {
        Progress {
            enabled: enabled && std::io::stderr().is_terminal(),
            last: Instant::now(),
            drawn: false,
        }
    }

    /// True when a redraw is due (so callers skip gathering the figures otherwise).
    #[inline]
    fn due(&self) -> bool {
        self.enabled && self.last.elapsed() >= Duration::from_millis(200)
    }

    fn tick(&mut self, fraction: f64, text: impl FnOnce() -> String) {
        if !self.due() {
            return;
        }
        self.last = Instant::now();
        const WIDTH: usize = 30;
        let filled = ((fraction.clamp(0.0, 1.0)) * WIDTH as f64) as usize;
        let bar: String = (0..WIDTH)
            .map(|i| if i < filled { '#' } else { '-' })
            .collect();
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r[{bar}] {}\x1b[K", text());
        let _ = err.flush();
        self.drawn = true;
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// The submitter's side of a run.
struct Runner<'a> {
    driver: &'a Driver,
    spec: &'a LoadSpec,
    shared: Arc<Shared>,
    epoch: u64,
    /// The result observer of the jobs sent at one time (see [`shared_observer`]).
    observer: SharedResultObserver,
    measure_from_ns: u64,
    pending: VecDeque<Pending>,
    payloads: Payloads,
    /// Tasks submitted, warm-up included.
    submitted: u64,
    /// Measured tasks submitted.
    measured: u64,
    progress: Progress,
    /// This submitter's index and the number of submitters.
    lane: u64,
    lanes: u64,
    /// This lane's share of the run.
    jobs_max: usize,
    limit: Limit,
}

/// One task's result, sent at `sent_ns`: its latency recorded, the submitter woken when the
/// results it waits for are in. Inlined into the observers, which call it once a result.
#[inline(always)]
fn record_result(shared: &Shared, epoch: u64, sent_ns: u64, result: Result<&Bytes, &str>) {
    let now_ns = shared.now_ns(epoch);
    let done = {
        let mut meter = shared.meter();
        meter.record(sent_ns, now_ns, result.map(|b| &b[..]));
        shared.add_completed(&mut meter, 1)
    };
    // `wake_at` only grows: a value read before the submitter's latest store is lower, and
    // wakes it all the same.
    if shared.wake_submitter && done >= shared.wake_at.load(Ordering::Acquire) {
        shared.submitter.unpark();
    }
}

/// The result observer of every job whose tasks were sent at one time, its tag.
fn shared_observer(shared: Arc<Shared>, epoch: u64) -> SharedResultObserver {
    Arc::new(move |sent_ns, _, result| record_result(&shared, epoch, sent_ns, result))
}

impl Runner<'_> {
    fn now_ns(&self) -> u64 {
        self.shared.now_ns(self.epoch)
    }

    /// Submits one job of `count` tasks all sent at `sent_ns`, tagged with that time for the
    /// shared observer (nothing boxed per job). Inlined into the closed loop, which calls it
    /// once a job.
    #[inline(always)]
    fn submit_at(&mut self, count: u64, sent_ns: u64) -> Result<(), String> {
        let job = Job::with_payloads(self.spec.task.clone(), self.payloads.take(count))
            .keep_results(false)
            .on_result_shared(&self.observer, sent_ns);
        let measured = if sent_ns >= self.measure_from_ns {
            count
        } else {
            0
        };
        self.send(job, count, measured, sent_ns)
    }

    /// Submits one job of a task for each of `times` (when each was due), with an observer of
    /// its own that knows them.
    fn submit_per_task(&mut self, times: Arc<[u64]>) -> Result<(), String> {
        let count = times.len() as u64;
        let measured = (times.iter())
            .filter(|&&ns| ns >= self.measure_from_ns)
            .count() as u64;
        let first_sent_ns = times.first().copied().unwrap_or(0);
        let (shared, epoch) = (self.shared.clone(), self.epoch);
        let job = Job::with_payloads(self.spec.task.clone(), self.payloads.take(count))
            .keep_results(false)
            .on_result(move |index, result| {
                let sent_ns = times.get(index as usize).copied().unwrap_or(0);
                record_result(&shared, epoch, sent_ns, result);
            });
        self.send(job, count, measured, first_sent_ns)
    }

    /// Hands `job` (`count` tasks, `measured` of them measured, the first sent at
    /// `first_sent_ns`) to the driver and keeps its handle. Inlined into both callers: the
    /// job moves to the driver without a copy into an argument.
    #[inline(always)]
    fn send(
        &mut self,
        job: Job,
        count: u64,
        measured: u64,
        first_sent_ns: u64,
    ) -> Result<(), String> {
        // A match, not `map_err` and `?`: the handle goes from the result into its `Pending`
        // without first being copied out of the result whole.
        match self.driver.submit(job) {
            Ok(handle) => self.pending.push_back(Pending {
                handle,
                first_sent_ns,
            }),
            Err(e) => return Err(format!("submit failed: {e}")),
        }
        self.submitted += count;
        self.measured += measured;
        Ok(())
    }

    /// Drops the finished jobs at the front (jobs end about in order). Inlined into the
    /// loops, which call it once a step (the closed loop once a wait for room).
    #[inline(always)]
    fn reap_front(&mut self) {
        while self.pending.front().is_some_and(|p| p.handle.is_finished()) {
            // `pop_front` moves nothing else.
            if let Some(done) = self.pending.pop_front() {
                self.reaped(done);
            }
        }
    }

    /// Drops every finished job.
    fn reap_all(&mut self) {
        let mut index = 0;
        while let Some(pending) = self.pending.get(index) {
            if !pending.handle.is_finished() {
                index += 1;
                continue;
            }
            if let Some(done) = self.pending.remove(index) {
                self.reaped(done);
            }
        }
    }

    /// A finished job, dropped: the rule is that every result was seen.
    #[inline]
    fn reaped(&mut self, done: Pending) {
        // The driver handed each result the handle counts to the observer (`submit`'s)
        // before it set the outcome.
        if done.handle.tasks_done() < done.handle.tasks() {
            self.settle(done);
        } else {
            // It has ended: nothing to cancel, so its drop need not ask again.
            done.handle.detach();
        }
    }

    /// A finished job with results missing: if it did not succeed, its tasks that never
    /// reported count as failed.
    #[cold]
    fn settle(&mut self, done: Pending) {
        let tasks = done.handle.tasks();
        let observed = done.handle.tasks_done().min(tasks);
        let outcome = done.handle.wait_timeout(Duration::ZERO);
        if matches!(outcome, Ok(JobOutcome::Succeeded(_))) {
            return;
        }
        let now_ns = self.now_ns();
        let mut meter = self.shared.meter();
        // Which tasks reported is not known here; charge the missing ones at the earliest
        // send time (exact for one-task and same-time jobs).
        let sent_ns = done.first_sent_ns;
        for _ in observed..tasks {
            meter.record(sent_ns, now_ns, Err("job ended without this task's result"));
        }
        self.shared.add_completed(&mut meter, tasks - observed);
    }

    fn outstanding(&self) -> u64 {
        self.submitted
            .saturating_sub(self.shared.completed.load(Ordering::Acquire))
    }

    /// True once the limit is reached; `sent_ns` is when the next task would be sent.
    fn measuring_done(&self, sent_ns: u64) -> bool {
        match self.limit {
            Limit::Tasks(tasks) => self.measured >= tasks,
            Limit::Duration(duration) => {
                sent_ns >= self.measure_from_ns + duration.as_nanos() as u64
            }
        }
    }

    /// Redraws the progress bar if it is due (reading the clock only then).
    #[inline]
    fn draw(&mut self) {
        if self.progress.due() {
            self.redraw();
        }
    }

    /// Draws the progress bar now (out of the loops' way: it formats text).
    #[inline(never)]
    fn redraw(&mut self) {
        let now_ns = self.now_ns();
        let since_s = now_ns.saturating_sub(self.measure_from_ns) as f64 / 1e9;
        let (fraction, label) = if now_ns < self.measure_from_ns {
            (0.0, "warm-up".to_string())
        } else {
            match self.limit {
                Limit::Tasks(tasks) => (self.measured as f64 / tasks.max(1) as f64, String::new()),
                Limit::Duration(d) => (since_s / d.as_secs_f64().max(1e-9), String::new()),
            }
        };
        let done = self.shared.meter().recorder.tasks();
        let outstanding = self.outstanding();
        self.progress.tick(fraction, || {
            format!(
                "{done} tasks, {:.0} tasks/s, {outstanding} in flight, {since_s:.1} s {label}",
                done as f64 / since_s.max(1e-9)
            )
        });
    }

    /// Keeps `in_flight` tasks outstanding in jobs of `batch`, reading the clock once a job:
    /// when there is room for it, as its send time.
    fn closed(&mut self, in_flight: u64, batch: u32) -> Result<(), String> {
        let window = in_flight.max(1);
        let batch = u64::from(batch.max(1)).min(window);
        // The measured tasks a run sends at most (a timed run: no count).
        let tasks_max = match self.limit {
            Limit::Tasks(tasks) => tasks,
            Limit::Duration(_) => u64::MAX,
        };
        // Finished jobs are dropped where the loop waits for room anyway (`wait_for_room`),
        // not at every job it sends; a loop that never waits drops them once it holds twice
        // the window's jobs.
        let held_max = window.saturating_mul(2);
        loop {
            if self.pending.len() as u64 >= held_max {
                self.reap_front();
            }
            let outstanding = self.outstanding();
            if self.measured + batch > tasks_max {
                // The end of a counted run (or a warm-up of a run shorter than a batch): the
                // next job may be smaller, by the time.
                if self.closed_last(outstanding, batch, window)? {
                    return Ok(());
                }
                continue;
            }
            // The next job is a whole batch: no room for it, wait, with no need of the time
            // (past a timed run's end, the check after the wait returns, sending nothing).
            if outstanding + batch > window {
                self.wait_for_room(batch, window);
                continue;
            }
            let now_ns = self.now_ns();
            if self.measuring_done(now_ns) {
                return Ok(());
            }
            self.submit_at(batch, now_ns)?;
        }
    }

    /// One step of a counted closed loop whose next job may carry fewer than `batch` tasks:
    /// what is left of the run once the warm-up is over. Submits it if there is room, else
    /// waits for room; true once the run has sent all it measures.
    fn closed_last(&mut self, outstanding: u64, batch: u64, window: u64) -> Result<bool, String> {
        let now_ns = self.now_ns();
        if self.measuring_done(now_ns) {
            return Ok(true);
        }
        let mut count = batch;
        if let Limit::Tasks(tasks) = self.limit {
            if now_ns >= self.measure_from_ns {
                count = count.min(tasks - self.measured);
            }
        }
        if outstanding + count <= window {
            self.submit_at(count, now_ns)?;
        } else {
            self.wait_for_room(count, window);
        }
        Ok(false)
    }

    /// Sleeps until `count` of the `window`'s slots are free (completed >= submitted + count
    /// - window), or 5 ms, after dropping the jobs that finished (see [`Runner::closed`]).
    fn wait_for_room(&mut self, count: u64, window: u64) {
        self.reap_front();
        let wake_at = (self.submitted + count).saturating_sub(window);
        self.shared.wake_at.store(wake_at, Ordering::Release);
        if self.outstanding() + count > window {
            std::thread::park_timeout(Duration::from_millis(5));
        }
        self.draw();
    }

    /// Returns true if it stopped early, saturated.
    fn open(&mut self, rate_per_s: f64) -> Result<bool, String> {
        // Lanes interleave: lane l sends the run's tasks l, l + lanes, l + 2 lanes, ...
        let interval_ns = 1e9 / rate_per_s;
        let (lane, lanes) = (self.lane, self.lanes);
        let intended = |i: u64| ((i * lanes + lane) as f64 * interval_ns) as u64;
        let mut next = 0u64;
        loop {
            self.reap_front();
            let now_ns = self.now_ns();
            if self.measuring_done(intended(next)) {
                return Ok(false);
            }
            if self.outstanding() >= self.spec.outstanding_max / self.lanes {
                return Ok(true);
            }
            let next_ns = intended(next);
            if next_ns > now_ns {
                let gap = Duration::from_nanos(next_ns - now_ns);
                if gap > Duration::from_micros(200) {
                    std::thread::sleep(gap - Duration::from_micros(100));
                } else {
                    std::thread::yield_now();
                }
                self.draw();
                continue;
            }
            if self.pending.len() >= self.jobs_max {
                // Too many jobs outstanding: let due tasks accumulate into one bigger job.
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            let mut times = Vec::new();
            while times.len() < OPEN_BATCH_MAX as usize && intended(next) <= now_ns {
                if let Limit::Tasks(tasks) = self.limit {
                    let measured_here = times
                        .iter()
                        .filter(|&&ns| ns >= self.measure_from_ns)
                        .count() as u64;
                    if self.measured + measured_here >= tasks {
                        break;
                    }
                }
                times.push(intended(next));
                next += 1;
            }
            if times.is_empty() {
                continue;
            }
            self.submit_per_task(times.into())?;
            self.draw();
        }
    }

    /// Waits until every submitted task has a result.
    fn drain(&mut self) -> Result<(), String> {
        self.shared.wake_at.store(self.submitted, Ordering::Release);
        let mut last_completed = self.shared.completed.load(Ordering::Acquire);
        let mut last_progress = Instant::now();
        while self.outstanding() > 0 || !self.pending.is_empty() {
            self.reap_all();
            let completed = self.shared.completed.load(Ordering::Acquire);
            if completed != last_completed {
                last_completed = completed;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > STALL {
                return Err(format!(
                    "stuck: {} tasks outstanding and no result for {} s (executors lost: {})",
                    self.outstanding(),
                    STALL.as_secs(),
                    self.driver.executors_lost()
                ));
            }
            std::thread::park_timeout(Duration::from_millis(2));
            self.draw();
        }
        Ok(())
    }
}

/// Runs one load against `driver` and returns what it measured.
pub fn run(driver: &Driver, spec: &LoadSpec) -> Result<RunResult, String> {
    let lanes = check_spec(spec)?;
    let epoch = clock::now_ns();
    let measure_from_ns = spec.warmup.as_nanos() as u64;
    let meter = Arc::new(Mutex::new(Meter::new(measure_from_ns, spec.intervals)));
    let stats_before = driver.stats();
    let lost_before = driver.executors_lost();
    let mut beside = None;
    let done = AtomicBool::new(false);
    let lane_results: Vec<Result<(u64, bool), String>> = std::thread::scope(|scope| {
        let beside_job = (spec.beside_tasks).map(|tasks| {
            let done = &done;
            scope.spawn(move || run_beside(driver, tasks, spec.warmup, done))
        });
        let threads: Vec<_> = (0..lanes)
            .map(|lane| {
                let meter = meter.clone();
                scope.spawn(move || run_lane(driver, spec, meter, epoch, lane, lanes))
            })
            .collect();
        let results = threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err("a submitter thread panicked".into()))
            })
            .collect();
        done.store(true, Ordering::Release);
        beside = beside_job.map(|t| t.join().unwrap_or(Ok(None)));
        results
    });
    let beside = beside.transpose()?;
    let mut measured = 0;
    let mut saturated = false;
    for result in lane_results {
        let (lane_measured, lane_saturated) = result?;
        measured += lane_measured;
        saturated |= lane_saturated;
    }
    let stats = driver.stats();
    let mut meter = meter.lock().unwrap_or_else(|p| p.into_inner());
    let end_ns = meter.finish();
    let elapsed = Duration::from_nanos(end_ns.saturating_sub(measure_from_ns));
    let failed_now = meter.recorder.failed();
    let launched = stats.launched - stats_before.launched;
    let succeeded = stats.succeeded - stats_before.succeeded;
    // Attempts beyond one per task (warm-up tasks included: retries are rare and the scheduler
    // does not tell them apart).
    let retried = launched.saturating_sub(succeeded + failed_now);
    let summary = meter.recorder.summary(
        measured,
        retried,
        driver.executors_lost() - lost_before,
        elapsed,
    );
    Ok(RunResult {
        summary,
        histogram: meter.recorder.histogram(),
        intervals: std::mem::take(&mut meter.intervals),
        timeline: std::mem::take(&mut meter.timeline),
        offered_per_s: match spec.mode {
            Mode::Open { rate_per_s } => Some(rate_per_s),
            Mode::Closed { .. } => None,
        },
        saturated,
        beside,
    })
}

/// The job beside the load: `tasks` noop tasks submitted once `warmup` passed, at priority -1
/// (the load's jobs go first); how long it took, or `None` if the load ended first (`done`).
fn run_beside(
    driver: &Driver,
    tasks: u64,
    warmup: Duration,
    done: &AtomicBool,
) -> Result<Option<Duration>, String> {
    // Built before it is due, so the submitting thread does not compete with the load then.
    let payloads = vec![Bytes::new(); tasks as usize];
    std::thread::sleep(warmup);
    let sent = Instant::now();
    let job = Job::with_payloads("noop", payloads)
        .priority(-1)
        .keep_results(false);
    let mut handle = (driver.submit(job)).map_err(|e| format!("the job beside: {e}"))?;
    while !done.load(Ordering::Acquire) {
        match handle.wait_timeout(Duration::from_millis(10)) {
            Ok(_) => return Ok(Some(sent.elapsed())),
            Err(running) => handle = running,
        }
    }
    Ok(None)
}

/// Checks the rate and the tasks in flight against the submitters; the number of lanes.
fn check_spec(spec: &LoadSpec) -> Result<u64, String> {
    if let Mode::Open { rate_per_s } = spec.mode {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return Err(format!("the rate must be positive, not {rate_per_s}"));
        }
    }
    let lanes = spec.submitters.max(1) as u64;
    if let Mode::Closed { in_flight, .. } = spec.mode {
        if in_flight < lanes {
            return Err(format!(
                "{lanes} submitters need at least {lanes} tasks in flight, not {in_flight}"
            ));
        }
    }
    Ok(lanes)
}

/// Lane `lane`'s share of `total`: the first `total % lanes` lanes take one more.
fn lane_share(total: u64, lane: u64, lanes: u64) -> u64 {
    total / lanes + u64::from(lane < total % lanes)
}

/// One submitter lane's run (on its own thread): its tasks measured and whether an open loop
/// fell behind its rate.
fn run_lane(
    driver: &Driver,
    spec: &LoadSpec,
    meter: Arc<Mutex<Meter>>,
    epoch: u64,
    lane: u64,
    lanes: u64,
) -> Result<(u64, bool), String> {
    let share = |total: u64, lane: u64| lane_share(total, lane, lanes);
    let shared = Arc::new(Shared {
        meter,
        completed: AtomicU64::new(0),
        wake_at: AtomicU64::new(0),
        submitter: std::thread::current(),
        wake_submitter: matches!(spec.mode, Mode::Closed { .. }),
    });
    let limit = match spec.limit {
        Limit::Tasks(tasks) => Limit::Tasks(share(tasks, lane)),
        duration => duration,
    };
    let mut payloads = Payloads::new(&spec.task, spec.payload_bytes);
    // Task indices stay unique across lanes (0..tasks for a counted run with no warm-up, so
    // `hash` checksums are comparable).
    payloads.next_index = match spec.limit {
        Limit::Tasks(tasks) => (0..lane).map(|l| share(tasks, l)).sum(),
        Limit::Duration(_) => lane << 40,
    };
    let mut runner = Runner {
        driver,
        spec,
        observer: shared_observer(shared.clone(), epoch),
        shared,
        epoch,
        measure_from_ns: spec.warmup.as_nanos() as u64,
        pending: VecDeque::new(),
        payloads,
        submitted: 0,
        measured: 0,
        progress: Progress::new(spec.progress && lane == 0),
        lane,
        lanes,
        jobs_max: (spec.jobs_max / lanes as usize).max(1),
        limit,
    };
    let sent = match spec.mode {
        Mode::Closed { in_flight, batch } => {
            runner.closed(share(in_flight, lane), batch).map(|()| false)
        }
        Mode::Open { rate_per_s } => runner.open(rate_per_s),
    };
    let drained = runner.drain();
    runner.progress.finish();
    let saturated = sent?;
    drained?;
    Ok((runner.measured, saturated))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The meter as it was before it counted each latency once and found a result's bucket
    /// with one comparison: every result recorded into the recorder and the interval, its
    /// timeline bucket found by division, the intervals rotated at each.
    struct Reference {
        measure_from_ns: u64,
        recorder: Recorder,
        timeline: Vec<u64>,
        interval: LatencyCounts,
        interval_start_ns: u64,
        intervals: Vec<(Duration, Duration, Histogram<u64>)>,
        last_result_ns: u64,
    }

    impl Reference {
        /// One result of a task sent at `sent_ns`, arrived at `now_ns` (inlined into the observer:
        /// it runs once a result).
        #[inline]
        fn record(&mut self, sent_ns: u64, now_ns: u64, result: Result<&[u8], &str>) {
            if sent_ns < self.measure_from_ns {
                return;
            }
            let latency_ns = now_ns.saturating_sub(sent_ns);
            self.recorder.record_ns(result, latency_ns);
            let since_ns = now_ns.saturating_sub(self.measure_from_ns);
            let bucket = (since_ns / BUCKET.as_nanos() as u64) as usize;
            if self.timeline.len() <= bucket {
                self.timeline.resize(bucket + 1, 0);
            }
            self.timeline[bucket] += 1;
            self.rotate(now_ns);
            self.interval.record_us((latency_ns / 1_000).max(1));
            self.last_result_ns = self.last_result_ns.max(now_ns);
        }

        fn rotate(&mut self, now_ns: u64) {
            let length_ns = INTERVAL.as_nanos() as u64;
            while now_ns >= self.interval_start_ns + length_ns {
                self.close(length_ns);
                self.interval_start_ns += length_ns;
            }
        }

        fn close(&mut self, length_ns: u64) {
            if self.interval.is_empty() {
                return;
            }
            self.intervals.push((
                Duration::from_nanos(self.interval_start_ns - self.measure_from_ns),
                Duration::from_nanos(length_ns),
                self.interval.to_histogram(),
            ));
            self.interval.clear();
        }

        fn finish(&mut self) {
            let end_ns = self.last_result_ns;
            self.rotate(end_ns);
            let tail_ns = end_ns.saturating_sub(self.interval_start_ns).max(1);
            self.close(tail_ns);
        }
    }

    fn pairs(h: &Histogram<u64>) -> Vec<(u64, u64)> {
        (h.iter_recorded())
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect()
    }

    /// One result: when its task was sent, when it arrived, and what it was.
    type Sample = (u64, u64, Result<Vec<u8>, &'static str>);

    /// An interval's start, length and buckets.
    type Buckets = (Duration, Duration, Vec<(u64, u64)>);

    /// Results over 4.5 s after a 0.3 s warm-up, as the observer and a failed job's charge
    /// give them: mostly in time order, some a little late (a clock read before the lock),
    /// some sent in the warm-up, latencies from under 1 us to over an hour, a gap of empty
    /// buckets and intervals, failures and checksums.
    fn results() -> Vec<Sample> {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut results = Vec::new();
        let mut now_ns = 250_000_000u64;
        while now_ns < 4_800_000_000 {
            now_ns += next() % 3_000_000;
            if (2_000_000_000..3_300_000_000).contains(&now_ns) {
                now_ns = 3_300_000_000;
            }
            let at_ns = match next() % 10 {
                0 => now_ns.saturating_sub(next() % 150_000_000),
                _ => now_ns,
            };
            let latency_ns = match next() % 20 {
                0 => next() % 5_000_000_000_000_000,
                1 => next() % 2_000,
                _ => next() % 20_000_000,
            };
            let result = match next() % 7 {
                0 => Err("failed"),
                1 => Ok(vec![1, 2, 3]),
                _ => Ok(next().to_le_bytes().to_vec()),
            };
            results.push((at_ns.saturating_sub(latency_ns), at_ns, result));
        }
        results
    }

    #[test]
    fn the_meter_measures_what_counting_every_result_everywhere_measured() {
        meter_against_the_reference(true);
    }

    /// Without interval histograms, the run's outcomes, latencies and timeline are the same;
    /// only the intervals are left out.
    #[test]
    fn a_meter_keeping_no_intervals_measures_the_same_run() {
        meter_against_the_reference(false);
    }

    fn meter_against_the_reference(keep_intervals: bool) {
        let measure_from_ns = 300_000_000;
        let mut meter = Meter::new(measure_from_ns, keep_intervals);
        let mut reference = Reference {
            measure_from_ns,
            recorder: Recorder::new(),
            timeline: Vec::new(),
            interval: LatencyCounts::new(),
            interval_start_ns: measure_from_ns,
            intervals: Vec::new(),
            last_result_ns: measure_from_ns,
        };
        let results = results();
        assert!(results.len() > 2_000, "{} results", results.len());
        for (sent_ns, now_ns, result) in &results {
            let result = result.as_deref().map_err(|e| *e);
            meter.record(*sent_ns, *now_ns, result);
            reference.record(*sent_ns, *now_ns, result);
            assert_eq!(meter.recorder.tasks(), reference.recorder.tasks());
        }
        assert_eq!(meter.finish(), reference.last_result_ns);
        reference.finish();
        let elapsed = Duration::from_secs(4);
        assert_eq!(
            meter.recorder.summary(9, 1, 0, elapsed),
            reference.recorder.summary(9, 1, 0, elapsed)
        );
        assert_eq!(
            pairs(&meter.recorder.histogram()),
            pairs(&reference.recorder.histogram())
        );
        assert_eq!(meter.timeline, reference.timeline);
        let intervals = |meter: &Meter| -> Vec<Buckets> {
            (meter.intervals.iter())
                .map(|i| (i.start, i.length, pairs(&i.histogram)))
                .collect()
        };
        let expected: Vec<_> = (reference.intervals.iter())
            .map(|(start, length, h)| (*start, *length, pairs(h)))
            .collect();
        assert!(expected.len() >= 3, "{} intervals", expected.len());
        match keep_intervals {
            true => assert_eq!(intervals(&meter), expected),
            false => assert!(meter.intervals.is_empty(), "intervals left out"),
        }
    }
}
