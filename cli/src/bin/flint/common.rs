//! What several commands share: limits, flag parsers, and waiting for executors to go.

use std::time::{Duration, Instant};

use flint_engine::affinity::Pinning;

/// The most task threads a stock `flint executor` runs (its queues grow with them; a bigger
/// machine runs more executors). The driver accepts claims up to
/// `flint_net::driver::EXECUTOR_CORES_MAX` from executors built on `executor::run`.
pub const EXECUTOR_CORES_MAX: i64 = 256;
/// The longest any command waits for something, in seconds: one day.
pub const WAIT_MAX_S: u64 = 86_400;

/// `--pin-cores`: `none` or a list of CPUs in this process's affinity mask.
pub fn pinning(text: &str) -> Result<Pinning, String> {
    Pinning::parse(text).map_err(|e| e.to_string())
}

/// Waits up to `wait_ms` while `more` says idle executors are still to be released.
pub fn wait_for_release(wait_ms: u64, more: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    while Instant::now() < deadline && more() {
        std::thread::sleep(Duration::from_millis(10));
    }
}
