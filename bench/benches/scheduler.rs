//! Scheduler throughput: task assignments plus completions per second, one thread, with 1, 100
//! and 10,000 executors (4 cores each) and 1,000,000 queued tasks.
//!
//! Setup (registering executors, submitting the job, which launches the first wave) is not
//! measured. The measured loop plays a perfect cluster: it takes each launch batch and answers
//! every launched attempt with FINISHED, oldest first, until the job's outcome arrives. Each task
//! is one assignment plus one completion, so elements = 2 x tasks (tasks/s is half the figure).
//!
//! Two groups measure the same runs: `scheduler` in wall-clock time, `scheduler_cpu` in the
//! bench thread's CPU time (Linux `/proc/thread-self/schedstat`), which stays meaningful when the
//! machine is shared and the thread is preempted.
//!
//! `scheduler_active_jobs`: the cost of one completion plus one new one-task job while N
//! one-task jobs are active (1, 1,000 and 100,000), 10 executors of 4 cores, steady state, under
//! FIFO and under FAIR with the jobs spread over 1,000 pools. Flat across N means job selection
//! and job removal do not scan the active jobs (FAIR: choosing a pool costs O(log pools)).
//! The `+ticks` rows also ask [`Scheduler::poll_timeout`] after every input and call
//! [`Scheduler::handle_timeout`] when it is due, as the driver does, with 10 us passing per round (so
//! the 100 ms speculation check and the 1 ms offer deferral come due during a run): flat
//! across N means the scheduler's timers do not scan the active jobs either.
//!
//! `scheduler_submit`: how long submitting one job of one function over 1,000,000 payloads (the
//! form the driver sends a job without locality in) holds the caller, the driver's loop, with
//! one 4-core executor registered (so it includes the first launches); `located_job`, the same
//! work for a job of 1,000,000 task specs each preferring two of 100 hosts (the form a job with
//! locality takes), with 10 executors on 10 of them: the submission and the ticks that build
//! it a chunk each until it is published, so the loop's whole work for it (each call holds the
//! loop for one chunk at most, `engine/src/scheduler/building.rs`). The scheduler and the
//! payloads or specs are made before, and dropped after, each measured submission.
//!
//! Under `cargo test --benches` (no `--bench` flag) it runs a 10,000-task version once.

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use flint_engine::scheduler::{
    Config, Event, ExecutorId, ExecutorInfo, JobSpec, Output, Scheduler, Sharing, StatusUpdate,
    TaskId, TaskSpec, TaskState, Tasks,
};

const CORES: u32 = 4;

fn task_count() -> usize {
    if std::env::args().any(|a| a == "--bench") {
        1_000_000
    } else {
        10_000
    }
}

/// A scheduler with `executors` executors and one job of `tasks` tasks already submitted.
fn setup(executors: u64, tasks: usize) -> Scheduler {
    let mut s = Scheduler::new(Config {
        pending_tasks_max: tasks,
        executors_max: executors as usize,
        ..Config::default()
    });
    for i in 0..executors {
        let info = ExecutorInfo {
            id: ExecutorId(i),
            host: format!("host{}", i / 16),
            cores: CORES,
            attributes: Vec::new(),
        };
        s.handle_register(info, 0).expect("fresh executor");
    }
    let payload = Bytes::from_static(b"payload");
    let spec = JobSpec::new(vec![TaskSpec::new("noop", payload); tasks]);
    s.handle_submit(spec, 0).expect("within limits");
    s
}

/// CPU time this thread has run, if the platform tells (Linux).
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// Criterion measurement: the bench thread's CPU time (wall time where unavailable).
struct ThreadCpu {
    wall: WallTime,
}

impl Measurement for ThreadCpu {
    type Intermediate = (Option<Duration>, Instant);
    type Value = Duration;

