//! The worker's status server (`--listen`): answers `flint status` (`Role::Client`) about this
//! worker and its executors, at most [`CLIENTS_MAX`] connections at once (the oldest goes when
//! another arrives), each closed when silent for [`CLIENT_IDLE_TIMEOUT`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::BytesMut;
use mio::Token;

use super::process::{Key, Running};
use super::{WorkerConfig, WorkerError};
use crate::conn::{ConnError, Inbound};
use crate::transport::server::{Handler, Limits, Server, Standing};
use crate::transport::{encode, unexpected};
use crate::wire::{self, Frame, Message, ProcessState, Role, FRAME_SIZE_MAX_DEFAULT};

/// Time a status connection has to finish its handshake.
const CLIENT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// A status connection silent this long is closed.
const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Status connections held at once; the oldest goes when another arrives.
const CLIENTS_MAX: usize = 64;

/// Binds the status listener (`--listen`); the advertised host and port become the bound ones.
pub(super) fn bind(addr: SocketAddr, config: &mut WorkerConfig) -> Result<Server<()>, WorkerError> {
    if !addr.ip().is_loopback() && config.secret.is_none() && !config.allow_insecure_bind {
        return Err(WorkerError::Start(format!(
            "refusing to listen on non-loopback {addr} without a shared secret"
        )));
    }
    let listener = mio::net::TcpListener::bind(addr)
        .map_err(|e| WorkerError::Start(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener.local_addr().unwrap_or(addr);
    if !bound.ip().is_unspecified() {
        config.host = bound.ip().to_string();
    }
    config.port = bound.port();
    let inbound = Inbound {
        role: Role::Worker,
        accepted_roles: &[Role::Client],
        secret: config.secret.clone(),
        frame_size_max: FRAME_SIZE_MAX_DEFAULT,
        outbound_max: 16 << 20,
    };
    let limits = Limits {
        connections_max: CLIENTS_MAX,
        handshakes_max: CLIENTS_MAX,
        clients_max: CLIENTS_MAX,
        handshake_timeout: CLIENT_HANDSHAKE_TIMEOUT,
        client_idle_timeout: CLIENT_IDLE_TIMEOUT,
        member_timeout: None,
    };
    Ok(Server::new(listener, inbound, limits, "the worker"))
}

/// What a status connection is answered from: this worker and its executors.
pub(super) struct StatusPeers<'a> {
    pub config: &'a WorkerConfig,
    pub executors: &'a HashMap<Key, Running>,
    pub registered: bool,
}

impl Handler<()> for StatusPeers<'_> {
    fn on_open(&mut self, _peer: Token, _role: Role) -> Result<(), String> {
        Ok(())
    }

    fn on_frame(
        &mut self,
        _peer: Token,
        _state: &mut (),
        frame: Frame,
        out: &mut BytesMut,
    ) -> Result<(), ConnError> {
        match frame.message()? {
            Message::StatusRequest {} => {
                self.status(out);
                Ok(())
            }
            Message::Shutdown {} => Err(ConnError::Closed),
            other => Err(ConnError::Protocol(unexpected(&other, "a status client"))),
        }
    }

    fn on_closed(&mut self, _peer: Token, _state: (), _why: &ConnError) {}

    fn standing(&self, _peer: Token, _state: &()) -> Standing {
        Standing::Client
    }
}

impl StatusPeers<'_> {
    fn status(&self, out: &mut BytesMut) {
        let cores_used: u32 = self.executors.values().map(|r| r.cores).sum();
        let memory_used_mb: u64 = self.executors.values().map(|r| r.memory_mb).sum();
        let workers = [wire::WorkerStatus {
            worker_id: &self.config.id,
            host: &self.config.host,
            port: self.config.port,
            state: if self.registered {
                wire::WorkerState::Alive
            } else {
                wire::WorkerState::Unknown
            },
            cores: self.config.cores,
            cores_used,
            memory_mb: self.config.memory_mb,
            memory_used_mb,
        }];
        let executors: Vec<wire::ExecutorStatus<'_>> = self
            .executors
            .iter()
            .map(|((app, executor), running)| wire::ExecutorStatus {
                app_id: app,
                executor_id: executor,
                worker_id: &self.config.id,
                cores: running.cores,
                state: ProcessState::Running,
            })
            .collect();
        let response = Message::StatusResponse {
            workers: wire::List::from_items(&workers),
            applications: wire::List::empty(),
            executors: wire::List::from_items(&executors),
        };
        encode(&response, out, FRAME_SIZE_MAX_DEFAULT);
    }
}
