//! The web UI: server-rendered HTML pages for the driver (jobs, executors, recent failures)
//! and the master (workers, applications, executors), refreshed by the browser every
//! [`REFRESH_SECONDS`], read-only, no scripts and no front-end build. Served with the metrics
//! by [`serve_driver`] and [`serve_cluster`] over [`super::http`]: `/` is the page, `/metrics`
//! the Prometheus text. With a secret, both need the token (see [`super::http`]); pages never
//! contain it.
//!
//! Every table row carries `data-` attributes with its key values, so tests (and scripts) can
//! read the page's DOM without parsing prose.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use super::http::{Access, Handler, HttpError, HttpLimits, HttpServer, Request, Response, Site};
use super::metrics::{self, ClusterCollector, ClusterRole, DriverCollector, SCRAPE_TIMEOUT};
use crate::driver::DriverObserver;
use crate::handshake::Secret;
use crate::observe::{ClusterView, DriverView};

/// The pages' script (login, live parts, charts): served at [`SCRIPT_PATH`] to anyone.
pub const SCRIPT: &str = include_str!("assets/flint.js");
/// Where [`SCRIPT`] is served.
pub const SCRIPT_PATH: &str = "/assets/flint.js";

/// Seconds between the page's refreshes.
pub const REFRESH_SECONDS: u32 = 2;