    fn start(&self) -> Self::Intermediate {
        (thread_cpu(), Instant::now())
    }
    fn end(&self, (cpu, wall): Self::Intermediate) -> Duration {
        match (cpu, thread_cpu()) {
            (Some(a), Some(b)) => b.saturating_sub(a),
            _ => wall.elapsed(),
        }
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

/// Runs the job to completion; returns the wall and CPU time taken and the completions.
fn run_timed(s: &mut Scheduler) -> (Duration, Duration, u64) {
    let m = ThreadCpu { wall: WallTime };
    let start = m.start();
    let (wall, completions) = run(s);
    (wall, m.end(start), completions)
}

/// Runs the job to completion; returns the time taken and the number of completions.
fn run(s: &mut Scheduler) -> (Duration, u64) {
    let mut outs = Vec::new();
    let mut inflight = VecDeque::new();
    let mut completions = 0u64;
    let result = Bytes::from_static(b"ok");
    let start = Instant::now();
    let mut now = 1u64;
    loop {
        s.drain_outputs(&mut outs);
        let mut done = false;
        for out in outs.drain(..) {
            match out {
                Output::Launch { executor, tasks } => {
                    inflight.extend(tasks.into_iter().map(|t| (executor, t.task, t.attempt)));
                }
                Output::Event(Event::JobOutcome { outcome, .. }) => {
                    black_box(outcome);
                    done = true;
                }
                Output::Event(event @ Event::OneTaskJobSucceeded { .. }) => {
                    black_box(event);
                    done = true;
                }
                other => {
                    black_box(other);
                }
            }
        }
        if done {
            break;
        }
        let Some((executor, task, attempt)) = inflight.pop_front() else {
            panic!("job stuck: nothing in flight and no outcome");
        };
        now += 1;
        s.handle_status(
            StatusUpdate {
                executor,
                task,
                attempt,
                state: TaskState::Finished,
                data: result.clone(),
            },
            now,
        );
        completions += 1;
    }
    (start.elapsed(), completions)
}

/// Benchmarks every executor count in one group; `cpu` picks which clock the group reports.
fn bench_group<M: Measurement<Value = Duration>>(c: &mut Criterion<M>, name: &str, cpu: bool) {
    let tasks = task_count();
    let mut group = c.benchmark_group(name);
    // One run per sample: each run is long (a million tasks), so flat sampling keeps the whole
    // bench within a couple of minutes.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Elements(2 * tasks as u64));
    for executors in [1u64, 100, 10_000] {
        group.bench_with_input(
            BenchmarkId::new("assignments+completions", format!("{executors}_executors")),
            &executors,
            |b, &executors| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let mut s = setup(executors, tasks);
                        let (wall, cpu_time, completions) = run_timed(&mut s);
                        assert_eq!(completions, tasks as u64);
                        total += if cpu { cpu_time } else { wall };
                        drop(s);
                    }
                    total
                });
            },
        );
    }
    group.finish();
}

fn scheduler(c: &mut Criterion) {
    bench_group(c, "scheduler", false);
    active_jobs(c);
    submit_big(c);
}

