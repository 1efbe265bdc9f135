//! The runtime: N pinned event loops, each a thread that owns a `mio::Poll`, a bounded
//! lock-free inbox, its timers and the endpoints placed on it (Spark's `Dispatcher`,
//! `Inbox` and `MessageLoop`, without the shared thread pool and the locks).
//!
//! ```
//! use flint_engine::runtime::{Ctx, Endpoint, Reply, Runtime, RuntimeConfig};
//! use std::time::Duration;
//!
//! struct Counter(u64);
//! enum Msg { Add(u64), Get(Reply<u64>) }
//! impl Endpoint for Counter {
//!     type Msg = Msg;
//!     fn on_message(&mut self, msg: Msg, _ctx: &mut Ctx<'_, Self>) {
//!         match msg {
//!             Msg::Add(n) => self.0 += n,
//!             Msg::Get(reply) => { let _ = reply.send(self.0); }
//!         }
//!     }
//! }
//!
//! let mut rt = Runtime::new(RuntimeConfig { threads: 1, ..Default::default() }).unwrap();
//! let counter = rt.handle().spawn("counter", Counter(0)).unwrap();
//! counter.send(Msg::Add(2)).unwrap();
//! assert_eq!(counter.ask(Msg::Get, Duration::from_secs(10)).unwrap(), 2);
//! rt.shutdown();
//! assert!(counter.send(Msg::Add(1)).is_err());
//! ```
//!
//! Placement: an endpoint lives on one loop for its whole life, so its handlers never run on
//! two threads at once. Messages reach it through its loop's inbox, in the order each sender
//! sent them. Shutdown pushes a poison pill into every inbox; each loop handles what was queued
//! before the pill, runs `on_stop` for its endpoints, drops them (and so their sources) and
//! exits.

mod endpoint;
mod event_loop;
pub mod inbox;
pub mod kicked;
mod timer;

pub use endpoint::{AskError, AskFuture, Ctx, Endpoint, EndpointRef, Reply, SendError};
pub(crate) use event_loop::panic_message;
pub use event_loop::LoopCtxError;
pub use inbox::Inbox;
pub use kicked::Kicked;
pub use timer::{TimerError, TimerId};

use std::any::TypeId;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::affinity::Pinning;
use event_loop::LoopShared;

/// Tables keyed by the runtime's own ids (handed out in increasing order).
pub(crate) use crate::ids::IdMap;

/// The instant `timeout` from now, saturating: a timeout too large to add (`Duration::MAX` from
/// a careless caller) is a deadline a century away rather than a panic.
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Whether waiting threads should spin before they block: on a machine with at least two cores
/// (see [`crate::spin::enabled`]; `FLINT_SPIN` overrides it). Blind spinning on 2 cores took the
/// core from the thread it was waiting for and cost 2-3x the throughput (BENCHMARKS.md, "without
/// spinning"); spins now adapt to the recent gaps, stay within a budget of spare cores and stop
/// when preempted ([`crate::spin`]), and on a quiet 2-core machine they cut a loopback round
/// trip from 75 to 25 us (BENCHMARKS.md, "third turn").
pub fn spinning_pays() -> bool {
    crate::spin::enabled()
}

/// `spin` where [`spinning_pays`], else zero: the default for the spin-before-park caps.
pub fn spin_default(spin: Duration) -> Duration {
    if spinning_pays() {
        spin
    } else {
        Duration::ZERO
    }
}

/// How to build a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Number of event loops; 0 means one per available core.
    pub threads: usize,
    /// Capacity of each loop's inbox (rounded up to a power of two).
    pub inbox_capacity: usize,
    /// Where loops run: loop `i` on the `i`-th listed CPU (a failure to pin is a logged
    /// warning). Default: not pinned.
    pub pin: Pinning,
    /// Thread name prefix; loop `i` is named `{thread_name}-{i}`.
    pub thread_name: String,
    /// Maximum number of live timers per loop.
    pub timers_max: usize,
    /// Maximum readiness events taken from `mio::Poll` per poll.
    pub events_capacity: usize,
    /// Maximum inbox messages handled between two looks at IO and timers.
    pub batch_max: usize,
    /// The longest an idle loop keeps polling its inbox before it parks in `mio::Poll::poll`
    /// (the spin adapts below it: [`crate::spin::AdaptiveSpin`]).
    pub spin_before_park: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            threads: 0,
            inbox_capacity: 4096,
            pin: Pinning::None,
            thread_name: "flint-loop".to_string(),
            timers_max: 65_536,
            events_capacity: 1024,
            batch_max: 256,
            spin_before_park: spin_default(Duration::from_micros(50)),
        }
    }
}

