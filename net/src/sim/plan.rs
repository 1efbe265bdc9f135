//! The scenario of a seed: the driver's settings, the executors (some late, some sharing a
//! name, some that crash, break, or stall), the hostile peers, the jobs (sizes, cancels,
//! deadlines, dropped handles, results kept or not, streamed or not), each at its time.

use std::time::Duration;

use bytes::Bytes;
use flint_engine::scheduler::{HedgeConfig, SpeculationConfig};
use flint_engine::sim::Rng;

use crate::driver::{DriverConfig, EXECUTOR_CORES_MAX};
use crate::handshake::Secret;
use crate::sim::hostile::Mode;
use crate::sim::ledger::PlannedJob;
use crate::sim::network::WINDOW_BYTES_DEFAULT;

/// The most executors a scenario starts (counting restarts and duplicates).
pub const EXECUTORS_MAX: usize = 8;

/// An executor as planned.
#[derive(Clone, Debug)]
pub struct PlannedExec {
    /// Its name (two may share one: the second must be refused while the first is known).
    pub name: String,
    /// Cores it claims.
    pub cores: u32,
    /// Run time multiplier.
    pub slowness: u64,
    /// Chance that an attempt fails.
    pub failure_prob: f64,
}

/// Something that happens at a planned time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ev {
    /// Executor `i` starts and connects.
    Join(usize),
    /// Executor `i`'s process dies; `loud`: its host resets the connection (the driver hears
    /// of it), else the driver hears nothing (only heartbeat expiry tells).
    Crash(usize, bool),
    /// Executor `i`'s connection breaks; both ends are told.
    Break(usize),
    /// Executor `i` stops reading (its bytes pile up); `frozen`: it also runs and sends
    /// nothing.
    Stall(usize, bool),
    /// Executor `i` thaws.
    Unstall(usize),
    /// Hostile peer `h` connects.
    Hostile(usize),
    /// Hostile peer `h` tells its lies.
    Lie(usize),
    /// Job `j` is submitted.
    Submit(usize),
    /// Job `j` is cancelled through its handle.
    Cancel(usize),
    /// Job `j`'s handle is dropped.
    Drop(usize),
}

/// A whole scenario.
#[derive(Debug)]
pub struct Plan {
    /// The driver's settings.
    pub config: DriverConfig,
    /// Executors, by index.
    pub executors: Vec<PlannedExec>,
    /// Hostile peers' modes, by index.
    pub hostiles: Vec<Mode>,
    /// Jobs, by index.
    pub jobs: Vec<PlannedJob>,
    /// What happens when, in time order.
    pub events: Vec<(u64, Ev)>,
    /// Whether the scheduler may copy stragglers or hedge (two attempts of a task at once).
    pub speculation: bool,
    /// Undelivered bytes a connection holds each way (small: a stalled peer's pile-up fills it).
    pub window_bytes_max: usize,
}

/// Draws the scenario of `rng`'s seed; `bursts`: on one seed in twenty, also a burst of many
/// small jobs (see [`plan_jobs`]).
pub fn plan(rng: &mut Rng, bursts: bool) -> Plan {
    let config = driver_config(rng);
    let speculation = config.scheduler.speculation.is_some() || config.scheduler.hedging.is_some();
    let mut plan = Plan {
        config,
        executors: Vec::new(),
        hostiles: Vec::new(),
        jobs: Vec::new(),
        events: Vec::new(),
        speculation,
        window_bytes_max: [WINDOW_BYTES_DEFAULT, WINDOW_BYTES_DEFAULT, 2 << 10, 256]
            [rng.range(0, 3) as usize],
    };
    plan_executors(rng, &mut plan);
    plan_hostiles(rng, &mut plan);
    plan_jobs(rng, &mut plan, bursts);
    plan.events.sort_by_key(|&(t, _)| t);
    plan
}

