//! The executor's graceful exit on SIGTERM (what Kubernetes sends a deleted pod), after
//! Spark's executor decommissioning: every lane tells the driver it is draining
//! (`ExecutorDraining`: the driver's scheduler gives it no new task), the attempts in flight
//! may finish until the drain timeout (the pod's `terminationGracePeriodSeconds` less a
//! margin), and those still running then are reported killed (re-queued at once, not counted
//! against the task) before the executor exits cleanly, instead of being lost with it.
//!
//! The handler only sets a flag (async-signal-safe); a watcher thread polls it and drives the
//! lanes through their endpoints' messages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flint_engine::runtime::EndpointRef;

use super::endpoint::{ExecutorEndpoint, ExecutorMsg};
use super::{ExecutorSummary, ExitSlot};

/// Set by the SIGTERM handler.
static SIGTERM: AtomicBool = AtomicBool::new(false);
/// How often the watcher looks at the flag and at the lanes' attempts.
const POLL: Duration = Duration::from_millis(10);
/// How long a lane may take to answer the watcher.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// The started lanes' endpoints (at most `LANES_MAX`).
#[derive(Clone, Default)]
pub(super) struct Lanes(Arc<Mutex<Vec<EndpointRef<ExecutorEndpoint>>>>);

impl Lanes {
    pub(super) fn add(&self, lane: EndpointRef<ExecutorEndpoint>) {
        let mut lanes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        assert!(
            lanes.len() < crate::wire::limits::LANES_MAX as usize,
            "a lane too many"
        );
        lanes.push(lane);
    }

    fn all(&self) -> Vec<EndpointRef<ExecutorEndpoint>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

extern "C" fn on_sigterm(_signal: libc::c_int) {
    SIGTERM.store(true, Ordering::SeqCst);
}

/// Installs the SIGTERM handler (again is harmless).
pub(super) fn catch_sigterm() -> std::io::Result<()> {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe; `action` is
    // zeroed (a valid `sigaction`: no flags, empty mask after `sigemptyset`) and outlives the
    // call, which copies it; the old action is not asked for (null).
    let installed = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigterm as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGTERM, &action, std::ptr::null_mut())
    };
    if installed != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Starts the watcher: until the executor exits, it waits for SIGTERM, then drains the lanes
/// for at most `timeout` and makes the executor leave.
pub(super) fn watch(lanes: Lanes, exit: Arc<ExitSlot>, timeout: Duration) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("flint-executor-sigterm".into())
        .spawn(move || {
            while !SIGTERM.load(Ordering::SeqCst) {
                if exit.is_set() {
                    return;
                }
                std::thread::sleep(POLL);
            }
            drain(&lanes.all(), &exit, timeout);
        })
        .map(drop)
}

/// Drains `lanes`: tells each, waits until none has an attempt in flight (or `timeout`),
/// reports what is left killed, and sets the executor's exit.
fn drain(lanes: &[EndpointRef<ExecutorEndpoint>], exit: &ExitSlot, timeout: Duration) {
    tracing::info!(
        lanes = lanes.len(),
        "SIGTERM: draining for at most {} ms",
        timeout.as_millis()
    );
    for lane in lanes {
        let _ = lane.send(ExecutorMsg::Drain);
    }
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline && !exit.is_set() {
        let in_flight: usize = (lanes.iter())
            .map(|lane| lane.ask(ExecutorMsg::InFlight, ASK_TIMEOUT).unwrap_or(0))
            .sum();
        if in_flight == 0 {
            break;
        }
        std::thread::sleep(POLL);
    }
    let left: usize = (lanes.iter())
        .map(|lane| lane.ask(ExecutorMsg::Leave, ASK_TIMEOUT).unwrap_or(0))
        .sum();
    tracing::info!(
        left,
        "leaving: {left} attempts still running reported killed"
    );
    exit.set(Ok(ExecutorSummary { task_attempts: 0 }));
}
