//! The standalone cluster manager, Spark's standalone mode: a [`master`] that workers register
//! with and applications ask for executors, [`worker`]s that start executor processes on their
//! machine, and the [`app_client`] a driver uses to register its application with the master.
//!
//! Each role is a thin IO endpoint around a sans-IO protocol part, unit-tested without sockets:
//! [`master_core::MasterCore`] (around the engine's `flint_engine::standalone::Master`), the
//! worker's and the application client's sessions. They share the crate's one transport (the
//! peer table with the handshake and its limits on the listening side, a reconnecting link on
//! the connecting side). The master journals workers and applications in its state directory
//! and recovers them when it starts again. Every role authenticates its peers with the cluster
//! secret unless the operator opts out (`--insecure`).
//!
//! Starting each: `MasterHandle::start(config)`, `worker::run(config)`,
//! `AppClient::start(config)`; the `flint master`, `flint worker` and `flint submit` commands
//! (crate `flint-cli`) do this from a command line.

pub mod app_client;
#[doc(hidden)]
pub mod journal;
pub mod master;
#[doc(hidden)]
pub mod master_core;
mod shared;
pub mod worker;

pub use journal::JournalError;

#[doc(hidden)]
pub use shared::*;
