//! Where a driver's executors come from and where they go, the IO side of the engine's
//! lifecycle state machines (`flint_engine::lifecycle`: the snapshot store, the allocator,
//! removals): [`local`] starts `flint executor` processes itself and keeps them at the
//! allocator's target; [`mirror`] follows executors a cluster manager creates, through an
//! [`mirror::ExecutorSource`]; [`master_source`] is that source for the standalone master's executors,
//! and scales them with the backlog.

pub mod local;
pub mod master_source;
pub mod mirror;
