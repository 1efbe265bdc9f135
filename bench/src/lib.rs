//! Shared pieces of the benches and the `flint-load` harness: starting a cluster
//! ([`cluster`]), offering load and measuring it ([`load`]), the HTML report and HDR logs
//! ([`report`]), and the driver's memory with many queued tasks ([`memory`]).

pub mod cluster;
pub mod load;
pub mod memory;
pub mod report;
