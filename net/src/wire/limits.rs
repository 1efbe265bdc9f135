//! The protocol's limits both sides hold to: the driver refuses a registration past them and
//! an executor sizes itself within them (the driver re-exports them).

/// The most task slots per executor core: executors size their queues for this many.
pub const TASKS_PER_CORE_MAX: u32 = 1024;

/// The most cores an executor may register with; a registration claiming more is refused
/// with the reason. (With [`TASKS_PER_CORE_MAX`] that is at most 2^20 slots.)
pub const EXECUTOR_CORES_MAX: u32 = 1024;

/// The most lanes an executor may run: connections to the driver, each with its own event
/// loop; an executor with more cores shares these among them.
pub const LANES_MAX: u32 = 16;

/// Function indexes a driver may define on one executor connection (`DefineFunction`): a
/// launch names its function by one of them, so it carries 4 bytes and the executor compares
/// nothing. A driver with more functions in use replaces the least recently defined.
pub const FUNCTIONS_PER_CONNECTION: u32 = 256;
