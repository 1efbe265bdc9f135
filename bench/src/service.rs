//! The service benchmark: what a web service embedding the driver sees. An axum server on
//! loopback answers `GET /flint` by submitting one job of `tasks_per_request` tasks with
//! `Driver::submit_async` and awaiting its handle, and `GET /inline` by calling the same function
//! the same number of times in the handler. A closed-loop load generator (`connections`
//! keep-alive HTTP/1.1 connections, a minimal client over tokio's `TcpStream`, on a thread of its
//! own) drives each route for a warm-up and a measured period. CPU per request is read from the
//! kernel for the server (this process less the client's thread) and for the executor processes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use flint_engine::functions::{Registry, Resolved, TaskContext};
use flint_net::driver::{Driver, DriverConfig};
use flint_net::job::{Job, JobOutcome};
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::async_load::{cpu_executors_us, cpu_us};
use crate::cluster::{self, Cluster, ClusterSpec, ExecutorSource};
use crate::fault::{Fault, Running, Target};

/// How long one request may take before the client gives up (a stuck server fails the run).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// A job's deadline in the handler: a request never waits without end for its job.
const JOB_DEADLINE: Duration = Duration::from_secs(5);
/// The largest response head and body the client accepts.
const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// The longest latency recorded (longer ones are clamped), in microseconds.
const LATENCY_US_MAX: u64 = 60_000_000;

/// One service run.
#[derive(Debug, Clone)]
pub struct ServiceSpec {
    /// Executor processes (`flint executor`); 0 runs the driver's local mode.
    pub executors: u32,
    /// Task threads per executor, or the local-mode pool's workers when `executors` is 0.
    pub cores: u32,
    /// The function each task runs (a built-in, e.g. `spin:20`).
    pub task: String,
    /// Payload bytes per task.
    pub payload_bytes: usize,
    /// Tasks in the job of one request.
    pub tasks_per_request: u32,
    /// Concurrent keep-alive connections of the load generator.
    pub connections: usize,
    /// Load before each measured period.
    pub warmup: Duration,
    /// Each measured period (the Flint one and the inline one).
    pub duration: Duration,
    /// The server's tokio worker threads.
    pub server_threads: usize,
    /// The `flint` binary for executor processes (default: beside this one).
    pub flint_bin: Option<PathBuf>,
    /// A fault on executor process 0 during the measured Flint period ([`crate::fault`]).
    pub fault: Option<Fault>,
    /// Hedged attempts and suspicion on (the driver's default).
    pub hedging: bool,
    /// Measure the inline route too (for the ratio); off, its period is empty.
    pub inline: bool,
}

/// What one measured period saw.
#[derive(Debug, Clone)]
pub struct Period {
    /// Requests answered in the period.
    pub requests: u64,
    /// Requests answered with an error status.
    pub failed: u64,
    /// Its length.
    pub elapsed: Duration,
    /// Request latency at the client, in microseconds.
    pub latency_us: Histogram<u64>,
    /// CPU time of the server (this process less the client's thread), in microseconds.
    pub cpu_server_us: u64,
    /// CPU time of the executor processes, in microseconds.
    pub cpu_executors_us: u64,
    /// CPU time of the load generator's thread, in microseconds.
    pub cpu_client_us: u64,
    /// Task attempts the driver launched in the period, and of those the copies (hedged or
    /// speculative): the extra attempts. Zero for the inline period.
    pub attempts: (u64, u64),
    /// Executors suspected and put on probation in the period.
    pub sick: (u64, u64),
}

impl Period {
    /// A period that was not measured.
    fn empty() -> Result<Period, String> {
        Ok(Period {
            requests: 0,
            failed: 0,
            elapsed: Duration::ZERO,
            latency_us: histogram()?,
            cpu_server_us: 0,
            cpu_executors_us: 0,
            cpu_client_us: 0,
            attempts: (0, 0),
            sick: (0, 0),
        })
    }