fn driver_config(rng: &mut Rng) -> DriverConfig {
    let heartbeat_interval_ms = rng.range(100, 300);
    let heartbeat_timeout_ms = heartbeat_interval_ms * rng.range(3, 6);
    let mut config = DriverConfig {
        secret: rng
            .chance(0.3)
            .then(|| Secret::new(b"the simulated cluster's secret".to_vec()).ok())
            .flatten(),
        heartbeat_interval: Duration::from_millis(heartbeat_interval_ms),
        heartbeat_timeout: Duration::from_millis(heartbeat_timeout_ms),
        handshake_timeout: Duration::from_millis(rng.range(300, 2_000)),
        tasks_per_core: rng.range(1, 4) as u32,
        outbound_max: if rng.chance(0.2) { 4 << 10 } else { 256 << 20 },
        ..DriverConfig::default()
    };
    config.scheduler.seed = rng.next_u64();
    config.scheduler.locality_wait_executor_us = rng.range(0, 20_000);
    config.scheduler.locality_wait_host_us = rng.range(0, 20_000);
    config.scheduler.max_failures = rng.range(1, 4) as u32;
    config.scheduler.slow_start_slots = if rng.chance(0.5) {
        u32::MAX
    } else {
        rng.range(1, 4) as u32
    };
    config.scheduler.unschedulable_timeout_us = 30_000_000;
    config.scheduler.speculation = rng.chance(0.5).then(|| SpeculationConfig {
        multiplier: 1.5,
        quantile: 0.5,
        min_runtime_us: rng.range(0, 20_000),
        interval_us: rng.range(1_000, 50_000),
        timeout_us: rng.range(20_000, 2_000_000),
    });
    // Hedging on in half the seeds, with floors from a tenth of a heartbeat to a few.
    config.scheduler.hedging = rng.chance(0.5).then(|| HedgeConfig {
        floor_us: rng.range(500, 1_000_000),
        cold_us: rng.range(1_000, 2_000_000),
        min_samples: rng.range(2, 20) as u32,
        copy_ratio: [0.01, 0.05, 0.5][rng.range(0, 2) as usize],
        burst: rng.range(1, 64) as u32,
        ..HedgeConfig::default()
    });
    config
}

/// Executor 0 joins early, never fails and has a name of its own (so every job can end); the
/// others may join late, crash, break or stall; one may reuse another's name, one may restart
/// under its old name.
fn plan_executors(rng: &mut Rng, plan: &mut Plan) {
    let failure_prob = [0.0, 0.02, 0.1][rng.range(0, 2) as usize];
    let n = rng.range(1, 6) as usize;
    for i in 0..n {
        // Now and then one claims more cores than a driver accepts: it must be refused.
        let cores = if i > 0 && rng.chance(0.03) {
            EXECUTOR_CORES_MAX + 1
        } else {
            rng.range(1, 4) as u32
        };
        let exec = PlannedExec {
            name: format!("exec-{i}"),
            cores,
            slowness: if i > 0 && rng.chance(0.2) { 10 } else { 1 },
            failure_prob,
        };
        plan.executors.push(exec);
        let join_us = if i == 0 || rng.chance(0.6) {
            rng.range(0, 50_000)
        } else {
            rng.range(0, 1_000_000)
        };
        plan.events.push((join_us, Ev::Join(i)));
        if i > 0 {
            plan_faults(rng, plan, i, join_us);
        }
    }
    // A second executor under a name already taken (not executor 0's: it must register).
    if n > 1 && rng.chance(0.2) {
        let twin = rng.range(1, n as u64 - 1) as usize;
        let mut exec = plan.executors[twin].clone();
        exec.cores = 1;
        let i = plan.executors.len();
        plan.executors.push(exec);
        plan.events.push((rng.range(0, 1_000_000), Ev::Join(i)));
    }
    // A crashed executor restarting under its old name.
    if plan.executors.len() < EXECUTORS_MAX && n > 1 && rng.chance(0.3) {
        let old = rng.range(1, n as u64 - 1) as usize;
        let i = plan.executors.len();
        let exec = plan.executors[old].clone();
        plan.executors.push(exec);
        let crash_us = rng.range(50_000, 800_000);
        plan.events
            .push((crash_us, Ev::Crash(old, rng.chance(0.5))));
        plan.events
            .push((crash_us + rng.range(0, 500_000), Ev::Join(i)));
    }
}

