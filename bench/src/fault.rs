//! Faults the load harness and the service benchmark inject into one executor process during
//! a measured period, so the tail is measured while something is wrong:
//!
//! - `freeze:AFTER:FOR`: SIGSTOP the executor AFTER seconds into the period, SIGCONT it FOR
//!   seconds later (a process paused by the OS, a long GC, a VM steal);
//! - `slow:FACTOR`: the executor runs 1/FACTOR of the time for the whole period (SIGSTOP and
//!   SIGCONT in a 10 ms cycle: a noisy neighbour, a throttled container);
//! - `cut:AFTER:FOR`: the executor's connections pass through a relay in this process, which
//!   stops forwarding AFTER seconds in, for FOR seconds, without closing anything (a network
//!   path that drops packets: the executor is silent but connected);
//! - `kill:AFTER`: SIGKILL the executor AFTER seconds in (it is not replaced).
//!
//! Every fault is undone when the period ends (or the harness stops), whatever happened.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The slow fault's cycle: the executor runs `CYCLE / factor` of each.
const CYCLE: Duration = Duration::from_millis(10);
/// The longest a fault may start after, or last (seconds).
const SECONDS_MAX: f64 = 3600.0;

/// A fault on one executor (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Paused `after` into the period, for `lasting`.
    Freeze {
        /// When, from the period's start.
        after: Duration,
        /// For how long.
        lasting: Duration,
    },
    /// Running 1/`factor` of the time, all period.
    Slow {
        /// How many times slower (2 to 100).
        factor: u32,
    },
    /// Killed (SIGKILL) `after` into the period.
    Kill {
        /// When, from the period's start.
        after: Duration,
    },
    /// Its connections stop forwarding `after` into the period, for `lasting`.
    Cut {
        /// When, from the period's start.
        after: Duration,
        /// For how long.
        lasting: Duration,
    },
}

impl std::str::FromStr for Fault {
    type Err = String;

    fn from_str(text: &str) -> Result<Fault, String> {
        let usage =
            "use freeze:AFTER_S:FOR_S, slow:FACTOR (2 to 100), cut:AFTER_S:FOR_S or kill:AFTER_S";
        let seconds = |s: &str| -> Result<Duration, String> {
            match s.parse::<f64>() {
                Ok(v) if (0.0..=SECONDS_MAX).contains(&v) => Ok(Duration::from_secs_f64(v)),
                _ => Err(format!("bad seconds {s:?} in {text:?}: {usage}")),
            }
        };
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            ["freeze", after, lasting] => Ok(Fault::Freeze {
                after: seconds(after)?,
                lasting: seconds(lasting)?,
            }),
            ["cut", after, lasting] => Ok(Fault::Cut {
                after: seconds(after)?,
                lasting: seconds(lasting)?,
            }),
            ["kill", after] => Ok(Fault::Kill {
                after: seconds(after)?,
            }),
            ["slow", factor] => match factor.parse::<u32>() {
                Ok(factor) if (2..=100).contains(&factor) => Ok(Fault::Slow { factor }),
                _ => Err(format!("bad factor in {text:?}: {usage}")),
            },
            _ => Err(format!("bad fault {text:?}: {usage}")),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Freeze { after, lasting } => {
                write!(
                    f,
                    "freeze:{}:{}",
                    after.as_secs_f64(),
                    lasting.as_secs_f64()
                )
            }
            Fault::Slow { factor } => write!(f, "slow:{factor}"),
            Fault::Kill { after } => write!(f, "kill:{}", after.as_secs_f64()),
            Fault::Cut { after, lasting } => {
                write!(f, "cut:{}:{}", after.as_secs_f64(), lasting.as_secs_f64())
            }
        }
    }
}

impl Fault {
    /// Whether the executor must connect through a [`Relay`].
    pub fn needs_relay(&self) -> bool {
        matches!(self, Fault::Cut { .. })
    }
}

/// Where a fault lands: the executor's pid, and its relay for a cut.
#[derive(Debug, Clone)]
pub struct Target {
    /// The executor process.
    pub pid: u32,
    /// Its relay, when it connects through one.
    pub relay: Option<Relay>,
}

