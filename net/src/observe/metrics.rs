//! Prometheus metrics for the driver, the master and the worker, encoded by
//! [`prometheus_client`] from the views of [`crate::observe`] at scrape time: nothing is
//! recorded for the metrics alone, so having them costs the hot path nothing beyond what
//! [`crate::observe`] keeps.
//!
//! Two formats, chosen by the scraper's `Accept` header ([`Format::negotiate`]): the Prometheus
//! text format 0.0.4 (the default; counter families named with their `_total`, as
//! `promtool check metrics` wants) and OpenMetrics 1.0 (asked for with
//! `application/openmetrics-text`).
//!
//! Embedding (a service serving its own `/metrics`, no second port):
//! - with `prometheus-client`: register a [`DriverCollector`] in your [`Registry`]
//!   (`registry.register_collector(Box::new(DriverCollector::new(driver.observer())))`);
//! - otherwise: [`render_driver`] gives the text and its `Content-Type` for the request's
//!   `Accept`, to append to (or serve beside) the service's own metrics;
//! - or let [`super::ui::serve_driver`] serve `/metrics` (and the pages) itself.
//!
//! Names (all prefixed `flint_`; counters end in `_total`):
//!
//! | role | metrics |
//! | --- | --- |
//! | driver | `tasks_launched`, `tasks_succeeded`, `task_attempts_failed`, `task_kills_sent`, `tasks_speculative_launched`, `task_hedges`, `task_hedges_withheld`, `executor_suspicions`, `executor_probations`, `status_updates_ignored` (counters); `tasks_pending`, `tasks_running`, `executor_tasks_running{executor}`, `executor_lanes{executor}` (gauges); `executor_tasks_finished{executor}`, `executor_tasks_failed{executor}`; `executors` (registered now), `executors_registered`, `executors_lost`, `executors_excluded`; `jobs_active`, `jobs_submitted`, `jobs_finished{outcome}`; `task_queue_seconds`, `task_round_trip_seconds` (histograms, sampled); `connections_refused{reason}` |
//! | master | `workers{state}`, `cores{state="used"\|"free"}` and `memory_bytes{state}` over alive workers, `applications{state}`, `executors_by_state{state}` |
//! | worker | `worker_cores{state}`, `worker_memory_bytes{state}`, `executors_by_state{state}` |
//! | every process | `up` (1 when the role answered), `net_frames_received`, `net_bytes_received`, `net_bytes_sent`, `net_writes` |

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
pub use prometheus_client::registry::Registry;

use super::http::Response;
use crate::handshake::Secret;
use crate::observe::{cluster_view, ClusterView, DriverView, DriverViews, Histogram, NET};

/// The `Content-Type` of OpenMetrics text.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The `Content-Type` of the Prometheus text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A metrics exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The Prometheus text format 0.0.4.
    Text,
    /// OpenMetrics 1.0.
    OpenMetrics,
}

impl Format {
    /// The format a scraper's `Accept` header asks for: OpenMetrics when it names
    /// `application/openmetrics-text`, else the text format.
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Text,
        }
    }

    /// Its `Content-Type`.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => TEXT_CONTENT_TYPE,
            Format::OpenMetrics => OPENMETRICS_CONTENT_TYPE,
        }
    }
}

/// How long a scrape waits for the role to answer.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);

type Result = std::result::Result<(), std::fmt::Error>;

