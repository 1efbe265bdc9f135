//! Running one job from the command line: the job flags every job-running command takes
//! ([`JobArgs`]), the driver settings they imply ([`driver_config`]), submitting the job with a
//! progress bar and an abort check ([`run_job`]), and printing its summary ([`print_summary`],
//! [`exit_code`]). Shared by the `flint` binary and `flint-k8s`, so both run jobs the same way.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;

use crate::summary::{indexed_payload, json_string, Recorder, Summary};
use flint_engine::clock;
use flint_engine::functions::{check_builtin, Registry};
use flint_net::driver::{Driver, DriverConfig, TASKS_PER_CORE_MAX};
use flint_net::job::{Job, JobHandle, JobOutcome, TaskLocality};

/// The job every job-running command takes.
#[derive(Args, Clone, Debug)]
pub struct JobArgs {
    /// Tasks in the job (0 to 10,000,000, the driver's pending-task limit).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(0..=TASKS_MAX))]
    pub tasks: u64,
    /// Function each task runs: noop, echo, hash, hash:MS, sleep:MS, spin:US (MS up to
    /// 3,600,000, US up to 3,600,000,000), fail:P, crash:P (P from 0 to 1), gate:PATH (waits
    /// until the file at the absolute PATH exists, then hashes: a job held open for a test).
    #[arg(long, default_value = "noop", value_parser = task_name)]
    pub task: String,
    /// Payload bytes per task (0 to 16,773,120): task i's payload is i as u64 LE, repeated and
    /// truncated to this length (`hash` needs at least 8). Tasks times payload is at most
    /// 4 GiB.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=PAYLOAD_MAX_BYTES))]
    pub payload: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Task slots the driver gives each executor core (pipelining depth, 1 to 1024).
    /// `--queue-depth` is its old name, still accepted.
    #[arg(long, alias = "queue-depth", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=i64::from(TASKS_PER_CORE_MAX)))]
    pub tasks_per_core: u32,
    /// Attempts per task before its job fails (1 to 1000).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub max_failures: u32,
    /// An executor silent this long is lost, in milliseconds (100 to 3,600,000).
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    pub heartbeat_timeout_ms: u64,
    /// Fail the job when its tasks have waited this long with no executor able to run them
    /// (all lost or excluded), in seconds: 1 to 86400.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub no_executor_timeout_s: u64,
    /// Sharing, pools, locality, speculation, exclusion (issue 14 item 9).
    #[command(flatten)]
    pub scheduling: SchedulingArgs,
}

/// How the job shares the cluster and handles failures (issue 14 item 9); each flag's range
/// is checked at parse time (exit 2 on a bad value).
#[derive(Args, Clone, Debug)]
pub struct SchedulingArgs {
    /// How jobs share executors: fifo (priority, then submission) or fair (pools by weight
    /// and minimum share).
    #[arg(long, default_value = "fifo", value_parser = ["fifo", "fair"])]
    pub sharing: String,
    /// FAIR pools from a TOML file (Spark's fairscheduler.xml): `[pool.NAME]` tables with
    /// `mode` ("fair" or "fifo"), `weight` (1 to 1000), `min_share` (cores); at most 1 MiB
    /// and 1024 pools.
    #[arg(long, value_parser = pool_file)]
    pub pools: Option<PoolFile>,
    /// The job's FAIR pool (1 to 128 bytes; default "default").
    #[arg(long, default_value = "default", value_parser = pool_name)]
    pub pool: String,
    /// The job's weight in its pool (1 to 1000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub weight: u32,
    /// The job's priority, higher first (-1000 to 1000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(-1000..=1000))]
    pub priority: i32,
    /// Delay scheduling: how long a task waits for its preferred executor, then host, in
    /// milliseconds (0 to 60,000; Spark's spark.locality.wait is 3,000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    pub locality_wait_ms: u64,
    /// Speculative copies of stragglers: on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    pub speculation: String,
    /// A task running this long on an executor that finishes nothing is copied, in seconds
    /// (1 to 86,400).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub speculation_timeout_s: u64,
    /// Exclusion of executors and hosts where tasks fail (Spark's spark.excludeOnFailure): on
    /// or off (the default, as in Spark: with few executors it can leave a job nowhere to run
    /// until the 120 s unschedulable timeout).
    #[arg(long, default_value = "off", value_parser = ["on", "off"])]
    pub exclusion: String,
    /// Hosts the job's tasks prefer, comma-separated (1 to 64 names of 1 to 253 bytes): task
    /// i prefers the (i mod n)-th, as a job reading blocks stored there would. Its tasks wait
    /// up to the locality wait for an executor on that host (`flint local`'s executors are
    /// on 127.0.0.1), then run anywhere. Each task's preference takes about 180 bytes more at
    /// the peak (10,000,000 tasks: 2.7 GB, against 0.9 GB without). Default: no preference.
    #[arg(long, value_parser = host_list)]
    pub prefer_hosts: Option<HostList>,
}

