//! End-to-end over loopback: a driver and two executors (1 core each) in this process, talking
//! over 127.0.0.1 exactly as separate processes would (`executor::run` on threads), beside the
//! same task function run in-process by the alternatives in the same group, so the network and
//! scheduling overhead reads as a ratio:
//!
//! * `e2e_job_10k_noop`: one job of 10,000 `noop` tasks, submit to outcome. Flint over loopback
//!   vs Flint in local mode (the same driver and scheduler, tasks on an in-process pool of 2
//!   workers, no sockets: the difference is the network and the executor) vs `rayon` (a
//!   2-thread pool, `par_iter` over the same calls) vs a std mpsc pool of 2 worker threads.
//! * `e2e_single_task`: the round trip of a one-task job (submit, run, result, outcome), the
//!   same four ways (`rayon::ThreadPool::spawn` + a channel back for rayon), beside the floor of
//!   any cross-thread round trip: a crossbeam-channel ping-pong between two threads.
//! * `e2e_one_task_jobs`: throughput of many one-task jobs from one submitting thread (1,000 per
//!   iteration, all submitted, then all awaited): Flint over loopback and in local mode, beside
//!   `rayon::spawn` + a channel per job.
//!
//! Run: `cargo bench -p flint-bench --bench e2e`. Under `cargo test --benches` each body runs
//! once.

use std::hint::black_box;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use flint_bench::cluster::{Cluster, ClusterSpec, ExecutorSource};
use flint_engine::functions::{Registry, TaskContext, TaskFn};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::job::{Job, JobOutcome};
use rayon::prelude::*;

const TASKS: usize = 10_000;
const WORKERS: usize = 2;

fn cluster() -> Cluster {
    Cluster::start(ClusterSpec {
        executors: WORKERS as u32,
        cores: 1,
        source: ExecutorSource::Threads,
        driver: DriverConfig::default(),
        relay_first: false,
    })
    .expect("a loopback cluster starts")
}

/// A driver in local mode: tasks run on its own pool of `WORKERS` workers, no sockets.
fn local_driver() -> Driver {
    Driver::builder()
        .local(WORKERS as u32, Registry::with_builtins())
        .start()
        .expect("a local-mode driver starts")
}

fn noop() -> TaskFn {
    Registry::with_builtins()
        .resolve("noop")
        .expect("noop is built in")
        .function
}

/// A pool of std threads fed by one mpsc channel, answering on a per-request channel.
struct MpscPool {
    tx: Option<mpsc::Sender<(u64, mpsc::Sender<Bytes>)>>,
    workers: Vec<JoinHandle<()>>,
}

impl MpscPool {
    fn new(workers: usize, function: TaskFn) -> Self {
        let (tx, rx) = mpsc::channel::<(u64, mpsc::Sender<Bytes>)>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let workers = (0..workers)
            .map(|_| {
                let rx = rx.clone();
                let function = function.clone();
                std::thread::spawn(move || loop {
                    let next = rx.lock().expect("not poisoned").recv();
                    let Ok((id, reply)) = next else { return };
                    let ctx = TaskContext::new(id, 0, None);
                    let result = function(&ctx, Bytes::new()).expect("noop succeeds");
                    let _ = reply.send(result);
                })
            })
            .collect();
        MpscPool {
            tx: Some(tx),
            workers,
        }
    }

    fn run(&self, tasks: usize) {
        let (reply, results) = mpsc::channel();
        let tx = self.tx.as_ref().expect("running");
        for id in 0..tasks as u64 {
            tx.send((id, reply.clone())).expect("workers alive");
        }
        drop(reply);
        let got = results.iter().take(tasks).count();
        assert_eq!(got, tasks);
    }
}

