//! The driver's memory with many queued tasks: a driver with no executors takes `tasks` tasks
//! (in jobs of at most 100,000) and the process's resident set is read from `/proc/self/status`
//! before and after. Nothing runs, so every task stays queued in the scheduler.

use std::time::{Duration, Instant};

use bytes::Bytes;
use flint_net::driver::{Driver, DriverConfig};
use flint_net::job::Job;

/// Tasks per submitted job.
const JOB_TASKS: u64 = 100_000;

/// What [`queued_memory`] measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QueuedMemory {
    /// Tasks queued.
    pub tasks: u64,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// Resident set before submitting (driver started, idle).
    pub rss_before_bytes: u64,
    /// Resident set with every task queued.
    pub rss_after_bytes: u64,
    /// Peak resident set (`VmHWM`), submission's transient copies included.
    pub rss_peak_bytes: u64,
    /// Time to submit them all.
    pub submit_s: f64,
}

impl QueuedMemory {
    /// Resident bytes per queued task.
    pub fn bytes_per_task(&self) -> f64 {
        self.rss_after_bytes.saturating_sub(self.rss_before_bytes) as f64 / self.tasks.max(1) as f64
    }

    /// One JSON object.
    pub fn to_json(&self) -> String {
        format!(
            "{{\"mode\":\"queued_memory\",\"tasks\":{},\"payload\":{},\"rss_before_bytes\":{},\
             \"rss_after_bytes\":{},\"rss_peak_bytes\":{},\"bytes_per_task\":{:.1},\"submit_s\":{:.3}}}",
            self.tasks,
            self.payload_bytes,
            self.rss_before_bytes,
            self.rss_after_bytes,
            self.rss_peak_bytes,
            self.bytes_per_task(),
            self.submit_s
        )
    }

    /// A table for people.
    pub fn to_table(&self) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        format!(
            "queued tasks    {}\npayload         {} B\nRSS before      {:.1} MiB\n\
             RSS after       {:.1} MiB\nRSS peak        {:.1} MiB\nper queued task {:.1} B\n\
             submit time     {:.3} s\n",
            self.tasks,
            self.payload_bytes,
            mib(self.rss_before_bytes),
            mib(self.rss_after_bytes),
            mib(self.rss_peak_bytes),
            self.bytes_per_task(),
            self.submit_s
        )
    }
}

/// A field of `/proc/self/status` in bytes (`VmRSS`, `VmHWM`).
pub fn proc_status_bytes(field: &str) -> Result<u64, String> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("cannot read /proc/self/status (Linux only): {e}"))?;
    status
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix(field)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
        .ok_or_else(|| format!("no {field} in /proc/self/status"))
}

/// Queues `tasks` tasks of `payload_bytes` (one shared buffer) on a driver with no executors
/// and measures the resident set.
pub fn queued_memory(tasks: u64, payload_bytes: usize) -> Result<QueuedMemory, String> {
    let mut config = DriverConfig::default();
    config.scheduler.pending_tasks_max = config.scheduler.pending_tasks_max.max(tasks as usize);
    config.scheduler.jobs_max = config
        .scheduler
        .jobs_max
        .max(tasks.div_ceil(JOB_TASKS) as usize + 1);
    // Nothing will run; keep the job from failing as unschedulable while it is measured.
    config.scheduler.unschedulable_timeout_us = u64::MAX / 4;
    let driver = Driver::builder()
        .config(config)
        .start()
        .map_err(|e| format!("cannot start the driver: {e}"))?;
    let _ = driver.executors_view().map_err(|e| e.to_string())?;
    let rss_before_bytes = proc_status_bytes("VmRSS")?;
    let payload = Bytes::from(vec![0u8; payload_bytes]);
    let start = Instant::now();
    let mut handles = Vec::new();
    let mut left = tasks;
    while left > 0 {
        let count = left.min(JOB_TASKS);
        let job = Job::new("noop", vec![payload.clone(); count as usize]);
        handles.push(driver.submit(job).map_err(|e| e.to_string())?);
        left -= count;
    }
    // An ask is answered after every submission before it has been handled.
    let _ = driver.executors_view().map_err(|e| e.to_string())?;
    let submit_s = start.elapsed().as_secs_f64();
    let rss_after_bytes = proc_status_bytes("VmRSS")?;
    let rss_peak_bytes = proc_status_bytes("VmHWM")?;
    for handle in &handles {
        handle.cancel();
    }
    drop(handles);
    let _ = driver.executors_view();
    std::thread::sleep(Duration::from_millis(10));
    driver.shutdown();
    Ok(QueuedMemory {
        tasks,
        payload_bytes,
        rss_before_bytes,
        rss_after_bytes,
        rss_peak_bytes,
        submit_s,
    })
}
