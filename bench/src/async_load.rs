//! The async mode of the load harness: what an async service embedding the driver sees. Many
//! tokio tasks (`callers`) each submit a job of `batch` tasks with `Driver::submit_async`, await
//! its handle, and go again, for a warm-up and then a measured period. The same callers then
//! run the same function inline (called directly in the task, no Flint) for the same period, so
//! the ratio of the two is measured in the same run. CPU time per job is read from the kernel
//! for this process (the driver, the callers, local mode's pool) and for each executor process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_net::driver::Driver;
use flint_net::job::{Job, JobOutcome};
use flint_net::{Registry, TaskContext};
use hdrhistogram::Histogram;

/// One async run.
#[derive(Debug, Clone)]
pub struct AsyncSpec {
    /// Concurrent callers (tokio tasks).
    pub callers: usize,
    /// Tasks per job.
    pub batch: u32,
    /// The function each task runs.
    pub task: String,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// Load before measurement.
    pub warmup: Duration,
    /// Measured period (each of the Flint run and the inline run).
    pub duration: Duration,
    /// Tokio worker threads (0: a current-thread runtime).
    pub threads: usize,
}

/// What one period measured.
#[derive(Debug, Clone)]
pub struct Period {
    /// Jobs completed in the measured period.
    pub jobs: u64,
    /// Tasks completed in the measured period.
    pub tasks: u64,
    /// Jobs that did not succeed.
    pub failed_jobs: u64,
    /// Its length.
    pub elapsed: Duration,
    /// Job latency, submit to outcome (us).
    pub latency_us: Histogram<u64>,
    /// CPU time of this process over the period (us).
    pub cpu_self_us: u64,
    /// CPU time of the executor processes over the period (us).
    pub cpu_executors_us: u64,
}

impl Period {
    /// Tasks per second.
    pub fn tasks_per_s(&self) -> f64 {
        self.tasks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// JSON fields of this period, prefixed.
    pub fn json(&self, prefix: &str) -> String {
        let h = &self.latency_us;
        let per_job = |us: u64| us as f64 / self.jobs.max(1) as f64;
        format!(
            "\"{prefix}tasks_per_s\":{:.1},\"{prefix}jobs\":{},\"{prefix}failed_jobs\":{},\
             \"{prefix}job_latency_us\":{{\"p50\":{},\"p90\":{},\"p99\":{},\"p999\":{},\"max\":{}}},\
             \"{prefix}cpu_us_per_job\":{:.2},\"{prefix}executor_cpu_us_per_job\":{:.2}",
            self.tasks_per_s(),
            self.jobs,
            self.failed_jobs,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.9),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            per_job(self.cpu_self_us),
            per_job(self.cpu_executors_us),
        )
    }
}

/// CPU time (user + system) of a process, in microseconds, from `/proc/PID/stat`; `pid` may be
/// `self`, or `self/task/TID` for one thread.
pub fn cpu_us(pid: &str) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // After the command's closing parenthesis: state is field 3; utime, stime are 14 and 15.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    // The kernel's clock tick is 100 Hz on every Linux this runs on (USER_HZ).
    ticks * 10_000
}

/// CPU time of the processes `pids`, summed, in microseconds.
pub fn cpu_executors_us(pids: &[u32]) -> u64 {
    pids.iter().map(|pid| cpu_us(&pid.to_string())).sum()
}

/// How the callers do one job.
#[derive(Clone)]
enum Work {
    Flint(Arc<Driver>),
    Inline(flint_engine::functions::Resolved),
}

/// Runs the Flint period and the inline period; `executor_pids` are the executor processes.
pub fn run(
    driver: Arc<Driver>,
    spec: &AsyncSpec,
    executor_pids: &[u32],
) -> Result<(Period, Period), String> {
    let resolved = Registry::with_builtins()
        .resolve(&spec.task)
        .map_err(|e| format!("--task: {e}"))?;
    let runtime = if spec.threads == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(spec.threads)
            .enable_time()
            .build()
    }
    .map_err(|e| format!("tokio: {e}"))?;
    let flint = runtime.block_on(period(Work::Flint(driver), spec, executor_pids))?;
    let inline = runtime.block_on(period(Work::Inline(resolved), spec, executor_pids))?;
    Ok((flint, inline))
}

/// What a period's callers share: whether to measure or stop, and what they measured.
struct Callers {
    measuring: AtomicBool,
    stop: AtomicBool,
    jobs: AtomicU64,
    failed: AtomicU64,
    latency: Mutex<Histogram<u64>>,
}

async fn period(work: Work, spec: &AsyncSpec, executor_pids: &[u32]) -> Result<Period, String> {
    let shared = Arc::new(Callers {
        measuring: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        jobs: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        latency: Mutex::new(
            Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
        ),
    });
    let payload = Bytes::from(vec![7u8; spec.payload_bytes]);
    let mut callers = Vec::with_capacity(spec.callers);
    for _ in 0..spec.callers {
        let (work, shared) = (work.clone(), shared.clone());
        let (task, payload, batch) = (spec.task.clone(), payload.clone(), spec.batch);
        callers.push(tokio::spawn(caller(work, shared, task, payload, batch)));
    }
    tokio::time::sleep(spec.warmup).await;
    let cpu_self_before = cpu_us("self");
    let cpu_exec_before = cpu_executors_us(executor_pids);
    let started = Instant::now();
    shared.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(spec.duration).await;
    shared.measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed();
    let cpu_self_us = cpu_us("self").saturating_sub(cpu_self_before);
    let cpu_executors_us = cpu_executors_us(executor_pids).saturating_sub(cpu_exec_before);
    shared.stop.store(true, Ordering::Relaxed);
    for caller in callers {
        caller
            .await
            .map_err(|e| format!("a caller panicked: {e}"))??;
    }
    let jobs = shared.jobs.load(Ordering::Relaxed);
    let latency_us = shared
        .latency
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(Period {
        jobs,
        tasks: jobs * u64::from(spec.batch),
        failed_jobs: shared.failed.load(Ordering::Relaxed),
        elapsed,
        latency_us,
        cpu_self_us,
        cpu_executors_us,
    })
}

/// One caller: jobs of `batch` tasks one after the other until told to stop, measured while
/// told to; its latencies are added to the shared histogram at the end.
async fn caller(
    work: Work,
    shared: Arc<Callers>,
    task: String,
    payload: Bytes,
    batch: u32,
) -> Result<(), String> {
    let mut local =
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?;
    while !shared.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let ok = call(&work, &task, &payload, batch).await?;
        if shared.measuring.load(Ordering::Relaxed) {
            let us = started.elapsed().as_micros().max(1) as u64;
            let _ = local.record(us.min(60_000_000));
            shared.jobs.fetch_add(1, Ordering::Relaxed);
            if !ok {
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    shared
        .latency
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .add(&local)
        .map_err(|e| e.to_string())
}

/// One job of `batch` tasks, through Flint or inline; whether every task succeeded.
async fn call(work: &Work, task: &str, payload: &Bytes, batch: u32) -> Result<bool, String> {
    Ok(match work {
        Work::Flint(driver) => {
            let job = Job::new(task.to_string(), vec![payload.clone(); batch as usize])
                .keep_results(false);
            let handle = driver.submit_async(job).await.map_err(|e| e.to_string())?;
            matches!(handle.await, JobOutcome::Succeeded(_))
        }
        Work::Inline(resolved) => {
            let ctx = TaskContext::new(0, 0, resolved.argument.as_deref());
            let ok = (0..batch).all(|_| (resolved.function)(&ctx, payload.clone()).is_ok());
            tokio::task::yield_now().await;
            ok
        }
    })
}
