//! Helpers shared by the process tests (the ones that run the `flint` binary): waiting on a
//! condition with a deadline, unique names, free ports, running `flint` to its end, a [`Gate`]
//! that holds a job until the test releases it, and reading a role's Prometheus metrics. Each
//! test binary uses some of them. `net/tests/common` has the same first three for flint-net's
//! tests.
#![allow(dead_code)]

pub mod cluster;
mod gate;
#[allow(unused_imports)]
pub use gate::Gate;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
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

/// [`wait_until`], and on a timeout `explain()` (the state that was waited on) in the failure.
pub fn wait_until_or(
    what: &str,
    mut condition: impl FnMut() -> bool,
    explain: impl Fn() -> String,
) {
    let deadline = Instant::now() + DEADLINE;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {}",
            explain()
        );
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

/// One GET to `addr` (with `Authorization: Bearer` when `bearer` is given): the status code and
/// the body, or 0 and "" when nothing answers.
pub fn http_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> (u16, String) {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return (0, String::new());
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\n{auth}\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return (0, String::new());
    }
    let mut raw = String::new();
    let _ = stream.read_to_string(&mut raw);
    let Some((head, body)) = raw.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

/// A role's Prometheus metrics (`/metrics` at `addr`, with `token` if it needs one), or "" when
/// it does not answer 200.
pub fn metrics(addr: SocketAddr, token: Option<&str>) -> String {
    match http_get(addr, "/metrics", token) {
        (200, body) => body,
        _ => String::new(),
    }
}

/// The value of one sample (`name{labels}` exactly as printed) in Prometheus text.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}

/// Every sample of `metric` that has labels, as (the labels between the braces, value):
/// `flint_executor_tasks_running` gives `("executor=\"local-0\"", 16.0)` and so on.
pub fn samples(text: &str, metric: &str) -> Vec<(String, f64)> {
    let prefix = format!("{metric}{{");
    text.lines()
        .filter_map(|line| {
            let (series, value) = line.strip_prefix(&prefix)?.rsplit_once(' ')?;
            Some((series.strip_suffix('}')?.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// Running attempts per executor of a driver's metrics text (`flint_executor_tasks_running`),
/// by executor id.
pub fn running_per_executor(text: &str) -> Vec<(String, f64)> {
    samples(text, "flint_executor_tasks_running")
        .into_iter()
        .filter_map(|(labels, value)| {
            let id = labels.strip_prefix("executor=\"")?.strip_suffix('"')?;
            Some((id.to_owned(), value))
        })
        .collect()
}

/// Whether a driver's metrics text shows `executors` registered, each holding running attempts
/// (with a job of a [`Gate`]'s tasks, they hold them until the gate opens).
pub fn holding(text: &str, executors: usize) -> bool {
    let holding = running_per_executor(text)
        .iter()
        .filter(|(_, running)| *running > 0.0)
        .count();
    sample(text, "flint_executors") == Some(executors as f64) && holding == executors
}

/// Waits until the driver whose metrics are at `addr` (read with `token`) is [`holding`] with
/// `executors`.
pub fn wait_until_held(addr: SocketAddr, token: Option<&str>, executors: usize) {
    wait_until(&format!("{executors} executors holding attempts"), || {
        holding(&metrics(addr, token), executors)
    });
}

/// Opens `gate` after checking, in the driver's metrics at `addr` (read with `token`), that no
/// task finished while it was shut.
pub fn open_held(gate: &Gate, addr: SocketAddr, token: Option<&str>) {
    let text = metrics(addr, token);
    assert_eq!(
        sample(&text, "flint_tasks_succeeded_total"),
        Some(0.0),
        "nothing finishes while the gate is shut: {text}"
    );
    gate.open();
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

/// The observe token a role printed the file of (`observe token in PATH`) in `stderr`, once it
/// has: the token its metrics and pages take (never the cluster secret).
pub fn wait_observe_token(stderr: impl Fn() -> String) -> String {
    let mut path = None;
    wait_until("the observe token's file to be printed", || {
        path = observe_token_path(&stderr());
        path.is_some()
    });
    let path = path.unwrap_or_default();
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("observe token file {path}: {e}"))
        .trim()
        .to_owned()
}

/// The observe token's file a role printed (`observe token in PATH`) in `stderr`, if it did.
#[allow(dead_code)] // not every test binary looks at the path itself
pub fn observe_token_path(stderr: &str) -> Option<String> {
    stderr.lines().find_map(|line| {
        let rest = line.split("observe token in ").nth(1)?;
        Some(rest.split(' ').next()?.to_owned())
    })
}

/// Runs `flint ARGS` to its end with `env` added; its output.
pub fn run_flint_env(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_flint"));
    for (k, v) in env {
        command.env(k, v);
    }
    command
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run flint")
}

/// Runs `flint ARGS` with `FLINT_SECRET` set to `secret`; its stdout (it must exit 0).
pub fn run_flint_with_secret(args: &[&str], secret: &str) -> String {
    let out = run_flint_env(args, &[("FLINT_SECRET", secret)]);
    assert!(
        out.status.success(),
        "flint {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
