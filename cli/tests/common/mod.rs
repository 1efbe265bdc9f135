//! Helpers shared by the process tests (the ones that run the `flint` binary): waiting on a
//! condition with a deadline, unique names, free ports, running `flint` to its end. Each test
//! binary uses some of them. `net/tests/common` has the same first three for flint-net's tests.
#![allow(dead_code)]

pub mod proc;

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

/// Runs `flint ARGS` to its end with stdout and stderr captured, failing the test if it is
/// still running after [`DEADLINE`].
pub fn run_flint(args: &[&str]) -> std::process::Output {
    use std::process::{Command, Stdio};
    let mut child = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flint");
    let start = Instant::now();
    while child.try_wait().expect("try_wait").is_none() {
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            panic!("flint {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().expect("output")
}

/// Raises this process's soft limit on open files to `wanted` (as far as the hard limit
/// allows), for tests that hold thousands of connections; the soft limit it has then.
pub fn raise_descriptor_limit(wanted: u64) -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 0;
    }
    if limit.rlim_cur < wanted {
        limit.rlim_cur = wanted.min(limit.rlim_max);
        // SAFETY: `limit` is a valid rlimit; raising the soft limit up to the hard one is allowed.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    }
    limit.rlim_cur
}
