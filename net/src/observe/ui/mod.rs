//! The web UI: pages for the driver (`driver`: summary, live charts, task timeline, jobs,
//! executors, failures; a page per job) and the master or a worker (`cluster`), read-only,
//! with the metrics and the JSON API ([`super::api`]) beside them, served by [`serve_driver`]
//! and [`serve_cluster`] over [`super::http`]. Tables are rendered on the server (readable
//! without JavaScript); one small script of Flint's own ([`SCRIPT`], no CDN, no build) logs the
//! browser in, swaps in fresh tables every [`REFRESH_SECONDS`] and draws the charts and the
//! timeline as SVG from the API. With a token, every request needs it (see [`super::token`]):
//! the login page takes it in a form (or from the address's `#token=` fragment) and a cookie
//! carries it after; pages never contain it and addresses never do.
//!
//! The role is asked for its view at most every [`VIEW_MAX_AGE`], however many clients ask
//! ([`ViewCache`]): the pages, the API and the metrics all render the same view.
//!
//! Every table row and drawn element carries `data-` attributes with its key values, so tests
//! (and scripts) can read the page's DOM without parsing prose.

mod cluster;
mod driver;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::api;
use super::http::{
    Access, HttpError, HttpHandler, HttpLimits, HttpServer, Request, Response, Site,
};
use super::metrics::{self, ClusterCollector, ClusterRole, SCRAPE_TIMEOUT};
use crate::handshake::Secret;
use crate::observe::{ClusterView, DriverView, DriverViews};

pub use cluster::page as cluster_page;
pub use driver::{job_page, page as driver_page};

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