fn counter(enc: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> Result {
    let metric = ConstCounter::new(value);
    metric.encode(enc.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, value: i64) -> Result {
    let metric = ConstGauge::new(value);
    metric.encode(enc.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// One metric with a label, one sample per row.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    label: &str,
    rows: &[(String, i64)],
) -> Result {
    let mut metric = enc.encode_descriptor(name, help, None, kind)?;
    for (value_label, value) in rows {
        let labels = [(label, value_label.as_str())];
        let sample = metric.encode_family(&labels)?;
        if matches!(kind, MetricType::Counter) {
            ConstCounter::new(*value as u64).encode(sample)?;
        } else {
            ConstGauge::new(*value).encode(sample)?;
        }
    }
    Ok(())
}

fn histogram(enc: &mut DescriptorEncoder, name: &str, help: &str, h: &Histogram) -> Result {
    let mut metric = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    metric.encode_histogram::<NoLabelSet>(
        h.sum_us as f64 / 1e6,
        h.count,
        &h.buckets_seconds(),
        None,
    )
}

fn net(enc: &mut DescriptorEncoder) -> Result {
    let load = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    counter(
        enc,
        "net_frames_received",
        "Frames decoded from peers by this process.",
        load(&NET.frames_in),
    )?;
    counter(
        enc,
        "net_bytes_received",
        "Bytes read from peers by this process.",
        load(&NET.bytes_in),
    )?;
    counter(
        enc,
        "net_bytes_sent",
        "Bytes written to peers by this process.",
        load(&NET.bytes_out),
    )?;
    counter(
        enc,
        "net_writes",
        "Socket writes that sent bytes (each carries one or more frames).",
        load(&NET.writes),
    )
}

/// The driver's metrics, asked of its loop at every scrape.
#[derive(Debug, Clone)]
pub struct DriverCollector {
    views: std::sync::Arc<dyn DriverViews>,
}

impl DriverCollector {
    /// Collects from the driver `views` answers for (its `DriverObserver`).
    pub fn new(views: impl DriverViews) -> DriverCollector {
        DriverCollector {
            views: std::sync::Arc::new(views),
        }
    }
}

impl Collector for DriverCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result {
        let view = self.views.driver_view(SCRAPE_TIMEOUT).ok();
        encode_driver_or_down(enc, view.as_ref())
    }
}

fn encode_driver_or_down(mut enc: DescriptorEncoder, view: Option<&DriverView>) -> Result {
    gauge(
        &mut enc,
        "up",
        "1 when the driver's loop answered this scrape.",
        i64::from(view.is_some()),
    )?;
    net(&mut enc)?;
    match view {
        Some(view) => encode_driver(&mut enc, view),
        None => Ok(()),
    }
}

/// A driver's view as it was asked (or `None`: it did not answer), for one rendering.
#[derive(Debug)]
struct DriverViewCollector(Option<std::sync::Arc<DriverView>>);

impl Collector for DriverViewCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result {
        encode_driver_or_down(enc, self.0.as_deref())
    }
}

/// The driver's metrics, asked of it now, in the format `accept` asks for: the text and its
/// `Content-Type` (see the module docs on embedding).
pub fn render_driver(views: &dyn DriverViews, accept: Option<&str>) -> (String, &'static str) {
    let view = views
        .driver_view(SCRAPE_TIMEOUT)
        .ok()
        .map(std::sync::Arc::new);
    let format = Format::negotiate(accept);
    let registry = registry_with(Box::new(DriverViewCollector(view)));
    (render(&registry, format), format.content_type())
}

fn response(text: String, format: Format) -> Response {
    Response::ok(format.content_type(), text)
}

/// The `/metrics` answer from a driver's `view`.
pub fn driver_response(view: &std::sync::Arc<DriverView>, accept: Option<&str>) -> Response {
    let format = Format::negotiate(accept);
    let registry = registry_with(Box::new(DriverViewCollector(Some(view.clone()))));
    response(render(&registry, format), format)
}

/// The `/metrics` answer when the driver did not answer: `up` 0 (the error is logged).
pub fn driver_down(accept: Option<&str>, error: &str) -> Response {
    tracing::debug!("metrics: the driver did not answer: {error}");
    let format = Format::negotiate(accept);
    let registry = registry_with(Box::new(DriverViewCollector(None)));
    response(render(&registry, format), format)
}

/// Encodes a [`DriverView`].
pub fn encode_driver(enc: &mut DescriptorEncoder, v: &DriverView) -> Result {
    encode_tasks(enc, v)?;
    encode_executors(enc, v)?;
    encode_jobs(enc, v)?;
    encode_latencies_and_refusals(enc, v)
}

/// The driver's task counters and gauges.
fn encode_tasks(enc: &mut DescriptorEncoder, v: &DriverView) -> Result {
    let s = &v.stats;
    counter(
        enc,
        "tasks_launched",
        "Task attempts launched (retries and speculative copies included).",
        s.launched,
    )?;
    counter(enc, "tasks_succeeded", "Tasks that succeeded.", s.succeeded)?;
    counter(
        enc,
        "task_attempts_failed",
        "Task attempts that failed (retried or not, killed and lost included).",
        s.attempts_failed,
    )?;
    counter(
        enc,
        "task_kills_sent",
        "Task attempts the driver asked an executor to kill.",
        v.kills_sent,
    )?;
    counter(
        enc,
        "tasks_speculative_launched",
        "Speculative task attempts launched.",
        s.speculative_launched,
    )?;
    counter(
        enc,
        "task_hedges",
        "Copies queued for attempts past their hedging threshold (hedged tasks).",
        s.hedges,
    )?;
    counter(
        enc,
        "task_hedges_withheld",
        "Overdue attempts not copied: no token left, or most executors slow at once.",
        s.hedges_withheld,
    )?;
    counter(
        enc,
        "executor_suspicions",
        "Times an executor was suspected (overdue attempts, silent as long): no new work.",
        s.suspicions,
    )?;
    counter(
        enc,
        "executor_probations",
        "Times an executor went on probation (much slower than its peers): one attempt at a time.",
        s.probations,
    )?;
    counter(
        enc,
        "status_updates_ignored",
        "Status updates ignored as stale, duplicate or unknown.",
        s.ignored_updates,
    )?;
    gauge(
        enc,
        "tasks_pending",
        "Tasks waiting for a slot.",
        v.pending_tasks as i64,
    )?;
    gauge(
        enc,
        "tasks_running",
        "Task attempts running.",
        v.running_tasks as i64,
    )
}

/// The driver's executors: per executor, counted now and since the start.
fn encode_executors(enc: &mut DescriptorEncoder, v: &DriverView) -> Result {
    let live: Vec<_> = v
        .executors
        .iter()
        .filter(|e| e.removed.is_empty())
        .collect();
    let rows = |f: &dyn Fn(&crate::observe::ExecutorView) -> i64| -> Vec<(String, i64)> {
        live.iter().map(|e| (e.executor_id.clone(), f(e))).collect()
    };
    family(
        enc,
        "executor_tasks_running",
        "Task attempts running per registered executor.",
        MetricType::Gauge,
        "executor",
        &rows(&|e| i64::from(e.tasks_running)),
    )?;
    family(
        enc,
        "executor_lanes",
        "Connections (lanes) each registered executor runs its tasks over: one per core, at most 16.",
        MetricType::Gauge,
        "executor",
        &rows(&|e| i64::from(e.lanes_joined)),
    )?;
    family(
        enc,
        "executor_tasks_finished",
        "Tasks finished per registered executor.",
        MetricType::Counter,
        "executor",
        &rows(&|e| e.tasks_finished as i64),
    )?;
    family(
        enc,
        "executor_tasks_failed",
        "Task attempts failed per registered executor.",
        MetricType::Counter,
        "executor",
        &rows(&|e| e.tasks_failed as i64),
    )?;
    gauge(
        enc,
        "executors",
        "Executors registered now.",
        live.len() as i64,
    )?;
    counter(
        enc,
        "executors_registered",
        "Executors registered since the start.",
        v.executors_registered,
    )?;
    counter(
        enc,
        "executors_lost",
        "Executors lost since the start (not stopped on purpose).",
        v.executors_lost,
    )?;
    counter(
        enc,
        "executors_excluded",
        "Executors excluded for failures (cumulative).",
        v.stats.executors_excluded,
    )
}

/// The driver's jobs: active, submitted, over by outcome.
fn encode_jobs(enc: &mut DescriptorEncoder, v: &DriverView) -> Result {
    gauge(
        enc,
        "jobs_active",
        "Jobs submitted and not over.",
        v.active_jobs as i64,
    )?;
    counter(
        enc,
        "jobs_submitted",
        "Jobs submitted since the start.",
        v.jobs_submitted,
    )?;
    let outcomes = ["succeeded", "failed", "cancelled"];
    let rows: Vec<(String, i64)> = outcomes
        .iter()
        .zip(v.jobs_over)
        .map(|(o, n)| ((*o).to_owned(), n as i64))
        .collect();
    family(
        enc,
        "jobs_finished",
        "Jobs over, by outcome.",
        MetricType::Counter,
        "outcome",
        &rows,
    )
}

/// The driver's sampled task latencies and its refused connections by reason.
fn encode_latencies_and_refusals(enc: &mut DescriptorEncoder, v: &DriverView) -> Result {
    histogram(
        enc,
        "task_queue_seconds",
        "Submit to first launch, one task in 16 sampled.",
        &v.queue_time,
    )?;
    histogram(
        enc,
        "task_round_trip_seconds",
        "Launch to the final status update at the driver, one task in 16 sampled.",
        &v.round_trip,
    )?;
    let rows: Vec<(String, i64)> = v
        .refusals
        .iter()
        .map(|(r, n)| ((*r).to_owned(), *n as i64))
        .collect();
    family(
        enc,
        "connections_refused",
        "Connections or registrations refused, by reason.",
        MetricType::Counter,
        "reason",
        &rows,
    )
}

/// Which role a [`ClusterCollector`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterRole {
    /// A master: workers, applications, executors.
    Master,
    /// A worker, about itself and its executors.
    Worker,
}