/// One submission of a job of `task_count()` tasks: one function over payloads, and task specs
/// with preferred hosts.
fn submit_big(c: &mut Criterion) {
    let tasks = task_count();
    let mut group = c.benchmark_group("scheduler_submit");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(tasks as u64));
    let payload = Bytes::from_static(b"12345678");
    group.bench_function(BenchmarkId::new("one_job", tasks), |b| {
        b.iter_batched(
            || {
                let s = submit_target(tasks, &["host0".into()]);
                let payloads: Vec<Bytes> = vec![payload.clone(); tasks];
                (s, payloads)
            },
            |(mut s, payloads)| {
                let spec = JobSpec::new(Tasks::Same {
                    function: "noop".into(),
                    cores: 1,
                    payloads: payloads.into(),
                });
                black_box(s.handle_submit(spec, 0).expect("accepted"));
                s
            },
            criterion::BatchSize::PerIteration,
        )
    });
    // The form a job with locality takes: task specs, each preferring its block's hosts (one
    // shared name per host, as `TaskSpec::preferred_hosts` asks).
    let hosts: Vec<std::sync::Arc<str>> = (0..LOCATED_HOSTS)
        .map(|h| format!("host{h}").into())
        .collect();
    group.bench_function(BenchmarkId::new("located_job", tasks), |b| {
        b.iter_batched(
            || {
                let s = submit_target(tasks, &hosts[..10]);
                let function: std::sync::Arc<str> = "noop".into();
                let specs: Vec<TaskSpec> = (0..tasks)
                    .map(|i| TaskSpec {
                        preferred_hosts: vec![
                            hosts[i % LOCATED_HOSTS].clone(),
                            hosts[(i * 7 + 3) % LOCATED_HOSTS].clone(),
                        ],
                        ..TaskSpec::new(function.clone(), payload.clone())
                    })
                    .collect();
                (s, specs)
            },
            |(mut s, specs)| {
                let id = s.handle_submit(JobSpec::new(specs), 0).expect("accepted");
                let mut now_us = 0;
                while s.job_info(id).is_none() {
                    now_us += 1_000;
                    s.handle_timeout(now_us);
                }
                black_box(id);
                s
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

/// A scheduler taking jobs of up to `tasks` tasks, with one executor on each of `hosts`.
fn submit_target(tasks: usize, hosts: &[std::sync::Arc<str>]) -> Scheduler {
    let mut s = Scheduler::new(Config {
        pending_tasks_max: tasks,
        ..Config::default()
    });
    for (i, host) in hosts.iter().enumerate() {
        let info = ExecutorInfo {
            id: ExecutorId(i as u64),
            host: host.to_string(),
            cores: CORES,
            attributes: Vec::new(),
        };
        s.handle_register(info, 0).expect("fresh executor");
    }
    s
}

/// Hosts the located job's tasks name (two each), ten of them with an executor.
const LOCATED_HOSTS: usize = 100;

/// One completion and one new one-task job, `rounds` times, with `active` one-task jobs kept.
fn active_jobs(c: &mut Criterion) {
    let sizes: &[usize] = if std::env::args().any(|a| a == "--bench") {
        &[1, 1_000, 100_000]
    } else {
        &[1, 1_000]
    };
    let mut group = c.benchmark_group("scheduler_active_jobs");
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    let rounds = 10_000u64;
    group.throughput(Throughput::Elements(rounds));
    for ticks in [false, true] {
        for (sharing, pools) in [(Sharing::Fifo, 1), (Sharing::Fair, FAIR_POOLS)] {
            for &active in sizes {
                let suffix = if ticks { "+ticks" } else { "" };
                let name = format!("completion+submission{suffix}_{sharing:?}");
                let run = Run {
                    active,
                    rounds,
                    sharing,
                    pools,
                    ticks,
                };
                group.bench_with_input(
                    BenchmarkId::new(name, format!("{active}_active_jobs")),
                    &run,
                    |b, run| {
                        b.iter_custom(|iters| {
                            let mut total = Duration::ZERO;
                            for _ in 0..iters {
                                total += steady_state(run);
                            }
                            total
                        });
                    },
                );
            }
        }
    }
    group.finish();
}

/// Pools the FAIR variant of `scheduler_active_jobs` spreads its jobs over.
const FAIR_POOLS: u64 = 1_000;

/// One `scheduler_active_jobs` run.
struct Run {
    /// One-task jobs kept active.
    active: usize,
    /// Completions (each followed by a submission) measured.
    rounds: u64,
    sharing: Sharing,
    /// Pools the jobs are spread over (FAIR).
    pools: u64,
    /// Ask `poll_timeout` after every input and `tick` when due, as the driver does.
    ticks: bool,
}

/// Ticks `s` if its timeout is due at `now_us` (the driver's loop: it asks after every input).
fn tick_if_due(s: &mut Scheduler, now_us: u64) {
    if black_box(s.poll_timeout()).is_some_and(|t| t <= now_us) {
        s.handle_timeout(now_us);
    }
}

fn steady_state(run: &Run) -> Duration {
    let &Run {
        active,
        rounds,
        sharing,
        pools,
        ticks,
    } = run;
    let step_us = if ticks { 10 } else { 1 };
    let mut s = scheduler_with_executors(sharing, active);
    let mut submitted = 0u64;
    let mut one_task = || {
        submitted += 1;
        one_task_job(sharing, pools, submitted)
    };
    for _ in 0..active {
        s.handle_submit(one_task(), 0).expect("within limits");
    }
    let mut outs = Vec::new();
    let mut inflight = VecDeque::new();
    let result = Bytes::from_static(b"ok");
    let mut now = 1u64;
    collect_launches(&mut s, &mut outs, &mut inflight);
    let start = Instant::now();
    for _ in 0..rounds {
        let (executor, task, attempt) = inflight.pop_front().expect("a task in flight");
        now += step_us;
        s.handle_status(
            StatusUpdate {
                executor,
                task,
                attempt,
                state: TaskState::Finished,
                data: result.clone(),
            },
            now,
        );
        if ticks {
            tick_if_due(&mut s, now);
        }
        s.handle_submit(one_task(), now).expect("within limits");
        if ticks {
            tick_if_due(&mut s, now);
        }
        collect_launches(&mut s, &mut outs, &mut inflight);
    }
    start.elapsed()
}

/// A scheduler with room for `active` jobs (and some) and ten executors registered.
fn scheduler_with_executors(sharing: Sharing, active: usize) -> Scheduler {
    let mut s = Scheduler::new(Config {
        sharing,
        pending_tasks_max: active + 64,
        jobs_max: active + 64,
        ..Config::default()
    });
    for i in 0..10u64 {
        let info = ExecutorInfo {
            id: ExecutorId(i),
            host: format!("host{i}"),
            cores: CORES,
            attributes: Vec::new(),
        };
        s.handle_register(info, 0).expect("fresh executor");
    }
    s
}

/// The `submitted`-th one-task job: under FAIR in pool `submitted % pools`.
fn one_task_job(sharing: Sharing, pools: u64, submitted: u64) -> JobSpec {
    let spec = JobSpec::new(vec![TaskSpec::new("noop", Bytes::new())]);
    match sharing {
        Sharing::Fifo => spec,
        Sharing::Fair => JobSpec {
            pool: format!("pool{}", submitted % pools).into(),
            ..spec
        },
    }
}

/// Moves the scheduler's launches into `inflight` as (executor, task, attempt).
fn collect_launches(
    s: &mut Scheduler,
    outs: &mut Vec<Output>,
    inflight: &mut VecDeque<(ExecutorId, TaskId, u32)>,
) {
    s.drain_outputs(outs);
    for out in outs.drain(..) {
        if let Output::Launch { executor, tasks } = out {
            inflight.extend(tasks.into_iter().map(|t| (executor, t.task, t.attempt)));
        }
    }
}

fn scheduler_cpu(c: &mut Criterion<ThreadCpu>) {
    bench_group(c, "scheduler_cpu", true);
}

criterion_group!(wall, scheduler);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ThreadCpu { wall: WallTime });
    targets = scheduler_cpu
}
criterion_main!(wall, cpu);
