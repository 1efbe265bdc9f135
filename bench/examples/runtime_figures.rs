//! Figures criterion does not give directly: spawn->start latency percentiles of the task pool
//! (worker spinning, and worker parked), and the CPU an idle runtime + pool burn.
//!
//! Run: `cargo run --release -p flint-bench --example runtime_figures`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flint_engine::pool::{Task, TaskPool, TaskPoolConfig};
use flint_engine::runtime::{Ctx, Endpoint, Runtime, RuntimeConfig};

static STARTED_NS: AtomicU64 = AtomicU64::new(u64::MAX);

fn one_spawn(pool: &TaskPool) -> u64 {
    STARTED_NS.store(u64::MAX, Ordering::Relaxed);
    let t0 = Instant::now();
    pool.submit(Task::new(move || {
        STARTED_NS.store(t0.elapsed().as_nanos() as u64, Ordering::Release);
    }))
    .expect("submit");
    loop {
        let ns = STARTED_NS.load(Ordering::Acquire);
        if ns != u64::MAX {
            return ns;
        }
        std::hint::spin_loop();
    }
}

fn percentiles(name: &str, mut v: Vec<u64>) {
    v.sort_unstable();
    let p = |q: f64| v[((v.len() as f64 - 1.0) * q) as usize];
    println!(
        "{name}: n={} p50={} ns p90={} ns p99={} ns p99.9={} ns",
        v.len(),
        p(0.5),
        p(0.9),
        p(0.99),
        p(0.999)
    );
}

/// CPU time (ns) consumed so far by all threads of this process, from /proc schedstat.
fn process_cpu_ns() -> u64 {
    let mut total = 0;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
    }
    total
}

/// utime + stime in clock ticks from /proc/self/stat.
fn process_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the ")": state is field 3, utime 14, stime 15 (1-based) => indices 11, 12.
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|x| x.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(11) + get(12)
}

struct Idle;
impl Endpoint for Idle {
    type Msg = ();
    fn on_message(&mut self, _: (), _ctx: &mut Ctx<'_, Self>) {}
}

fn main() {
    // Spinning is on by default from 2 cores (see `flint_engine::runtime::spinning_pays`); this
    // measures the spinning path with an explicit cap (`FLINT_SPIN=0` would turn it off).
    let pool = TaskPool::new(TaskPoolConfig {
        workers: 2,
        spin_before_park: Duration::from_micros(100),
        ..Default::default()
    })
    .expect("pool");
    for _ in 0..10_000 {
        one_spawn(&pool);
    }
    let hot: Vec<u64> = (0..200_000).map(|_| one_spawn(&pool)).collect();
    percentiles("pool spawn->start, worker spinning", hot);
    let cold: Vec<u64> = (0..300)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(2)); // let the workers park
            one_spawn(&pool)
        })
        .collect();
    percentiles("pool spawn->start, worker parked", cold);

    let rt = Runtime::new(RuntimeConfig::default()).expect("runtime");
    let idle = rt.handle().spawn("idle", Idle).expect("spawn");
    idle.send(()).expect("send");
    std::thread::sleep(Duration::from_millis(200));
    let window = Duration::from_secs(5);
    let (ns0, ticks0, t0) = (process_cpu_ns(), process_ticks(), Instant::now());
    std::thread::sleep(window);
    let (ns1, ticks1, wall) = (process_cpu_ns(), process_ticks(), t0.elapsed());
    let pct = (ns1 - ns0) as f64 / wall.as_nanos() as f64 * 100.0;
    println!(
        "idle runtime ({} loops) + idle pool (2 workers) over {:.1} s: {:.4}% of one core \
         (schedstat {} us; utime+stime {} ticks)",
        rt.handle().loops(),
        wall.as_secs_f64(),
        pct,
        (ns1 - ns0) / 1000,
        ticks1 - ticks0
    );
    drop(rt);
    drop(pool);
}
