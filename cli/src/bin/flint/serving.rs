//! Serving what a role shows, Prometheus metrics and the web UI: the flags and the servers.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use flint_net::driver::Driver;
use flint_net::handshake::Secret;
use flint_net::observe::http::HttpServer;
use flint_net::observe::metrics::ClusterRole;
use flint_net::observe::ui::{self, Serve};

/// Serving what a role shows: Prometheus metrics and the web UI.
#[derive(Args, Clone, Default)]
pub struct ObserveArgs {
    /// Serve Prometheus metrics (OpenMetrics text at /metrics) on this address. With a shared
    /// secret every request needs it as a token (`?token=` or `Authorization: Bearer`);
    /// without one, loopback addresses only.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
    /// Serve the web UI (HTML at /, refreshed every 2 s, read-only; /metrics too) on this
    /// address; the same token rule as --metrics-listen.
    #[arg(long)]
    pub ui_listen: Option<SocketAddr>,
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

/// Starts the metrics and UI servers `args` asks for, watching `driver`; `who` names it in
/// what is printed. The token (if `secret`) is never printed.
pub fn serve_driver(
    driver: &Driver,
    args: &ObserveArgs,
    secret: Option<Secret>,
    who: &str,
) -> Result<Vec<HttpServer>, String> {
    let mut servers = Vec::new();
    for (addr, serve, what) in [
        (args.metrics_listen, Serve::Metrics, "metrics"),
        (args.ui_listen, Serve::UiAndMetrics, "web UI"),
    ] {
        if let Some(addr) = addr {
            let server = ui::serve_driver(addr, driver.observer(), secret.clone(), serve)
                .map_err(|e| format!("{what}: {e}"))?;
            announce(who, what, &server, secret.is_some());
            servers.push(server);
        }
    }
    Ok(servers)
}

/// Starts the metrics and UI servers of a master or worker answering status at `status`.
pub fn serve_cluster(
    status: SocketAddr,
    metrics_listen: Option<SocketAddr>,
    ui_listen: Option<SocketAddr>,
    secret: Option<Secret>,
    role: ClusterRole,
    who: &str,
) -> Result<Vec<HttpServer>, String> {
    let mut servers = Vec::new();
    for (addr, serve, what) in [
        (metrics_listen, Serve::Metrics, "metrics"),
        (ui_listen, Serve::UiAndMetrics, "web UI"),
    ] {
        if let Some(addr) = addr {
            let server = ui::serve_cluster(addr, status, secret.clone(), role, serve)
                .map_err(|e| format!("{what}: {e}"))?;
            announce(who, what, &server, secret.is_some());
            servers.push(server);
        }
    }
    Ok(servers)
}

/// Prints where a server listens (never the token itself).
fn announce(who: &str, what: &str, server: &HttpServer, token: bool) {
    let path = if what == "metrics" { "metrics" } else { "" };
    let token = if token {
        " (token: the shared secret, as ?token= or Authorization: Bearer)"
    } else {
        ""
    };
    eprintln!(
        "{who}: {what} on http://{}/{path}{token}",
        server.local_addr()
    );
}

/// Keeps serving after the job when asked (see `--observe-linger-ms`).
pub fn linger(args: &DriverObserveArgs) {
    let serving = args.serve.metrics_listen.is_some() || args.serve.ui_listen.is_some();
    if serving && args.observe_linger_ms > 0 {
        std::thread::sleep(Duration::from_millis(args.observe_linger_ms));
    }
}
