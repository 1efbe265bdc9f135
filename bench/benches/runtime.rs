//! Runtime and pool benches, each beside its alternative in the same group:
//!
//! * `inbox_throughput`: one producer thread -> one consumer, messages per second, flint's
//!   `Inbox` vs crossbeam-channel (bounded) vs std `sync_channel`;
//! * `inbox_round_trip`: ping-pong between two threads over two queues (latency);
//! * `pool_throughput`: empty tasks submitted from one thread until all ran, flint `TaskPool`
//!   vs `rayon::spawn` vs a plain std mpsc thread pool, all with 2 workers;
//! * `pool_spawn_to_start`: time from just before submit to the task's first instruction,
//!   with the workers hot (spinning or just done);
//! * `endpoint_ask`: a runtime endpoint's ask round trip vs a crossbeam request/reply thread.
//!
//! Flint's pool and loop are measured pinned (the default) and unpinned: on a small machine
//! shared with other work a pinned thread cannot move off a busy core, rayon's and std's can.
//!
//! Run: `cargo bench -p flint-bench --bench runtime -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_utils::Backoff;
use flint_engine::affinity::Pinning;
use flint_engine::pool::{Task, TaskPool, TaskPoolConfig};
use flint_engine::runtime::{Ctx, Endpoint, Inbox, Reply, Runtime, RuntimeConfig};

const WORKERS: usize = 2;
const BATCH: u64 = 10_000;

fn inbox_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("inbox_throughput");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("flint_inbox", |b| b.iter_custom(flint_inbox_transfer));
    g.bench_function("crossbeam_channel", |b| {
        b.iter_custom(|iters| {
            let (tx, rx) = crossbeam_channel::bounded::<u64>(1024);
            let total = iters * BATCH;
            let producer = std::thread::spawn(move || {
                for i in 0..total {
                    tx.send(i).unwrap();
                }
            });
            let start = Instant::now();
            for _ in 0..total {
                black_box(rx.recv().unwrap());
            }
            let elapsed = start.elapsed();
            producer.join().unwrap();
            elapsed
        })
    });
    g.bench_function("std_mpsc", |b| {
        b.iter_custom(|iters| {
            let (tx, rx) = mpsc::sync_channel::<u64>(1024);
            let total = iters * BATCH;
            let producer = std::thread::spawn(move || {
                for i in 0..total {
                    tx.send(i).unwrap();
                }
            });
            let start = Instant::now();
            for _ in 0..total {
                black_box(rx.recv().unwrap());
            }
            let elapsed = start.elapsed();
            producer.join().unwrap();
            elapsed
        })
    });
    g.finish();
}

/// `iters * BATCH` values through an [`Inbox`] from a producer thread, both sides spinning
/// with a backoff; the consumer's time.
fn flint_inbox_transfer(iters: u64) -> Duration {
    let inbox = Arc::new(Inbox::<u64>::new(1024));
    let total = iters * BATCH;
    let producer = {
        let inbox = inbox.clone();
        std::thread::spawn(move || {
            for i in 0..total {
                let mut v = i;
                let backoff = Backoff::new();
                loop {
                    match inbox.push(v) {
                        Ok(_) => break,
                        Err(back) => {
                            v = back;
                            backoff.snooze();
                        }
                    }
                }
            }
        })
    };
    let start = Instant::now();
    let mut got = 0;
    let backoff = Backoff::new();
    while got < total {
        match inbox.pop() {
            Some(v) => {
                black_box(v);
                got += 1;
                backoff.reset();
            }
            None => backoff.snooze(),
        }
    }
    let elapsed = start.elapsed();
    producer.join().unwrap();
    elapsed
}

/// Waits for a value the way crossbeam-channel's `recv` does before it blocks: spin, then
/// yield (fair on an oversubscribed machine).
fn spin_pop(inbox: &Inbox<u64>) -> u64 {
    let backoff = Backoff::new();
    loop {
        if let Some(v) = inbox.pop() {
            return v;
        }
        backoff.snooze();
    }
}