/// A fault being applied; [`Running::stop`] undoes it.
#[derive(Debug)]
pub struct Running {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Running {
    /// Starts `fault` on `target`, its times counted from `delay` from now (the measured
    /// period's start).
    pub fn start(fault: Fault, target: Target, delay: Duration) -> Result<Running, String> {
        if fault.needs_relay() && target.relay.is_none() {
            return Err("a cut needs the executor to connect through a relay".into());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("fault".into())
            .spawn(move || {
                if !sleep_until(Instant::now() + delay, &stopping) {
                    apply(fault, &target, &stopping);
                }
            })
            .map_err(|e| format!("cannot start the fault's thread: {e}"))?;
        Ok(Running {
            stop,
            thread: Some(thread),
        })
    }

    /// Undoes the fault (the executor runs, the relay forwards) and waits for that.
    pub fn stop(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Sends `signal` to `pid` (a process this harness started).
fn signal(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a pid that has
    // exited makes it fail with ESRCH, which is fine here.
    unsafe {
        libc::kill(pid, signal);
    }
}

/// Sleeps until `at` or until told to stop; whether it was told to stop.
fn sleep_until(at: Instant, stop: &AtomicBool) -> bool {
    while Instant::now() < at {
        if stop.load(Ordering::Relaxed) {
            return true;
        }
        let left = at.saturating_duration_since(Instant::now());
        std::thread::sleep(left.min(Duration::from_millis(1)));
    }
    stop.load(Ordering::Relaxed)
}

/// The fault's thread: applies it on schedule, and always undoes it before returning.
fn apply(fault: Fault, target: &Target, stop: &AtomicBool) {
    let start = Instant::now();
    match fault {
        Fault::Freeze { after, lasting } => {
            if !sleep_until(start + after, stop) {
                signal(target.pid, libc::SIGSTOP);
                sleep_until(start + after + lasting, stop);
            }
            signal(target.pid, libc::SIGCONT);
        }
        Fault::Slow { factor } => {
            let running = CYCLE / factor;
            let mut at = start;
            loop {
                at += running;
                if sleep_until(at, stop) {
                    break;
                }
                signal(target.pid, libc::SIGSTOP);
                at += CYCLE - running;
                if sleep_until(at, stop) {
                    break;
                }
                signal(target.pid, libc::SIGCONT);
            }
            signal(target.pid, libc::SIGCONT);
        }
        Fault::Kill { after } => {
            if !sleep_until(start + after, stop) {
                signal(target.pid, libc::SIGKILL);
            }
        }
        Fault::Cut { after, lasting } => {
            let Some(relay) = &target.relay else {
                return;
            };
            if !sleep_until(start + after, stop) {
                relay.cut.store(true, Ordering::Relaxed);
                sleep_until(start + after + lasting, stop);
            }
            relay.cut.store(false, Ordering::Relaxed);
        }
    }
}

/// A TCP relay in this process between one executor and the driver: each connection to it is
/// forwarded to the driver both ways, byte for byte, until it is cut (then nothing moves, and
/// nothing closes) or either side closes.
#[derive(Debug, Clone)]
pub struct Relay {
    /// Where the executor connects.
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
}

impl Relay {
    /// A relay on 127.0.0.1 to `driver`, accepting for as long as the process runs.
    pub fn start(driver: SocketAddr) -> Result<Relay, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("relay: {e}"))?;
        let addr = listener.local_addr().map_err(|e| format!("relay: {e}"))?;
        let cut = Arc::new(AtomicBool::new(false));
        let cutting = cut.clone();
        std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                for inbound in listener.incoming().flatten() {
                    let Ok(outbound) = TcpStream::connect(driver) else {
                        continue;
                    };
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    forward(&inbound, &outbound, &cutting);
                    forward(&outbound, &inbound, &cutting);
                }
            })
            .map_err(|e| format!("relay: {e}"))?;
        Ok(Relay { addr, cut })
    }
}

/// Copies `from` to `to` on a thread of its own, holding back while the relay is cut.
fn forward(from: &TcpStream, to: &TcpStream, cut: &Arc<AtomicBool>) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    let cut = cut.clone();
    let _ = std::thread::Builder::new()
        .name("relay-copy".into())
        .spawn(move || {
            let mut buffer = vec![0u8; 64 * 1024];
            loop {
                while cut.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let n = match from.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                // Read before the cut, held until it ends: a cut link delivers nothing.
                while cut.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse_and_print_back() {
        for text in ["freeze:2:5", "slow:10", "cut:1.5:3", "kill:2"] {
            let fault: Fault = text.parse().expect("parses");
            assert_eq!(fault.to_string(), text);
        }
        for bad in [
            "freeze:2",
            "slow:1",
            "slow:1000",
            "cut:-1:2",
            "thaw:1:1",
            "freeze:x:1",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
    }
}