/// A parsed `--prefer-hosts` list.
#[derive(Clone, Debug)]
pub struct HostList(pub Vec<std::sync::Arc<str>>);

/// Host names a `--prefer-hosts` list holds at most.
const PREFER_HOSTS_MAX: usize = 64;

/// `--prefer-hosts`: 1 to 64 comma-separated names, each 1 to 253 bytes.
fn host_list(text: &str) -> Result<HostList, String> {
    let names: Vec<&str> = text.split(',').collect();
    if names.len() > PREFER_HOSTS_MAX {
        return Err(format!("at most {PREFER_HOSTS_MAX} hosts"));
    }
    if let Some(bad) = names.iter().find(|n| n.is_empty() || n.len() > 253) {
        return Err(format!("a host name has 1 to 253 bytes, not {}", bad.len()));
    }
    Ok(HostList(names.into_iter().map(Into::into).collect()))
}

/// A parsed `--pools` file.
#[derive(Clone, Debug)]
pub struct PoolFile(pub Vec<flint_engine::scheduler::PoolConfig>);

/// `--pools`: a readable, valid pool file.
fn pool_file(text: &str) -> Result<PoolFile, flint_net::pools::PoolsError> {
    flint_net::pools::load(std::path::Path::new(text)).map(PoolFile)
}

/// `--pool`: 1 to 128 bytes.
fn pool_name(text: &str) -> Result<String, String> {
    if text.is_empty() || text.len() > 128 {
        return Err("a pool name has 1 to 128 bytes".into());
    }
    Ok(text.to_owned())
}

impl SchedulingArgs {
    /// The driver-wide part: sharing, pools, locality waits, speculation, exclusion.
    pub fn apply(&self, config: &mut flint_engine::scheduler::Config) {
        config.sharing = if self.sharing == "fair" {
            flint_engine::scheduler::Sharing::Fair
        } else {
            flint_engine::scheduler::Sharing::Fifo
        };
        if let Some(PoolFile(pools)) = &self.pools {
            config.pools = pools.clone();
        }
        config.locality_wait_executor_us = self.locality_wait_ms * 1000;
        config.locality_wait_host_us = self.locality_wait_ms * 1000;
        config.speculation =
            (self.speculation == "on").then(|| flint_engine::scheduler::SpeculationConfig {
                timeout_us: self.speculation_timeout_s * 1_000_000,
                ..Default::default()
            });
        config.exclusion =
            (self.exclusion == "on").then(flint_engine::scheduler::ExclusionConfig::default);
    }

    /// The job's part: pool, weight, priority, and its `tasks` tasks' preferred hosts.
    pub fn job(&self, job: Job, tasks: usize) -> Job {
        let job = (job.pool(self.pool.clone()))
            .weight(self.weight)
            .priority(self.priority);
        let Some(HostList(hosts)) = &self.prefer_hosts else {
            return job;
        };
        // Clones of one name per host, as `TaskLocality::hosts` asks.
        let locality = (0..tasks).map(|i| TaskLocality {
            executors: Vec::new(),
            hosts: vec![hosts[i % hosts.len()].clone()],
        });
        job.locality(locality.collect())
    }
}