fn inbox_round_trip(c: &mut Criterion) {
    let mut g = c.benchmark_group("inbox_round_trip");
    g.bench_function("flint_inbox", |b| {
        let ping = Arc::new(Inbox::<u64>::new(64));
        let pong = Arc::new(Inbox::<u64>::new(64));
        let echo = {
            let (ping, pong) = (ping.clone(), pong.clone());
            std::thread::spawn(move || loop {
                let v = spin_pop(&ping);
                let _ = pong.push(v);
                if v == u64::MAX {
                    return;
                }
            })
        };
        b.iter(|| {
            let _ = ping.push(1);
            black_box(spin_pop(&pong))
        });
        let _ = ping.push(u64::MAX);
        echo.join().unwrap();
    });
    g.bench_function("crossbeam_channel", |b| {
        let (ping_tx, ping_rx) = crossbeam_channel::bounded::<u64>(64);
        let (pong_tx, pong_rx) = crossbeam_channel::bounded::<u64>(64);
        let echo = std::thread::spawn(move || {
            while let Ok(v) = ping_rx.recv() {
                let _ = pong_tx.send(v);
            }
        });
        b.iter(|| {
            ping_tx.send(1).unwrap();
            black_box(pong_rx.recv().unwrap())
        });
        drop(ping_tx);
        echo.join().unwrap();
    });
    g.bench_function("std_mpsc", |b| {
        let (ping_tx, ping_rx) = mpsc::sync_channel::<u64>(64);
        let (pong_tx, pong_rx) = mpsc::sync_channel::<u64>(64);
        let echo = std::thread::spawn(move || {
            while let Ok(v) = ping_rx.recv() {
                let _ = pong_tx.send(v);
            }
        });
        b.iter(|| {
            ping_tx.send(1).unwrap();
            black_box(pong_rx.recv().unwrap())
        });
        drop(ping_tx);
        echo.join().unwrap();
    });
    g.finish();
}

/// A plain thread pool: workers share one `std::sync::mpsc` receiver behind a mutex.
struct StdPool {
    tx: Option<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl StdPool {
    fn new(n: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = (0..n)
            .map(|_| {
                let rx = rx.clone();
                std::thread::spawn(move || loop {
                    let job = rx.lock().unwrap().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
            })
            .collect();
        Self {
            tx: Some(tx),
            threads,
        }
    }
    fn spawn(&self, f: impl FnOnce() + Send + 'static) {
        if let Some(tx) = &self.tx {
            tx.send(Box::new(f)).unwrap();
        }
    }
}

impl Drop for StdPool {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            t.join().unwrap();
        }
    }
}

/// The pool pinned to every allowed CPU, or unpinned (the default): on a small shared machine
/// pinned workers cannot move away from a busy core, so both are measured.
fn flint_pool(pinned: bool) -> TaskPool {
    TaskPool::new(TaskPoolConfig {
        workers: WORKERS,
        pin: if pinned {
            Pinning::all()
        } else {
            Pinning::None
        },
        ..Default::default()
    })
    .unwrap()
}

fn rayon_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(WORKERS)
        .build()
        .unwrap()
}

fn wait_count(counter: &AtomicUsize, target: usize) {
    let backoff = Backoff::new();
    while counter.load(Ordering::Acquire) < target {
        backoff.snooze();
    }
}

fn pool_throughput(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_throughput");
    g.throughput(Throughput::Elements(BATCH));
    for (name, pin) in [("flint_pool", true), ("flint_pool_unpinned", false)] {
        static DONE: AtomicUsize = AtomicUsize::new(0);
        let pool = flint_pool(pin);
        g.bench_function(BenchmarkId::new(name, WORKERS), |b| {
            b.iter(|| {
                DONE.store(0, Ordering::Relaxed);
                for _ in 0..BATCH {
                    pool.submit(Task::new(|| {
                        DONE.fetch_add(1, Ordering::Release);
                    }))
                    .unwrap();
                }
                wait_count(&DONE, BATCH as usize);
            })
        });
    }
    {
        static DONE: AtomicUsize = AtomicUsize::new(0);
        let pool = rayon_pool();
        g.bench_function(BenchmarkId::new("rayon_spawn", WORKERS), |b| {
            b.iter(|| {
                DONE.store(0, Ordering::Relaxed);
                for _ in 0..BATCH {
                    pool.spawn(|| {
                        DONE.fetch_add(1, Ordering::Release);
                    });
                }
                wait_count(&DONE, BATCH as usize);
            })
        });
    }
    {
        static DONE: AtomicUsize = AtomicUsize::new(0);
        let pool = StdPool::new(WORKERS);
        g.bench_function(BenchmarkId::new("std_mpsc_pool", WORKERS), |b| {
            b.iter(|| {
                DONE.store(0, Ordering::Relaxed);
                for _ in 0..BATCH {
                    pool.spawn(|| {
                        DONE.fetch_add(1, Ordering::Release);
                    });
                }
                wait_count(&DONE, BATCH as usize);
            })
        });
    }
    g.finish();
}