fn duration_text(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m {:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

fn clock_text(unix_ms: u64) -> String {
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
.s-WAITING,.s-LAUNCHING,.s-UNKNOWN,.s-SUSPECTED,.s-STALLED,.s-PROBATION{color:#9a6700}dl{display:flex;flex-wrap:wrap;gap:0 2em}\
dt{color:#666}dd{margin:0 0 .4em 0;font-weight:600;font-size:1.2em}\
progress{width:10em}.reason{font-family:monospace;font-size:12px;color:#555}\
.charts{display:flex;flex-wrap:wrap;gap:.8em}figure{margin:0;border:1px solid #ddd;padding:4px}\
figcaption{font-weight:600;font-size:12px}svg.chart{width:420px;height:170px}\
.grid{stroke:#eee}.tick{font-size:10px;fill:#666}.line{fill:none;stroke-width:1.5}\
.legend{font-size:11px}#timeline{width:100%;max-width:1200px}.lane{font-size:11px;fill:#444}\
.bar.copy{stroke:#111;stroke-dasharray:3 2;stroke-width:1}.kill{stroke:#cf222e;stroke-width:2}";

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
fn site(handler: HttpHandler) -> Site {
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

fn unavailable(what: &str, error: &str) -> Response {
    Response::text(503, format!("{what} did not answer: {error}\n"))
}

fn html(body: String) -> Response {
    Response::ok("text/html; charset=utf-8", body)
}

/// How long one answer of a role serves every request (pages, API, metrics): however many
/// clients ask, the role is asked at most this often.
pub const VIEW_MAX_AGE: Duration = Duration::from_millis(250);
/// How long a request waits for a fresh view before it takes the last one.
pub const VIEW_WAIT: Duration = Duration::from_millis(300);
/// How old the last view may be to be served when no fresh one came in [`VIEW_WAIT`].
pub const VIEW_STALE_MAX: Duration = Duration::from_secs(10);

/// The views a server's requests share (see the module docs). A thread of its own asks the role
/// when a request wants a view fresher than [`VIEW_MAX_AGE`]; the request waits at most
/// [`VIEW_WAIT`] for it and then takes the last one, so a role too busy to answer at once (a
/// driver's loop in a million-task job) slows no request past that, and is never asked by two
/// at once.
pub struct ViewCache<T> {
    shared: Arc<CacheShared<T>>,
}

struct CacheShared<T> {
    state: Mutex<CacheState<T>>,
    changed: Condvar,
}

struct CacheState<T> {
    last: Option<(Instant, Arc<T>)>,
    /// The last failure to get one, and when.
    error: Option<(Instant, String)>,
    wanted: bool,
    stopped: bool,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<T: Send + Sync + 'static> ViewCache<T> {
    /// A cache whose thread gets views with `fetch`.
    pub fn start(fetch: impl Fn() -> Result<T, String> + Send + 'static) -> ViewCache<T> {
        let shared = Arc::new(CacheShared {
            state: Mutex::new(CacheState {
                last: None,
                error: None,
                wanted: false,
                stopped: false,
            }),
            changed: Condvar::new(),
        });
        let inner = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("flint-http-view".into())
            .spawn(move || refresh(&inner, fetch));
        if let Err(error) = spawned {
            lock(&shared.state).error = Some((Instant::now(), error.to_string()));
        }
        ViewCache { shared }
    }

    /// A view: fresh, or the last one if none came in [`VIEW_WAIT`] (see the type's docs).
    pub fn get(&self) -> Result<Arc<T>, String> {
        let asked = Instant::now();
        let mut state = lock(&self.shared.state);
        loop {
            if let Some((at, view)) = &state.last {
                let waited = asked.elapsed() >= VIEW_WAIT;
                if at.elapsed() < VIEW_MAX_AGE || (waited && at.elapsed() < VIEW_STALE_MAX) {
                    return Ok(view.clone());
                }
            }
            if let Some((at, error)) = &state.error {
                if *at >= asked {
                    return Err(error.clone());
                }
            }
            if asked.elapsed() > SCRAPE_TIMEOUT + VIEW_WAIT || state.stopped {
                return Err("no view in time".into());
            }
            state.wanted = true;
            self.shared.changed.notify_all();
            let (next, _) = (self.shared.changed)
                .wait_timeout(state, Duration::from_millis(50))
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            state = next;
        }
    }
}

impl<T> Drop for ViewCache<T> {
    fn drop(&mut self) {
        lock(&self.shared.state).stopped = true;
        self.shared.changed.notify_all();
    }
}

/// The cache's thread: asks for a view whenever one is wanted, until the cache is dropped.
fn refresh<T>(shared: &CacheShared<T>, fetch: impl Fn() -> Result<T, String>) {
    loop {
        {
            let mut state = lock(&shared.state);
            while !state.wanted && !state.stopped {
                state =
                    (shared.changed.wait(state)).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if state.stopped {
                return;
            }
            state.wanted = false;
        }
        let fetched = fetch();
        let mut state = lock(&shared.state);
        match fetched {
            Ok(view) => state.last = Some((Instant::now(), Arc::new(view))),
            Err(error) => state.error = Some((Instant::now(), error)),
        }
        shared.changed.notify_all();
    }
}

/// The answer to a driver's request, from its view.
fn driver_answer(request: &Request, view: &Arc<DriverView>, serve: Serve) -> Response {
    let path = request.path.as_str();
    if path == "/metrics" {
        return metrics::driver_response(view, request.accept.as_deref());
    }
    if serve == Serve::Metrics {
        return Response::text(404, "not found: this address serves /metrics only\n");
    }
    if let Some(answer) = api::driver(path, view) {
        return answer;
    }
    match path {
        "/" => html(driver::page(view)),
        "/job" => {
            let id = request.param("id").and_then(|id| id.parse().ok());
            match id.and_then(|id| driver::job_page(view, id)) {
                Some(page) => html(page),
                None => Response::text(404, "no such job among the active and recent ones\n"),
            }
        }
        _ => Response::text(404, "not found\n"),
    }
}

/// Serves the driver `observer` watches at `addr` to those `access` lets in: `/metrics`, and
/// when `serve` says so the pages (`/`, `/job?id=N`) and the JSON API ([`api`]).
pub fn serve_driver(
    addr: SocketAddr,
    observer: impl DriverViews,
    access: Access,
    serve: Serve,
) -> Result<HttpServer, HttpError> {
    let cache = ViewCache::start(move || observer.driver_view(SCRAPE_TIMEOUT));
    let handler: HttpHandler = Arc::new(move |request: &Request| match cache.get() {
        Ok(view) => driver_answer(request, &view, serve),
        Err(error) if request.path == "/metrics" => {
            metrics::driver_down(request.accept.as_deref(), &error.to_string())
        }
        Err(error) => unavailable("the driver", &error.to_string()),
    });
    HttpServer::start(addr, access, HttpLimits::default(), site(handler))
}

/// The answer to a master's or worker's request, from its view.
fn cluster_answer(
    request: &Request,
    view: &ClusterView,
    role: ClusterRole,
    serve: Serve,
) -> Response {
    let path = request.path.as_str();
    if path == "/metrics" {
        return metrics::cluster_response(role, view, request.accept.as_deref());
    }
    if serve == Serve::Metrics {
        return Response::text(404, "not found: this address serves /metrics only\n");
    }
    if let Some(answer) = api::cluster(path, view) {
        return answer;
    }
    match path {
        "/" => html(cluster::page(role, view)),
        _ => Response::text(404, "not found\n"),
    }
}

/// Serves the master (or worker) answering status requests at `status_addr` (with `secret`,
/// the cluster's) at `addr` to those `access` lets in: `/metrics`, and when `serve` says so the
/// page at `/` and the JSON API ([`api`]).
pub fn serve_cluster(
    addr: SocketAddr,
    status_addr: SocketAddr,
    secret: Option<Secret>,
    access: Access,
    role: ClusterRole,
    serve: Serve,
) -> Result<HttpServer, HttpError> {
    let collector = ClusterCollector::new(status_addr, secret, role);
    let cache = ViewCache::start(move || collector.view().map_err(|e| e.to_string()));
    let handler: HttpHandler = Arc::new(move |request: &Request| match cache.get() {
        Ok(view) => cluster_answer(request, &view, role, serve),
        Err(error) if request.path == "/metrics" => {
            metrics::cluster_down(role, request.accept.as_deref(), &error.to_string())
        }
        Err(error) => unavailable("the status request", &error.to_string()),
    });
    HttpServer::start(addr, access, HttpLimits::default(), site(handler))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    /// A cache whose views are the numbers sent to `release`, one per fetch.
    fn cache() -> (ViewCache<u32>, std::sync::mpsc::Sender<u32>) {
        let (release, views) = channel::<u32>();
        let views = Mutex::new(views);
        let fetch = move || lock(&views).recv().map_err(|e| e.to_string());
        (ViewCache::start(fetch), release)
    }

    #[test]
    fn a_busy_role_delays_requests_by_the_wait_at_most() {
        let (cache, release) = cache();
        release.send(1).unwrap();
        assert_eq!(
            *cache.get().unwrap(),
            1,
            "the first request waits for the first view"
        );
        assert_eq!(*cache.get().unwrap(), 1, "fresh: not asked again");
        std::thread::sleep(VIEW_MAX_AGE);
        // The role does not answer: the request takes the last view after the wait.
        let started = Instant::now();
        assert_eq!(*cache.get().unwrap(), 1);
        assert!(started.elapsed() >= VIEW_WAIT, "{:?}", started.elapsed());
        release.send(2).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while *cache.get().unwrap() != 2 {
            assert!(Instant::now() < deadline, "the answer, once in, is served");
        }
    }
}
