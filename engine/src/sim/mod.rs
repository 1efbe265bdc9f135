//! A seeded, deterministic cluster simulator around the [`Scheduler`]: a test tool, not part of
//! a production driver.
//!
//! [`run_seed`] builds a random scenario from a seed (executors with their own latencies, some
//! joining late, some dying mid-task; jobs with locality preferences, oversized payloads,
//! cancellations and task kills; random task failures; status updates delayed, reordered,
//! duplicated, and garbage ones) and plays it on a simulated clock, calling `tick` exactly when
//! the scheduler asks to ([`Scheduler::poll_timeout`]). After every step it checks:
//!
//! - no executor has more cores in use than it has, and the scheduler's free-core count matches
//!   an independent count from launches and final status updates;
//! - every submitted task gets exactly one final report, every job exactly one outcome, after all
//!   its task reports;
//! - a success is reported only for a task an executor finished, with that executor's result;
//! - nothing is launched on a refused, removed or excluded executor;
//! - a job succeeds if and only if all its tasks succeeded; a cancelled job (and only that) is
//!   reported cancelled;
//! - progress: free cores never idle longer than the locality waits while a job has runnable
//!   tasks for them, and every job ends before a generous deadline.
//!
//! Half the seeds add *churn* through the executor lifecycle ([`crate::lifecycle`]): an
//! allocator (a fixed target, or dynamic allocation from the backlog) creates executors,
//! some of which never register (deleted after the pending timeout and replaced) and some of
//! which crash; process exits and deletions go to the [`Lifecycle`] (its snapshot store's
//! batches feed the allocator and the removals, which remove gone executors from the
//! scheduler; executors it deletes while registered are drained first, and never get a launch
//! after that).
//! Those seeds also check that only dead executors are removed that way and that the allocator
//! never keeps more executors than its bound.
//!
//! Odd seeds deliver reports in *frames*: those due in one 5 ms window reach the scheduler as
//! one batch ([`Scheduler::handle_statuses`]), as a driver reads an executor's frame off its
//! connection, so a batch's successes are applied as runs (`scheduler/successes.rs`) among
//! failures, kills, executor losses and garbage. Even seeds deliver each report alone.
//!
//! A failure names the seed and the command that replays it (`ci/sim --seed N`).

mod checks;
mod churn;
mod events;
mod plan;
mod rng;

use plan::random_config;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;

pub use rng::Rng;

use crate::lifecycle::{
    Allocation, AllocatorConfig, DynamicConfig, ExecutorState, Lifecycle, LifecycleConfig,
    LifecycleOutput,
};

use crate::scheduler::{
    Attempt, Config, Event, ExclusionConfig, ExecutorId, ExecutorInfo, HedgeConfig, JobId,
    JobOutcome, JobSetting, JobSpec, JobToken, Output, PoolConfig, Refusal, RemovalReason,
    Scheduler, Sharing, SpeculationConfig, StatusUpdate, TaskId, TaskLaunch, TaskSpec, TaskState,
    Tasks, BUILD_CHUNK_TASKS,
};

/// Whether a report is final (finished, failed, killed): what a frame gathers.
fn is_final(state: TaskState) -> bool {
    matches!(
        state,
        TaskState::Finished | TaskState::Failed | TaskState::Killed
    )
}

/// How far apart a job being built gets its chunks (the driver's shortest tick).
const BUILD_TICK_US: u64 = 1_000;
/// Largest core count a simulated task asks for.
const TASK_CORES_MAX: u32 = 2;
/// Simulated time after which a run that has not finished counts as stuck.
const DEADLINE_US: u64 = 3_600_000_000;
/// Steps after which a run counts as stuck (guards against livelock).
const STEPS_MAX: u64 = 2_000_000;

