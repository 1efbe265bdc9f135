//! Serving what a role shows, Prometheus metrics, the web UI and the JSON API: the flags, who
//! may read them (the observe token) and the servers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use flint_net::driver::Driver;
use flint_net::handshake::Secret;
use flint_net::observe::http::{Access, HttpServer};
use flint_net::observe::metrics::ClusterRole;
use flint_net::observe::token::ObserveToken;
use flint_net::observe::ui::{self, Serve};

/// Serving what a role shows: Prometheus metrics, the web UI and the JSON API.
#[derive(Args, Clone, Default)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics at /metrics on this address (the text format, or OpenMetrics
    /// when asked for). With a shared secret every request needs the observe token
    /// (`Authorization: Bearer TOKEN`, see --observe-token-file); without one, loopback only.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web UI (pages at /, live charts, task timeline, a page per job), the JSON API
    /// at /api/v1/ and /metrics on this address; the same token rule as --metrics-listen (a
    /// browser logs in once with the token and keeps a cookie).
    #[arg(long)]
    pub ui_listen: Option<SocketAddr>,
    /// The read-only observe token for --metrics-listen and --ui-listen: a file holding it
    /// (16 to 1024 visible ASCII characters; made with a random one, mode 0600, if missing).
    /// Never the cluster secret. Default: a new token in a new private file, printed at start.
    #[arg(long)]
    pub observe_token_file: Option<PathBuf>,
}

/// The same for drivers, which end with their job.
#[derive(Args, Clone, Default)]
pub struct DriverObserveArgs {
    #[command(flatten)]
    pub serve: ObserveArgs,
    /// With --metrics-listen or --ui-listen: keep serving this long after the job ends (before
    /// executors stop), so a last scrape or look sees its end, in milliseconds (0 to 3600000).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub observe_linger_ms: u64,
}

/// The metrics and UI servers one process runs, held until it ends, with the private directory
/// of the token made for them, if one was.
#[derive(Default)]
pub struct Serving {
    _servers: Vec<HttpServer>,
    _token_dir: Option<TokenDir>,
}

/// A directory made for a token, removed when dropped (the process's servers stop, or fail to
/// start), so that a run does not leave a credential behind in the temporary directory. A
/// token file the operator named is never one.
struct TokenDir(PathBuf);

impl Drop for TokenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Who may read the servers of `who`: holders of the observe token in `token_file` (made
/// there if missing) or, without one, of a new token in a new private file (its directory
/// returned, removed when dropped); with neither a file nor a cluster `secret`, anyone on
/// loopback. The token's file is printed, never the token; a token equal to the cluster secret
/// is refused.
fn observe_access(
    token_file: Option<&Path>,
    secret: Option<&Secret>,
    who: &str,
) -> Result<(Access, Option<TokenDir>), String> {
    let (token, path, dir) = match (token_file, secret) {
        (Some(path), _) => {
            let (token, _) = ObserveToken::load_or_create(path).map_err(|e| e.to_string())?;
            (token, path.to_owned(), None)
        }
        (None, Some(_)) => {
            let (token, path) = ObserveToken::create_in_temp_dir().map_err(|e| e.to_string())?;
            let dir = path.parent().map(|dir| TokenDir(dir.to_owned()));
            (token, path, dir)
        }
        (None, None) => return Ok((Access::Open, None)),
    };
    token.check_not_secret(secret).map_err(|e| e.to_string())?;
    eprintln!(
        "{who}: observe token in {} (Authorization: Bearer TOKEN, or log in on the page)",
        path.display()
    );
    Ok((Access::Token(token), dir))
}

/// Starts the metrics and UI servers `args` asks for, watching `driver`; `who` names it in
/// what is printed.
pub fn serve_driver(
    driver: &Driver,
    args: &ObserveArgs,
    secret: Option<Secret>,
    who: &str,
) -> Result<Serving, String> {
    serve_each(args, secret.as_ref(), who, |addr, access, serve| {
        ui::serve_driver(addr, driver.observer(), access, serve)
    })
}

/// Starts the metrics and UI servers `args` asks for, of a master or worker answering status
/// at `status` (asked with the cluster `secret`).
pub fn serve_cluster(
    status: SocketAddr,
    args: &ObserveArgs,
    secret: Option<Secret>,
    role: ClusterRole,
    who: &str,
) -> Result<Serving, String> {
    serve_each(args, secret.as_ref(), who, |addr, access, serve| {
        ui::serve_cluster(addr, status, secret.clone(), access, role, serve)
    })
}

/// Starts the metrics server and the UI server where `args` asks for them, each with `start`,
/// under one access rule (the observe token, never the cluster `secret`).
fn serve_each<E: std::fmt::Display>(
    args: &ObserveArgs,
    secret: Option<&Secret>,
    who: &str,
    start: impl Fn(SocketAddr, Access, Serve) -> Result<HttpServer, E>,
) -> Result<Serving, String> {
    if args.metrics_listen.is_none() && args.ui_listen.is_none() {
        return Ok(Serving::default());
    }
    // A server that fails to start drops the token's directory with it.
    let (access, token_dir) = observe_access(args.observe_token_file.as_deref(), secret, who)?;
    let mut servers = Vec::new();
    for (addr, serve, what) in [
        (args.metrics_listen, Serve::Metrics, "metrics"),
        (args.ui_listen, Serve::UiAndMetrics, "web UI"),
    ] {
        if let Some(addr) = addr {
            let server = start(addr, access.clone(), serve).map_err(|e| format!("{what}: {e}"))?;
            announce(who, what, &server);
            servers.push(server);
        }
    }
    Ok(Serving {
        _servers: servers,
        _token_dir: token_dir,
    })
}

/// Prints where a server listens (never the token).
fn announce(who: &str, what: &str, server: &HttpServer) {
    let path = if what == "metrics" { "metrics" } else { "" };
    eprintln!("{who}: {what} on http://{}/{path}", server.local_addr());
}

/// Keeps serving after the job when asked (see `--observe-linger-ms`).
pub fn linger(args: &DriverObserveArgs) {
    let serving = args.serve.metrics_listen.is_some() || args.serve.ui_listen.is_some();
    if serving && args.observe_linger_ms > 0 {
        std::thread::sleep(Duration::from_millis(args.observe_linger_ms));
    }
}
