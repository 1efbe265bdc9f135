//! `flint status`: a standalone master's (or one worker's) workers, applications and
//! executors, as tables or JSON.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use flint_net::observe::ClusterView;
use flint_net::standalone::BlockingClient;
use flint_net::wire::{AppStatus, ExecutorStatus, List, Message, Role, WorkerStatus};

use crate::secrets::SecretArgs;

/// `flint status`'s flags.
#[derive(Args)]
pub struct StatusArgs {
    /// The master's address (or a worker's `--listen` address, for that worker alone).
    #[arg(long)]
    master: SocketAddr,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// How long to wait for the answer, in milliseconds (1 to 600000).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=600_000))]
    timeout_ms: u64,
    #[command(flatten)]
    secret: SecretArgs,
}

/// Runs `flint status`: one question, one answer, printed.
pub fn run(args: StatusArgs) -> Result<ExitCode, String> {
    args.secret.listens_nowhere("flint status")?;
    let secret = args.secret.required("flint status")?;
    let mut client = BlockingClient::connect(
        args.master,
        Role::Client,
        secret,
        Duration::from_millis(args.timeout_ms),
    )
    .map_err(|e| e.to_string())?;
    client
        .send(&Message::StatusRequest {})
        .map_err(|e| e.to_string())?;
    let frame = client.next_frame().map_err(|e| e.to_string())?;
    let message = frame
        .message()
        .map_err(|e| format!("malformed answer: {e}"))?;
    let Message::StatusResponse {
        workers,
        applications,
        executors,
    } = message
    else {
        return Err(format!("unexpected answer {}", message.kind().name()));
    };
    if args.json {
        // The document the master's /api/v1/cluster serves.
        let view = ClusterView::from_status(workers, applications, executors);
        println!("{}", flint_net::observe::api::cluster_json(&view));
    } else {
        print_status_tables(workers, applications, executors);
    }
    Ok(ExitCode::SUCCESS)
}

/// `flint status`: a table each for the workers, applications and executors.
fn print_status_tables(
    workers: List<'_, WorkerStatus<'_>>,
    applications: List<'_, AppStatus<'_>>,
    executors: List<'_, ExecutorStatus<'_>>,
) {
    println!("WORKERS");
    println!(
        "  {:<24} {:<22} {:<8} {:>11} {:>15}",
        "id", "address", "state", "cores used", "memory used MiB"
    );
    for w in workers {
        println!(
            "  {:<24} {:<22} {:<8} {:>11} {:>15}",
            w.worker_id,
            format!("{}:{}", w.host, w.port),
            w.state.to_string().to_uppercase(),
            format!("{}/{}", w.cores_used, w.cores),
            format!("{}/{}", w.memory_used_mb, w.memory_mb)
        );
    }
    println!("APPLICATIONS");
    println!(
        "  {:<24} {:<16} {:<9} {:>6} {:>10}",
        "id", "name", "state", "cores", "requested"
    );
    for a in applications {
        println!(
            "  {:<24} {:<16} {:<9} {:>6} {:>10}",
            a.app_id,
            a.name,
            a.state.to_string().to_uppercase(),
            a.cores_granted,
            a.executors_requested
        );
        if !a.waiting.is_empty() {
            println!("    waiting: {}", a.waiting);
        }
    }
    println!("EXECUTORS");
    println!(
        "  {:<24} {:<8} {:<24} {:>5} {:<9}",
        "application", "id", "worker", "cores", "state"
    );
    for e in executors {
        println!(
            "  {:<24} {:<8} {:<24} {:>5} {:<9}",
            e.app_id,
            e.executor_id,
            e.worker_id,
            e.cores,
            e.state.to_string().to_uppercase()
        );
    }
}
