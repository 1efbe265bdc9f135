//! Flint on the network: the wire protocol, connections on the event loop, the roles.
#![deny(missing_docs)]

mod admission;
pub mod app_client;
pub mod conn;
pub mod driver;
pub mod executor;
pub mod handshake;
pub mod job;
pub mod journal;
pub mod lifecycle;
pub mod master;
pub mod master_core;
pub mod master_source;
pub mod observe;
pub mod pools;
#[doc(hidden)]
pub mod sim;
pub mod standalone;
pub mod transport;
pub mod wire;
pub mod worker;

pub use flint_engine::functions::{Registry, TaskContext, TaskError};