/// What a run did (for reports and for checking that scenarios exercise things).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    /// Events processed.
    pub steps: u64,
    /// Simulated time at the end, micros.
    pub end_us: u64,
    /// Jobs submitted and accepted.
    pub jobs: u64,
    /// Jobs refused by backpressure.
    pub jobs_refused: u64,
    /// Jobs that succeeded, failed, were cancelled.
    pub outcomes: [u64; 3],
    /// Tasks accepted.
    pub tasks: u64,
    /// Task attempts launched.
    pub launched: u64,
    /// Task attempts that failed on an executor (injected).
    pub failures_injected: u64,
    /// Executors that died mid-run.
    pub executors_lost: u64,
    /// Registrations refused.
    pub refusals: u64,
    /// Status updates the scheduler ignored (duplicates, garbage, stale).
    pub ignored_updates: u64,
    /// Speculative attempts launched.
    pub speculative: u64,
    /// Executors the lifecycle allocator created (churn seeds).
    pub executors_created: u64,
    /// A digest of every launch in order (when, where, which attempt): two runs of a seed
    /// that launch differently differ here.
    pub launches_digest: u64,
}

/// A violated invariant (or a stuck run), with what replays it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// The seed.
    pub seed: u64,
    /// The step at which it was detected.
    pub step: u64,
    /// Simulated time, micros.
    pub now_us: u64,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} failed at step {} (t = {} us): {}\n  replay: ci/sim --seed {}",
            self.seed, self.step, self.now_us, self.message, self.seed
        )
    }
}

impl std::error::Error for SimError {}

/// Something that happens at a simulated time.
#[derive(Clone, Debug)]
enum Ev {
    /// An executor asks to register.
    Register(ExecutorId),
    /// An already registered executor registers again (must be refused).
    RegisterDuplicate(ExecutorId),
    /// An executor's process dies; the driver hears of it later.
    Die(ExecutorId, RemovalReason),
    /// The driver learns an executor is gone.
    Remove(ExecutorId, RemovalReason),
    /// A planned job is submitted.
    Submit(usize),
    /// A planned job is cancelled.
    Cancel(usize),
    /// A task is killed by the user.
    KillTask(usize, u32),
    /// A launch reaches its executor.
    Arrive(ExecutorId, TaskLaunch),
    /// A task attempt's run ends on its executor.
    Complete(ExecutorId, Attempt),
    /// A kill request reaches an executor.
    KillArrive(ExecutorId, Attempt),
    /// A status update reaches the driver.
    Deliver(StatusUpdate),
    /// The lifecycle loop runs: snapshot batches, the allocator (churn seeds).
    Lifecycle,
    /// An allocator-created executor's process crashes (churn seeds).
    Exit(ExecutorId),
}

/// Start of the ids of executors the allocator creates.
const CHURN_ID_BASE: u64 = 100_000;
/// The lifecycle loop's period.
const CHURN_TICK_US: u64 = 10_000;

/// The executor lifecycle around the scheduler on churn seeds.
struct Churn {
    lifecycle: Lifecycle,
    ids: BTreeMap<String, ExecutorId>,
    names: BTreeMap<ExecutorId, String>,
    crash_prob: f64,
    /// The most live executors the allocator may keep.
    live_max: usize,
}

struct SimExec {
    info: ExecutorInfo,
    /// Process alive (runs tasks, sends updates).
    alive: bool,
    /// Registered with the scheduler (per the scheduler's answers).
    registered: bool,
    /// Ever removed or refused: must never receive launches again.
    retired: bool,
    /// Run time multiplier (stragglers).
    slowness: u64,
    /// Attempts running in the process, with cores.
    running: BTreeMap<Attempt, u32>,
    /// Attempts the scheduler should count as holding cores.
    held: BTreeMap<Attempt, u32>,
    /// Deleted by the allocator: its process is gone and it never registers.
    deleted: bool,
    /// Draining before its deletion: must never receive launches again.
    draining: bool,
}

impl SimExec {
    fn new(info: ExecutorInfo, slowness: u64) -> SimExec {
        SimExec {
            info,
            alive: false,
            registered: false,
            retired: false,
            slowness,
            running: BTreeMap::new(),
            held: BTreeMap::new(),
            deleted: false,
            draining: false,
        }
    }
}

struct PlannedJob {
    spec: JobSpec,
    id: Option<JobId>,
    cancelled: bool,
    outcome: Option<JobOutcome>,
    oversized: bool,
}

