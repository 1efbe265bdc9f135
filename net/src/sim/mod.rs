//! The cluster simulator: the real `DriverCore` (`driver/core.rs`) and 1 to 8 real
//! [`ExecutorCore`](crate::executor::ExecutorCore)s in one thread on one simulated clock, with
//! faults, so every seed tests the protocol users run. A test tool, not part of a production
//! driver: `#[doc(hidden)] pub` rather than behind a cargo feature, so `cargo test -p flint-net`,
//! the `cluster_sim` example and `ci/sim` (which runs it beside the scheduler's simulator in
//! `flint_engine::sim`, the one that fuzzes the scheduler alone) build it with no flags and a
//! feature cannot be left off by accident.
//!
//! [`run_seed`] draws a scenario from a seed (`plan.rs`) and plays it: between the driver and
//! each peer a simulated TCP connection (`network.rs`) delivers bytes in order after seeded
//! delays, cut into random chunks, through per-seed socket windows; connections break (both
//! ends told); executors crash (the driver hears a reset later, or nothing: heartbeat expiry),
//! go deaf (they heartbeat but read nothing: their bytes pile up) or freeze, join late, reuse a
//! name, restart under their old one; an executor of 2 or 3 cores runs that many lanes (each
//! its own connection and core, joining once lane 0 is registered, one fate for all), and a
//! break or deafness may hit any one of its lanes; hostile peers (`hostile.rs`) send garbage, a wrong
//! handshake, or, registered, status updates for attempts they were never given, with the very
//! bytes an honest run would return. Each executor runs its launches on a fake runner
//! (`runner.rs`). Jobs go through the driver's submit path with real
//! [`JobHandle`](crate::job::JobHandle)s: random sizes, some cancelled, some with deadlines,
//! some handles dropped, some not keeping results, some streaming. The IO sides of the cores
//! (`nodes.rs`) do what the endpoints do: decode frames, drop a connection that does not read.
//! The clock jumps to the earliest of the planned events, the network's next delivery and the
//! nodes' `poll_timeout`s.
//!
//! After every step (`ledger.rs` holds the job checks):
//!
//! - every job handle gets exactly one outcome; a success iff every task's result is bytes an
//!   executor's run of that task produced from its own payload (a forgery of the same bytes
//!   does not count: the ledger records only runs that happened); results observed and
//!   streamed give each task once; a failure has a cause the scenario made (an injected
//!   failure, a deadline, no executor), never a lie; a job cancelled or dropped while open ends
//!   cancelled, and only those do;
//! - no attempt is launched twice, each with its own task's payload; no task runs on two
//!   executors the driver both still holds unless speculation or hedging may have copied it;
//!   hedged copies within their bucket (`burst` plus `copy_ratio` of the first launches); no two
//!   registered peers the driver holds share a name;
//! - the driver's `handle_timeout(now)` leaves no deadline at or before `now` (its loop would
//!   spin);
//! - progress: every job ends before a generous deadline.
//!
//! At the end, with no jobs, the idle driver must not tick: over a quiet window it wakes no
//! more than its peers' frames and expiry checks explain, and once every peer has gone it
//! takes at most a few last wakes, then its `poll_timeout` is `None`, it holds no job, task or
//! executor, and its own count of outcomes equals what the handles saw (plus the dropped ones,
//! cancelled).
//!
//! Logging: the simulator's events and the cores' own logs go to `tracing` (the simulator's at
//! debug, target `flint_net::sim`); `SIM_VERBOSE=1 ci/sim --cluster --seed S` prints them. A
//! failure names the seed and the command that replays it.

mod hostile;
mod ledger;
mod network;
mod nodes;
mod plan;
mod runner;

use std::collections::BTreeMap;
use std::fmt;

use flint_engine::sim::Rng;

use crate::driver::EXECUTOR_CORES_MAX;
use crate::executor::ExecutorConfig;
use crate::job::Job;
use crate::sim::hostile::Hostile;
use crate::sim::ledger::{Ledger, Observed};
use crate::sim::network::{ConnId, Delivery, End, Network};
use crate::sim::nodes::{us, DriverNode, ExecNode, Liveness};
use crate::sim::plan::{Ev, Plan};