    /// Requests per second.
    pub fn requests_per_s(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn per_request(&self, us: u64) -> f64 {
        us as f64 / self.requests.max(1) as f64
    }

    /// JSON fields of this period, each name prefixed.
    pub fn json(&self, prefix: &str) -> String {
        let h = &self.latency_us;
        format!(
            "\"{prefix}requests_per_s\":{:.1},\"{prefix}requests\":{},\"{prefix}failed\":{},\
             \"{prefix}latency_us\":{{\"p50\":{},\"p99\":{},\"p999\":{},\"max\":{}}},\
             \"{prefix}attempts\":{},\"{prefix}extra_attempts\":{},\
             \"{prefix}suspicions\":{},\"{prefix}probations\":{},\
             \"{prefix}server_cpu_us_per_request\":{:.2},\
             \"{prefix}executor_cpu_us_per_request\":{:.2},\
             \"{prefix}client_cpu_us_per_request\":{:.2}",
            self.requests_per_s(),
            self.requests,
            self.failed,
            h.value_at_quantile(0.5),
            h.value_at_quantile(0.99),
            h.value_at_quantile(0.999),
            h.max(),
            self.attempts.0,
            self.attempts.1,
            self.sick.0,
            self.sick.1,
            self.per_request(self.cpu_server_us),
            self.per_request(self.cpu_executors_us),
            self.per_request(self.cpu_client_us),
        )
    }
}

/// Both periods of one run.
#[derive(Debug, Clone)]
pub struct ServiceResult {
    /// The spec it ran.
    pub spec: ServiceSpec,
    /// Requests served through Flint.
    pub flint: Period,
    /// The same requests with the work done in the handler.
    pub inline: Period,
}

impl ServiceResult {
    /// Flint's requests per second over inline's.
    pub fn ratio(&self) -> f64 {
        self.flint.requests_per_s() / self.inline.requests_per_s().max(1e-9)
    }

    /// Whether every request of both periods succeeded.
    pub fn succeeded(&self) -> bool {
        self.flint.failed == 0 && self.inline.failed == 0
    }

    /// One JSON object.
    pub fn json(&self) -> String {
        let s = &self.spec;
        let fault = s.fault.map_or_else(|| "none".to_owned(), |f| f.to_string());
        format!(
            "{{\"mode\":\"{}\",\"fault\":\"{fault}\",\"hedging\":{},\"executors\":{},\"cores\":{},\
             \"task\":\"{}\",\"tasks_per_request\":{},\"connections\":{},\
             \"server_threads\":{},{},{},\"ratio_to_inline\":{:.4}}}",
            self.mode(),
            s.hedging,
            s.executors,
            s.cores,
            s.task.escape_default(),
            s.tasks_per_request,
            s.connections,
            s.server_threads,
            self.flint.json(""),
            self.inline.json("inline_"),
            self.ratio(),
        )
    }

    fn mode(&self) -> &'static str {
        if self.spec.executors == 0 {
            "local"
        } else {
            "remote"
        }
    }

    /// The table's header line.
    pub fn table_header() -> &'static str {
        "mode    flint req/s  inline req/s  ratio  flint p50/p99 us  inline p50/p99 us  \
         server CPU us/req (flint/inline)  executors CPU us/req"
    }

    /// This run's row of the table.
    pub fn table_row(&self) -> String {
        let (f, i) = (&self.flint, &self.inline);
        let q = |p: &Period, q: f64| p.latency_us.value_at_quantile(q);
        format!(
            "{:<6}  {:>11.0}  {:>12.0}  {:>5.3}  {:>16}  {:>17}  {:>32}  {:>20.1}",
            self.mode(),
            f.requests_per_s(),
            i.requests_per_s(),
            self.ratio(),
            format!("{} / {}", q(f, 0.5), q(f, 0.99)),
            format!("{} / {}", q(i, 0.5), q(i, 0.99)),
            format!(
                "{:.1} / {:.1}",
                f.per_request(f.cpu_server_us),
                i.per_request(i.cpu_server_us)
            ),
            f.per_request(f.cpu_executors_us),
        )
    }
}