/// Why an endpoint could not be spawned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    /// An endpoint with this name is already running.
    #[error("an endpoint named {0:?} already exists")]
    DuplicateName(String),
    /// There is no loop with this index.
    #[error("no event loop with index {0}")]
    NoSuchLoop(usize),
    /// The chosen loop's inbox stayed full for the spawn's whole wait.
    #[error("the event loop's inbox is full")]
    Full,
    /// The runtime is shut down.
    #[error("the runtime is shut down")]
    Shutdown,
}

/// Why a named endpoint could not be looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    /// No running endpoint has this name.
    #[error("no endpoint named {0:?}")]
    Unknown(String),
    /// The endpoint exists but is of another type.
    #[error("endpoint {0:?} has another type")]
    WrongType(String),
    /// The runtime is shut down.
    #[error("the runtime is shut down")]
    Shutdown,
}

/// Why a runtime could not be built.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// Creating a `mio::Poll`, a `mio::Waker` or a thread failed.
    #[error("runtime setup failed: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) struct EndpointState {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) alive: AtomicBool,
    pub(crate) loop_index: usize,
}

struct NameEntry {
    state: Arc<EndpointState>,
    type_id: TypeId,
}

pub(crate) struct RuntimeShared {
    pub(crate) loops: Vec<Arc<LoopShared>>,
    pub(crate) closed: AtomicBool,
    names: Mutex<HashMap<String, NameEntry>>,
    next_id: AtomicU64,
    next_loop: AtomicUsize,
}

impl RuntimeShared {
    /// Forgets `name` if it still maps to endpoint `id`.
    pub(crate) fn unregister(&self, name: &str, id: u64) {
        let mut names = lock(&self.names);
        if names.get(name).is_some_and(|e| e.state.id == id) {
            names.remove(name);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned name table is still consistent (every update is a single insert or remove).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A cheap, cloneable, `Send` handle to a runtime: spawn and look up endpoints from any thread.
#[derive(Clone)]
pub struct RuntimeHandle {
    pub(crate) shared: Arc<RuntimeShared>,
}

impl std::fmt::Debug for RuntimeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeHandle")
            .field("loops", &self.shared.loops.len())
            .finish()
    }
}

impl RuntimeHandle {
    /// Number of event loops.
    pub fn loops(&self) -> usize {
        self.shared.loops.len()
    }