/// The most tasks one command-line job has: the driver's default pending-task limit.
pub const TASKS_MAX: u64 = 10_000_000;
/// The largest payload a task may have in a 16 MiB frame (the rest is the frame's fields).
pub const PAYLOAD_MAX_BYTES: u64 = 16 * 1024 * 1024 - 8192;
/// The most payload bytes a command-line job builds.
pub const JOB_PAYLOAD_MAX_BYTES: u64 = 4 << 30;
/// `--task`: a name the built-ins know with a valid argument.
pub fn task_name(text: &str) -> Result<String, String> {
    Registry::with_builtins()
        .resolve(text)
        .map_err(|e| e.to_string())?;
    check_builtin(text).map_err(|e| e.to_string())?;
    Ok(text.to_owned())
}

/// The driver settings the job flags imply (task slots, heartbeats, attempts).
pub fn driver_config(job: &JobArgs) -> DriverConfig {
    let mut config = DriverConfig {
        tasks_per_core: job.tasks_per_core,
        heartbeat_timeout: Duration::from_millis(job.heartbeat_timeout_ms),
        ..DriverConfig::default()
    };
    config.heartbeat_interval =
        (config.heartbeat_timeout / 6).clamp(Duration::from_millis(10), Duration::from_secs(1));
    config.scheduler.max_failures = job.max_failures.max(1);
    job.scheduling.apply(&mut config.scheduler);
    config
}

/// What the flags cannot check one by one; runs before anything is allocated.
pub fn validate(job: &JobArgs) -> Result<(), String> {
    let hash = job.task == "hash" || job.task.starts_with("hash:");
    if hash && job.payload < 8 {
        return Err("--task hash needs --payload of at least 8 bytes".into());
    }
    if job.tasks.saturating_mul(job.payload) > JOB_PAYLOAD_MAX_BYTES {
        return Err(format!(
            "--tasks {} times --payload {} is over {JOB_PAYLOAD_MAX_BYTES} bytes of payloads",
            job.tasks, job.payload
        ));
    }
    Ok(())
}

/// How long a run waits for its results once the job ended: the driver drops the job's
/// observer before it hands the outcome over, so this is never reached while it runs.
const HANDBACK_WAIT: Duration = Duration::from_secs(10);

/// The results' recorder, owned by the job's result observer on the driver's loop (so a
/// result takes no lock) and handed back when the driver drops the observer, which it does
/// after the job's last result and before its outcome is handed over.
struct Handback {
    recorder: Option<Recorder>,
    to: std::sync::mpsc::SyncSender<Recorder>,
}

impl Drop for Handback {
    fn drop(&mut self) {
        if let Some(recorder) = self.recorder.take() {
            // Room for one, sent once: never blocks; nobody waits if the run gave up.
            let _ = self.to.try_send(recorder);
        }
    }
}

/// Submits the job, shows progress, waits, and summarizes. `abort` is asked every 200 ms; a
/// reason from it cancels the job, as does `--no-executor-timeout-s` of tasks waiting with no
/// executor able to run them.
pub fn run_job(
    driver: &Driver,
    args: &JobArgs,
    abort: &dyn Fn() -> Option<String>,
) -> Result<Summary, String> {
    // `validate` bounded both, so these fit in memory and in usize.
    let (tasks, payload) = (args.tasks as usize, args.payload as usize);
    let payloads: Vec<Bytes> = if payload == 0 {
        vec![Bytes::new(); tasks]
    } else {
        (0..args.tasks)
            .map(|i| Bytes::from(indexed_payload(i, payload)))
            .collect()
    };
    let (handed_back, recorder_back) = std::sync::mpsc::sync_channel(1);
    let mut observer = Handback {
        recorder: Some(Recorder::new()),
        to: handed_back,
    };
    let start = Instant::now();
    // Read once per result: the cheap clock (see `flint_engine::clock`).
    let start_ns = clock::now_ns();
    // Results are checksummed as they arrive; the outcome need not keep them.
    let job = args
        .scheduling
        .job(Job::new(args.task.clone(), payloads), tasks)
        .keep_results(false)
        .on_result(move |_, result| {
            let latency_ns = clock::elapsed_ns(start_ns);
            if let Some(recorder) = observer.recorder.as_mut() {
                recorder.record_ns(result.map(|bytes| &bytes[..]), latency_ns);
            }
        });
    let handle = driver.submit(job).map_err(|e| e.to_string())?;
    let show_progress = !args.json && std::io::stderr().is_terminal();
    let outcome = wait_for_outcome(driver, args, handle, start, show_progress, abort)?;
    let elapsed = start.elapsed();
    if show_progress && elapsed > Duration::from_secs(1) {
        eprintln!();
    }
    if let JobOutcome::Failed(reasons) = &outcome {
        for reason in reasons.iter().take(5) {
            eprintln!("flint: job failed: {reason}");
        }
    }
    let stats = driver.stats();
    let recorder = (recorder_back.recv_timeout(HANDBACK_WAIT))
        .map_err(|_| "the driver did not hand the job's results back".to_string())?;
    let retried = stats
        .launched
        .saturating_sub(stats.succeeded + recorder.failed());
    Ok(recorder.summary(args.tasks, retried, driver.executors_lost(), elapsed))
}

