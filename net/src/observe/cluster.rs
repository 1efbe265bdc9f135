//! The standalone cluster as its master and workers report it (their status answers, asked
//! over the cluster protocol): the rows of the master's and a worker's page and metrics.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Serialize;

use crate::handshake::Secret;
use crate::standalone::{BlockingClient, ClientError};
use crate::wire::{AppStatus, ExecutorStatus, List, Message, Role, WorkerStatus};

/// A worker as the master reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerRow {
    /// Its id.
    pub id: String,
    /// The host it is reached at.
    pub host: String,
    /// Its port (0: it does not listen).
    pub port: u16,
    /// `ALIVE`, `DEAD`, `UNKNOWN`.
    pub state: String,
    /// Cores it offers.
    pub cores: u32,
    /// Cores in use.
    pub cores_used: u32,
    /// Memory it offers (MiB).
    pub memory_mb: u64,
    /// Memory in use (MiB).
    pub memory_used_mb: u64,
}

/// An application as the master reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppRow {
    /// Its id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// `WAITING`, `RUNNING`, `FINISHED`, `FAILED`, `KILLED`.
    pub state: String,
    /// Cores its executors hold.
    pub cores_granted: u32,
    /// Executors it asked for.
    pub executors_requested: u32,
    /// Why it waits (empty: it does not).
    pub waiting: String,
}

/// An executor as the master (or a worker) reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterExecutorRow {
    /// Its application.
    #[serde(rename = "app_id")]
    pub app: String,
    /// Its id.
    pub id: String,
    /// Its worker.
    #[serde(rename = "worker_id")]
    pub worker: String,
    /// Its cores.
    pub cores: u32,
    /// Its state (`LAUNCHING`, `RUNNING`, ...).
    pub state: String,
}

/// What a master (or a worker, about itself) answers to a status request; as JSON, the
/// document `flint status --json` prints and `/api/v1/cluster` serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    /// Workers, alive first.
    pub workers: Vec<WorkerRow>,
    /// Applications.
    #[serde(rename = "applications")]
    pub apps: Vec<AppRow>,
    /// Executors.
    pub executors: Vec<ClusterExecutorRow>,
}

/// Asks the master or worker at `addr` for its status, as `flint status` does (a loopback
/// address stands in for an unspecified one).
pub fn cluster_view(
    addr: SocketAddr,
    secret: Option<Secret>,
    timeout: Duration,
) -> Result<ClusterView, ClientError> {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let mut client = BlockingClient::connect(addr, Role::Client, secret, timeout)?;
    client.send(&Message::StatusRequest {})?;
    let frame = client.next_frame()?;
    let message = frame.message().map_err(ClientError::Malformed)?;
    let Message::StatusResponse {
        workers,
        applications,
        executors,
    } = message
    else {
        return Err(ClientError::Unexpected(message.kind().name()));
    };
    Ok(ClusterView::from_status(workers, applications, executors))
}

impl ClusterView {
    /// The view of a `StatusResponse`'s lists.
    pub fn from_status(
        workers: List<'_, WorkerStatus<'_>>,
        applications: List<'_, AppStatus<'_>>,
        executors: List<'_, ExecutorStatus<'_>>,
    ) -> ClusterView {
        let upper = |state: &dyn std::fmt::Display| state.to_string().to_uppercase();
        ClusterView {
            workers: (workers.iter())
                .map(|w| WorkerRow {
                    id: w.worker_id.to_owned(),
                    host: w.host.to_owned(),
                    port: w.port,
                    state: upper(&w.state),
                    cores: w.cores,
                    cores_used: w.cores_used,
                    memory_mb: w.memory_mb,
                    memory_used_mb: w.memory_used_mb,
                })
                .collect(),
            apps: (applications.iter())
                .map(|a| AppRow {
                    id: a.app_id.to_owned(),
                    name: a.name.to_owned(),
                    state: upper(&a.state),
                    cores_granted: a.cores_granted,
                    executors_requested: a.executors_requested,
                    waiting: a.waiting.to_owned(),
                })
                .collect(),
            executors: (executors.iter())
                .map(|e| ClusterExecutorRow {
                    app: e.app_id.to_owned(),
                    id: e.executor_id.to_owned(),
                    worker: e.worker_id.to_owned(),
                    cores: e.cores,
                    state: upper(&e.state),
                })
                .collect(),
        }
    }
}
