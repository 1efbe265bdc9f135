//! The driver's peer table: whom it lets in (executors and status clients, with the secret)
//! and its limits. Peers have small tables of their own: at most [`HANDSHAKES_MAX`]
//! unauthenticated ones and [`CLIENTS_MAX`] status clients (the oldest goes when another
//! arrives), so executors always find room under `connections_max`.

use std::time::Duration;

use crate::conn::Inbound;
use crate::driver::DriverConfig;
use crate::transport::peers::{Limits, PeersConfig};
use crate::wire::Role;

/// Connections still in the handshake (unauthenticated) held at once; the oldest goes when
/// another arrives.
pub const HANDSHAKES_MAX: usize = 256;
/// Client connections (`Role::Client`) held at once; the oldest goes when another arrives.
pub const CLIENTS_MAX: usize = 64;
/// A client connection silent this long is closed.
pub const CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Whom the driver lets in: executors and status clients.
pub(crate) fn inbound(config: &DriverConfig) -> Inbound {
    Inbound {
        role: Role::Driver,
        accepted_roles: &[Role::Executor, Role::Client],
        secret: config.secret.clone(),
        frame_size_max: config.frame_size_max,
        outbound_max: config.outbound_max,
    }
}

/// The driver's peer table: executors and status clients, bounded by the config.
pub(super) fn peers_config(config: &DriverConfig) -> PeersConfig {
    PeersConfig {
        inbound: inbound(config),
        name: "the driver",
        limits: Limits {
            connections_max: config.connections_max,
            handshakes_max: HANDSHAKES_MAX,
            clients_max: CLIENTS_MAX,
            handshake_timeout: config.handshake_timeout,
            client_idle_timeout: CLIENT_IDLE_TIMEOUT,
            member_timeout: Some(config.heartbeat_timeout),
        },
    }
}
