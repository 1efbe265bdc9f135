//! Flint's in-process core: everything that runs without sockets.
//!
//! The runtime (pinned event loops with bounded inboxes), the task pool with the task functions
//! and the runner that reports their completions, and the scheduler state machine live here
//! (with, behind the `sim` feature, the scheduler's deterministic simulator); `flint-net` puts
//! them on the wire.
#![deny(missing_docs)]

pub mod affinity;
pub mod clock;
pub mod functions;
pub mod hash;
pub mod ids;
pub mod lifecycle;
mod loom;
pub mod pool;
pub mod runner;
pub mod runtime;
pub mod scheduler;
#[cfg(feature = "sim")]
pub mod sim;
pub mod spin;
pub mod standalone;