/// The function every simulated job names.
const FUNCTION: &str = "sim";
/// Simulated time by which every job must have ended.
const DEADLINE_US: u64 = 600_000_000;
/// Steps after which a run counts as stuck (guards against livelock).
const STEPS_MAX: u64 = 3_000_000;
/// Wakes an idle driver with no peers may still take before it must want none.
const IDLE_WAKES_MAX: usize = 4;
/// Steps the shutdown at the end may take.
const SHUTDOWN_STEPS_MAX: u64 = 100_000;

/// What a run did (for reports and for checking that scenarios exercise things).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimReport {
    /// Steps played.
    pub steps: u64,
    /// Simulated time at the end, micros.
    pub end_us: u64,
    /// Jobs the driver accepted.
    pub jobs: u64,
    /// Outcomes seen by handles: succeeded, failed, cancelled.
    pub outcomes: [u64; 3],
    /// Tasks in accepted jobs.
    pub tasks: u64,
    /// Attempts launched on executors.
    pub launched: u64,
    /// Executors started.
    pub executors: u64,
    /// Executors that ended refused (a duplicate name, a bad handshake).
    pub refused: u64,
    /// Executors crashed, broken off or stalled by the scenario.
    pub faults: u64,
    /// Lanes started after lane 0 (executors of more than one core).
    pub lanes: u64,
    /// Faults that hit a lane other than lane 0 alone (a break, deafness).
    pub lane_faults: u64,
    /// Connections the driver's IO side dropped as not reading.
    pub backlogged: u64,
    /// Status updates hostile peers sent.
    pub lies: u64,
    /// Bytes and chunks the network delivered.
    pub delivered: (u64, u64),
    /// Hedged copies queued, executors suspected (the driver's counts).
    pub hedges: (u64, u64),
}

impl SimReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &SimReport) {
        self.steps += other.steps;
        self.end_us += other.end_us;
        self.jobs += other.jobs;
        for (t, x) in self.outcomes.iter_mut().zip(other.outcomes) {
            *t += x;
        }
        self.tasks += other.tasks;
        self.launched += other.launched;
        self.executors += other.executors;
        self.refused += other.refused;
        self.faults += other.faults;
        self.lanes += other.lanes;
        self.lane_faults += other.lane_faults;
        self.backlogged += other.backlogged;
        self.lies += other.lies;
        self.delivered.0 += other.delivered.0;
        self.delivered.1 += other.delivered.1;
        self.hedges.0 += other.hedges.0;
        self.hedges.1 += other.hedges.1;
    }
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
            "cluster seed {} failed at step {} (t = {} us): {}\n  replay: SIM_VERBOSE=1 ci/sim --cluster --seed {}",
            self.seed, self.step, self.now_us, self.message, self.seed
        )
    }
}

impl std::error::Error for SimError {}

/// A peer's process, by its connection.
enum Peer {
    Exec(usize),
    Hostile(usize),
}

/// One run.
struct Sim {
    seed: u64,
    rng: Rng,
    plan: Plan,
    now_us: u64,
    step: u64,
    /// The next planned event.
    next_event: usize,
    net: Network,
    driver: DriverNode,
    execs: Vec<Option<ExecNode>>,
    hostiles: Vec<Option<(ConnId, Hostile)>>,
    peers: BTreeMap<ConnId, Peer>,
    ledger: Ledger,
    /// Planned job -> its index in the ledger, once accepted.
    job_slots: Vec<Option<usize>>,
    report: SimReport,
}

/// Runs the scenario of `seed`, checking the invariants after every step.
pub fn run_seed(seed: u64) -> Result<SimReport, SimError> {
    run(seed, BURSTS)
}

/// Whether scenarios include bursts of many small jobs (70 to 100 at once: they once made the
/// driver core ask to be woken at the time it had just handled, see
/// `a_burst_of_jobs_does_not_make_the_driver_spin`).
const BURSTS: bool = true;