/// One simulation run.
struct Sim {
    seed: u64,
    rng: Rng,
    sched: Scheduler,
    now_us: u64,
    step: u64,
    seq: u64,
    events: BTreeMap<(u64, u64), Ev>,
    execs: BTreeMap<ExecutorId, SimExec>,
    jobs: Vec<PlannedJob>,
    job_index: BTreeMap<JobId, usize>,
    results: BTreeMap<TaskId, Result<Bytes, String>>,
    finished_by_exec: BTreeSet<TaskId>,
    failure_prob: f64,
    /// Per (executor, job): since when the executor has had free cores while the job had
    /// runnable tasks for it.
    idle_since_us: BTreeMap<(ExecutorId, JobId), u64>,
    idle_limit_us: u64,
    /// When the scheduler last ticked.
    last_tick_us: u64,
    report: SimReport,
    verbose: bool,
    churn: Option<Churn>,
    /// Jobs with a counted failure: their tasks may avoid executors (per-task exclusion).
    tainted: BTreeSet<JobId>,
    /// Jobs with attempts on executors removed as lost, by executor (a late exit reason may
    /// still charge them).
    lost_held: BTreeMap<ExecutorId, Vec<JobId>>,
    /// Reports go in frames (odd seeds): those due in one [`FRAME_US`] window reach the
    /// scheduler as one batch, as a driver reads them off a connection.
    frames: bool,
}

/// The window of reports a frame gathers, on odd seeds.
const FRAME_US: u64 = 5_000;

/// `digest` with `(when, executor, task, attempt)` of one more launch folded in.
fn digest(digest: u64, (at_us, executor, task, attempt): (u64, u64, u64, u32)) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = crate::hash::FxHasher::default();
    (digest, at_us, executor, task, attempt).hash(&mut h);
    h.finish()
}

/// The result an executor returns for a task (checked against what the scheduler reports).
fn expected_result(task: TaskId) -> Bytes {
    Bytes::from(task.0.to_le_bytes().to_vec())
}

/// Runs the scenario of `seed` and checks the invariants after every step.
pub fn run_seed(seed: u64) -> Result<SimReport, SimError> {
    run(seed, false, false)
}

/// [`run_seed`], printing every event and output to stderr (for replaying a failure).
pub fn run_seed_verbose(seed: u64) -> Result<SimReport, SimError> {
    run(seed, true, false)
}

/// [`run_seed`] with a scheduler that walks for every assignment, none of the shortcuts
/// that spare walks: the same seed must report the same, launches included.
pub fn run_seed_walking(seed: u64) -> Result<SimReport, SimError> {
    run(seed, false, true)
}