/// Measures submit -> start: each iteration submits one task that records how long after the
/// submitter's timestamp it started, and waits for it.
fn spawn_to_start(iters: u64, spawn: impl Fn(Box<dyn FnOnce() + Send>)) -> Duration {
    static STARTED_NS: AtomicU64 = AtomicU64::new(u64::MAX);
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        STARTED_NS.store(u64::MAX, Ordering::Relaxed);
        let t0 = Instant::now();
        spawn(Box::new(move || {
            STARTED_NS.store(t0.elapsed().as_nanos() as u64, Ordering::Release);
        }));
        let backoff = Backoff::new();
        let ns = loop {
            let ns = STARTED_NS.load(Ordering::Acquire);
            if ns != u64::MAX {
                break ns;
            }
            backoff.snooze();
        };
        total += Duration::from_nanos(ns);
    }
    total
}

fn pool_spawn_to_start(c: &mut Criterion) {
    let mut g = c.benchmark_group("pool_spawn_to_start");
    for (name, pin) in [("flint_pool", true), ("flint_pool_unpinned", false)] {
        let pool = flint_pool(pin);
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                spawn_to_start(iters, |f| {
                    pool.submit(Task::new(f)).unwrap();
                })
            })
        });
    }
    {
        let pool = rayon_pool();
        g.bench_function("rayon_spawn", |b| {
            b.iter_custom(|iters| spawn_to_start(iters, |f| pool.spawn(f)))
        });
    }
    {
        let pool = StdPool::new(WORKERS);
        g.bench_function("std_mpsc_pool", |b| {
            b.iter_custom(|iters| spawn_to_start(iters, |f| pool.spawn(f)))
        });
    }
    g.finish();
}

struct Echo;

impl Endpoint for Echo {
    type Msg = Reply<u64>;
    fn on_message(&mut self, reply: Reply<u64>, _ctx: &mut Ctx<'_, Self>) {
        let _ = reply.send(1);
    }
}

fn endpoint_ask(c: &mut Criterion) {
    let mut g = c.benchmark_group("endpoint_ask");
    for (name, pinned) in [
        ("flint_endpoint_ask", true),
        ("flint_endpoint_ask_unpinned", false),
    ] {
        let rt = Runtime::new(RuntimeConfig {
            threads: 1,
            pin: if pinned {
                Pinning::all()
            } else {
                Pinning::None
            },
            ..Default::default()
        })
        .unwrap();
        let echo = rt.handle().spawn("echo", Echo).unwrap();
        g.bench_function(name, |b| {
            b.iter(|| black_box(echo.ask(|r| r, Duration::from_secs(10)).unwrap()))
        });
    }
    {
        type Request = crossbeam_channel::Sender<u64>;
        let (tx, rx) = crossbeam_channel::bounded::<Request>(1024);
        let server = std::thread::spawn(move || {
            while let Ok(reply) = rx.recv() {
                let _ = reply.send(1);
            }
        });
        g.bench_function("crossbeam_request_reply", |b| {
            b.iter(|| {
                let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
                tx.send(reply_tx).unwrap();
                black_box(reply_rx.recv().unwrap())
            })
        });
        drop(tx);
        server.join().unwrap();
    }
    g.finish();
}

criterion_group!(
    benches,
    inbox_throughput,
    inbox_round_trip,
    pool_throughput,
    pool_spawn_to_start,
    endpoint_ask
);
criterion_main!(benches);
