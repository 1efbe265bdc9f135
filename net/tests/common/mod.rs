//! Helpers shared by flint-net's integration tests: waiting on a condition with a deadline, unique
//! names, free ports. Each test binary uses some of them. (The tests that run the `flint` binary
//! live in `cli/tests/`, with a copy of these and `run_flint`.)
#![allow(dead_code)]

use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long any one condition may take before the test fails; generous, because CI machines are
/// small and shared. No test asserts speed.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `condition` every few milliseconds until it holds; fails the test after [`DEADLINE`].
pub fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A number no other call in this process returns (for file and directory names).
pub fn unique() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Submits a job whose result observer holds `driver`'s loop (observers run on it) until the
/// returned sender is used or [`DEADLINE`] passes; returns once the loop is held, with the
/// job's handle.
pub fn hold_loop(
    driver: &flint_net::driver::Driver,
) -> (flint_net::job::JobHandle, std::sync::mpsc::Sender<()>) {
    let (blocked_tx, blocked_rx) = std::sync::mpsc::channel();
    let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let blocker =
        flint_net::job::Job::new("noop", vec![bytes::Bytes::new()]).on_result(move |_, _| {
            let _ = blocked_tx.send(());
            let _ = release_rx.lock().expect("lock").recv_timeout(DEADLINE);
        });
    let held = driver.submit(blocker).expect("submitted");
    blocked_rx.recv_timeout(DEADLINE).expect("the loop is held");
    (held, release_tx)
}