fn run(seed: u64, verbose: bool, walking: bool) -> Result<SimReport, SimError> {
    let mut sim = Sim::new(seed);
    sim.verbose = verbose;
    sim.sched.set_walk_only(walking);
    if verbose {
        eprintln!("config: {:?}", sim.sched.config());
    }
    sim.run()?;
    sim.report.launched = sim.sched.stats().launched;
    sim.report.ignored_updates = sim.sched.stats().ignored_updates;
    sim.report.speculative = sim.sched.stats().speculative_launched;
    sim.report.end_us = sim.now_us;
    Ok(sim.report)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let config = random_config(&mut rng, seed);
        // While a job is built a chunk per tick, a tick (and any locality wait ending in it)
        // comes up to `BUILD_TICK_US` late, as in the driver.
        let build_slack_us = match config.build_chunk_tasks < BUILD_CHUNK_TASKS {
            true => BUILD_TICK_US,
            false => 0,
        };
        let idle_limit_us =
            config.locality_wait_executor_us + config.locality_wait_host_us + 1 + build_slack_us;
        let failure_prob = [0.0, 0.02, 0.1, 0.3][rng.range(0, 3) as usize];
        let mut sim = Sim {
            seed,
            sched: Scheduler::new(config),
            rng,
            now_us: 0,
            step: 0,
            seq: 0,
            events: BTreeMap::new(),
            execs: BTreeMap::new(),
            jobs: Vec::new(),
            job_index: BTreeMap::new(),
            results: BTreeMap::new(),
            finished_by_exec: BTreeSet::new(),
            failure_prob,
            idle_since_us: BTreeMap::new(),
            idle_limit_us,
            last_tick_us: 0,
            report: SimReport::default(),
            verbose: false,
            churn: None,
            tainted: BTreeSet::new(),
            lost_held: BTreeMap::new(),
            // From the seed, not the generator: even seeds play as they did before frames.
            frames: seed % 2 == 1,
        };
        sim.plan();
        sim.plan_churn();
        sim
    }

    fn at(&mut self, t_us: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert((t_us, self.seq), ev);
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, SimError> {
        Err(SimError {
            seed: self.seed,
            step: self.step,
            now_us: self.now_us,
            message: message.into(),
        })
    }

    fn run(&mut self) -> Result<(), SimError> {
        loop {
            self.step += 1;
            self.report.steps = self.step;
            if self.step > STEPS_MAX || self.now_us > DEADLINE_US {
                if self.verbose {
                    self.dump();
                }
                return self.fail(format!(
                    "no progress: {} jobs still open at the deadline",
                    self.open_jobs()
                ));
            }
            if self.events.is_empty() && self.open_jobs() > 0 && !self.any_alive() {
                // Like a cluster manager, replace executors when all are gone.
                self.add_replacement();
            }
            let next_ev = self.events.keys().next().copied();
            // "At once" (0) is a job being built: the driver ticks at most once a millisecond,
            // so its chunks are built that far apart, and inputs arrive between them.
            let next_tick_us = self.last_tick_us.saturating_add(BUILD_TICK_US);
            let timeout = (self.sched.poll_timeout()).map(|d| match d {
                0 => next_tick_us.max(self.now_us),
                d => d,
            });
            match (next_ev, timeout) {
                (Some((t, _)), Some(d)) if d < t => self.tick(d),
                (None, Some(d)) => {
                    if self.open_jobs() == 0 {
                        break;
                    }
                    self.tick(d)
                }
                (Some(key), _) => {
                    let Some(ev) = self.events.remove(&key) else {
                        break;
                    };
                    self.now_us = self.now_us.max(key.0);
                    self.handle(ev)?;
                }
                (None, None) => break,
            }
            self.drain()?;
            self.check()?;
        }
        self.finish()
    }

    /// Marks the jobs with attempts on `id` as having counted failures (per-task exclusion may
    /// keep their tasks off some executors: the idle check does not apply to them).
    fn taint_held(&mut self, id: ExecutorId) {
        if let Some(e) = self.execs.get(&id) {
            for key in e.held.keys() {
                self.tainted.insert(key.task.job());
            }
        }
    }

    /// Prints what the scheduler holds (verbose replays of a stuck run).
    fn dump(&self) {
        for j in self.jobs.iter().filter_map(|j| j.id) {
            let excluded: Vec<ExecutorId> = self
                .execs
                .keys()
                .copied()
                .filter(|&e| self.sched.is_excluded(self.now_us, e, Some(j)))
                .collect();
            let pending = self.sched.job_pending_tasks(j);
            eprintln!("{j:?}: pending {pending:?}, excluded on {excluded:?}");
        }
        for (id, e) in &self.execs {
            eprintln!(
                "{id:?} on {}: registered {}, scheduler sees {:?} (usable {:?}, suspected {}, \
                 stalled {}, probation {}), excluded {}, held {:?}",
                e.info.host,
                e.registered,
                self.sched.executor_cores(*id),
                self.sched.executor_usable(*id),
                self.sched.suspected_executors().contains(id),
                self.sched.stalled_executors().iter().any(|(s, _)| s == id),
                self.sched.executors_on_probation().contains(id),
                self.sched.is_excluded(self.now_us, *id, None),
                e.held
            );
        }
    }

    fn any_alive(&self) -> bool {
        self.execs.values().any(|e| e.alive && e.registered)
    }

    fn add_replacement(&mut self) {
        let id = ExecutorId(1000 + self.execs.len() as u64);
        let info = ExecutorInfo {
            id,
            host: format!("host-replacement-{}", id.0),
            cores: 2,
            attributes: Vec::new(),
        };
        self.execs.insert(id, SimExec::new(info, 1));
        let t = self.now_us + 10_000;
        self.at(t, Ev::Register(id));
    }

    fn tick(&mut self, t_us: u64) {
        // A deadline in the past (already due) still advances the clock by one micro.
        self.now_us = self.now_us.max(t_us);
        self.last_tick_us = self.now_us;
        if self.verbose {
            eprintln!("{:>9} tick", self.now_us);
        }
        self.sched.handle_timeout(self.now_us);
    }

    fn open_jobs(&self) -> usize {
        self.jobs
            .iter()
            .filter(|j| j.id.is_some() && j.outcome.is_none())
            .count()
    }

    fn net_delay(&mut self) -> u64 {
        if self.rng.chance(0.05) {
            self.rng.range(1_000, 30_000)
        } else {
            self.rng.range(10, 500)
        }
    }

    fn handle(&mut self, ev: Ev) -> Result<(), SimError> {
        let now = self.now_us;
        if self.verbose {
            eprintln!("{now:>9} event {ev:?}");
        }
        let handled = match ev {
            Ev::Register(id) => self.on_register(id)?,
            Ev::RegisterDuplicate(id) => self.on_register_duplicate(id)?,
            Ev::Die(id, reason) => {
                self.on_die(id, reason);
                true
            }
            Ev::Remove(id, reason) => {
                self.on_remove(id, reason)?;
                true
            }
            Ev::Submit(j) => self.on_submit(j)?,
            Ev::Cancel(j) => self.on_cancel(j)?,
            Ev::KillTask(j, i) => self.on_kill_task(j, i)?,
            Ev::Arrive(id, launch) => self.on_arrive(id, launch)?,
            Ev::Complete(id, key) => self.on_complete(id, key),
            Ev::KillArrive(id, key) => self.on_kill_arrive(id, key),
            Ev::Deliver(update) if self.frames && is_final(update.state) => {
                self.deliver_frame(update);
                true
            }
            Ev::Deliver(update) => {
                self.deliver(update)?;
                true
            }
            Ev::Lifecycle => {
                self.lifecycle()?;
                true
            }
            Ev::Exit(id) => {
                self.on_exit(id);
                true
            }
        };
        if handled {
            self.maybe_garbage(now);
        }
        Ok(())
    }

    /// Now and then, garbage from a peer: unknown task, wrong attempt, wrong executor.
    fn maybe_garbage(&mut self, now: u64) {
        if self.rng.chance(0.02) {
            let executor = ExecutorId(self.rng.range(0, 9));
            let garbage = StatusUpdate {
                executor,
                task: TaskId(((self.rng.next_u64() % 8) << 32) | self.rng.range(0, 30)),
                attempt: self.rng.range(5, 9) as u32,
                state: [TaskState::Finished, TaskState::Failed, TaskState::Killed]
                    [self.rng.range(0, 2) as usize],
                data: Bytes::from_static(b"garbage"),
            };
            let t = now + 1;
            self.at(t, Ev::Deliver(garbage));
        }
    }

    fn send(
        &mut self,
        t_us: u64,
        executor: ExecutorId,
        key: Attempt,
        state: TaskState,
        data: Bytes,
    ) {
        let update = StatusUpdate {
            executor,
            task: key.task,
            attempt: key.attempt,
            state,
            data,
        };
        let t_us = match self.frames {
            true => t_us.next_multiple_of(FRAME_US),
            false => t_us,
        };
        self.at(t_us, Ev::Deliver(update));
    }

    /// A final report due now, with every other final report due by now (ahead of the other
    /// events due: messages due at once come in any order), to the scheduler as one batch.
    fn deliver_frame(&mut self, first: StatusUpdate) {
        let due: Vec<(u64, u64)> = (self.events.range(..=(self.now_us, u64::MAX)))
            .filter(|(_, ev)| matches!(ev, Ev::Deliver(u) if is_final(u.state)))
            .map(|(key, _)| *key)
            .collect();
        let mut frame = vec![first];
        for key in due {
            let Some(Ev::Deliver(update)) = self.events.remove(&key) else {
                unreachable!("a final report was just found");
            };
            frame.push(update);
        }
        if self.verbose {
            eprintln!("{:>9} a frame of {} reports", self.now_us, frame.len());
        }
        for update in &frame {
            let lost = self.note_update(update);
            debug_assert!(!lost, "a frame holds final reports only");
        }
        self.sched.handle_statuses(frame, self.now_us);
    }

    /// What `update` changes of the simulated executor's view (an attempt it held ends); true
    /// if it reports its attempt LOST.
    fn note_update(&mut self, update: &StatusUpdate) -> bool {
        let key = Attempt::new(update.task, update.attempt);
        let id = update.executor;
        let mut lost = false;
        if update.state == TaskState::Failed
            && self
                .execs
                .get(&id)
                .is_some_and(|e| e.registered && e.held.contains_key(&key))
        {
            self.tainted.insert(update.task.job());
        }
        if let Some(e) = self.execs.get_mut(&id) {
            if e.registered && e.held.contains_key(&key) {
                match update.state {
                    TaskState::Running => {}
                    TaskState::Lost => lost = true,
                    _ => {
                        e.held.remove(&key);
                    }
                }
            }
        }
        lost
    }

    fn deliver(&mut self, update: StatusUpdate) -> Result<(), SimError> {
        let id = update.executor;
        let lost = self.note_update(&update);
        self.sched.handle_status(update, self.now_us);
        if lost {
            // The scheduler treats a LOST task as its executor lost.
            if self.sched.executor_cores(id).is_some() {
                return self.fail(format!("{id:?} reported LOST but is still registered"));
            }
            if let Some(e) = self.execs.get_mut(&id) {
                // Removed as lost: a late exit reason may still charge what it held.
                let jobs = e.held.keys().map(|key| key.task.job()).collect();
                self.lost_held.insert(id, jobs);
                e.alive = false;
                e.registered = false;
                e.retired = true;
                e.running.clear();
                e.held.clear();
            }
            self.report.executors_lost += 1;
            // The driver dropped it; its process exits (code 1: the driver went away).
            self.churn_update(
                id,
                ExecutorState::Failed {
                    code: 1,
                    caused_by_app: false,
                },
            );
        }
        Ok(())
    }

    /// Takes the scheduler's outputs, checking each (an event's token too), in
    /// [`Scheduler::poll_output`]'s order.
    fn drain(&mut self) -> Result<(), SimError> {
        loop {
            let out = match self.sched.poll_command() {
                Some(out) => out,
                None => {
                    let Some((event, token)) = self.sched.poll_event_with_token() else {
                        return Ok(());
                    };
                    self.check_token(&event, token)?;
                    Output::Event(event)
                }
            };
            if self.verbose {
                eprintln!("{:>9}   out {out:?}", self.now_us);
            }
            match out {
                Output::Launch { executor, tasks } => {
                    for launch in tasks {
                        let seen = (self.now_us, executor.0, launch.task.0, launch.attempt);
                        self.report.launches_digest = digest(self.report.launches_digest, seen);
                        self.on_launch(executor, launch)?;
                    }
                }
                Output::Kill {
                    executor,
                    task,
                    attempt,
                    ..
                } => {
                    let t = self.now_us + self.net_delay();
                    self.at(t, Ev::KillArrive(executor, Attempt::new(task, attempt)));
                }
                Output::Event(Event::TaskResult { task, result }) => {
                    self.on_result(task, result)?
                }
                Output::Event(Event::JobOutcome { job, outcome }) => {
                    self.on_outcome(job, outcome)?
                }
                Output::Event(event @ Event::OneTaskJobSucceeded { .. }) => {
                    for part in event.split() {
                        match part {
                            Event::TaskResult { task, result } => self.on_result(task, result)?,
                            Event::JobOutcome { job, outcome } => self.on_outcome(job, outcome)?,
                            Event::OneTaskJobSucceeded { .. } => unreachable!("split"),
                        }
                    }
                }
            }
        }
    }

    /// Fails unless `event` carries its job's token: the planned job's index (`on_submit`).
    fn check_token(&mut self, event: &Event, token: JobToken) -> Result<(), SimError> {
        let job = match event {
            Event::TaskResult { task, .. } | Event::OneTaskJobSucceeded { task, .. } => task.job(),
            Event::JobOutcome { job, .. } => *job,
        };
        let planned = self.job_index.get(&job).map(|&j| JobToken(j as u32));
        if planned != Some(token) {
            return self.fail(format!(
                "{event:?} carries {token:?}, its job's is {planned:?}"
            ));
        }
        Ok(())
    }

    fn on_launch(&mut self, executor: ExecutorId, launch: TaskLaunch) -> Result<(), SimError> {
        let job = launch.task.job();
        if self.execs.get(&executor).is_some_and(|e| e.draining) {
            return self.fail(format!(
                "launch of {} on draining {executor:?}",
                launch.task
            ));
        }
        if self.sched.is_excluded(self.now_us, executor, Some(job)) {
            return self.fail(format!(
                "launch of {} on excluded {executor:?}",
                launch.task
            ));
        }
        if self.results.contains_key(&launch.task) {
            return self.fail(format!("launch of {} after its final report", launch.task));
        }
        let ended = (self.job_index.get(&job)).is_some_and(|&j| {
            self.jobs
                .get(j)
                .is_some_and(|planned| planned.outcome.is_some())
        });
        if ended {
            return self.fail(format!("launch of {} after its job's outcome", launch.task));
        }
        let Some(e) = self.execs.get_mut(&executor) else {
            return self.fail(format!("launch on unknown {executor:?}"));
        };
        if !e.registered || e.retired {
            let msg = format!(
                "launch of {} on {executor:?} (registered {}, removed or refused {})",
                launch.task, e.registered, e.retired
            );
            return self.fail(msg);
        }
        e.held
            .insert(Attempt::new(launch.task, launch.attempt), launch.cores);
        let used: u32 = e.held.values().sum();
        if used > e.info.cores {
            let msg = format!(
                "{executor:?} oversubscribed: {used} of {} cores",
                e.info.cores
            );
            return self.fail(msg);
        }
        let t = self.now_us + self.net_delay();
        self.at(t, Ev::Arrive(executor, launch));
        Ok(())
    }

    fn on_result(&mut self, task: TaskId, result: Result<Bytes, String>) -> Result<(), SimError> {
        if self.results.contains_key(&task) {
            return self.fail(format!("second final report for {task}"));
        }
        let Some(&j) = self.job_index.get(&task.job()) else {
            return self.fail(format!("report for {task} of an unknown job"));
        };
        if self.jobs.get(j).is_some_and(|job| job.outcome.is_some()) {
            return self.fail(format!("report for {task} after its job's outcome"));
        }
        let n = self.jobs.get(j).map_or(0, |job| job.spec.tasks.len());
        if task.index() as usize >= n {
            return self.fail(format!("report for {task}, beyond the job's {n} tasks"));
        }
        if let Ok(data) = &result {
            if !self.finished_by_exec.contains(&task) {
                return self.fail(format!(
                    "{task} reported succeeded, no executor finished it"
                ));
            }
            if *data != expected_result(task) {
                return self.fail(format!(
                    "{task} reported a result its executor did not send"
                ));
            }
        }
        self.results.insert(task, result);
        Ok(())
    }

    fn on_outcome(&mut self, job: JobId, outcome: JobOutcome) -> Result<(), SimError> {
        let Some(&j) = self.job_index.get(&job) else {
            return self.fail(format!("outcome for unknown {job:?}"));
        };
        let Some(pj) = self.jobs.get(j) else {
            return Ok(());
        };
        if pj.outcome.is_some() {
            return self.fail(format!("second outcome for {job:?}"));
        }
        // Every task reports before a success; a job that fails or is cancelled reports none
        // for the tasks it had not finished.
        let n = pj.spec.tasks.len() as u32;
        let mut all_ok = true;
        let mut results = Vec::new();
        for i in 0..n {
            match self.results.get(&TaskId::new(job, i)) {
                None if matches!(outcome, JobOutcome::Succeeded(_)) => {
                    return self.fail(format!("{job:?} succeeded before task {i}'s report"))
                }
                None | Some(Err(_)) => all_ok = false,
                Some(Ok(b)) => results.push(b.clone()),
            }
        }
        let kind = match &outcome {
            JobOutcome::Succeeded(r) => {
                self.check_succeeded(job, pj, r, all_ok, results)?;
                0
            }
            JobOutcome::Failed(reasons) => {
                self.check_failed(job, pj, reasons, all_ok)?;
                1
            }
            JobOutcome::Cancelled => {
                if !pj.cancelled {
                    return self.fail(format!("{job:?} reported cancelled but never was"));
                }
                2
            }
        };
        self.report.outcomes[kind] += 1;
        if let Some(pj) = self.jobs.get_mut(j) {
            pj.outcome = Some(outcome);
        }
        Ok(())
    }
}