/// The master's (or a worker's) metrics, from its status answer at every scrape.
#[derive(Debug, Clone)]
pub struct ClusterCollector {
    addr: SocketAddr,
    secret: Option<Secret>,
    role: ClusterRole,
}

impl ClusterCollector {
    /// Collects from the master or worker answering status requests at `addr`.
    pub fn new(addr: SocketAddr, secret: Option<Secret>, role: ClusterRole) -> ClusterCollector {
        ClusterCollector { addr, secret, role }
    }

    /// The view, asked now.
    pub fn view(&self) -> std::result::Result<ClusterView, crate::standalone::ClientError> {
        cluster_view(self.addr, self.secret.clone(), SCRAPE_TIMEOUT)
    }
}

fn count_by<'a>(states: impl Iterator<Item = &'a str>, all: &[&str]) -> Vec<(String, i64)> {
    let mut rows: Vec<(String, i64)> = all.iter().map(|s| (s.to_lowercase(), 0)).collect();
    for state in states {
        let state = state.to_lowercase();
        match rows.iter_mut().find(|(s, _)| *s == state) {
            Some(row) => row.1 += 1,
            None => rows.push((state, 1)),
        }
    }
    rows
}

impl Collector for ClusterCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result {
        let view = self.view();
        if let Err(error) = &view {
            tracing::debug!("metrics: no status answer: {error}");
        }
        encode_cluster_or_down(enc, self.role, view.ok().as_ref())
    }
}

