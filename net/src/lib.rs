//! Flint on the network: the wire protocol, connections on the event loop, the roles.
#![deny(missing_docs)]

pub mod conn;
pub mod driver;
pub mod executor;
pub mod functions;
pub mod handshake;
pub mod job;
pub mod local;
pub mod runner;
pub mod source;
pub mod summary;
pub mod wire;
