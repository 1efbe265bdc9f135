//! Paired throughput comparison of the task pool and `rayon::spawn` on empty tasks: the two
//! alternate batch by batch in one process (100 rounds of 10 000 tasks each, 2 workers each),
//! so machine noise hits both alike; prints the median batch time of each and the ratio.
//! Environment knobs for experiments: `W` workers, `B` local batch, `S` spin before park in
//! microseconds, `P=0` to not pin.
//!
//! Run: `cargo run --release -p flint-bench --example pool_vs_rayon`.

use flint_engine::pool::{Task, TaskPool, TaskPoolConfig};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
static DONE: AtomicUsize = AtomicUsize::new(0);
const N: usize = 10_000;
fn wait() {
    let b = crossbeam_utils::Backoff::new();
    while DONE.load(Ordering::Acquire) < N {
        b.snooze();
    }
}
fn main() {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let pool = TaskPool::new(TaskPoolConfig {
        workers: env("W", 2) as usize,
        local_batch_max: env("B", 32) as usize,
        spin_before_park: Duration::from_micros(env("S", 20)),
        pin: if env("P", 1) == 1 {
            flint_engine::affinity::Pinning::all()
        } else {
            flint_engine::affinity::Pinning::None
        },
        ..Default::default()
    })
    .unwrap();
    let rayon = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (mut f, mut r) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        DONE.store(0, Ordering::Relaxed);
        let t = Instant::now();
        for _ in 0..N {
            pool.submit(Task::new(|| {
                DONE.fetch_add(1, Ordering::Release);
            }))
            .unwrap();
        }
        wait();
        f.push(t.elapsed());
        DONE.store(0, Ordering::Relaxed);
        let t = Instant::now();
        for _ in 0..N {
            rayon.spawn(|| {
                DONE.fetch_add(1, Ordering::Release);
            });
        }
        wait();
        r.push(t.elapsed());
    }
    f.sort();
    r.sort();
    let m = |v: &Vec<Duration>| v[v.len() / 2];
    println!(
        "median per 10k: flint {:?} rayon {:?} ratio flint/rayon throughput {:.2}",
        m(&f),
        m(&r),
        m(&r).as_secs_f64() / m(&f).as_secs_f64()
    );
}
