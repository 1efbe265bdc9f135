//! The cluster simulator (a test tool, not part of a production driver): see `run_seed`.

pub mod hostile;
pub mod ledger;
pub mod network;
pub mod runner;