fn encode_cluster_or_down(
    mut enc: DescriptorEncoder,
    role: ClusterRole,
    view: Option<&ClusterView>,
) -> Result {
    gauge(
        &mut enc,
        "up",
        "1 when the role answered this scrape's status request.",
        i64::from(view.is_some()),
    )?;
    net(&mut enc)?;
    let Some(view) = view else {
        return Ok(());
    };
    match role {
        ClusterRole::Master => encode_master(&mut enc, view),
        ClusterRole::Worker => encode_worker(&mut enc, view),
    }
}

/// A master's or worker's view as it was asked, for one rendering.
#[derive(Debug)]
struct ClusterViewCollector(ClusterRole, Option<ClusterView>);

impl Collector for ClusterViewCollector {
    fn encode(&self, enc: DescriptorEncoder) -> Result {
        encode_cluster_or_down(enc, self.0, self.1.as_ref())
    }
}

/// The `/metrics` answer from a master's or worker's `view`.
pub fn cluster_response(role: ClusterRole, view: &ClusterView, accept: Option<&str>) -> Response {
    let format = Format::negotiate(accept);
    let registry = registry_with(Box::new(ClusterViewCollector(role, Some(view.clone()))));
    response(render(&registry, format), format)
}

/// The `/metrics` answer when the role did not answer: `up` 0.
pub fn cluster_down(role: ClusterRole, accept: Option<&str>, error: &str) -> Response {
    tracing::debug!("metrics: no status answer: {error}");
    let format = Format::negotiate(accept);
    let registry = registry_with(Box::new(ClusterViewCollector(role, None)));
    response(render(&registry, format), format)
}

/// A family's rows: each label value with its value.
type Rows = Vec<(String, i64)>;

