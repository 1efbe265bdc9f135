//! `flint-load`: drives a real Flint cluster (a driver in this process, executors as local
//! `flint executor` processes, threads, or processes started elsewhere) with a closed loop, an
//! open loop or an open-loop rate ramp, and reports throughput and latency as a table, JSON,
//! HDR histogram logs and an HTML page.
//!
//! Build both binaries first (a cargo bin cannot depend on another package's bin):
//! `cargo build --release -p flint-cli --bin flint -p flint-bench --bin flint-load`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::{ArgGroup, Parser};
use flint_bench::async_load::{self, AsyncSpec};
use flint_bench::cluster::{self, Cluster, ClusterSpec, ExecutorSource, SECRET_ENV};
use flint_bench::fault::{Fault, Running};
use flint_bench::load::{self, Limit, LoadSpec, Mode, RunResult};
use flint_bench::memory;
use flint_bench::report::{self, Section};
use flint_cli::summary::{json_string, Latency, Summary};
use flint_net::driver::DriverConfig;
use flint_net::handshake::Secret;
use flint_net::Registry;
use hdrhistogram::Histogram;

#[derive(Parser, Debug)]
#[command(
    name = "flint-load",
    version,
    about = "Load harness for Flint: closed loop, open loop and rate ramps against a real cluster",
    long_about = "Load harness for Flint: closed loop (--in-flight), open loop (--rate) and rate \
        ramps (--ramp) against a real cluster.\n\nBy default it starts --executors local `flint \
        executor` processes from the `flint` binary next to this one; build both with\n  \
        cargo build --release -p flint-cli --bin flint -p flint-bench --bin flint-load\n\
        --in-process runs the executors as threads of this process instead, and --driver-listen \
        waits for executors started elsewhere.",
    group(ArgGroup::new("load").args(["in_flight", "rate", "ramp"])),
    group(ArgGroup::new("limit").args(["tasks", "duration"])),
    group(ArgGroup::new("where").args(["driver_listen", "in_process", "local_mode"]))
)]
struct Args {
    /// Executors (started here unless --driver-listen).
    #[arg(long, default_value_t = 2)]
    executors: u32,
    /// Cores (task threads) per local executor.
    #[arg(long, default_value_t = 1)]
    cores: u32,
    /// Listen here and wait for --executors executors started elsewhere
    /// (`flint executor --driver ADDR`).
    #[arg(long, value_name = "ADDR")]
    driver_listen: Option<SocketAddr>,
    /// With --driver-listen: how long to wait for the executors, in seconds.
    #[arg(long, default_value_t = 60)]
    wait_s: u64,
    /// With --driver-listen: file holding the shared secret (else $FLINT_SECRET, else none).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// With --driver-listen: allow a non-loopback address without a secret.
    #[arg(long)]
    allow_insecure_bind: bool,
    /// Serve the driver's Prometheus metrics (/metrics) and web UI (/) here while the load
    /// runs (with --driver-listen's secret as the token, if any; else loopback only).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Run the executors as threads of this process (over 127.0.0.1) instead of processes.
    #[arg(long)]
    in_process: bool,
    /// No executors: the driver's local mode runs the tasks on an in-process pool of
    /// executors x cores workers, no sockets (to separate the network's cost).
    #[arg(long)]
    local_mode: bool,
    /// The `flint` binary for local executors (default: next to this binary).
    #[arg(long, value_name = "PATH")]
    flint_bin: Option<PathBuf>,
    /// Let local executor processes write to stderr.
    #[arg(long)]
    executor_logs: bool,
    /// Closed loop: keep N tasks outstanding (the default, with N = 128).
    #[arg(long, value_name = "N")]
    in_flight: Option<u64>,
    /// Closed loop: tasks per submitted job.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Submitter threads (each submit is a blocking ask to the driver; more threads overlap
    /// them). The window, rate and task count are split between them.
    #[arg(long, default_value_t = 1)]
    submitters: usize,
    /// Open loop: send tasks at this rate (tasks per second).
    #[arg(long, value_name = "PER_S")]
    rate: Option<f64>,
    /// Open-loop rate ramp: STEPS rates from FROM to TO per second, geometric, each for
    /// --step-s seconds, e.g. 1000:200000:8.
    #[arg(long, value_name = "FROM:TO:STEPS")]
    ramp: Option<String>,
    /// Seconds per ramp step.
    #[arg(long, default_value_t = 2.0)]
    step_s: f64,
    /// Stop after this many measured tasks.
    #[arg(long, value_name = "T")]
    tasks: Option<u64>,
    /// Stop sending after this many seconds of measurement (default 5 unless --tasks).
    #[arg(long, value_name = "S")]
    duration: Option<f64>,
    /// Seconds of load before measurement starts (not counted).
    #[arg(long, default_value_t = 1.0, value_name = "S")]
    warmup: f64,
    /// What each task runs: noop, spin:US, sleep:MS, echo, hash, fail:P.
    #[arg(long, default_value = "noop", value_name = "SPEC")]
    task: String,
    /// Payload bytes per task (0 to 64 KiB and beyond).
    #[arg(long, default_value_t = 0, value_name = "BYTES")]
    payload: usize,
    /// Task slots the driver gives each executor core (pipelining depth, 1 to 1024).
    /// `--queue-depth` is its old name, still accepted.
    #[arg(long, alias = "queue-depth", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=i64::from(flint_net::driver::TASKS_PER_CORE_MAX)))]
    tasks_per_core: u32,
    /// Open loop: give up once this many tasks are outstanding (past saturation).
    #[arg(long, default_value_t = 1_000_000)]
    outstanding_max: u64,
    /// Print one JSON object instead of a table (no progress bar).
    #[arg(long)]
    json: bool,
    /// Write DIR/index.html (plots) and DIR/*.hlog (HDR histogram interval logs).
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// Beside the load, one job of this many noop tasks (priority below the load's) submitted
    /// as warm-up ends: the load's latencies while a big batch job starts, runs and ends
    /// (1 to 100,000,000: its payloads alone take 32 bytes a task).
    #[arg(long, value_name = "TASKS", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    beside_tasks: Option<u64>,
    /// Instead of load: queue --tasks tasks (default 10,000,000) on a driver with no executors
    /// and report its resident memory before and after.
    #[arg(long)]
    queued_memory: bool,
    /// Async mode: this many tokio tasks each submit a job of --batch tasks with
    /// `submit_async`, await it, and go again (1 to 100,000); then the same callers run the
    /// function inline for the same time, for the ratio.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    async_callers: Option<u64>,
    /// Async mode: tokio worker threads (0: one current-thread runtime; at most 64).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(0..=64))]
    async_threads: u64,
    /// A fault on executor process 0, its times counted from the end of the warm-up:
    /// freeze:AFTER_S:FOR_S (SIGSTOP, then SIGCONT), slow:FACTOR (runs 1/FACTOR of the time)
    /// cut:AFTER_S:FOR_S (its connections stop forwarding, nothing closes) or kill:AFTER_S
    /// (SIGKILL, not replaced). The JSON gains
    /// `fault` and `copies` (hedged or speculative attempts).
    #[arg(long, value_name = "FAULT")]
    fault: Option<Fault>,
    /// Turns hedged attempts and suspicion off (the driver's default is on), to compare.
    #[arg(long)]
    no_hedging: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("flint-load: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<ExitCode, String> {
    if args.queued_memory {
        return queued_memory(args);
    }
    check_task(args)?;
    let warmup = seconds("--warmup", args.warmup)?;
    let limit = limit_of(args)?;
    let ramp = args.ramp.as_deref().map(parse_ramp).transpose()?;
    if ramp.is_some() && !(args.step_s > 0.0 && args.step_s < 1e7) {
        return Err(format!("--step-s must be positive, not {}", args.step_s));
    }
    let mode = mode_of(args)?;
    let jobs_max = jobs_max_of(mode);
    let cluster_spec = cluster_spec_of(args, jobs_max)?;
    let source_name = source_name(&cluster_spec.source);
    let spec = LoadSpec {
        mode,
        task: args.task.as_str().into(),
        payload_bytes: args.payload,
        limit,
        warmup,
        outstanding_max: args.outstanding_max.max(1),
        jobs_max,
        progress: !args.json,
        submitters: args.submitters,
        beside_tasks: args.beside_tasks,
        // Only a report writes the per-second histograms.
        intervals: args.report.is_some(),
    };
    if let Some(callers) = args.async_callers {
        return run_async(args, callers, cluster_spec, &spec, source_name);
    }
    let started = SystemTime::now();
    let cluster = Cluster::start(cluster_spec)?;
    let _metrics = match args.metrics_listen {
        Some(addr) => Some(serve_metrics(addr, args.driver_listen.is_some(), &cluster)?),
        None => None,
    };
    let stats_before = cluster.driver.stats();
    // A fault on executor process 0, its times counted from the end of the warm-up.
    let fault = match (args.fault, cluster.fault_target()) {
        (Some(fault), Some(target)) => Some(Running::start(fault, target, spec.warmup)?),
        (Some(_), None) => return Err("--fault needs executor processes".into()),
        (None, _) => None,
    };
    let outcome = match &ramp {
        None => load::run(&cluster.driver, &spec).map(|run| vec![(name_of(&spec), run)]),
        Some(rates) => run_ramp(&cluster, &spec, rates, args.step_s),
    };
    drop(fault);
    let stats = cluster.driver.stats();
    let copies = stats.speculative_launched - stats_before.speculative_launched;
    cluster.stop();
    let runs = outcome?;
    let ramped = ramp.is_some();
    let knee = ramp.as_ref().and_then(|_| knee(&runs));
    let summary = combined(&runs);
    if args.json {
        let mut fields = summary_fields(args, &spec, ramped, source_name, &runs, knee);
        let fault = args
            .fault
            .map_or_else(|| "none".to_owned(), |f| f.to_string());
        fields.push(("fault", json_string(&fault)));
        fields.push(("copies", copies.to_string()));
        println!("{}", summary.to_json(&fields));
    } else {
        print_tables(&spec, ramped, &runs, knee, &summary);
    }
    if let Some(dir) = &args.report {
        write_report(dir, &runs, ramped, knee, started)?;
    }
    Ok(if summary.succeeded == summary.tasks && summary.tasks > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `--queued-memory`: the driver's memory with `--tasks` queued and no executors.
/// The metrics and pages at `addr`: loopback without a token when the executors are local
/// (their secret is nobody's to know), else with a token of their own in a new private file.
fn serve_metrics(
    addr: SocketAddr,
    external: bool,
    cluster: &Cluster,
) -> Result<flint_net::observe::http::HttpServer, String> {
    use flint_net::observe::http::Access;
    let access = if external {
        let (token, path) = flint_net::observe::token::ObserveToken::create_in_temp_dir()
            .map_err(|e| e.to_string())?;
        eprintln!("flint-load: observe token in {}", path.display());
        Access::Token(token)
    } else {
        Access::Open
    };
    flint_net::observe::ui::serve_driver(
        addr,
        cluster.driver.observer(),
        access,
        flint_net::observe::ui::Serve::UiAndMetrics,
    )
    .map_err(|e| e.to_string())
}

fn queued_memory(args: &Args) -> Result<ExitCode, String> {
    let result = memory::queued_memory(args.tasks.unwrap_or(10_000_000), args.payload)?;
    if args.json {
        println!("{}", result.to_json());
    } else {
        print!("{}", result.to_table());
    }
    Ok(ExitCode::SUCCESS)
}

/// `--task`, `--payload` and `--submitters` together.
fn check_task(args: &Args) -> Result<(), String> {
    Registry::with_builtins()
        .resolve(&args.task)
        .map_err(|e| format!("--task: {e}"))?;
    if (args.task == "hash" || args.task.starts_with("hash:")) && args.payload < 8 {
        return Err("--task hash needs --payload of at least 8 bytes".into());
    }
    if args.submitters == 0 || args.submitters > 64 {
        return Err("--submitters must be between 1 and 64".into());
    }
    Ok(())
}

/// When the run ends: `--tasks` or `--duration` (5 s if neither).
fn limit_of(args: &Args) -> Result<Limit, String> {
    match (args.tasks, args.duration) {
        (Some(0), _) => Err("--tasks must be at least 1".into()),
        (Some(tasks), _) => Ok(Limit::Tasks(tasks)),
        (None, Some(d)) if d > 0.0 => Ok(Limit::Duration(seconds("--duration", d)?)),
        (None, Some(d)) => Err(format!("--duration must be positive, not {d}")),
        (None, None) => Ok(Limit::Duration(Duration::from_secs(5))),
    }
}

/// The load: open loop with `--rate`, else a closed loop of `--in-flight` (128) tasks.
fn mode_of(args: &Args) -> Result<Mode, String> {
    if let Some(rate_per_s) = args.rate {
        if !(rate_per_s.is_finite() && rate_per_s > 0.0) {
            return Err("--rate must be a positive number".into());
        }
        return Ok(Mode::Open { rate_per_s });
    }
    let in_flight = args.in_flight.unwrap_or(128);
    if in_flight == 0 || args.batch == 0 {
        return Err("--in-flight and --batch must be at least 1".into());
    }
    if in_flight < args.submitters as u64 {
        return Err("--in-flight must be at least --submitters".into());
    }
    Ok(Mode::Closed {
        in_flight,
        batch: args.batch,
    })
}

/// The most jobs the submitter keeps outstanding. The scheduler scans its active jobs per
/// assignment, so the submitter keeps fewer outstanding jobs than the driver allows and lets
/// due tasks share a job instead.
fn jobs_max_of(mode: Mode) -> usize {
    match mode {
        Mode::Closed { in_flight, batch } => {
            (in_flight.div_ceil(u64::from(batch)) as usize).saturating_add(64)
        }
        Mode::Open { .. } => 4096,
    }
}

/// The driver's settings and where its executors come from.
fn cluster_spec_of(args: &Args, jobs_max: usize) -> Result<ClusterSpec, String> {
    let mut driver = DriverConfig {
        tasks_per_core: args.tasks_per_core,
        ..DriverConfig::default()
    };
    driver.scheduler.jobs_max = driver.scheduler.jobs_max.max(jobs_max + 64);
    // The job beside the load takes its own room, not the load's.
    let beside = args.beside_tasks.unwrap_or(0) as usize;
    driver.scheduler.pending_tasks_max = driver.scheduler.pending_tasks_max.saturating_add(beside);
    if args.no_hedging {
        driver.scheduler.hedging = None;
    }
    let source = match args.driver_listen {
        Some(listen) => {
            driver.listen = listen;
            driver.allow_insecure_bind = args.allow_insecure_bind;
            driver.secret = match &args.secret_file {
                Some(path) => Some(Secret::from_file(path).map_err(|e| e.to_string())?),
                None => Secret::from_env(SECRET_ENV).map_err(|e| e.to_string())?,
            };
            ExecutorSource::External {
                wait: Duration::from_secs(args.wait_s),
            }
        }
        None if args.in_process => ExecutorSource::Threads,
        None if args.local_mode => ExecutorSource::LocalMode,
        None => ExecutorSource::Processes {
            binary: cluster::flint_binary(args.flint_bin.as_deref())?,
            logs: args.executor_logs,
        },
    };
    Ok(ClusterSpec {
        executors: args.executors,
        cores: args.cores,
        source,
        driver,
        relay_first: args.fault.is_some_and(|f| f.needs_relay()),
    })
}

/// The `executor_source` field.
fn source_name(source: &ExecutorSource) -> &'static str {
    match source {
        ExecutorSource::Processes { .. } => "processes",
        ExecutorSource::Threads => "threads",
        ExecutorSource::LocalMode => "local_mode",
        ExecutorSource::External { .. } => "external",
    }
}

/// `--async-callers`: tokio callers submitting and awaiting, beside the same work done inline;
/// one JSON line.
fn run_async(
    args: &Args,
    callers: u64,
    cluster_spec: ClusterSpec,
    load: &LoadSpec,
    source_name: &str,
) -> Result<ExitCode, String> {
    let cluster = Cluster::start(cluster_spec)?;
    let spec = AsyncSpec {
        callers: callers as usize,
        batch: args.batch.max(1),
        task: args.task.clone(),
        payload_bytes: args.payload,
        warmup: load.warmup,
        duration: match load.limit {
            Limit::Duration(d) => d,
            Limit::Tasks(_) => return Err("async mode takes --duration, not --tasks".into()),
        },
        threads: args.async_threads as usize,
    };
    let pids = cluster.executor_pids();
    let result = async_load::run(cluster.driver.clone(), &spec, &pids);
    cluster.stop();
    let (flint, inline) = result?;
    println!(
        "{{\"mode\":\"async\",\"callers\":{callers},\"batch\":{},\"task\":{},\"payload\":{},\"executors\":{},\"executor_source\":{},\"async_threads\":{},{},{},\"ratio_to_inline\":{:.4}}}",
        spec.batch,
        json_string(&args.task),
        args.payload,
        args.executors,
        json_string(source_name),
        args.async_threads,
        flint.json(""),
        inline.json("inline_"),
        flint.tasks_per_s() / inline.tasks_per_s().max(1e-9),
    );
    Ok(if flint.failed_jobs == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The `--json` fields beyond the summary's: the mode, the flags, and for a ramp its steps and
/// knee.
fn summary_fields(
    args: &Args,
    spec: &LoadSpec,
    ramped: bool,
    source_name: &str,
    runs: &[(String, RunResult)],
    knee: Option<f64>,
) -> Vec<(&'static str, String)> {
    let mode = if ramped { "ramp" } else { spec.mode.name() };
    let mut extra: Vec<(&str, String)> = vec![
        ("mode", json_string(mode)),
        ("task", json_string(&args.task)),
        ("payload", args.payload.to_string()),
        ("executors", args.executors.to_string()),
        ("cores", args.cores.to_string()),
        ("executor_source", json_string(source_name)),
        ("warmup_s", format!("{:.3}", spec.warmup.as_secs_f64())),
        ("tasks_per_core", args.tasks_per_core.to_string()),
        ("submitters", args.submitters.to_string()),
    ];
    match spec.mode {
        Mode::Closed { in_flight, batch } if !ramped => {
            extra.push(("in_flight", in_flight.to_string()));
            extra.push(("batch", batch.to_string()));
        }
        Mode::Open { rate_per_s } if !ramped => {
            extra.push(("rate_per_s", format!("{rate_per_s:.1}")));
        }
        _ => {}
    }
    let saturated = runs.iter().any(|(_, r)| r.saturated);
    extra.push(("saturated", saturated.to_string()));
    if let Some(tasks) = spec.beside_tasks {
        extra.push(("beside_tasks", tasks.to_string()));
        let took = runs.iter().find_map(|(_, r)| r.beside.flatten());
        extra.push((
            "beside_s",
            took.map_or("null".into(), |t| format!("{:.3}", t.as_secs_f64())),
        ));
    }
    if ramped {
        extra.push(("steps", steps_json(runs)));
        extra.push((
            "knee_per_s",
            knee.map_or("null".into(), |r| format!("{r:.1}")),
        ));
    }
    extra
}

/// The tables for people: a ramp's steps, the summary, the mode.
fn print_tables(
    spec: &LoadSpec,
    ramped: bool,
    runs: &[(String, RunResult)],
    knee: Option<f64>,
    summary: &Summary,
) {
    if ramped {
        print!("{}", steps_table(runs, knee));
    }
    print!("{}", summary.to_table());
    if let Some(tasks) = spec.beside_tasks {
        match runs.iter().find_map(|(_, r)| r.beside.flatten()) {
            Some(took) => println!(
                "beside          {tasks} noop tasks in {:.3} s",
                took.as_secs_f64()
            ),
            None => println!(
                "beside          {tasks} noop tasks, not done when the load was (cancelled)"
            ),
        }
    }
    let saturated = runs.iter().any(|(_, r)| r.saturated);
    println!(
        "mode            {}{}",
        if ramped {
            "ramp".to_string()
        } else {
            describe(&spec.mode)
        },
        if saturated {
            " (saturated: stopped at --outstanding-max)"
        } else {
            ""
        }
    );
}

/// `--report DIR`: the HTML page and the HDR logs.
fn write_report(
    dir: &std::path::Path,
    runs: &[(String, RunResult)],
    ramped: bool,
    knee: Option<f64>,
    started: SystemTime,
) -> Result<(), String> {
    let sections: Vec<Section<'_>> = runs
        .iter()
        .map(|(name, run)| Section {
            name: name.clone(),
            run,
        })
        .collect();
    let ramp_html = ramped.then(|| ramp_html(runs, knee));
    let command: Vec<String> = std::env::args().collect();
    let page = report::write(
        dir,
        "flint-load report",
        &command.join(" "),
        &sections,
        ramp_html.as_deref(),
        started,
    )?;
    eprintln!("flint-load: report written to {}", page.display());
    Ok(())
}

fn seconds(flag: &str, value: f64) -> Result<Duration, String> {
    if (0.0..1e7).contains(&value) {
        Ok(Duration::from_secs_f64(value))
    } else {
        Err(format!("{flag} must be a number of seconds, not {value}"))
    }
}

/// `FROM:TO:STEPS` as STEPS rates, geometric from FROM to TO.
fn parse_ramp(text: &str) -> Result<Vec<f64>, String> {
    let bad = || format!("--ramp wants FROM:TO:STEPS (e.g. 1000:100000:8), not {text:?}");
    let parts: Vec<&str> = text.split(':').collect();
    let [from, to, steps] = parts.as_slice() else {
        return Err(bad());
    };
    let from: f64 = from.parse().map_err(|_| bad())?;
    let to: f64 = to.parse().map_err(|_| bad())?;
    let steps: u32 = steps.parse().map_err(|_| bad())?;
    if !(from > 0.0 && to >= from && to.is_finite()) || steps == 0 || steps > 100 {
        return Err(bad());
    }
    if steps == 1 {
        return Ok(vec![from]);
    }
    let ratio = (to / from).powf(1.0 / f64::from(steps - 1));
    Ok((0..steps).map(|i| from * ratio.powi(i as i32)).collect())
}

fn run_ramp(
    cluster: &Cluster,
    spec: &LoadSpec,
    rates: &[f64],
    step_s: f64,
) -> Result<Vec<(String, RunResult)>, String> {
    let step = seconds("--step-s", step_s)?;
    let mut runs = Vec::new();
    for (i, &rate_per_s) in rates.iter().enumerate() {
        let step_spec = LoadSpec {
            mode: Mode::Open { rate_per_s },
            limit: Limit::Duration(step),
            // The first step warms up for --warmup; later ones briefly, to settle.
            warmup: if i == 0 {
                spec.warmup
            } else {
                spec.warmup.min(Duration::from_millis(250))
            },
            ..spec.clone()
        };
        let run = load::run(&cluster.driver, &step_spec)?;
        let saturated = run.saturated;
        runs.push((format!("rate-{rate_per_s:.0}"), run));
        if saturated {
            break;
        }
    }
    Ok(runs)
}

fn name_of(spec: &LoadSpec) -> String {
    match spec.mode {
        Mode::Closed { in_flight, .. } => format!("closed-{in_flight}"),
        Mode::Open { rate_per_s } => format!("open-{rate_per_s:.0}"),
    }
}

fn describe(mode: &Mode) -> String {
    match mode {
        Mode::Closed { in_flight, batch } => {
            format!("closed loop, {in_flight} in flight, {batch} task(s) per job")
        }
        Mode::Open { rate_per_s } => format!("open loop, {rate_per_s:.0} tasks/s offered"),
    }
}

/// The knee of a ramp: the lowest rate from which every step on is degraded: p99 over 20 times
/// the first step's and over 10 ms, or achieved under 95% of offered, or saturated. Requiring
/// every later step to be degraded keeps a transient spike at one rate (another process's burst
/// on a shared machine) from being taken for the knee.
fn knee(runs: &[(String, RunResult)]) -> Option<f64> {
    let base_p99 = runs.first()?.1.summary.latency_us.p99.max(1);
    let degraded = |run: &RunResult| {
        let s = &run.summary;
        let offered = run.offered_per_s.unwrap_or(0.0);
        run.saturated
            || s.latency_us.p99 > (base_p99 * 20).max(10_000)
            || s.tasks_per_s < 0.95 * offered
    };
    let mut knee = None;
    for (_, run) in runs.iter().rev() {
        if !degraded(run) {
            break;
        }
        knee = run.offered_per_s;
    }
    knee
}

fn steps_json(runs: &[(String, RunResult)]) -> String {
    let steps: Vec<String> = runs
        .iter()
        .map(|(_, run)| {
            let s = &run.summary;
            let l = &s.latency_us;
            format!(
                "{{\"rate_per_s\":{:.1},\"tasks\":{},\"succeeded\":{},\"tasks_per_s\":{:.1},\
                 \"latency_us\":{{\"p50\":{},\"p90\":{},\"p99\":{},\"p999\":{},\"max\":{}}},\
                 \"saturated\":{}}}",
                run.offered_per_s.unwrap_or(0.0),
                s.tasks,
                s.succeeded,
                s.tasks_per_s,
                l.p50,
                l.p90,
                l.p99,
                l.p999,
                l.max,
                run.saturated
            )
        })
        .collect();
    format!("[{}]", steps.join(","))
}

fn steps_table(runs: &[(String, RunResult)], knee: Option<f64>) -> String {
    let mut out = String::from("offered/s    achieved/s   p50 us    p99 us    p99.9 us  max us\n");
    for (_, run) in runs {
        let s = &run.summary;
        let l = &s.latency_us;
        let offered = run.offered_per_s.unwrap_or(0.0);
        out.push_str(&format!(
            "{:<12.0} {:<12.0} {:<9} {:<9} {:<9} {}{}\n",
            offered,
            s.tasks_per_s,
            l.p50,
            l.p99,
            l.p999,
            l.max,
            if Some(offered) == knee {
                "  <- knee"
            } else {
                ""
            }
        ));
    }
    out.push('\n');
    out
}

fn ramp_html(runs: &[(String, RunResult)], knee: Option<f64>) -> String {
    let pick = |f: fn(&Latency) -> u64| -> Vec<(f64, f64)> {
        runs.iter()
            .map(|(_, r)| {
                (
                    r.offered_per_s.unwrap_or(0.0),
                    f(&r.summary.latency_us).max(1) as f64,
                )
            })
            .collect()
    };
    let latency = report::chart(
        "latency against offered rate (open loop)",
        "offered tasks/s",
        "latency us",
        &[
            ("p50".to_string(), pick(|l| l.p50)),
            ("p99".to_string(), pick(|l| l.p99)),
            ("p99.9".to_string(), pick(|l| l.p999)),
        ],
        report::Scale::Log,
        report::Scale::Log,
    );
    let achieved: Vec<(f64, f64)> = runs
        .iter()
        .map(|(_, r)| (r.offered_per_s.unwrap_or(0.0), r.summary.tasks_per_s))
        .collect();
    let offered: Vec<(f64, f64)> = achieved.iter().map(|&(o, _)| (o, o)).collect();
    let throughput = report::chart(
        "achieved against offered rate",
        "offered tasks/s",
        "tasks/s",
        &[
            ("achieved".to_string(), achieved),
            ("offered".to_string(), offered),
        ],
        report::Scale::Linear,
        report::Scale::Linear,
    );
    format!(
        "<h2>Rate ramp</h2>\n<p>Knee: {}</p>\n{latency}{throughput}",
        knee.map_or("not reached".to_string(), |k| format!(
            "{k:.0} tasks/s offered"
        ))
    )
}

/// One summary over every run (a ramp's steps added up; latency over all of them).
fn combined(runs: &[(String, RunResult)]) -> Summary {
    if let [(_, only)] = runs {
        return only.summary.clone();
    }
    let mut histogram: Option<Histogram<u64>> = None;
    let mut total = Summary {
        tasks: 0,
        succeeded: 0,
        failed: 0,
        retried: 0,
        executors_lost: 0,
        elapsed_s: 0.0,
        tasks_per_s: 0.0,
        latency_us: Latency::default(),
        checksum: 0,
    };
    for (_, run) in runs {
        let s = &run.summary;
        total.tasks += s.tasks;
        total.succeeded += s.succeeded;
        total.failed += s.failed;
        total.retried += s.retried;
        total.executors_lost += s.executors_lost;
        total.elapsed_s += s.elapsed_s;
        total.checksum = total.checksum.wrapping_add(s.checksum);
        match histogram.as_mut() {
            None => histogram = Some(run.histogram.clone()),
            Some(h) => {
                let _ = h.add(&run.histogram);
            }
        }
    }
    if total.elapsed_s > 0.0 {
        total.tasks_per_s = (total.succeeded + total.failed) as f64 / total.elapsed_s;
    }
    if let Some(h) = histogram.filter(|h| !h.is_empty()) {
        total.latency_us = Latency {
            p50: h.value_at_quantile(0.5),
            p90: h.value_at_quantile(0.9),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        };
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_cli::summary::Recorder;

    #[test]
    fn a_job_beside_the_load_is_bounded_in_tasks() {
        let parse = |n: &str| Args::try_parse_from(["flint-load", "--beside-tasks", n]);
        assert_eq!(
            parse("10000000").expect("in range").beside_tasks,
            Some(10_000_000)
        );
        for bad in ["0", "100000001", "18446744073709551615", "-1", "many"] {
            assert!(parse(bad).is_err(), "--beside-tasks {bad} is refused");
        }
    }

    fn step(rate_per_s: f64, achieved_per_s: f64, p99_us: u64) -> (String, RunResult) {
        let mut recorder = Recorder::new();
        recorder.record(Ok(&[]), Duration::from_micros(p99_us));
        let mut summary = recorder.summary(1, 0, 0, Duration::from_secs(1));
        summary.tasks_per_s = achieved_per_s;
        (
            format!("rate-{rate_per_s}"),
            RunResult {
                summary,
                histogram: recorder.histogram(),
                intervals: Vec::new(),
                timeline: Vec::new(),
                offered_per_s: Some(rate_per_s),
                saturated: false,
                beside: None,
            },
        )
    }

    #[test]
    fn ramps_are_geometric_and_bad_ones_are_refused() {
        let rates = parse_ramp("1000:100000:3").unwrap();
        assert_eq!(rates.len(), 3);
        assert!((rates[1] - 10_000.0).abs() < 1e-6);
        assert!((rates[2] - 100_000.0).abs() < 1e-6);
        assert_eq!(parse_ramp("5:5:1").unwrap(), vec![5.0]);
        for bad in ["", "1:2", "0:10:2", "10:1:2", "1:10:0", "a:b:c", "1:10:2:3"] {
            assert!(parse_ramp(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_knee_ignores_a_transient_spike() {
        let runs = vec![
            step(1000.0, 1000.0, 200),
            step(2000.0, 2000.0, 50_000),
            step(4000.0, 4000.0, 300),
            step(8000.0, 7000.0, 400),
            step(16000.0, 9000.0, 90_000),
        ];
        assert_eq!(knee(&runs), Some(8000.0));
        assert_eq!(knee(&runs[..3]), None);
    }

    #[test]
    fn a_single_run_summary_passes_through_and_ramps_add_up() {
        let runs = vec![step(1000.0, 1000.0, 200), step(2000.0, 2000.0, 400)];
        assert_eq!(combined(&runs[..1]), runs[0].1.summary);
        let total = combined(&runs);
        assert_eq!((total.tasks, total.succeeded), (2, 2));
        assert!(total.latency_us.max >= 400);
    }
}