/// Starts the cluster and the server, measures `/flint` then `/inline`, and stops everything.
pub fn run(spec: &ServiceSpec) -> Result<ServiceResult, String> {
    let resolved = Registry::with_builtins()
        .resolve(&spec.task)
        .map_err(|e| format!("--task: {e}"))?;
    if spec.tasks_per_request == 0 || spec.connections == 0 || spec.cores == 0 {
        return Err("--tasks-per-request, --connections and --cores must be at least 1".into());
    }
    let cluster = start_cluster(spec)?;
    let service = Arc::new(Service {
        driver: cluster.driver.clone(),
        task: spec.task.as_str().into(),
        resolved,
        payloads: vec![Bytes::from(vec![7u8; spec.payload_bytes]); spec.tasks_per_request as usize]
            .into(),
    });
    if spec.fault.is_some() && spec.executors == 0 {
        cluster.stop();
        return Err("--fault needs executor processes (--executors 1 or more)".into());
    }
    let faulty = spec.fault.zip(cluster.fault_target());
    let result = serve_and_measure(service, spec, &cluster.executor_pids(), faulty);
    cluster.stop();
    let (flint, inline) = result?;
    Ok(ServiceResult {
        spec: spec.clone(),
        flint,
        inline,
    })
}

fn start_cluster(spec: &ServiceSpec) -> Result<Cluster, String> {
    let (executors, source) = if spec.executors == 0 {
        (1, ExecutorSource::LocalMode)
    } else {
        let binary = cluster::flint_binary(spec.flint_bin.as_deref())?;
        let source = ExecutorSource::Processes {
            binary,
            logs: false,
        };
        (spec.executors, source)
    };
    let mut driver = DriverConfig::default();
    let jobs_max = spec.connections.saturating_add(64);
    driver.scheduler.jobs_max = driver.scheduler.jobs_max.max(jobs_max);
    if !spec.hedging {
        driver.scheduler.hedging = None;
    }
    Cluster::start(ClusterSpec {
        executors,
        cores: spec.cores,
        source,
        driver,
        relay_first: spec.fault.is_some_and(|f| f.needs_relay()),
    })
}

/// The handlers' state.
struct Service {
    driver: Arc<Driver>,
    task: std::sync::Arc<str>,
    resolved: Resolved,
    /// Every request's inputs: one list its jobs share (no vector per request).
    payloads: std::sync::Arc<[Bytes]>,
}

