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

/// A TCP port free now, for a test's child process (or driver) to listen on a moment later.
/// It comes from below the kernel's ephemeral range: a port `bind(:0)` hands out comes from
/// that range, and once released it may be given to any connection opened on this machine
/// before the listener binds it (a worker once failed to listen so, mid-`ci/test`). One test
/// process never hands out a port twice.
pub fn free_port() -> u16 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = 10_000u16.min(first_ephemeral / 2).max(1_024);
    if first_ephemeral <= low {
        // No room below the range: take one from it.
        return (TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()))
            .map(|a| a.port())
            .expect("a free port");
    }
    let span = u64::from(first_ephemeral - low);
    // Test binaries run one after another; each starts elsewhere in the span anyway.
    let start = u64::from(std::process::id()).wrapping_mul(7_919);
    for _ in 0..span {
        let next = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low + (start.wrapping_add(next) % span) as u16;
        // Free on every address (the child may listen on 127.0.0.2 or .3).
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {low}..{first_ephemeral}");
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
