//! The standalone cluster manager's brain as sans-IO state machines (Spark's `Master` scheduling
//! logic): see [`master`]. `flint-net` puts it on the wire (`net/src/master.rs`) and runs the
//! worker side (`net/src/worker.rs`).

pub mod master;

pub use master::{
    AppSpec, AppState, AppView, Config, ExecutorView, Master, Output, ProcessState, RecoveredApp,
    Status, WorkerSpec, WorkerState, WorkerView, NO_WORKER_FITS,
};
