//! Shared pieces of the benches and the `flint-load` harness: starting a cluster
//! ([`cluster`]), offering load and measuring it ([`load`]), the HTML report and HDR logs
//! ([`report`]), the driver's memory with many queued tasks ([`memory`]), and async callers
//! beside the same work done inline ([`async_load`]), and an axum service running one job per
//! request beside the same service doing the work inline ([`service`]); faults injected into
//! one executor during a measured period ([`fault`]).

pub mod async_load;
pub mod cluster;
pub mod fault;
pub mod load;
pub mod memory;
pub mod report;
pub mod service;