/// Cores and memory (bytes) of the alive workers, each as `used` and `free` rows.
fn alive_resources(view: &ClusterView) -> (Rows, Rows) {
    let alive: Vec<_> = view.workers.iter().filter(|w| w.state == "ALIVE").collect();
    let used: u64 = alive.iter().map(|w| u64::from(w.cores_used)).sum();
    let total: u64 = alive.iter().map(|w| u64::from(w.cores)).sum();
    let mem_used: u64 = alive.iter().map(|w| w.memory_used_mb).sum();
    let mem_total: u64 = alive.iter().map(|w| w.memory_mb).sum();
    let split = |used: u64, total: u64| {
        vec![
            ("used".to_owned(), used as i64),
            ("free".to_owned(), total.saturating_sub(used) as i64),
        ]
    };
    let mib = |mb: u64| mb.saturating_mul(1 << 20);
    (split(used, total), split(mib(mem_used), mib(mem_total)))
}

/// The view's executors counted by state.
fn executors_by_state(view: &ClusterView) -> Rows {
    count_by(
        view.executors.iter().map(|e| e.state.as_str()),
        &["LAUNCHING", "RUNNING", "EXITED", "FAILED", "KILLED", "LOST"],
    )
}

/// A master's metrics: workers, their resources, applications, executors.
fn encode_master(enc: &mut DescriptorEncoder, view: &ClusterView) -> Result {
    let (cores, memory) = alive_resources(view);
    family(
        enc,
        "workers",
        "Workers by state.",
        MetricType::Gauge,
        "state",
        &count_by(
            view.workers.iter().map(|w| w.state.as_str()),
            &["ALIVE", "DEAD", "UNKNOWN"],
        ),
    )?;
    family(
        enc,
        "cores",
        "Cores of alive workers, used and free.",
        MetricType::Gauge,
        "state",
        &cores,
    )?;
    family(
        enc,
        "memory_bytes",
        "Memory of alive workers, used and free.",
        MetricType::Gauge,
        "state",
        &memory,
    )?;
    family(
        enc,
        "applications",
        "Applications by state.",
        MetricType::Gauge,
        "state",
        &count_by(
            view.apps.iter().map(|a| a.state.as_str()),
            &["WAITING", "RUNNING", "FINISHED", "FAILED", "KILLED"],
        ),
    )?;
    family(
        enc,
        "executors_by_state",
        "Executors of active applications by state.",
        MetricType::Gauge,
        "state",
        &executors_by_state(view),
    )
}

/// A worker's metrics: its resources and executors.
fn encode_worker(enc: &mut DescriptorEncoder, view: &ClusterView) -> Result {
    let (cores, memory) = alive_resources(view);
    family(
        enc,
        "worker_cores",
        "This worker's cores, used and free.",
        MetricType::Gauge,
        "state",
        &cores,
    )?;
    family(
        enc,
        "worker_memory_bytes",
        "This worker's memory, used and free.",
        MetricType::Gauge,
        "state",
        &memory,
    )?;
    family(
        enc,
        "executors_by_state",
        "This worker's executors by state.",
        MetricType::Gauge,
        "state",
        &executors_by_state(view),
    )
}

/// A registry with `flint_`-prefixed names holding `collector`.
pub fn registry_with(collector: Box<dyn Collector>) -> Registry {
    let mut registry = Registry::with_prefix("flint");
    registry.register_collector(collector);
    registry
}

/// The registry's text in `format`.
pub fn render(registry: &Registry, format: Format) -> String {
    let mut out = String::new();
    if let Err(error) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!("metrics could not be encoded: {error}");
    }
    match format {
        Format::OpenMetrics => out,
        Format::Text => openmetrics_to_text(&out),
    }
}

/// OpenMetrics text (as [`prometheus_client`] writes it) in the Prometheus text format 0.0.4:
/// a counter family takes its samples' `_total` name in `# HELP` and `# TYPE`, and `# UNIT`
/// and `# EOF` go. (Sample lines are the same in both for what Flint exposes: no exemplars,
/// no `_created`.)
pub fn openmetrics_to_text(open: &str) -> String {
    let counters: std::collections::HashSet<&str> = open
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(open.len());
    for line in open.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let suffix = if counters.contains(name) {
                    "_total"
                } else {
                    ""
                };
                out.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}