/// One job per request, awaited.
async fn flint_handler(State(service): State<Arc<Service>>) -> StatusCode {
    let job = Job::with_payloads(service.task.clone(), service.payloads.clone())
        .keep_results(false)
        .deadline(JOB_DEADLINE);
    match service.driver.submit_async(job).await {
        Ok(handle) => match handle.await {
            JobOutcome::Succeeded(_) => StatusCode::OK,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The same work in the handler.
async fn inline_handler(State(service): State<Arc<Service>>) -> StatusCode {
    let resolved = &service.resolved;
    let ctx = TaskContext::new(0, 0, resolved.argument.as_deref());
    let ok = service
        .payloads
        .iter()
        .all(|payload| (resolved.function)(&ctx, payload.clone()).is_ok());
    if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    }
}

/// Runs the server on its own runtime while the client measures each route in turn.
fn serve_and_measure(
    service: Arc<Service>,
    spec: &ServiceSpec,
    executor_pids: &[u32],
    fault: Option<(Fault, Target)>,
) -> Result<(Period, Period), String> {
    let driver = service.driver.clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(spec.server_threads.max(1))
        .thread_name("service-server")
        // The server's workers tell the spin budget when they are busy, so Flint's spinning
        // threads leave their cores alone (a no-op when spinning is off).
        .on_thread_start(|| flint_engine::spin::set_thread_busy(true))
        .on_thread_unpark(|| flint_engine::spin::set_thread_busy(true))
        .on_thread_park(|| flint_engine::spin::set_thread_busy(false))
        .on_thread_stop(|| flint_engine::spin::set_thread_busy(false))
        .enable_all()
        .build()
        .map_err(|e| format!("tokio: {e}"))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
        .map_err(|e| format!("cannot listen: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let router = Router::new()
        .route("/flint", get(flint_handler))
        .route("/inline", get(inline_handler))
        .with_state(service);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });
    let flint_side = Some(FlintSide { driver, fault });
    let flint = measure(addr, "/flint", spec, executor_pids, flint_side);
    let inline = flint.is_ok().then(|| match spec.inline {
        true => measure(addr, "/inline", spec, executor_pids, None),
        false => Period::empty(),
    });
    let _ = stop.send(());
    let served =
        runtime.block_on(async { tokio::time::timeout(Duration::from_secs(5), server).await });
    runtime.shutdown_timeout(Duration::from_secs(5));
    match served {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => return Err(format!("the server failed: {e}")),
        Ok(Err(e)) => return Err(format!("the server panicked: {e}")),
        Err(_) => return Err("the server did not stop within 5 s".into()),
    }
    Ok((flint?, inline.unwrap_or_else(|| Err("not run".into()))?))
}

/// Counters the client's connections share.
#[derive(Default)]
struct Shared {
    measuring: AtomicBool,
    stop: AtomicBool,
    requests: AtomicU64,
    failed: AtomicU64,
}

/// The closed-loop client on a thread of its own (so its CPU can be told apart): a warm-up,
/// then a measured period.
fn measure(
    addr: SocketAddr,
    path: &'static str,
    spec: &ServiceSpec,
    executor_pids: &[u32],
    flint: Option<FlintSide>,
) -> Result<Period, String> {
    let spec = spec.clone();
    let pids = executor_pids.to_vec();
    std::thread::Builder::new()
        .name("service-client".into())
        .spawn(move || {
            let thread = this_thread_stat()?;
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("tokio: {e}"))?
                .block_on(client_period(addr, path, &spec, &pids, &thread, flint))
        })
        .map_err(|e| format!("cannot start the client thread: {e}"))?
        .join()
        .map_err(|_| "the client thread panicked".to_string())?
}

/// `self/task/TID` for the calling thread, for [`cpu_us`].
fn this_thread_stat() -> Result<String, String> {
    let link = std::fs::read_link("/proc/thread-self")
        .map_err(|e| format!("cannot read /proc/thread-self: {e}"))?;
    let tid = link
        .file_name()
        .and_then(|name| name.to_str())
        .ok_or("/proc/thread-self has no thread id")?;
    Ok(format!("self/task/{tid}"))
}

/// CPU times at one instant: (process, client thread, executors), in microseconds.
fn cpu_now(thread: &str, pids: &[u32]) -> (u64, u64, u64) {
    (cpu_us("self"), cpu_us(thread), cpu_executors_us(pids))
}

/// The Flint route's extras: the driver (for its attempt counts) and the fault to inject.
struct FlintSide {
    driver: Arc<Driver>,
    fault: Option<(Fault, Target)>,
}

async fn client_period(
    addr: SocketAddr,
    path: &'static str,
    spec: &ServiceSpec,
    pids: &[u32],
    thread: &str,
    flint: Option<FlintSide>,
) -> Result<Period, String> {
    let shared = Arc::new(Shared::default());
    let latency = Arc::new(Mutex::new(histogram()?));
    let mut connections = Vec::with_capacity(spec.connections);
    for _ in 0..spec.connections {
        let (shared, latency) = (shared.clone(), latency.clone());
        connections.push(tokio::spawn(async move {
            let result = connection(addr, path, &shared).await;
            // One failed connection ends the run: the others stop too.
            shared.stop.store(true, Ordering::Relaxed);
            let local = result?;
            latency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(&local)
                .map_err(|e| e.to_string())
        }));
    }
    tokio::time::sleep(spec.warmup).await;
    let before = cpu_now(thread, pids);
    let stats_before = flint.as_ref().map(|f| f.driver.stats());
    let started = Instant::now();
    shared.measuring.store(true, Ordering::Relaxed);
    let fault = flint.as_ref().and_then(|f| f.fault.clone());
    let running = fault
        .map(|(f, target)| Running::start(f, target, Duration::ZERO))
        .transpose()?;
    tokio::time::sleep(spec.duration).await;
    shared.measuring.store(false, Ordering::Relaxed);
    drop(running);
    let elapsed = started.elapsed();
    let after = cpu_now(thread, pids);
    let (attempts, sick) = match (&flint, stats_before) {
        (Some(f), Some(b)) => {
            let a = f.driver.stats();
            let extra = a.speculative_launched - b.speculative_launched;
            let sick = (a.suspicions - b.suspicions, a.probations - b.probations);
            ((a.launched - b.launched, extra), sick)
        }
        _ => ((0, 0), (0, 0)),
    };
    shared.stop.store(true, Ordering::Relaxed);
    for connection in connections {
        connection
            .await
            .map_err(|e| format!("a connection panicked: {e}"))??;
    }
    let cpu_client_us = after.1.saturating_sub(before.1);
    let latency_us = latency.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(Period {
        requests: shared.requests.load(Ordering::Relaxed),
        failed: shared.failed.load(Ordering::Relaxed),
        elapsed,
        latency_us,
        cpu_server_us: after
            .0
            .saturating_sub(before.0)
            .saturating_sub(cpu_client_us),
        cpu_executors_us: after.2.saturating_sub(before.2),
        cpu_client_us,
        attempts,
        sick,
    })
}

fn histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).map_err(|e| e.to_string())
}