fn run(seed: u64, bursts: bool) -> Result<SimReport, SimError> {
    let mut sim = Sim::new(seed, bursts);
    sim.run()?;
    sim.report.steps = sim.step;
    sim.report.end_us = sim.now_us;
    let stats = sim.driver.core.stats();
    sim.report.hedges = (stats.hedges, stats.suspicions);
    sim.report.outcomes = sim.ledger.outcomes;
    sim.report.backlogged = sim.driver.backlogged;
    sim.report.delivered = (sim.net.delivered_bytes, sim.net.delivered_chunks);
    sim.report.lies = sim.hostiles.iter().flatten().map(|(_, h)| h.lies).sum();
    Ok(sim.report)
}

impl Sim {
    fn new(seed: u64, bursts: bool) -> Sim {
        let mut rng = Rng::new(seed);
        let plan = plan::plan(&mut rng, bursts);
        let driver = DriverNode::new(plan.config.clone());
        let net = Network::new(plan.window_bytes_max);
        Sim {
            seed,
            execs: plan.executors.iter().map(|_| None).collect(),
            hostiles: plan.hostiles.iter().map(|_| None).collect(),
            job_slots: vec![None; plan.jobs.len()],
            rng,
            plan,
            now_us: 0,
            step: 0,
            next_event: 0,
            net,
            driver,
            peers: BTreeMap::new(),
            ledger: Ledger::default(),
            report: SimReport::default(),
        }
    }

    fn fail<T>(&self, message: impl Into<String>) -> Result<T, SimError> {
        Err(SimError {
            seed: self.seed,
            step: self.step,
            now_us: self.now_us,
            message: message.into(),
        })
    }

