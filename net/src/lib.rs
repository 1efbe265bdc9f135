//! Flint on the network: the wire protocol, connections on the event loop, the roles.
#![deny(missing_docs)]

pub mod conn;
pub mod functions;
pub mod handshake;
pub mod summary;
pub mod wire;