/// Waits up to `wait` until `count` executors are registered, or `abort` gives a reason.
pub fn wait_for_executors(
    driver: &Driver,
    count: usize,
    wait: Duration,
    abort: &dyn Fn() -> Option<String>,
) -> Result<(), String> {
    let deadline = Instant::now() + wait;
    while driver.executors() < count {
        if let Some(reason) = abort() {
            return Err(reason);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out waiting for {count} executors ({} registered)",
                driver.executors()
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// How often a running job's abort check runs.
const ABORT_CHECK: Duration = Duration::from_millis(20);

/// How often the progress bar is drawn again.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Waits for the job's outcome, drawing the progress bar if `show_progress`; cancels the job
/// (and says why) when `abort` gives a reason or no executor could run its tasks for
/// `--no-executor-timeout-s`.
fn wait_for_outcome(
    driver: &Driver,
    args: &JobArgs,
    mut handle: JobHandle,
    start: Instant,
    show_progress: bool,
    abort: &dyn Fn() -> Option<String>,
) -> Result<JobOutcome, String> {
    let timeout = Duration::from_secs(args.no_executor_timeout_s);
    let mut drawn = start;
    loop {
        // Short enough that a signal's cancel (`abort`) stops launches at once.
        match handle.wait_timeout(ABORT_CHECK) {
            Ok(outcome) => return Ok(outcome),
            Err(pending) => {
                if let Some(reason) = abort() {
                    pending.cancel();
                    return Err(reason);
                }
                if let Some(waited) = driver.no_executor_for().filter(|w| *w >= timeout) {
                    pending.cancel();
                    return Err(format!(
                        "no executor could run the job's tasks for {} s (all lost or excluded; \
                         --no-executor-timeout-s {}): {} of {} tasks done; giving up",
                        waited.as_secs(),
                        args.no_executor_timeout_s,
                        pending.tasks_done(),
                        pending.tasks()
                    ));
                }
                if show_progress
                    && start.elapsed() > Duration::from_secs(1)
                    && drawn.elapsed() >= PROGRESS_EVERY
                {
                    drawn = Instant::now();
                    progress(pending.tasks_done(), pending.tasks(), start.elapsed());
                }
                handle = pending;
            }
        }
    }
}

fn progress(done: u64, total: u64, elapsed: Duration) {
    const WIDTH: u64 = 40;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH);
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled { '#' } else { '-' })
        .collect();
    eprint!(
        "\r[{bar}] {done}/{total} tasks, {:.1} s",
        elapsed.as_secs_f64()
    );
}

/// Prints the summary to stdout: one JSON object (the job's task and payload, then `extra`)
/// with `--json`, else the table.
pub fn print_summary(summary: &Summary, job: &JobArgs, extra: &[(&str, String)]) {
    if job.json {
        let mut fields: Vec<(&str, String)> = vec![
            ("task", json_string(&job.task)),
            ("payload", job.payload.to_string()),
        ];
        fields.extend(extra.iter().cloned());
        println!("{}", summary.to_json(&fields));
    } else {
        print!("{}", summary.to_table());
    }
}

/// Success when every task succeeded.
pub fn exit_code(summary: &Summary) -> ExitCode {
    if summary.succeeded == summary.tasks {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A string field for the summary: quoted for JSON.
pub fn json_or_plain(job: &JobArgs, text: &str) -> String {
    if job.json {
        json_string(text)
    } else {
        text.to_owned()
    }
}
