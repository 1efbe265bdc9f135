//! `flint master`: the standalone master, with its shared secret and journal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flint_engine::standalone::Config as StandaloneConfig;
use flint_net::handshake::{Secret, SECRET_ENV};
use flint_net::observe::metrics::ClusterRole;
use flint_net::standalone::master::{MasterConfig, MasterHandle};

use crate::secrets::SecretArgs;
use crate::serving::{serve_cluster, ObserveArgs};

/// `flint master`'s flags.
#[derive(Args)]
pub struct MasterArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7077")]
    listen: SocketAddr,
    /// Directory for the journal of workers and applications; a restarted master recovers them.
    /// The master's shared secret is kept here too (`secret`, mode 0600) unless --secret-file
    /// or $FLINT_SECRET names one.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// A worker silent this long is dead, in milliseconds (100 to 3600000). Spark's default is
    /// 60 s; 15 s notices a lost host four times sooner while tolerating a dozen missed
    /// heartbeats (one a second).
    #[arg(long, default_value_t = 15_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    worker_timeout_ms: u64,
    /// How often workers heartbeat, in milliseconds (10 to 60000, and below
    /// --worker-timeout-ms).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=60_000))]
    heartbeat_interval_ms: u64,
    /// How long a restarted master waits for journaled workers and drivers, in milliseconds
    /// (0 to 3600000; default: the worker timeout).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    recovery_timeout_ms: Option<u64>,
    /// Pack executors onto as few workers as possible (default: spread them out).
    #[arg(long)]
    packed: bool,
    /// Abnormal executor exits in a row, with none running, that remove an application
    /// (1 to 10000).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_executor_retries: u32,
    /// Cores an application that sets no maximum of its own gets at most (1 to 1000000;
    /// Spark's spark.deploy.defaultCores), so one application cannot take the whole cluster.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    default_cores: u32,
    /// An executor a worker has not reported running this long after its launch is marked
    /// failed and placed elsewhere, in milliseconds (100 to 3600000).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..=3_600_000))]
    launch_timeout_ms: u64,
    #[command(flatten)]
    secret: SecretArgs,
    #[command(flatten)]
    observe: ObserveArgs,
}

/// Runs `flint master` until the process is killed.
pub fn run(args: MasterArgs) -> Result<ExitCode, String> {
    if args.heartbeat_interval_ms >= args.worker_timeout_ms {
        return Err(format!(
            "--heartbeat-interval-ms ({}) must be below --worker-timeout-ms ({})",
            args.heartbeat_interval_ms, args.worker_timeout_ms
        ));
    }
    let secret = master_secret(&args)?;
    let worker_timeout_us = args.worker_timeout_ms.saturating_mul(1000);
    let config = MasterConfig {
        listen: args.listen,
        allow_insecure_bind: args.secret.allow_insecure_bind,
        secret: secret.as_ref().map(|(secret, _)| secret.clone()),
        state_dir: args.state_dir.clone(),
        heartbeat_interval: Duration::from_millis(args.heartbeat_interval_ms),
        master: StandaloneConfig {
            worker_timeout_us,
            spread_out: !args.packed,
            max_executor_retries: args.max_executor_retries,
            recovery_timeout_us: args
                .recovery_timeout_ms
                .map_or(worker_timeout_us, |ms| ms.saturating_mul(1000)),
            default_cores: args.default_cores,
            launch_timeout_us: args.launch_timeout_ms.saturating_mul(1000),
            ..StandaloneConfig::default()
        },
        ..MasterConfig::default()
    };
    let master = MasterHandle::start(config).map_err(|e| e.to_string())?;
    let status_addr = master.local_addr().unwrap_or(args.listen);
    let _servers = serve_cluster(
        status_addr,
        &args.observe,
        secret.as_ref().map(|(secret, _)| secret.clone()),
        ClusterRole::Master,
        "flint master",
    )?;
    if let Some((_, source)) = &secret {
        eprintln!(
            "flint master: shared secret in {source}; give workers, `flint submit` and `flint status` --secret-file PATH (or ${SECRET_ENV})"
        );
    }
    eprintln!(
        "flint master: listening on {}",
        master
            .local_addr()
            .map_or_else(|| args.listen.to_string(), |a| a.to_string())
    );
    // The master runs until SIGTERM or SIGINT (or SIGKILL, which skips the clean-up).
    let (stop, stopped) = std::sync::mpsc::channel();
    flint_net::signals::on_stop_signal("flint master", move |signal| {
        let _ = stop.send(signal);
    })
    .map_err(|e| format!("cannot catch SIGTERM: {e}"))?;
    let _ = stopped.recv();
    // The journal has every record already; the servers (and a generated observe token's
    // directory) go as they are dropped.
    master.shutdown();
    Ok(ExitCode::SUCCESS)
}

/// The master's shared secret and where it came from: --secret-file (created if missing),
/// $FLINT_SECRET, STATE_DIR/secret (created if missing), or a new file in a fresh directory.
fn master_secret(args: &MasterArgs) -> Result<Option<(Secret, String)>, String> {
    if args.secret.insecure {
        args.secret.check_insecure()?;
        tracing::warn!(
            "flint master: --insecure: no shared secret; anyone who can reach {} can register \
             workers and applications, and so run executors on the workers",
            args.listen
        );
        return Ok(None);
    }
    let path = match (&args.secret.secret_file, &args.state_dir) {
        (Some(path), _) => path.clone(),
        (None, state_dir) => {
            if let Some(secret) = Secret::from_env(SECRET_ENV).map_err(|e| e.to_string())? {
                return Ok(Some((secret, format!("${SECRET_ENV}"))));
            }
            secret_path_in(state_dir.as_deref())?
        }
    };
    if path.exists() {
        // (Secret::from_file warns about a file other users may read.)
        let secret = Secret::from_file(&path).map_err(|e| e.to_string())?;
        return Ok(Some((secret, path.display().to_string())));
    }
    let secret = Secret::generate().map_err(|e| format!("no randomness: {e}"))?;
    secret.write_new_file(&path).map_err(|e| e.to_string())?;
    Ok(Some((secret, path.display().to_string())))
}

/// Where a master without --secret-file or $FLINT_SECRET keeps its secret: STATE_DIR/secret,
/// else `secret` in a fresh temporary directory.
fn secret_path_in(state_dir: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = state_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create state dir {}: {e}", dir.display()))?;
        return Ok(dir.join("secret"));
    }
    use std::os::unix::fs::DirBuilderExt;
    // A name of its own (not derived from the secret), made here with mode 0700, so nothing
    // planted in the temporary directory beforehand is used.
    let tag: String = flint_net::handshake::random_nonce()
        .map_err(|e| format!("no randomness: {e}"))?
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("flint-master-{tag}"));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    Ok(dir.join("secret"))
}