    /// Whether [`Runtime::shutdown`] has begun.
    pub fn is_shut_down(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Spawns `endpoint` under `name` on the next loop (round robin).
    pub fn spawn<E: Endpoint>(
        &self,
        name: &str,
        endpoint: E,
    ) -> Result<EndpointRef<E>, SpawnError> {
        let n = self.shared.loops.len();
        let index = self.shared.next_loop.fetch_add(1, Ordering::Relaxed) % n;
        self.spawn_on(index, name, endpoint)
    }

    /// Spawns `endpoint` under `name` on loop `loop_index`. Its `on_start` runs on that loop
    /// before any message sent through the returned reference (or a later lookup).
    pub fn spawn_on<E: Endpoint>(
        &self,
        loop_index: usize,
        name: &str,
        endpoint: E,
    ) -> Result<EndpointRef<E>, SpawnError> {
        let target = self
            .shared
            .loops
            .get(loop_index)
            .ok_or(SpawnError::NoSuchLoop(loop_index))?;
        if self.is_shut_down() {
            return Err(SpawnError::Shutdown);
        }
        let mut names = lock(&self.shared.names);
        if names.contains_key(name) {
            return Err(SpawnError::DuplicateName(name.to_string()));
        }
        let state = Arc::new(EndpointState {
            id: self.shared.next_id.fetch_add(1, Ordering::Relaxed),
            name: name.to_string(),
            alive: AtomicBool::new(true),
            loop_index,
        });
        let reference = EndpointRef::new(self.shared.clone(), state.clone());
        let envelope = event_loop::spawn_envelope(endpoint, reference.clone());
        // Spawning waits a little for room: it is rare and losing it would be surprising.
        target
            .push_wait(envelope, Duration::from_secs(1))
            .map_err(|_| SpawnError::Full)?;
        names.insert(
            name.to_string(),
            NameEntry {
                state,
                type_id: TypeId::of::<E>(),
            },
        );
        Ok(reference)
    }

    /// Looks up a running endpoint of type `E` by name.
    pub fn lookup<E: Endpoint>(&self, name: &str) -> Result<EndpointRef<E>, LookupError> {
        if self.is_shut_down() {
            return Err(LookupError::Shutdown);
        }
        let names = lock(&self.shared.names);
        let entry = names
            .get(name)
            .ok_or_else(|| LookupError::Unknown(name.to_string()))?;
        if entry.type_id != TypeId::of::<E>() {
            return Err(LookupError::WrongType(name.to_string()));
        }
        Ok(EndpointRef::new(self.shared.clone(), entry.state.clone()))
    }
}

/// A set of pinned event loops. Dropping it shuts it down.
pub struct Runtime {
    handle: RuntimeHandle,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("loops", &self.handle.loops())
            .finish()
    }
}

impl Runtime {
    /// Starts the loops described by `config`.
    pub fn new(config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        let threads = if config.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.threads
        };
        let mut polls = Vec::with_capacity(threads);
        let mut loops = Vec::with_capacity(threads);
        for index in 0..threads {
            let (poll, shared) = LoopShared::new(index, config.inbox_capacity)?;
            polls.push(poll);
            loops.push(Arc::new(shared));
        }
        let shared = Arc::new(RuntimeShared {
            loops,
            closed: AtomicBool::new(false),
            names: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            next_loop: AtomicUsize::new(0),
        });
        let mut runtime = Runtime {
            handle: RuntimeHandle {
                shared: shared.clone(),
            },
            threads: Vec::with_capacity(threads),
        };
        for (index, poll) in polls.into_iter().enumerate() {
            let pin = config.pin.clone();
            let event_loop = event_loop::EventLoop::new(index, poll, shared.clone(), &config);
            let spawned = std::thread::Builder::new()
                .name(format!("{}-{index}", config.thread_name))
                .spawn(move || {
                    pin.pin_current(index, "event loop");
                    event_loop.run();
                });
            match spawned {
                Ok(t) => runtime.threads.push(t),
                Err(e) => {
                    // Stop the loops already started (Drop runs shutdown).
                    drop(runtime);
                    return Err(RuntimeError::Io(e));
                }
            }
        }
        Ok(runtime)
    }

    /// A handle for spawning, looking up and sending from any thread.
    pub fn handle(&self) -> RuntimeHandle {
        self.handle.clone()
    }

    /// Pushes a poison pill into every inbox and joins the loops. Each loop first handles
    /// everything queued before its pill, then runs `on_stop` for its endpoints and drops them.
    /// Sends after this call returns fail with [`SendError::Shutdown`]. Idempotent. Must not
    /// be called from an event loop thread (it would join itself); the call is then ignored
    /// with an error log.
    pub fn shutdown(&mut self) {
        if event_loop::on_loop_thread() {
            tracing::error!("Runtime::shutdown called from an event loop thread; ignored");
            return;
        }
        let shared = &self.handle.shared;
        shared.closed.store(true, Ordering::Release);
        for (i, l) in shared.loops.iter().enumerate() {
            if i < self.threads.len() {
                l.push_poison();
            }
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::error!("an event loop thread panicked");
            }
        }
        lock(&shared.names).clear();
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn spawn_errors() {
        let mut rt = Runtime::new(RuntimeConfig {
            threads: 1,
            ..Default::default()
        })
        .unwrap();
        struct Nop;
        impl Endpoint for Nop {
            type Msg = ();
            fn on_message(&mut self, _: (), _: &mut Ctx<'_, Self>) {}
        }
        let h = rt.handle();
        h.spawn("a", Nop).unwrap();
        assert_eq!(
            h.spawn("a", Nop).unwrap_err(),
            SpawnError::DuplicateName("a".into())
        );
        assert_eq!(
            h.spawn_on(7, "b", Nop).unwrap_err(),
            SpawnError::NoSuchLoop(7)
        );
        assert!(matches!(
            h.lookup::<Nop>("zz"),
            Err(LookupError::Unknown(_))
        ));
        rt.shutdown();
        assert_eq!(h.spawn("c", Nop).unwrap_err(), SpawnError::Shutdown);
        assert_eq!(h.lookup::<Nop>("a").unwrap_err(), LookupError::Shutdown);
    }
}
