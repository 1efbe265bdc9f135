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
//! A failure names the seed and the command that replays it (`ci/sim --seed N`).

mod rng;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;

pub use rng::Rng;

use crate::lifecycle::{
    Allocation, AllocatorConfig, DynamicConfig, ExecutorState, Lifecycle, LifecycleConfig,
    LifecycleOutput,
};

use crate::scheduler::{
    Config, ExclusionConfig, ExecutorId, ExecutorInfo, HedgeConfig, JobId, JobOutcome, JobSetting,
    JobSpec, Output, PoolConfig, Refusal, RemovalReason, Scheduler, Sharing, SpeculationConfig,
    StatusUpdate, TaskId, TaskLaunch, TaskSpec, TaskState,
};

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
    Complete(ExecutorId, u64, u32),
    /// A kill request reaches an executor.
    KillArrive(ExecutorId, u64, u32),
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
    running: BTreeMap<(u64, u32), u32>,
    /// Attempts the scheduler should count as holding cores.
    held: BTreeMap<(u64, u32), u32>,
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
    report: SimReport,
    verbose: bool,
    churn: Option<Churn>,
    /// Jobs with a counted failure: their tasks may avoid executors (per-task exclusion).
    tainted: BTreeSet<JobId>,
    /// Jobs with attempts on executors removed as lost, by executor (a late exit reason may
    /// still charge them).
    lost_held: BTreeMap<ExecutorId, Vec<JobId>>,
}

/// The result an executor returns for a task (checked against what the scheduler reports).
fn expected_result(task: TaskId) -> Bytes {
    Bytes::from(task.0.to_le_bytes().to_vec())
}

/// Runs the scenario of `seed` and checks the invariants after every step.
pub fn run_seed(seed: u64) -> Result<SimReport, SimError> {
    run(seed, false)
}

/// [`run_seed`], printing every event and output to stderr (for replaying a failure).
pub fn run_seed_verbose(seed: u64) -> Result<SimReport, SimError> {
    run(seed, true)
}