/// What a server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Serve {
    /// `/metrics` only.
    Metrics,
    /// The page at `/` and `/metrics`.
    UiAndMetrics,
}

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m {:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

fn clock(unix_ms: u64) -> String {
    let s = unix_ms / 1000;
    format!(
        "{:02}:{:02}:{:02} UTC",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60
    )
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.2em 2em;color:#222}\
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.1em;margin-top:1.4em;border-bottom:1px solid #ccc}\
table{border-collapse:collapse;min-width:40em}th,td{padding:3px 10px;text-align:left;\
border-bottom:1px solid #eee;vertical-align:top}th{background:#f4f4f4}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
.s-RUNNING,.s-ALIVE,.s-SUCCEEDED{color:#1a7f37}.s-FAILED,.s-DEAD,.s-LOST{color:#cf222e}\
.s-WAITING,.s-LAUNCHING,.s-UNKNOWN{color:#9a6700}dl{display:flex;flex-wrap:wrap;gap:0 2em}\
dt{color:#666}dd{margin:0 0 .4em 0;font-weight:600;font-size:1.2em}\
progress{width:10em}.reason{font-family:monospace;font-size:12px;color:#555}";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <link rel=\"icon\" href=\"data:,\"><title>{}</title><style>{STYLE}</style>\
         <script src=\"{SCRIPT_PATH}\" defer></script></head><body>{body}\
         <p class=\"reason\">Read-only; updates every {REFRESH_SECONDS} s (last \
         <span id=\"updated\">at load</span>). Prometheus metrics at /metrics, JSON at \
         /api/v1/.</p></body></html>",
        escape(title)
    )
}

/// The page a browser without the token gets: a form for the token (sent in a `POST` body,
/// answered with a cookie), which the script fills from the address's `#token=` fragment
/// (never sent to the server, never in a `Referer`).
pub fn login_page() -> String {
    page(
        "Flint: log in",
        "<h1>Flint</h1><p>This page needs the observe token (the file given with \
         <code>--observe-token-file</code>, or the one the process printed the path of).</p>\
         <form id=\"login\" method=\"post\" action=\"/login\">\
         <input type=\"hidden\" name=\"next\" value=\"/\">\
         <input type=\"password\" name=\"token\" autocomplete=\"off\" size=\"70\" \
         placeholder=\"observe token\" autofocus> <button>Log in</button></form>\
         <p id=\"login-error\" class=\"reason\"></p>",
    )
}

/// A site: `handler` for requests with the token, the script and the login page for anyone.
fn site(handler: Handler) -> Site {
    let mut login = Response::ok("text/html; charset=utf-8", login_page());
    login.status = 401;
    Site {
        handler,
        public: vec![(
            SCRIPT_PATH,
            Response::ok("text/javascript; charset=utf-8", SCRIPT),
        )],
        login: Some(login),
    }
}

fn stat(out: &mut String, id: &str, label: &str, value: impl std::fmt::Display) {
    let _ = write!(
        out,
        "<div><dt>{label}</dt><dd id=\"{id}\">{value}</dd></div>"
    );
}

/// The driver's page.
pub fn driver_page(v: &DriverView) -> String {
    let mut b = String::new();
    driver_summary(&mut b, v);
    jobs_table(&mut b, v);
    driver_executors_table(&mut b, v);
    failures_table(&mut b, v);
    page("Flint driver", &b)
}

/// The driver page's summary: uptime, jobs, tasks, executors.
fn driver_summary(b: &mut String, v: &DriverView) {
    let _ = write!(b, "<h1>Flint driver</h1><dl id=\"summary\">");
    stat(b, "uptime", "up", duration(v.uptime));
    stat(b, "jobs-active", "jobs active", v.active_jobs);
    stat(b, "tasks-pending", "tasks pending", v.pending_tasks);
    stat(b, "tasks-running", "tasks running", v.running_tasks);
    stat(b, "tasks-succeeded", "tasks succeeded", v.stats.succeeded);
    stat(
        b,
        "attempts-failed",
        "attempts failed",
        v.stats.attempts_failed,
    );
    stat(
        b,
        "executors-live",
        "executors",
        v.executors.iter().filter(|e| e.removed.is_empty()).count(),
    );
    stat(b, "executors-lost", "executors lost", v.executors_lost);
    b.push_str("</dl>");
}

/// The driver page's jobs, with their progress and failures.
fn jobs_table(b: &mut String, v: &DriverView) {
    b.push_str(
        "<h2>Jobs</h2><table id=\"jobs\"><tr><th>id</th><th>function</th><th>state</th>\
        <th>progress</th><th>tasks done</th><th>failed attempts</th><th>submitted</th>\
        <th>duration</th><th>failures</th></tr>",
    );
    for j in &v.jobs {
        let failures: Vec<String> = j.failures.iter().map(|f| escape(f)).collect();
        let _ = write!(
            b,
            "<tr data-job=\"{id}\" data-state=\"{st}\" data-tasks=\"{t}\" data-done=\"{d}\">\
             <td>{id}</td><td>{f}</td><td class=\"s-{st}\">{st}</td>\
             <td><progress max=\"{t}\" value=\"{d}\"></progress></td>\
             <td class=\"num\">{d} / {t}</td><td class=\"num\">{fa}</td><td>{sub}</td>\
             <td class=\"num\">{dur}</td><td class=\"reason\">{fl}</td></tr>",
            id = j.id,
            f = escape(&j.function),
            st = j.state,
            t = j.tasks,
            d = j.tasks_done,
            fa = j.attempts_failed,
            sub = clock(j.submitted_unix_ms),
            dur = duration(j.duration),
            fl = failures.join("<br>"),
        );
    }
    b.push_str("</table>");
}

/// The driver page's executors, the removed ones with why.
fn driver_executors_table(b: &mut String, v: &DriverView) {
    b.push_str(
        "<h2>Executors</h2><table id=\"executors\"><tr><th>id</th><th>host</th>\
        <th>cores</th><th>lanes</th><th>running</th><th>finished</th><th>failed</th>\
        <th>state</th></tr>",
    );
    for e in &v.executors {
        let state = if e.removed.is_empty() {
            "ALIVE"
        } else if e.lost {
            "LOST"
        } else {
            "REMOVED"
        };
        let _ = write!(
            b,
            "<tr data-executor=\"{n}\" data-state=\"{state}\" data-running=\"{r}\" \
             data-finished=\"{fi}\" data-failed=\"{fa}\" data-lanes=\"{l}\"><td>{n}</td>\
             <td>{h}</td><td class=\"num\">{c}</td><td class=\"num\">{l}</td>\
             <td class=\"num\">{r}</td><td class=\"num\">{fi}</td>\
             <td class=\"num\">{fa}</td><td class=\"s-{state}\">{state} <span class=\"reason\">{why}</span></td></tr>",
            n = escape(&e.executor_id),
            h = escape(&e.host),
            c = e.cores,
            l = e.lanes_joined,
            r = e.tasks_running,
            fi = e.tasks_finished,
            fa = e.tasks_failed,
            why = escape(&e.removed),
        );
    }
    b.push_str("</table>");
}

/// The driver page's recent task failures.
fn failures_table(b: &mut String, v: &DriverView) {
    b.push_str(
        "<h2>Recent failures</h2><table id=\"failures\"><tr><th>when</th><th>job</th>\
        <th>task</th><th>attempt</th><th>executor</th><th>reason</th></tr>",
    );
    for f in &v.failures {
        let _ = write!(
            b,
            "<tr data-job=\"{j}\" data-task=\"{t}\"><td>{w}</td><td>{j}</td><td>{t}</td>\
             <td>{a}</td><td>{e}</td><td class=\"reason\">{r}</td></tr>",
            w = clock(f.unix_ms),
            j = f.job,
            t = f.index,
            a = f.attempt,
            e = escape(&f.executor_id),
            r = escape(&f.reason),
        );
    }
    b.push_str("</table>");
}

/// The master's page (a worker's shows itself and its executors the same way).
pub fn cluster_page(role: ClusterRole, v: &ClusterView) -> String {
    let title = match role {
        ClusterRole::Master => "Flint master",
        ClusterRole::Worker => "Flint worker",
    };
    let mut b = String::new();
    cluster_summary(&mut b, title, v);
    workers_table(&mut b, v);
    if role == ClusterRole::Master {
        applications_table(&mut b, v);
    }
    cluster_executors_table(&mut b, v);
    page(title, &b)
}

/// The cluster page's summary: workers, cores, applications, executors.
fn cluster_summary(b: &mut String, title: &str, v: &ClusterView) {
    let _ = write!(b, "<h1>{title}</h1><dl id=\"summary\">");
    let alive: Vec<_> = v.workers.iter().filter(|w| w.state == "ALIVE").collect();
    let cores: u32 = alive.iter().map(|w| w.cores).sum();
    let used: u32 = alive.iter().map(|w| w.cores_used).sum();
    stat(b, "workers-alive", "workers alive", alive.len());
    stat(b, "cores-used", "cores used", format!("{used} / {cores}"));
    stat(
        b,
        "apps-running",
        "applications running",
        v.apps.iter().filter(|a| a.state == "RUNNING").count(),
    );
    stat(
        b,
        "apps-waiting",
        "applications waiting",
        v.apps.iter().filter(|a| a.state == "WAITING").count(),
    );
    stat(b, "executors-count", "executors", v.executors.len());
    b.push_str("</dl>");
}

/// The cluster page's workers and their resources.
fn workers_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Workers</h2><table id=\"workers\"><tr><th>id</th><th>address</th>\
        <th>state</th><th>cores used</th><th>memory used (MiB)</th></tr>",
    );
    for w in &v.workers {
        let _ = write!(
            b,
            "<tr data-worker=\"{id}\" data-state=\"{st}\" data-cores=\"{c}\" data-cores-used=\"{cu}\" \
             data-memory-mb=\"{m}\"><td>{id}</td><td>{a}</td><td class=\"s-{st}\">{st}</td>\
             <td class=\"num\">{cu} / {c}</td><td class=\"num\">{mu} / {m}</td></tr>",
            id = escape(&w.id),
            a = escape(&w.address),
            st = escape(&w.state),
            c = w.cores,
            cu = w.cores_used,
            m = w.memory_mb,
            mu = w.memory_used_mb,
        );
    }
    b.push_str("</table>");
}

/// The master page's applications, the waiting ones with why.
fn applications_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Applications</h2><table id=\"applications\"><tr><th>id</th><th>name</th>\
        <th>state</th><th>cores</th><th>executors requested</th><th>waiting because</th></tr>",
    );
    for a in &v.apps {
        let _ = write!(
            b,
            "<tr data-app=\"{id}\" data-state=\"{st}\" data-cores=\"{c}\"><td>{id}</td><td>{n}</td>\
             <td class=\"s-{st}\">{st}</td><td class=\"num\">{c}</td><td class=\"num\">{r}</td>\
             <td class=\"reason\">{w}</td></tr>",
            id = escape(&a.id),
            n = escape(&a.name),
            st = escape(&a.state),
            c = a.cores_granted,
            r = a.executors_requested,
            w = escape(&a.waiting),
        );
    }
    b.push_str("</table>");
}

/// The cluster page's executors.
fn cluster_executors_table(b: &mut String, v: &ClusterView) {
    b.push_str(
        "<h2>Executors</h2><table id=\"executors\"><tr><th>application</th><th>id</th>\
        <th>worker</th><th>cores</th><th>state</th></tr>",
    );
    for e in &v.executors {
        let _ = write!(
            b,
            "<tr data-app=\"{a}\" data-executor=\"{id}\" data-worker=\"{w}\" data-state=\"{st}\">\
             <td>{a}</td><td>{id}</td><td>{w}</td><td class=\"num\">{c}</td>\
             <td class=\"s-{st}\">{st}</td></tr>",
            a = escape(&e.app),
            id = escape(&e.id),
            w = escape(&e.worker),
            c = e.cores,
            st = escape(&e.state),
        );
    }
    b.push_str("</table>");
}

fn unavailable(what: &str, error: &str) -> Response {
    Response::text(503, format!("{what} did not answer: {error}\n"))
}

/// Serves the driver `observer` watches at `addr`: `/metrics`, and the page at `/` when
/// `serve` says so. With a `secret` every request needs it as a token.
pub fn serve_driver(
    addr: SocketAddr,
    observer: DriverObserver,
    access: Access,
    serve: Serve,
) -> Result<HttpServer, HttpError> {
    let registry = metrics::registry_with(Box::new(DriverCollector::new(observer.clone())));
    let handler: Handler = Arc::new(move |request: &Request| match request.path.as_str() {
        "/metrics" => Response::ok(metrics::CONTENT_TYPE, metrics::render(&registry)),
        "/" if serve == Serve::UiAndMetrics => match observer.view(SCRAPE_TIMEOUT) {
            Ok(view) => Response::ok("text/html; charset=utf-8", driver_page(&view)),
            Err(error) => unavailable("the driver", &error.to_string()),
        },
        _ => Response::text(404, "not found\n"),
    });
    HttpServer::start(addr, access, HttpLimits::default(), site(handler))
}

/// Serves the master (or worker) answering status requests at `status_addr` (with
/// `secret`) at `addr`: `/metrics`, and the page at `/` when `serve` says so.
pub fn serve_cluster(
    addr: SocketAddr,
    status_addr: SocketAddr,
    secret: Option<Secret>,
    access: Access,
    role: ClusterRole,
    serve: Serve,
) -> Result<HttpServer, HttpError> {
    let collector = ClusterCollector::new(status_addr, secret.clone(), role);
    let registry = metrics::registry_with(Box::new(collector.clone()));
    let handler: Handler = Arc::new(move |request: &Request| match request.path.as_str() {
        "/metrics" => Response::ok(metrics::CONTENT_TYPE, metrics::render(&registry)),
        "/" if serve == Serve::UiAndMetrics => match collector.view() {
            Ok(view) => Response::ok("text/html; charset=utf-8", cluster_page(role, &view)),
            Err(error) => unavailable("the status request", &error.to_string()),
        },
        _ => Response::text(404, "not found\n"),
    });
    HttpServer::start(addr, access, HttpLimits::default(), site(handler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_everything_a_peer_chose() {
        let view = ClusterView {
            workers: vec![crate::observe::WorkerRow {
                id: "<script>".into(),
                address: "h:1".into(),
                state: "ALIVE".into(),
                cores: 2,
                cores_used: 1,
                memory_mb: 10,
                memory_used_mb: 0,
            }],
            ..ClusterView::default()
        };
        let html = cluster_page(ClusterRole::Master, &view);
        assert!(!html.contains("<script>"));
        assert!(html.contains("data-worker=\"&lt;script&gt;\""));
    }
}