/// One keep-alive connection: requests back to back until told to stop.
async fn connection(
    addr: SocketAddr,
    path: &str,
    shared: &Shared,
) -> Result<Histogram<u64>, String> {
    let mut latency = histogram()?;
    let mut stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    let mut buffer = Vec::with_capacity(1024);
    while !shared.stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let status = tokio::time::timeout(
            REQUEST_TIMEOUT,
            exchange(&mut stream, request.as_bytes(), &mut buffer),
        )
        .await
        .map_err(|_| format!("no response to {path} within {REQUEST_TIMEOUT:?}"))??;
        if shared.measuring.load(Ordering::Relaxed) {
            let us = started
                .elapsed()
                .as_micros()
                .clamp(1, LATENCY_US_MAX.into()) as u64;
            let _ = latency.record(us);
            shared.requests.fetch_add(1, Ordering::Relaxed);
            if status != 200 {
                shared.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(latency)
}

/// Sends one request and reads its response; returns the status code.
async fn exchange(
    stream: &mut TcpStream,
    request: &[u8],
    buffer: &mut Vec<u8>,
) -> Result<u16, String> {
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("cannot send a request: {e}"))?;
    buffer.clear();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some((status, length)) = parse_response(buffer)? {
            if buffer.len() >= length {
                return Ok(status);
            }
        }
        if buffer.len() > RESPONSE_BYTES_MAX {
            return Err(format!(
                "a response over {RESPONSE_BYTES_MAX} bytes (or no end of its head)"
            ));
        }
        let read = stream
            .read(&mut chunk)
            .await
            .map_err(|e| format!("cannot read a response: {e}"))?;
        if read == 0 {
            return Err("the server closed the connection".into());
        }
        buffer.extend_from_slice(&chunk[..read]);
    }
}

/// A response's status and its whole length (head and body) once its head is in `buffer`.
fn parse_response(buffer: &[u8]) -> Result<Option<(u16, usize)>, String> {
    let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Ok(None);
    };
    let head = std::str::from_utf8(&buffer[..head_end]).map_err(|_| "a non-UTF-8 head")?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("a bad status line in {head:?}"))?;
    let mut body_bytes = 0usize;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                body_bytes = value
                    .trim()
                    .parse()
                    .map_err(|_| format!("a bad content-length in {head:?}"))?;
            }
        }
    }
    if body_bytes > RESPONSE_BYTES_MAX {
        return Err(format!("a body of {body_bytes} bytes"));
    }
    Ok(Some((status, head_end + 4 + body_bytes)))
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    #[test]
    fn parses_a_complete_response_and_waits_for_a_partial_one() {
        let full = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 3\r\n\r\nabc";
        assert_eq!(parse_response(full), Ok(Some((500, full.len()))));
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-le"), Ok(None));
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        let huge = b"HTTP/1.1 200 OK\r\ncontent-length: 99999999\r\n\r\n";
        assert!(parse_response(huge).is_err());
    }
}