fn run(seed: u64, verbose: bool) -> Result<SimReport, SimError> {
    let mut sim = Sim::new(seed);
    sim.verbose = verbose;
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

/// A random scheduler configuration for `seed`, drawn from `rng`.
fn random_config(rng: &mut Rng, seed: u64) -> Config {
    Config {
        sharing: random_sharing(rng),
        pools: vec![
            PoolConfig {
                name: "a".into(),
                mode: random_sharing(rng),
                weight: 1,
                min_share: rng.range(0, 3) as u32,
            },
            PoolConfig {
                name: "b".into(),
                mode: random_sharing(rng),
                weight: 3,
                min_share: rng.range(0, 3) as u32,
            },
        ],
        max_failures: rng.range(1, 4) as u32,
        locality_wait_executor_us: rng.range(0, 20_000),
        locality_wait_host_us: rng.range(0, 20_000),
        exclusion: rng.chance(0.6).then(|| ExclusionConfig {
            task_executor_failures_max: rng.range(1, 2) as u32,
            task_host_failures_max: rng.range(1, 3) as u32,
            job_executor_failures_max: rng.range(1, 3) as u32,
            job_host_failures_max: rng.range(2, 5) as u32,
            executor_failures_max: rng.range(2, 6) as u32,
            host_excluded_executors_max: rng.range(1, 3) as u32,
            timeout_us: rng.range(50_000, 2_000_000),
        }),
        speculation: rng.chance(0.4).then(|| SpeculationConfig {
            multiplier: 1.5,
            quantile: 0.5,
            min_runtime_us: rng.range(0, 20_000),
            interval_us: rng.range(1_000, 50_000),
            timeout_us: rng.range(20_000, 2_000_000),
        }),
        hedging: rng.chance(0.5).then(|| HedgeConfig {
            percentile: 0.9,
            factor: 1.5 + rng.range(0, 3) as f64 * 0.5,
            floor_us: rng.range(100, 5_000),
            cold_us: rng.range(1_000, 100_000),
            min_samples: rng.range(3, 20) as u32,
            copy_ratio: 0.05 + rng.range(0, 5) as f64 * 0.1,
            burst: rng.range(2, 64) as u32,
            silence_min_us: rng.range(0, 20_000),
        }),
        slow_start_slots: if rng.chance(0.5) {
            u32::MAX
        } else {
            rng.range(1, 4) as u32
        },
        pending_tasks_max: if rng.chance(0.2) { 30 } else { 10_000 },
        result_bytes_max: 1 << 30,
        jobs_max: 100,
        executors_max: 1000,
        payload_max_bytes: 64,
        unschedulable_timeout_us: 3_000_000,
        seed,
    }
}

/// FIFO or FAIR, even odds.
fn random_sharing(rng: &mut Rng) -> Sharing {
    if rng.chance(0.5) {
        Sharing::Fifo
    } else {
        Sharing::Fair
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng::new(seed);
        let config = random_config(&mut rng, seed);
        let idle_limit_us = config.locality_wait_executor_us + config.locality_wait_host_us + 1;
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
            report: SimReport::default(),
            verbose: false,
            churn: None,
            tainted: BTreeSet::new(),
            lost_held: BTreeMap::new(),
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

    /// Draws the scenario: executors (some late, some dying), jobs, cancellations, kills.
    fn plan(&mut self) {
        let hosts = self.rng.range(1, 4);
        let n_execs = self.rng.range(1, 12);
        for i in 0..n_execs {
            self.plan_executor(i, hosts);
        }
        // A late replacement executor so loss never leaves the cluster empty for good.
        let id = ExecutorId(100);
        let info = ExecutorInfo {
            id,
            host: "host-late".into(),
            cores: 2,
            attributes: Vec::new(),
        };
        self.execs.insert(id, SimExec::new(info, 1));
        let t = self.rng.range(100_000, 400_000);
        self.at(t, Ev::Register(id));

        let n_jobs = self.rng.range(1, 6) as usize;
        for j in 0..n_jobs {
            self.plan_job(j, hosts, n_execs);
        }
    }

    /// Executor `i` (of ids from 1, on one of `hosts` hosts): when it joins, maybe registers
    /// twice, maybe dies.
    fn plan_executor(&mut self, i: u64, hosts: u64) {
        let id = ExecutorId(i + 1);
        let host = format!("host{}", self.rng.range(0, hosts - 1));
        let info = ExecutorInfo {
            id,
            host,
            cores: self.rng.range(1, 4) as u32,
            attributes: Vec::new(),
        };
        let slowness = if self.rng.chance(0.2) { 10 } else { 1 };
        self.execs.insert(id, SimExec::new(info, slowness));
        let join_us = if i == 0 || self.rng.chance(0.6) {
            0
        } else {
            self.rng.range(0, 200_000)
        };
        self.at(join_us, Ev::Register(id));
        if self.rng.chance(0.1) {
            self.at(join_us + 1, Ev::RegisterDuplicate(id));
        }
        if self.rng.chance(0.25) {
            let reason = match self.rng.range(0, 2) {
                0 => RemovalReason::Lost("heartbeat timeout".into()),
                1 => RemovalReason::Killed,
                _ => RemovalReason::Exited {
                    code: 137,
                    caused_by_app: self.rng.chance(0.5),
                },
            };
            let t = join_us + self.rng.range(1, 300_000);
            self.at(t, Ev::Die(id, reason));
        }
    }

    /// Job `j`: its tasks, settings and submission, maybe a cancellation and a task kill.
    fn plan_job(&mut self, j: usize, hosts: u64, n_execs: u64) {
        let n_tasks = self.rng.range(0, 40);
        let oversized = self.rng.chance(0.05) && n_tasks > 0;
        let tasks = self.random_tasks(n_tasks, oversized, hosts, n_execs);
        let mut spec = JobSpec::new(tasks);
        self.random_settings(&mut spec, j, n_tasks);
        let submit_us = self.rng.range(0, 300_000);
        self.at(submit_us, Ev::Submit(j));
        if self.rng.chance(0.1) {
            let t = submit_us + self.rng.range(0, 100_000);
            self.at(t, Ev::Cancel(j));
        }
        if n_tasks > 0 && self.rng.chance(0.1) {
            let t = submit_us + self.rng.range(0, 100_000);
            let i = self.rng.range(0, n_tasks - 1) as u32;
            self.at(t, Ev::KillTask(j, i));
        }
        self.jobs.push(PlannedJob {
            spec,
            id: None,
            cancelled: false,
            outcome: None,
            oversized,
        });
    }

    /// `n_tasks` tasks (the middle one over the payload limit if `oversized`), some big, some
    /// preferring one of `n_execs` executors or one of `hosts` hosts.
    fn random_tasks(
        &mut self,
        n_tasks: u64,
        oversized: bool,
        hosts: u64,
        n_execs: u64,
    ) -> Vec<TaskSpec> {
        let mut tasks = Vec::new();
        for i in 0..n_tasks {
            let payload_len = if oversized && i == n_tasks / 2 {
                100
            } else {
                8
            };
            let mut t = TaskSpec::new("work", Bytes::from(vec![7u8; payload_len]));
            t.cores = if self.rng.chance(0.15) {
                TASK_CORES_MAX
            } else {
                1
            };
            if self.rng.chance(0.3) {
                t.preferred_executors
                    .push(ExecutorId(self.rng.range(1, n_execs + 1)));
            }
            if self.rng.chance(0.2) {
                t.preferred_hosts
                    .push(format!("host{}", self.rng.range(0, hosts)));
            }
            tasks.push(t);
        }
        tasks
    }

    /// Job `j`'s pool, weight, priority and per-job settings, drawn.
    fn random_settings(&mut self, spec: &mut JobSpec, j: usize, n_tasks: u64) {
        spec.pool = match self.rng.range(0, 9) {
            // An unconfigured pool (FAIR inside, weight 1), now and then.
            0 => format!("job-{j}").into(),
            1..=4 => "a".into(),
            _ => "b".into(),
        };
        spec.weight = self.rng.range(1, 3) as u32;
        spec.priority = self.rng.range(0, 2) as i32;
        spec.keep_results = self.rng.chance(0.8);
        // Per-job settings (issue 14 item 9) on a fifth of the jobs each.
        if self.rng.chance(0.2) {
            spec.max_failures = Some(self.rng.range(1, 4) as u32);
        }
        if self.rng.chance(0.2) {
            spec.speculation = if self.rng.chance(0.5) {
                JobSetting::Off
            } else {
                JobSetting::Custom(SpeculationConfig {
                    multiplier: 1.5,
                    quantile: 0.5,
                    min_runtime_us: self.rng.range(0, 20_000),
                    interval_us: self.rng.range(1_000, 50_000),
                    timeout_us: self.rng.range(20_000, 2_000_000),
                })
            };
        }
        if self.rng.chance(0.2) {
            spec.exclusion = if self.rng.chance(0.5) {
                JobSetting::Off
            } else {
                JobSetting::Custom(ExclusionConfig {
                    task_executor_failures_max: self.rng.range(1, 2) as u32,
                    task_host_failures_max: self.rng.range(1, 3) as u32,
                    ..ExclusionConfig::default()
                })
            };
        }
        if self.rng.chance(0.1) {
            // Results are 8 bytes each: sometimes the bound is below what the job returns.
            spec.result_bytes_max = Some(self.rng.range(0, 8 * n_tasks + 8));
        }
    }

    /// On half the seeds (drawn from a separate stream, so the other half keep their
    /// scenarios), an allocator with churn (see the module docs).
    fn plan_churn(&mut self) {
        let mut rng = Rng::new(self.seed ^ 0x5eed_c4a7_11fe_c7c1);
        if !rng.chance(0.5) {
            return;
        }
        let dynamic = rng.chance(0.5).then(|| DynamicConfig {
            min: 1,
            max: rng.range(2, 5) as u32,
            tasks_per_executor: rng.range(1, 4) as u32,
            idle_timeout_us: rng.range(5_000, 100_000),
        });
        let initial_target = rng.range(1, 4) as u32;
        let live_max = match &dynamic {
            Some(d) => d.max as usize,
            None => initial_target as usize,
        };
        let allocator = AllocatorConfig {
            batch_size: rng.range(1, 3) as u32,
            batch_delay_us: rng.range(0, 30_000),
            pending_timeout_us: 100_000,
            failures_max: u32::MAX,
            initial_target,
            dynamic,
            name_prefix: "churn-".into(),
        };
        let config = LifecycleConfig {
            tick_us: rng.range(0, 30_000),
            sync_grace_us: rng.range(0, 50_000),
            drain_timeout_us: rng.range(20_000, 200_000),
            ..LifecycleConfig::new(Allocation::Create(allocator))
        };
        self.churn = Some(Churn {
            lifecycle: Lifecycle::new(config, 0),
            ids: BTreeMap::new(),
            names: BTreeMap::new(),
            crash_prob: [0.0, 0.2, 0.5][rng.range(0, 2) as usize],
            live_max,
        });
        self.at(0, Ev::Lifecycle);
    }

    /// Tells the snapshot store about an allocator-created executor.
    fn churn_update(&mut self, id: ExecutorId, state: ExecutorState) {
        let now = self.now_us;
        if let Some(c) = self.churn.as_mut() {
            if let Some(name) = c.names.get(&id) {
                c.lifecycle.handle_update(name, state, now);
            }
        }
    }

    /// One round of the lifecycle loop.
    fn lifecycle(&mut self) -> Result<(), SimError> {
        let Some(mut c) = self.churn.take() else {
            return Ok(());
        };
        let result = self.lifecycle_step(&mut c);
        self.churn = Some(c);
        let now = self.now_us;
        if self.open_jobs() > 0 || now < 400_000 {
            self.at(now + CHURN_TICK_US, Ev::Lifecycle);
        }
        result
    }

    fn lifecycle_step(&mut self, c: &mut Churn) -> Result<(), SimError> {
        let now = self.now_us;
        self.report_load(c);
        c.lifecycle.handle_timeout(now);
        while let Some(output) = c.lifecycle.poll_output() {
            if self.verbose {
                eprintln!("{now:>9}   lifecycle {output:?}");
            }
            match output {
                LifecycleOutput::Create(names) => self.create_churn(c, names),
                LifecycleOutput::Drain(names) => self.drain_churn(c, names)?,
                LifecycleOutput::Delete { name, .. } => self.delete_churn(c, name)?,
                LifecycleOutput::Remove(name, reason) => self.remove_churn(c, name, reason)?,
                LifecycleOutput::List => self.list_churn(c),
                LifecycleOutput::Changed(..) => {}
                LifecycleOutput::RequestTotal(total) => {
                    return self.fail(format!("a creating allocator asked for a total {total}"));
                }
                LifecycleOutput::Stop(reason) => {
                    return self.fail(format!("allocator stopped: {reason}"));
                }
            }
        }
        let live = c.lifecycle.stats().allocator.peak as usize;
        if live > c.live_max {
            return self.fail(format!(
                "allocator kept {live} executors, more than {}",
                c.live_max
            ));
        }
        Ok(())
    }

    /// A gone executor's removal (of dead executors only) reaches the scheduler a little later.
    fn remove_churn(
        &mut self,
        c: &mut Churn,
        name: String,
        reason: RemovalReason,
    ) -> Result<(), SimError> {
        let Some(&id) = c.ids.get(&name) else {
            return self.fail(format!("removal of unknown executor {name}"));
        };
        if self.execs.get(&id).is_some_and(|e| e.alive) {
            return self.fail(format!("removal of live {id:?} ({reason})"));
        }
        let t = self.now_us + self.rng.range(0, 5_000);
        self.at(t, Ev::Remove(id, reason));
        Ok(())
    }

    /// The poll source: every allocator-made executor whose process exists (started, not
    /// deleted, refused or crashed), running once registered.
    fn list_churn(&mut self, c: &mut Churn) {
        let listing: Vec<(String, ExecutorState)> = (c.ids.iter())
            .filter_map(|(name, id)| {
                let e = self.execs.get(id)?;
                let exists = !e.deleted && !e.retired && (e.alive || !e.registered);
                let state = match (exists, e.alive && e.registered) {
                    (false, _) => return None,
                    (true, true) => ExecutorState::Running,
                    (true, false) => ExecutorState::Pending,
                };
                Some((name.clone(), state))
            })
            .collect();
        c.lifecycle.handle_listing(listing, self.now_us);
    }

    /// The lifecycle drains executors `names`: the scheduler stops offering them work.
    fn drain_churn(&mut self, c: &mut Churn, names: Vec<String>) -> Result<(), SimError> {
        for name in names {
            let Some(&id) = c.ids.get(&name) else {
                return self.fail(format!("drain of unknown executor {name}"));
            };
            if !self.sched.drain_executor(id) {
                return self.fail(format!("drain of unregistered {id:?}"));
            }
            if let Some(e) = self.execs.get_mut(&id) {
                e.draining = true;
            }
        }
        Ok(())
    }

    /// Tells the lifecycle the backlog and each of its registered executors' busy cores.
    fn report_load(&mut self, c: &mut Churn) {
        let now = self.now_us;
        let pending = self.sched.pending_tasks();
        let running = self.sched.unfinished_tasks().saturating_sub(pending);
        let executors: Vec<(&str, u32)> = c
            .ids
            .iter()
            .filter(|(_, id)| self.execs.get(id).is_some_and(|e| e.alive && e.registered))
            .filter_map(|(name, id)| {
                let (cores, free) = self.sched.executor_cores(*id)?;
                Some((name.as_str(), cores - free))
            })
            .collect();
        c.lifecycle.handle_load(pending, running, executors, now);
    }

    /// The allocator created executors `names`: each gets an id and cores, most register, some
    /// crash later.
    fn create_churn(&mut self, c: &mut Churn, names: Vec<String>) {
        let now = self.now_us;
        for name in names {
            let id = ExecutorId(CHURN_ID_BASE + self.report.executors_created);
            self.report.executors_created += 1;
            let info = ExecutorInfo {
                id,
                host: "host-churn".into(),
                cores: self.rng.range(1, 3) as u32,
                attributes: Vec::new(),
            };
            self.execs.insert(id, SimExec::new(info, 1));
            c.ids.insert(name.clone(), id);
            c.names.insert(id, name.clone());
            // One in ten never registers (the pending timeout deletes it).
            if !self.rng.chance(0.1) {
                let t = now + self.rng.range(1_000, 30_000);
                self.at(t, Ev::Register(id));
            }
            if self.rng.chance(c.crash_prob) {
                let t = now + self.rng.range(5_000, 200_000);
                self.at(t, Ev::Exit(id));
            }
        }
    }

    /// The lifecycle deleted executor `name`: it stops at once (a drained one runs nothing
    /// unless its drain timed out).
    fn delete_churn(&mut self, c: &mut Churn, name: String) -> Result<(), SimError> {
        let now = self.now_us;
        let Some(&id) = c.ids.get(&name) else {
            return self.fail(format!("deletion of unknown executor {name}"));
        };
        if let Some(e) = self.execs.get_mut(&id) {
            e.deleted = true;
            e.alive = false;
            e.running.clear();
        }
        c.lifecycle
            .handle_update(&name, ExecutorState::Deleted, now);
        Ok(())
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
            let timeout = self.sched.poll_timeout();
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
            for &(task, _) in e.held.keys() {
                self.tainted.insert(TaskId(task).job());
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
        if self.verbose {
            eprintln!("{:>9} tick", self.now_us);
        }
        self.sched.tick(self.now_us);
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
            Ev::Complete(id, task, attempt) => self.on_complete(id, task, attempt),
            Ev::KillArrive(id, task, attempt) => self.on_kill_arrive(id, task, attempt),
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

    /// An executor registers: accepted, or refused (an excluded host), as expected. Returns false if the event is ignored (then nothing follows it).
    fn on_register(&mut self, id: ExecutorId) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(e) = self.execs.get(&id) else {
            return Ok(false);
        };
        if e.deleted {
            return Ok(false);
        }
        let info = e.info.clone();
        match self.sched.register_executor(now, info) {
            Ok(()) => {
                if let Some(e) = self.execs.get_mut(&id) {
                    e.alive = true;
                    e.registered = true;
                }
                self.churn_update(id, ExecutorState::Running);
            }
            Err(Refusal::HostExcluded { .. }) => {
                self.report.refusals += 1;
                if let Some(e) = self.execs.get_mut(&id) {
                    e.retired = true;
                }
                // A refused executor exits (code 3).
                self.churn_update(
                    id,
                    ExecutorState::Failed {
                        code: 3,
                        caused_by_app: false,
                    },
                );
            }
            Err(r) => return self.fail(format!("unexpected refusal of {id:?}: {r}")),
        }
        Ok(true)
    }

    /// A registered executor registers again: refused as a duplicate. Returns false if the event is ignored (then nothing follows it).
    fn on_register_duplicate(&mut self, id: ExecutorId) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(e) = self.execs.get(&id) else {
            return Ok(false);
        };
        if !e.registered {
            return Ok(false);
        }
        let info = e.info.clone();
        match self.sched.register_executor(now, info) {
            Err(Refusal::DuplicateId(d)) if d == id => self.report.refusals += 1,
            other => return self.fail(format!("duplicate registration of {id:?}: {other:?}")),
        }
        Ok(true)
    }

    /// A live executor dies: its removal reaches the scheduler later (sometimes first as a lost connection, the exit reason after).
    fn on_die(&mut self, id: ExecutorId, reason: RemovalReason) {
        let now = self.now_us;
        if let Some(e) = self.execs.get_mut(&id) {
            if e.alive {
                e.alive = false;
                e.running.clear();
                self.report.executors_lost += 1;
                let t = now + self.rng.range(0, 50_000);
                if reason.caused_by_app() && self.rng.chance(0.5) {
                    // The connection closes first (lost, no word on whose fault); the
                    // cluster manager's exit reason comes later and is charged then.
                    self.taint_held(id);
                    self.at(t, Ev::Remove(id, RemovalReason::Lost("closed".into())));
                    let late = t + self.rng.range(1, 30_000);
                    self.at(late, Ev::Remove(id, reason));
                } else {
                    self.at(t, Ev::Remove(id, reason));
                }
            }
        }
    }

    /// An executor is removed from the scheduler, noting which jobs a late exit reason is charged to.
    fn on_remove(&mut self, id: ExecutorId, reason: RemovalReason) -> Result<(), SimError> {
        let now = self.now_us;
        if reason.caused_by_app() {
            self.taint_held(id);
            // A late reason is charged to what the executor held when it was lost.
            for job in self.lost_held.remove(&id).unwrap_or_default() {
                self.tainted.insert(job);
            }
        } else if matches!(reason, RemovalReason::Lost(_)) {
            if let Some(e) = self.execs.get(&id) {
                let jobs = e.held.keys().map(|&(t, _)| TaskId(t).job()).collect();
                self.lost_held.insert(id, jobs);
            }
        }
        let registered = self.execs.get(&id).is_some_and(|e| e.registered);
        let removed = self.sched.remove_executor(now, id, reason);
        if removed != registered {
            return self.fail(format!(
                "remove_executor({id:?}) returned {removed}, registered = {registered}"
            ));
        }
        if let Some(e) = self.execs.get_mut(&id) {
            e.registered = false;
            e.retired = true;
            e.held.clear();
        }
        Ok(())
    }

    /// Planned job `j` is submitted: accepted, or refused by backpressure. Returns false if the event is ignored (then nothing follows it).
    fn on_submit(&mut self, j: usize) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(job) = self.jobs.get(j) else {
            return Ok(false);
        };
        let spec = job.spec.clone();
        let n = spec.tasks.len() as u64;
        match self.sched.submit_job(now, spec) {
            Ok(id) => {
                self.job_index.insert(id, j);
                if let Some(job) = self.jobs.get_mut(j) {
                    job.id = Some(id);
                }
                self.report.jobs += 1;
                self.report.tasks += n;
            }
            Err(crate::scheduler::SubmitError::TooManyPending { .. }) => {
                self.report.jobs_refused += 1;
            }
            Err(e) => return self.fail(format!("unexpected submit error: {e}")),
        }
        Ok(true)
    }

    /// Planned job `j` is cancelled: accepted exactly when the job is open. Returns false if the event is ignored (then nothing follows it).
    fn on_cancel(&mut self, j: usize) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(id) = self.jobs.get(j).and_then(|job| job.id) else {
            return Ok(false);
        };
        let open = self.jobs.get(j).is_some_and(|job| job.outcome.is_none());
        let accepted = self.sched.cancel_job(now, id);
        if accepted != open {
            return self.fail(format!(
                "cancel_job({id:?}) returned {accepted} but the job is open: {open}"
            ));
        }
        if let Some(job) = self.jobs.get_mut(j) {
            job.cancelled |= accepted;
        }
        Ok(true)
    }

    /// Task `i` of planned job `j` is killed: accepted exactly when the task is open. Returns false if the event is ignored (then nothing follows it).
    fn on_kill_task(&mut self, j: usize, i: u32) -> Result<bool, SimError> {
        let now = self.now_us;
        let Some(id) = self.jobs.get(j).and_then(|job| job.id) else {
            return Ok(false);
        };
        let task = TaskId::new(id, i);
        let open = !self.results.contains_key(&task);
        let killed = self.sched.kill_task(now, task, "user request");
        if killed != open {
            return self.fail(format!(
                "kill_task({task}) returned {killed} but task open = {open}"
            ));
        }
        Ok(true)
    }

    /// A launch reaches executor `id`: it runs (within its cores) and completes later. Returns false if the event is ignored (then nothing follows it).
    fn on_arrive(&mut self, id: ExecutorId, launch: TaskLaunch) -> Result<bool, SimError> {
        let now = self.now_us;
        let slowness = match self.execs.get(&id) {
            Some(e) if e.alive => e.slowness,
            _ => return Ok(false),
        };
        let run = self.rng.range(1_000, 20_000) * slowness;
        let key = (launch.task.0, launch.attempt);
        if let Some(e) = self.execs.get_mut(&id) {
            e.running.insert(key, launch.cores);
            let used: u32 = e.running.values().sum();
            if used > e.info.cores {
                let msg = format!("executor {id:?} runs {used} cores of {}", e.info.cores);
                return self.fail(msg);
            }
        }
        self.at(now + run, Ev::Complete(id, key.0, key.1));
        if self.rng.chance(0.3) {
            let t = now + self.net_delay();
            self.send(t, id, key, TaskState::Running, Bytes::new());
        }
        Ok(true)
    }

    /// An attempt running on executor `id` ends: failed (injected), killed, lost or finished, reported (sometimes twice). Returns false if the event is ignored (then nothing follows it).
    fn on_complete(&mut self, id: ExecutorId, task: u64, attempt: u32) -> bool {
        let now = self.now_us;
        let Some(e) = self.execs.get_mut(&id) else {
            return false;
        };
        if !e.alive || e.running.remove(&(task, attempt)).is_none() {
            return false;
        }
        let t = now + self.net_delay();
        let roll = self.rng.next_u64() % 1000;
        let (state, data) = if self.rng.chance(self.failure_prob) {
            self.report.failures_injected += 1;
            (TaskState::Failed, Bytes::from_static(b"injected failure"))
        } else if roll < 20 {
            // The executor kills the attempt on its own (preempted): never counted.
            (TaskState::Killed, Bytes::from_static(b"preempted"))
        } else if roll < 23 {
            (TaskState::Lost, Bytes::new())
        } else {
            self.finished_by_exec.insert(TaskId(task));
            (TaskState::Finished, expected_result(TaskId(task)))
        };
        self.send(t, id, (task, attempt), state, data.clone());
        if self.rng.chance(0.05) {
            let t2 = t + self.net_delay();
            self.send(t2, id, (task, attempt), state, data);
        }
        true
    }

    /// A kill reaches executor `id`: a running attempt is reported killed. Returns false if the event is ignored (then nothing follows it).
    fn on_kill_arrive(&mut self, id: ExecutorId, task: u64, attempt: u32) -> bool {
        let now = self.now_us;
        let Some(e) = self.execs.get_mut(&id) else {
            return false;
        };
        if e.alive && e.running.remove(&(task, attempt)).is_some() {
            let t = now + self.net_delay();
            self.send(t, id, (task, attempt), TaskState::Killed, Bytes::new());
        }
        true
    }

    /// An allocator-created executor crashes: the snapshot store hears of its exit.
    fn on_exit(&mut self, id: ExecutorId) {
        let crashed = match self.execs.get_mut(&id) {
            Some(e) if e.alive && !e.deleted => {
                e.alive = false;
                e.running.clear();
                true
            }
            _ => false,
        };
        if crashed {
            self.report.executors_lost += 1;
            let caused_by_app = self.rng.chance(0.5);
            self.churn_update(
                id,
                ExecutorState::Failed {
                    code: 137,
                    caused_by_app,
                },
            );
        }
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
        key: (u64, u32),
        state: TaskState,
        data: Bytes,
    ) {
        let update = StatusUpdate {
            executor,
            task: TaskId(key.0),
            attempt: key.1,
            state,
            data,
        };
        self.at(t_us, Ev::Deliver(update));
    }

    fn deliver(&mut self, update: StatusUpdate) -> Result<(), SimError> {
        let key = (update.task.0, update.attempt);
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
        self.sched.status_update(self.now_us, update);
        if lost {
            // The scheduler treats a LOST task as its executor lost.
            if self.sched.executor_cores(id).is_some() {
                return self.fail(format!("{id:?} reported LOST but is still registered"));
            }
            if let Some(e) = self.execs.get_mut(&id) {
                // Removed as lost: a late exit reason may still charge what it held.
                let jobs = e.held.keys().map(|&(t, _)| TaskId(t).job()).collect();
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

    /// Takes the scheduler's outputs, checking each.
    fn drain(&mut self) -> Result<(), SimError> {
        while let Some(out) = self.sched.poll_output() {
            if self.verbose {
                eprintln!("{:>9}   out {out:?}", self.now_us);
            }
            match out {
                Output::Launch { executor, tasks } => {
                    for launch in tasks {
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
                    self.at(t, Ev::KillArrive(executor, task.0, attempt));
                }
                Output::TaskResult { task, result } => self.on_result(task, result)?,
                Output::JobOutcome { job, outcome } => self.on_outcome(job, outcome)?,
            }
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
        e.held.insert((launch.task.0, launch.attempt), launch.cores);
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
        let n = pj.spec.tasks.len() as u32;
        let mut all_ok = true;
        let mut results = Vec::new();
        for i in 0..n {
            match self.results.get(&TaskId::new(job, i)) {
                None => return self.fail(format!("{job:?} outcome before task {i}'s report")),
                Some(Ok(b)) => results.push(b.clone()),
                Some(Err(_)) => all_ok = false,
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

    /// A job reported succeeded with results `r`: all its tasks did (`all_ok`, their
    /// `results`), the results kept are those and within its bound, and it was neither
    /// cancelled nor oversized.
    fn check_succeeded(
        &self,
        job: JobId,
        pj: &PlannedJob,
        r: &[Bytes],
        all_ok: bool,
        results: Vec<Bytes>,
    ) -> Result<(), SimError> {
        let kept = if pj.spec.keep_results {
            results
        } else {
            Vec::new()
        };
        if !all_ok || *r != kept {
            return self.fail(format!("{job:?} succeeded but not all tasks did"));
        }
        let kept_bytes: usize = kept.iter().map(Bytes::len).sum();
        if pj
            .spec
            .result_bytes_max
            .is_some_and(|max| kept_bytes as u64 > max)
        {
            return self.fail(format!(
                "{job:?} kept {kept_bytes} result bytes, over its bound"
            ));
        }
        if pj.cancelled || pj.oversized {
            return self.fail(format!("{job:?} succeeded though cancelled or oversized"));
        }
        Ok(())
    }

    /// A job reported failed for `reasons`: some task failed (not `all_ok`), it was not
    /// cancelled, and a reason explains it.
    fn check_failed(
        &self,
        job: JobId,
        pj: &PlannedJob,
        reasons: &[String],
        all_ok: bool,
    ) -> Result<(), SimError> {
        if all_ok || reasons.is_empty() {
            return self.fail(format!("{job:?} failed with all tasks ok: {reasons:?}"));
        }
        if pj.cancelled {
            return self.fail(format!("{job:?} was cancelled but reported failed"));
        }
        if pj.oversized && !reasons.iter().any(|r| r.contains("payload_max_bytes")) {
            return self.fail(format!("{job:?} oversized, reasons: {reasons:?}"));
        }
        // A job fails only for a reason: a counted failure (a FAILED report or an
        // exit the app caused, which taint the job), a kill by the user, a limit, or a
        // task nothing can run. Kills by executors and losses never count.
        let explained = self.tainted.contains(&job)
            || pj.oversized
            || reasons.iter().any(|r| {
                [
                    "killed:",
                    "result_bytes_max",
                    "no executor could run",
                    "cannot run anywhere",
                ]
                .iter()
                .any(|why| r.contains(why))
            });
        if !explained {
            return self.fail(format!(
                "{job:?} failed with no counted failure, kill or limit: {reasons:?}"
            ));
        }
        Ok(())
    }

    /// The per-step invariants that look at the whole state.
    fn check(&mut self) -> Result<(), SimError> {
        let now = self.now_us;
        let mut idle = Vec::new();
        for (id, e) in &self.execs {
            let view = self.sched.executor_cores(*id);
            if !e.registered {
                if view.is_some() {
                    return self.fail(format!("{id:?} removed but the scheduler still has it"));
                }
                continue;
            }
            let held: u32 = e.held.values().sum();
            let expected = Some((e.info.cores, e.info.cores - held.min(e.info.cores)));
            if view != expected {
                return self.fail(format!(
                    "{id:?}: scheduler says (cores, free) = {view:?}, expected {expected:?}"
                ));
            }
            // Slots it may be given now: free within its slow-start window, none while stalled.
            let free = self.sched.executor_usable(*id).unwrap_or(0);
            if free >= TASK_CORES_MAX && !self.sched.is_excluded(now, *id, None) {
                for job in self.jobs.iter().filter_map(|j| j.id) {
                    if self.tainted.contains(&job) {
                        continue;
                    }
                    if self.sched.job_pending_tasks(job).is_some_and(|p| p > 0)
                        && !self.sched.is_excluded(now, *id, Some(job))
                    {
                        idle.push((*id, job));
                    }
                }
            }
        }
        self.idle_since_us.retain(|id, _| idle.contains(id));
        for (id, job) in idle {
            let since = *self.idle_since_us.entry((id, job)).or_insert(now);
            if now - since > self.idle_limit_us {
                return self.fail(format!(
                    "{id:?} idle for {} us while {job:?} has runnable tasks (limit {} us)",
                    now - since,
                    self.idle_limit_us
                ));
            }
        }
        Ok(())
    }

    /// End-of-run checks: everything accepted was reported, nothing is left inside.
    fn finish(&mut self) -> Result<(), SimError> {
        for pj in &self.jobs {
            if let Some(id) = pj.id {
                if pj.outcome.is_none() {
                    return self.fail(format!("{id:?} never got an outcome"));
                }
            }
        }
        if self.sched.unfinished_tasks() != 0 || self.sched.active_jobs() != 0 {
            return self.fail(format!(
                "run ended with {} unfinished tasks and {} active jobs inside the scheduler",
                self.sched.unfinished_tasks(),
                self.sched.active_jobs()
            ));
        }
        Ok(())
    }
}