fn plan_faults(rng: &mut Rng, plan: &mut Plan, i: usize, join_us: u64) {
    let at = |rng: &mut Rng| join_us + rng.range(1_000, 1_500_000);
    if rng.chance(0.15) {
        let t = at(rng);
        plan.events.push((t, Ev::Crash(i, rng.chance(0.5))));
    }
    if rng.chance(0.1) {
        let t = at(rng);
        plan.events.push((t, Ev::Break(i)));
    }
    if rng.chance(0.15) {
        let t = at(rng);
        // Deaf (heartbeating, not reading: the driver notices its heartbeats counting fewer
        // attempts than it was sent) or frozen (heartbeat expiry notices).
        let frozen = rng.chance(0.5);
        plan.events.push((t, Ev::Stall(i, frozen)));
        if rng.chance(0.7) {
            plan.events
                .push((t + rng.range(10_000, 3_000_000), Ev::Unstall(i)));
        }
    }
}

fn plan_hostiles(rng: &mut Rng, plan: &mut Plan) {
    let n = [0, 0, 1, 1, 2][rng.range(0, 4) as usize];
    for h in 0..n {
        let modes = [
            Mode::Garbage,
            Mode::WrongHandshake,
            Mode::Liar,
            Mode::Liar,
            Mode::Interloper,
        ];
        let mode = modes[rng.range(0, modes.len() as u64 - 1) as usize];
        plan.hostiles.push(mode);
        let t = rng.range(0, 600_000);
        plan.events.push((t, Ev::Hostile(h)));
        for _ in 0..rng.range(1, 4) {
            plan.events
                .push((t + rng.range(1_000, 500_000), Ev::Lie(h)));
        }
    }
}

/// One to six jobs of random sizes; with `bursts`, on one seed in twenty, a burst of 70 to 100
/// one-task jobs besides (more jobs at once than the driver scans on every input). The burst
/// is drawn from a stream of its own, so turning it on leaves every other scenario as it was.
fn plan_jobs(rng: &mut Rng, plan: &mut Plan, bursts: bool) {
    let n = rng.range(1, 6) as usize;
    let mut burst_rng = Rng::new(plan.config.scheduler.seed ^ 0xb0b5_7000_0000_0001);
    let burst = if bursts && burst_rng.chance(0.05) {
        burst_rng.range(70, 100) as usize
    } else {
        0
    };
    let burst_us = burst_rng.range(0, 500_000);
    for j in 0..n + burst {
        if j >= n {
            let job = PlannedJob {
                payloads: vec![Bytes::from(j.to_le_bytes().to_vec())],
                keep_results: true,
                stream: false,
                deadline_us: None,
                cancel_us: None,
                drop_us: None,
            };
            plan.events
                .push((burst_us + burst_rng.range(0, 2_000), Ev::Submit(j)));
            plan.jobs.push(job);
            continue;
        }
        let tasks = match rng.range(0, 9) {
            0 => 0,
            1..=6 => rng.range(1, 12),
            _ => rng.range(13, 60),
        };
        let payloads = (0..tasks)
            .map(|_| {
                let len = rng.range(0, 24) as usize;
                Bytes::from((0..len).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>())
            })
            .collect();
        let submit_us = rng.range(0, 800_000);
        let job = PlannedJob {
            payloads,
            keep_results: rng.chance(0.7),
            stream: rng.chance(0.3),
            deadline_us: rng.chance(0.15).then(|| rng.range(1_000, 500_000)),
            cancel_us: rng.chance(0.1).then(|| submit_us + rng.range(0, 200_000)),
            drop_us: rng.chance(0.1).then(|| submit_us + rng.range(0, 200_000)),
        };
        plan.events.push((submit_us, Ev::Submit(j)));
        if let Some(t) = job.cancel_us {
            plan.events.push((t, Ev::Cancel(j)));
        }
        if let Some(t) = job.drop_us {
            plan.events.push((t, Ev::Drop(j)));
        }
        plan.jobs.push(job);
    }
}