    /// When something next happens: a planned event, a delivery, a node's timeout.
    fn next_us(&mut self) -> Option<u64> {
        let event = self.plan.events.get(self.next_event).map(|&(t, _)| t);
        let execs = self
            .execs
            .iter()
            .flatten()
            .filter_map(ExecNode::poll_timeout)
            .min();
        [
            event,
            self.net.poll_timeout(),
            self.driver.poll_timeout(),
            execs,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// What asks to be woken now or earlier (for a stuck run's report).
    fn due_now(&mut self) -> String {
        let now = self.now_us;
        let mut due = Vec::new();
        if self.driver.poll_timeout().is_some_and(|t| t <= now) {
            due.push(format!("driver {:?}", self.driver.poll_timeout()));
        }
        if self.net.poll_timeout().is_some_and(|t| t <= now) {
            due.push("network".to_owned());
        }
        for e in self.execs.iter().flatten() {
            if e.poll_timeout().is_some_and(|t| t <= now) {
                due.push(format!("{} {:?}", e.name, e.poll_timeout()));
            }
        }
        let view = self.driver.core.executors_view();
        format!(
            "[{}]; the driver has {} tasks pending, {} running, on executors {:?}; executors \
             here: {:?}",
            due.join(", "),
            view.pending_tasks,
            view.running_tasks,
            view.executors,
            self.execs
                .iter()
                .flatten()
                .map(|e| (&e.name, e.liveness(), e.lanes()))
                .collect::<Vec<_>>()
        )
    }

    fn run(&mut self) -> Result<(), SimError> {
        while self.next_event < self.plan.events.len() || self.ledger.open_jobs() > 0 {
            if self.step > STEPS_MAX || self.now_us > DEADLINE_US {
                let due = self.due_now();
                return self.fail(format!(
                    "no progress: {} jobs open at the deadline; due now: {due}",
                    self.ledger.open_jobs()
                ));
            }
            let Some(t) = self.next_us() else {
                return self.fail(format!(
                    "nothing left to happen with {} jobs open",
                    self.ledger.open_jobs()
                ));
            };
            self.advance(t)?;
        }
        self.finish()
    }

    /// One step: everything due at `t`, then the outputs, then the checks.
    fn advance(&mut self, t: u64) -> Result<(), SimError> {
        self.step += 1;
        // A deadline in the past still moves the clock on (a core that keeps asking for the
        // same past time must not stop it).
        self.now_us = self.now_us.max(t);
        let now = self.now_us;
        while let Some(&(at, ev)) = self.plan.events.get(self.next_event) {
            if at > now {
                break;
            }
            self.next_event += 1;
            tracing::debug!(target: "flint_net::sim", now_us = now, "event {ev:?}");
            self.handle(ev)?;
        }
        while let Some((conn, end, what)) = self.net.poll_delivery(now) {
            self.deliver(conn, end, what)?;
        }
        self.driver.handle_timeout(now).or_else(|m| self.fail(m))?;
        self.pump()?;
        self.ledger.check(now).or_else(|m| self.fail(m))?;
        self.check_hedges()?;
        self.check_runs()
    }

    /// Hedged copies stay within their bucket: `burst` plus `copy_ratio` of each launch that
    /// was not a copy.
    fn check_hedges(&self) -> Result<(), SimError> {
        let Some(config) = self.plan.config.scheduler.hedging.as_ref() else {
            return Ok(());
        };
        let stats = self.driver.core.stats();
        let firsts = stats.launched - stats.speculative_launched;
        let bound = f64::from(config.burst) + config.copy_ratio * firsts as f64;
        if stats.hedges as f64 > bound + 1.0 {
            return self.fail(format!(
                "{} hedged copies over their bound {bound:.1} ({firsts} first launches)",
                stats.hedges
            ));
        }
        Ok(())
    }

    fn handle(&mut self, ev: Ev) -> Result<(), SimError> {
        let now = self.now_us;
        match ev {
            Ev::Join(i) => self.join(i),
            Ev::Crash(i, loud) => self.crash(i, loud),
            Ev::Break(i) => self.break_lane(i),
            Ev::Stall(i, frozen) => self.stall(i, frozen),
            Ev::Unstall(i) => {
                if let Some(e) = self.execs.get_mut(i).and_then(Option::as_mut) {
                    if e.is_alive() {
                        e.set_liveness(None, Liveness::Running);
                        for conn in e.conns() {
                            self.net.set_peer_stalled(conn, false);
                        }
                    }
                }
            }
            Ev::Hostile(h) => self.hostile_joins(h),
            Ev::Lie(h) => {
                let targets = self.ledger.targets(16);
                if let Some(Some((_, hostile))) = self.hostiles.get_mut(h) {
                    hostile.lie(&mut self.rng, &targets);
                }
            }
            Ev::Submit(j) => self.submit(j)?,
            Ev::Cancel(j) | Ev::Drop(j) => {
                if let Some(&Some(slot)) = self.job_slots.get(j) {
                    let drop = matches!(ev, Ev::Drop(_));
                    self.ledger
                        .cancel(slot, drop, now)
                        .or_else(|m| self.fail(m))?;
                    self.driver.apply_cancels(now);
                }
            }
        }
        Ok(())
    }

    /// Executor `i` crashes: its connections break, the peer told (`loud`) or never.
    fn crash(&mut self, i: usize, loud: bool) {
        let now = self.now_us;
        if let Some(e) = self.execs.get_mut(i).and_then(Option::as_mut) {
            if e.is_alive() {
                e.crash();
                self.report.faults += 1;
                for conn in e.conns() {
                    let told = loud.then(|| self.rng.range(0, 50_000));
                    self.net.break_conn(conn, now, told, None);
                }
            }
        }
    }

    /// One lane's connection of executor `i` breaks (of an executor of lanes: any of them).
    fn break_lane(&mut self, i: usize) {
        let now = self.now_us;
        if let Some(e) = self.execs.get(i).and_then(Option::as_ref) {
            self.report.faults += 1;
            let lane = self.rng.range(0, e.lanes() as u64 - 1) as usize;
            self.report.lane_faults += u64::from(lane > 0);
            let conn = e.conns().nth(lane).unwrap_or_else(|| e.conn());
            let (d, p) = (self.rng.range(0, 20_000), self.rng.range(0, 20_000));
            self.net.break_conn(conn, now, Some(d), Some(p));
        }
    }

    /// Executor `i` stalls: `frozen`, the whole process; else one lane (any) goes deaf.
    fn stall(&mut self, i: usize, frozen: bool) {
        if let Some(e) = self.execs.get_mut(i).and_then(Option::as_mut) {
            if e.is_alive() {
                self.report.faults += 1;
                let (lane, liveness) = if frozen {
                    (None, Liveness::Frozen)
                } else {
                    let lane = self.rng.range(0, e.lanes() as u64 - 1) as usize;
                    self.report.lane_faults += u64::from(lane > 0);
                    (Some(lane), Liveness::Deaf)
                };
                e.set_liveness(lane, liveness);
                for (at, conn) in e.conns().enumerate() {
                    if lane.is_none_or(|only| only == at) {
                        self.net.set_peer_stalled(conn, true);
                    }
                }
            }
        }
    }

    fn join(&mut self, i: usize) {
        let Some(planned) = self.plan.executors.get(i).cloned() else {
            return;
        };
        let conn = self.net.open(&mut self.rng);
        let driver_addr = std::net::SocketAddr::from(([127, 0, 0, 1], 7077));
        let config = ExecutorConfig {
            host: format!("host-{}", planned.name),
            cores: planned.cores,
            secret: self.plan.config.secret.clone(),
            tasks_per_core: self.plan.config.tasks_per_core,
            ..ExecutorConfig::new(driver_addr, planned.name)
        };
        let runner = (planned.failure_prob, planned.slowness);
        let node = ExecNode::new(&mut self.rng, &config, conn, runner);
        if let Some(slot) = self.execs.get_mut(i) {
            *slot = Some(node);
        }
        self.peers.insert(conn, Peer::Exec(i));
        self.report.executors += 1;
        let now = self.now_us;
        self.driver.connect(&mut self.rng, &mut self.net, conn, now);
    }

    fn hostile_joins(&mut self, h: usize) {
        let Some(&mode) = self.plan.hostiles.get(h) else {
            return;
        };
        let conn = self.net.open(&mut self.rng);
        // A liar takes an honest executor's name now and then (not executor 0's); an
        // interloper asks to join executor 0 or 1 (lanes if they have several cores).
        let name = if mode == hostile::Mode::Interloper {
            format!("exec-{}", self.rng.range(0, 1))
        } else if self.rng.chance(0.3) {
            "exec-1".to_owned()
        } else {
            format!("hostile-{h}")
        };
        let secret = self.plan.config.secret.clone();
        let hostile = Hostile::new(&mut self.rng, mode, name, secret);
        if let Some(slot) = self.hostiles.get_mut(h) {
            *slot = Some((conn, hostile));
        }
        self.peers.insert(conn, Peer::Hostile(h));
        let now = self.now_us;
        self.driver.connect(&mut self.rng, &mut self.net, conn, now);
    }

    fn submit(&mut self, j: usize) -> Result<(), SimError> {
        let Some(planned) = self.plan.jobs.get(j).cloned() else {
            return Ok(());
        };
        let observed: Observed = Observed::default();
        let seen = observed.clone();
        let mut job = Job::new(FUNCTION, planned.payloads.clone())
            .keep_results(planned.keep_results)
            .on_result(move |index, result| {
                let result = result.cloned().map_err(str::to_owned);
                seen.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((index, result));
            });
        if planned.stream {
            job = job.stream_results();
        }
        if let Some(d) = planned.deadline_us {
            job = job.deadline(std::time::Duration::from_micros(d));
        }
        let now = self.now_us;
        match self.driver.submit(job, now) {
            Ok(handle) => {
                self.report.jobs += 1;
                self.report.tasks += planned.payloads.len() as u64;
                let slot = self.ledger.submitted(planned, handle, observed, now);
                if let Some(s) = self.job_slots.get_mut(j) {
                    *s = Some(slot);
                }
                Ok(())
            }
            Err(e) => self.fail(format!("job {j} refused at submit: {e}")),
        }
    }

    /// Hands a delivery to its end; a hostile peer just registered has its name checked.
    fn deliver(&mut self, conn: ConnId, end: End, what: Delivery) -> Result<(), SimError> {
        let now = self.now_us;
        match (end, self.peers.get(&conn)) {
            (End::Driver, _) => {
                let (rng, net) = (&mut self.rng, &mut self.net);
                self.driver.deliver(rng, net, conn, what, now);
            }
            (End::Peer, Some(Peer::Exec(i))) => {
                if let Some(Some(e)) = self.execs.get_mut(*i) {
                    e.deliver(conn, what, now);
                }
            }
            (End::Peer, Some(Peer::Hostile(h))) => {
                let Some(Some((_, hostile))) = self.hostiles.get_mut(*h) else {
                    return Ok(());
                };
                let Delivery::Bytes(bytes) = &what else {
                    return Ok(());
                };
                let was = hostile.is_registered();
                hostile.handle_bytes(bytes);
                if hostile.has_joined() {
                    let name = hostile.name().to_owned();
                    return self.fail(format!("an interloper joined {name} as a lane"));
                }
                if !was && hostile.is_registered() {
                    let name = hostile.name().to_owned();
                    return self.check_names(&name, conn);
                }
            }
            (End::Peer, None) => {}
        }
        Ok(())
    }

    /// Every node's outputs until nothing moves: executors first (their frames may make the
    /// driver's), then the driver.
    fn pump(&mut self) -> Result<(), SimError> {
        let now = self.now_us;
        for i in 0..self.execs.len() {
            let Some(Some(e)) = self.execs.get_mut(i) else {
                continue;
            };
            let was_alive = e.is_alive();
            let step = e
                .step(&mut self.rng, &mut self.net, &mut self.ledger, now)
                .map_err(|m| format!("{}: {m}", e.name));
            let step = match step {
                Ok(step) => step,
                Err(m) => return self.fail(m),
            };
            self.report.launched += step.launched.len() as u64;
            if was_alive && !e.is_alive() {
                if let Some(Err(crate::executor::ExecutorError::Refused(_))) = &e.exit {
                    self.report.refused += 1;
                }
            }
            if step.registered {
                if e.cores > EXECUTOR_CORES_MAX {
                    let m = format!("{} registered claiming {} cores", e.name, e.cores);
                    return self.fail(m);
                }
                let (name, conn) = (e.name.clone(), e.conn());
                self.check_names(&name, conn)?;
            }
            self.start_lane(i);
        }
        for (conn, hostile) in self.hostiles.iter_mut().flatten() {
            if let Some(bytes) = hostile.poll_transmit() {
                self.net.send(&mut self.rng, *conn, End::Peer, now, bytes);
            }
        }
        self.driver.pump(&mut self.rng, &mut self.net, now);
        Ok(())
    }

    /// Executor `i`'s lane 0 registered: its next lane connects (one per step, as `run`
    /// starts them one after another).
    fn start_lane(&mut self, i: usize) {
        let Some(Some(e)) = self.execs.get_mut(i) else {
            return;
        };
        if let Some(key) = e.lane_to_start() {
            let conn = self.net.open(&mut self.rng);
            e.start_lane(&mut self.rng, conn, key);
            self.report.lanes += 1;
            self.peers.insert(conn, Peer::Exec(i));
            let now = self.now_us;
            self.driver.connect(&mut self.rng, &mut self.net, conn, now);
        }
    }

    /// The peer `name` on `conn` was just seen registered: no other registered peer the
    /// driver still holds (executor or hostile) has that name.
    fn check_names(&self, name: &str, conn: ConnId) -> Result<(), SimError> {
        // A registration answer can still be in flight when the driver has already dropped
        // the connection (a hostile peer's garbage after its registration): that peer is not
        // held, whatever it believes.
        if !self.driver.is_open(conn) {
            return Ok(());
        }
        let execs = (self.execs.iter().flatten())
            .filter(|e| e.registered_us.is_some())
            .map(|e| (e.name.as_str(), e.conn()));
        let hostiles = (self.hostiles.iter().flatten())
            .filter(|(_, h)| h.is_registered())
            .map(|(c, h)| (h.name(), *c));
        for (other, other_conn) in execs.chain(hostiles) {
            if other == name && other_conn != conn && self.driver.is_open(other_conn) {
                return self.fail(format!(
                    "{name} registered twice: connections {other_conn} and {conn} both held"
                ));
            }
        }
        Ok(())
    }

    /// No task runs on two executors the driver holds at once, unless speculation copied it.
    fn check_runs(&self) -> Result<(), SimError> {
        if self.plan.speculation {
            return Ok(());
        }
        let mut running: BTreeMap<u64, (ConnId, u32)> = BTreeMap::new();
        for e in self.execs.iter().flatten() {
            for (on, task, attempt) in e.attempts(|conn| self.driver.is_open(conn)) {
                if let Some((conn, other)) = running.insert(task, (on, attempt)) {
                    return self.fail(format!(
                        "task {task:#x} runs on connections {conn} (attempt {other}) and {on} \
                         (attempt {attempt}) at once, with no speculation"
                    ));
                }
            }
        }
        Ok(())
    }

    /// The end: the idle driver does not tick, then every peer goes and the driver holds
    /// nothing.
    fn finish(&mut self) -> Result<(), SimError> {
        self.check_idle()?;
        let now = self.now_us;
        for e in self.execs.iter_mut().flatten() {
            if e.is_alive() {
                e.crash();
                for conn in e.conns() {
                    self.net.close(&mut self.rng, conn, End::Peer, now);
                }
            }
        }
        for (conn, _) in self.hostiles.iter().flatten() {
            self.net.close(&mut self.rng, *conn, End::Peer, now);
        }
        // Until the network is quiet and the driver has no deadline left: a connection whose
        // close never reaches it (a silent crash) goes by the driver's own deadlines.
        let mut steps = 0;
        while let Some(t) = [self.net.poll_timeout(), self.driver.core.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
        {
            steps += 1;
            if steps > SHUTDOWN_STEPS_MAX {
                return self.fail("the network never went quiet after every peer left");
            }
            self.advance(t)?;
        }
        if self.driver.open_conns() != 0 {
            return self.fail(format!(
                "every peer left, the driver holds {} connections",
                self.driver.open_conns()
            ));
        }
        let over = self.driver.core.observe(self.now_us).jobs_over;
        let [ok, failed, cancelled] = self.ledger.outcomes;
        let expected = [ok, failed, cancelled + self.ledger.dropped_open];
        if over != expected {
            return self.fail(format!(
                "the driver ended jobs {over:?} (succeeded, failed, cancelled); the handles \
                 and dropped handles say {expected:?}"
            ));
        }
        let (jobs, view) = (self.driver.active_jobs(), self.driver.core.executors_view());
        if jobs != 0 || view.pending_tasks + view.running_tasks != 0 || !view.executors.is_empty() {
            return self.fail(format!(
                "every job ended and every peer left, the driver holds {jobs} jobs, {} pending \
                 and {} running tasks, executors {:?}",
                view.pending_tasks, view.running_tasks, view.executors
            ));
        }
        // A few last wakes are allowed (a re-check after the last input), then none.
        for _ in 0..IDLE_WAKES_MAX {
            if let Some(t) = self.driver.poll_timeout() {
                self.advance(t)?;
            }
        }
        if let Some(t) = self.driver.poll_timeout() {
            return self.fail(format!(
                "an idle driver with no peers still wants to wake at {t} us after \
                 {IDLE_WAKES_MAX} wakes"
            ));
        }
        Ok(())
    }

    /// Over a quiet window of four heartbeat timeouts with no jobs, the driver wakes at most
    /// once per frame it gets (a re-check after input) plus a few expiry checks per timeout.
    fn check_idle(&mut self) -> Result<(), SimError> {
        let timeout_us = us(self.plan.config.heartbeat_timeout).max(1);
        let end_us = self.now_us + 4 * timeout_us;
        let (wakeups, frames) = (self.driver.wakeups, self.driver.frames);
        while let Some(t) = self.next_us() {
            if t > end_us {
                break;
            }
            if self.step > STEPS_MAX {
                return self.fail("no progress while idle");
            }
            self.advance(t)?;
        }
        let woke = self.driver.wakeups - wakeups;
        let heard = self.driver.frames - frames;
        let allowed = heard + 4 * 4 + 4;
        if woke > allowed {
            return self.fail(format!(
                "an idle driver woke {woke} times in {} us, hearing {heard} frames (at most \
                 {allowed} explained)",
                4 * timeout_us
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two hundred seeds in debug: every invariant holds, and the scenarios do exercise
    /// faults, refusals, lies and every outcome.
    #[test]
    fn two_hundred_seeds_hold_every_invariant() {
        let mut total = SimReport::default();
        for seed in 0..200 {
            match run_seed(seed) {
                Ok(r) => total.add(&r),
                Err(e) => panic!("{e}"),
            }
        }
        assert!(total.outcomes.iter().all(|&n| n > 0), "{total:?}");
        assert!(
            total.faults > 0 && total.refused > 0 && total.lies > 0,
            "{total:?}"
        );
        // Executors of 2 and 3 cores run lanes; some lanes past 0 break or go deaf.
        assert!(total.lanes > 0 && total.lane_faults > 0, "{total:?}");
        assert!(total.launched >= total.tasks / 2, "{total:?}");
    }

    /// A deaf executor (heartbeating, not reading) holds attempt 0 of a task; speculation
    /// copies it once and the copy fails or is lost (sent to an executor that died). The
    /// scheduler once never copied it again (`speculated` stayed set), so the job waited for
    /// good; now a failed attempt beside a running one clears the mark. Seeds 19653 and 39901
    /// showed it before lanes changed every plan; they no longer do (with the fix undone,
    /// seeds 0..200,000 pass), so the direct test is the engine's
    /// `a_failed_copy_beside_a_running_original_lets_the_straggler_be_copied_again` and this
    /// seed stays as a plain regression run.
    #[test]
    fn a_failed_copy_of_a_deaf_executors_task_is_copied_again() {
        if let Err(e) = run_seed(19653) {
            panic!("{e}");
        }
    }

    /// A deaf executor (heartbeating, not reading) with speculation off once held its
    /// launches for good while they fit in the socket windows, so its jobs never ended; now
    /// its heartbeats, counting fewer attempts than it was sent, get it removed and its tasks
    /// run elsewhere. Seeds 1585 and 1891 failed without that before lanes changed every plan
    /// (they may no longer show it); the direct tests are `driver::core`'s
    /// `an_executor_that_does_not_read_its_launches_is_lost_and_its_task_runs_elsewhere` and
    /// its pair.
    #[test]
    fn a_deaf_executor_without_speculation_loses_its_tasks_to_others() {
        for seed in [1585, 1891] {
            if let Err(e) = run_seed(seed) {
                panic!("{e}");
            }
        }
    }

    /// With more than 64 jobs active the driver core once re-read the scheduler's deadline at
    /// most every 10 ms, so after `handle_timeout(now)` its `poll_timeout` could still return
    /// `now` and the endpoint's loop spun for up to 10 ms (fixed: the scheduler's `poll_timeout`
    /// is O(log jobs) and asked after every input).
    #[test]
    fn a_burst_of_jobs_does_not_make_the_driver_spin() {
        for seed in 0..200 {
            if let Err(e) = run(seed, true) {
                panic!("{e}");
            }
        }
    }

    #[test]
    fn a_seed_replays_the_same_run() {
        assert_eq!(run_seed(42), run_seed(42));
    }
}