impl Drop for MpscPool {
    fn drop(&mut self) {
        self.tx.take();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn flint_job(driver: &Driver, tasks: usize) {
    let handle = driver
        .submit(Job::new("noop", vec![Bytes::new(); tasks]))
        .expect("submitted");
    match handle.wait() {
        JobOutcome::Succeeded(results) => {
            assert_eq!(results.len(), tasks);
            black_box(results);
        }
        other => panic!("the job did not succeed: {other:?}"),
    }
}

fn job_10k(c: &mut Criterion) {
    let mut g = c.benchmark_group("e2e_job_10k_noop");
    g.throughput(Throughput::Elements(TASKS as u64));
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    g.sample_size(20);
    let flint = cluster();
    g.bench_function("flint_loopback_2x1", |b| {
        b.iter(|| flint_job(&flint.driver, TASKS))
    });
    flint.stop();
    let local = local_driver();
    g.bench_function("flint_local_2", |b| b.iter(|| flint_job(&local, TASKS)));
    local.shutdown();

    let function = noop();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build()
        .expect("a rayon pool");
    g.bench_function("rayon_2", |b| {
        b.iter(|| {
            let results: Vec<Bytes> = pool.install(|| {
                (0..TASKS as u64)
                    .into_par_iter()
                    .map(|id| function(&TaskContext::new(id, 0, None), Bytes::new()).expect("noop"))
                    .collect()
            });
            black_box(results)
        })
    });
    let mpsc_pool = MpscPool::new(WORKERS, noop());
    g.bench_function("std_mpsc_pool_2", |b| b.iter(|| mpsc_pool.run(TASKS)));
    g.finish();
}

fn single_task(c: &mut Criterion) {
    let mut g = c.benchmark_group("e2e_single_task");
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    let flint = cluster();
    g.bench_function("flint_loopback_2x1", |b| {
        b.iter(|| flint_job(&flint.driver, 1))
    });
    flint.stop();
    let local = local_driver();
    g.bench_function("flint_local_2", |b| b.iter(|| flint_job(&local, 1)));
    local.shutdown();

    let function = noop();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build()
        .expect("a rayon pool");
    g.bench_function("rayon_spawn_2", |b| {
        b.iter(|| {
            let (tx, rx) = mpsc::sync_channel(1);
            let function = function.clone();
            pool.spawn(move || {
                let result = function(&TaskContext::new(0, 0, None), Bytes::new());
                let _ = tx.send(result);
            });
            black_box(rx.recv().expect("a result"))
        })
    });
    let mpsc_pool = MpscPool::new(WORKERS, noop());
    g.bench_function("std_mpsc_pool_2", |b| b.iter(|| mpsc_pool.run(1)));

    // The floor: one message to another thread and one back.
    let (to_tx, to_rx) = crossbeam_channel::bounded::<u64>(1);
    let (back_tx, back_rx) = crossbeam_channel::bounded::<u64>(1);
    let echo = std::thread::spawn(move || {
        while let Ok(n) = to_rx.recv() {
            if back_tx.send(n).is_err() {
                break;
            }
        }
    });
    g.bench_function("crossbeam_channel_round_trip", |b| {
        b.iter(|| {
            to_tx.send(1).expect("echo thread alive");
            black_box(back_rx.recv().expect("echo"))
        })
    });
    drop(to_tx);
    let _ = echo.join();
    g.finish();
}

/// Jobs per iteration of `e2e_one_task_jobs`.
const JOBS: usize = 1000;

fn flint_jobs(driver: &Driver) {
    let handles: Vec<_> = (0..JOBS)
        .map(|_| {
            driver
                .submit(Job::new("noop", vec![Bytes::new()]).keep_results(false))
                .expect("submitted")
        })
        .collect();
    for handle in handles {
        assert!(matches!(handle.wait(), JobOutcome::Succeeded(_)));
    }
}

fn one_task_jobs(c: &mut Criterion) {
    let mut g = c.benchmark_group("e2e_one_task_jobs");
    g.throughput(Throughput::Elements(JOBS as u64));
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(20);
    let flint = cluster();
    g.bench_function("flint_loopback_2x1", |b| {
        b.iter(|| flint_jobs(&flint.driver))
    });
    flint.stop();
    let local = local_driver();
    g.bench_function("flint_local_2", |b| b.iter(|| flint_jobs(&local)));
    local.shutdown();
    let function = noop();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build()
        .expect("a rayon pool");
    g.bench_function("rayon_spawn_2", |b| {
        b.iter(|| {
            let receivers: Vec<_> = (0..JOBS)
                .map(|_| {
                    let (tx, rx) = mpsc::sync_channel(1);
                    let function = function.clone();
                    pool.spawn(move || {
                        let _ = tx.send(function(&TaskContext::new(0, 0, None), Bytes::new()));
                    });
                    rx
                })
                .collect();
            for rx in receivers {
                let _ = black_box(rx.recv().expect("a result"));
            }
        })
    });
    g.finish();
}

criterion_group!(benches, job_10k, single_task, one_task_jobs);
criterion_main!(benches);
