//! Flint on the network: the wire protocol, connections on the event loop, the roles.
#![deny(missing_docs)]

mod admission;
pub mod app_client;
pub mod conn;
pub mod driver;
pub mod executor;
pub mod handshake;
pub mod http;
pub mod job;
pub mod journal;
pub mod local;
pub mod master;
pub mod master_source;
pub mod metrics;
pub mod observe;
pub mod pools;
pub mod source;
pub mod standalone;
pub mod ui;
pub mod wire;
pub mod worker;

pub use flint_engine::functions::{Registry, TaskContext, TaskError};
