//! Endpoints: the typed actors that live on an event loop, the context their handlers get,
//! the references other threads send through, and ask/reply.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use mio::event::{Event, Source};
use mio::{Interest, Registry, Token};

use super::event_loop::{Envelope, LoopCtxError, LoopInner};
use super::timer::{TimerError, TimerId};
use super::{EndpointState, RuntimeHandle, RuntimeShared};

/// A named actor on one event loop. Its handlers run one at a time on that loop's thread:
/// `on_start` before the first message, `on_stop` after the last. A panic in a handler is
/// caught and logged, and the endpoint is stopped (without `on_stop`, since its state may be
/// broken) and dropped; other endpoints keep running.
pub trait Endpoint: Send + Sized + 'static {
    /// The messages it receives. Requests carry a [`Reply`] for the answer.
    type Msg: Send + 'static;

    /// Runs on the loop before any message.
    fn on_start(&mut self, ctx: &mut Ctx<'_, Self>) {
        let _ = ctx;
    }

    /// Handles one message.
    fn on_message(&mut self, msg: Self::Msg, ctx: &mut Ctx<'_, Self>);

    /// A wake-up another thread sent with [`EndpointRef::notify`]: `what` says which (an
    /// endpoint that drains a queue of its own when told, say).
    fn on_notify(&mut self, what: u32, ctx: &mut Ctx<'_, Self>) {
        let _ = (what, ctx);
    }

    /// A mio source this endpoint registered (see [`Ctx::register`]) is ready.
    fn on_readiness(&mut self, token: Token, event: &Event, ctx: &mut Ctx<'_, Self>) {
        let _ = (token, event, ctx);
    }

    /// A timer this endpoint set (see [`Ctx::timer_once`], [`Ctx::timer_periodic`]) fired.
    fn on_timer(&mut self, timer: TimerId, ctx: &mut Ctx<'_, Self>) {
        let _ = (timer, ctx);
    }

    /// Runs once after each round in which the loop called this endpoint's handlers (its
    /// messages, readiness events and timers of that round), before the loop waits again. An
    /// endpoint that defers work until a burst of inputs is handled (one write for many
    /// messages, say) does it here. A round handles a bounded number of inputs, so the
    /// deferred work is bounded too.
    fn on_batch_end(&mut self, ctx: &mut Ctx<'_, Self>) {
        let _ = ctx;
    }

    /// Runs once after the last message: on [`EndpointRef::stop`], [`Ctx::stop`] or runtime
    /// shutdown. The endpoint (and any sources it owns) is dropped right after.
    fn on_stop(&mut self, ctx: &mut Ctx<'_, Self>) {
        let _ = ctx;
    }
}

/// What a handler can do on its loop: register mio sources, set timers, stop itself, reach
/// the runtime.
pub struct Ctx<'a, E> {
    pub(crate) inner: &'a mut LoopInner,
    pub(crate) me: &'a EndpointRef<E>,
    pub(crate) stop_requested: bool,
}

impl<E: Endpoint> Ctx<'_, E> {
    /// The loop's mio registry, for operations `register`/`deregister` do not cover.
    pub fn registry(&self) -> &Registry {
        self.inner.poll.registry()
    }

    /// Registers `source` on this loop; its readiness events go to this endpoint's
    /// [`Endpoint::on_readiness`] with the returned token. The endpoint keeps ownership of the
    /// source (dropping the source, e.g. with the endpoint, removes it from the poll).
    pub fn register<S: Source + ?Sized>(
        &mut self,
        source: &mut S,
        interest: Interest,
    ) -> Result<Token, LoopCtxError> {
        self.inner.register(self.me.state.id, source, interest)
    }

    /// Changes the interest of a registered source.
    pub fn reregister<S: Source + ?Sized>(
        &mut self,
        source: &mut S,
        token: Token,
        interest: Interest,
    ) -> Result<(), LoopCtxError> {
        self.inner
            .poll
            .registry()
            .reregister(source, token, interest)?;
        Ok(())
    }

    /// Sources registered on this loop, by all its endpoints: what a role that opens and closes
    /// connections can check to see it deregisters the closed ones.
    pub fn sources_registered(&self) -> usize {
        self.inner.sources_registered()
    }

    /// Removes a registered source from the loop and forgets its token.
    pub fn deregister<S: Source + ?Sized>(
        &mut self,
        source: &mut S,
        token: Token,
    ) -> Result<(), LoopCtxError> {
        self.inner.deregister(self.me.state.id, source, token)
    }

    /// Fires [`Endpoint::on_timer`] once after `delay`.
    pub fn timer_once(&mut self, delay: Duration) -> Result<TimerId, TimerError> {
        self.inner.timers.add(self.me.state.id, delay, None)
    }

    /// Fires [`Endpoint::on_timer`] every `period` (first after one period) until cancelled.
    pub fn timer_periodic(&mut self, period: Duration) -> Result<TimerId, TimerError> {
        self.inner
            .timers
            .add(self.me.state.id, period, Some(period))
    }

    /// Cancels one of this endpoint's timers; false if it already fired (one-shot) or was
    /// cancelled.
    pub fn cancel_timer(&mut self, timer: TimerId) -> bool {
        self.inner.timers.cancel(self.me.state.id, timer)
    }

    /// Stops this endpoint when the current handler returns (`on_stop` then runs).
    pub fn stop(&mut self) {
        self.stop_requested = true;
    }

    /// A reference to this endpoint, e.g. to hand to others.
    pub fn myself(&self) -> EndpointRef<E> {
        self.me.clone()
    }

    /// The runtime, to spawn or look up endpoints.
    pub fn runtime(&self) -> RuntimeHandle {
        RuntimeHandle {
            shared: self.me.shared.clone(),
        }
    }

    /// This endpoint's name.
    pub fn name(&self) -> &str {
        &self.me.state.name
    }

    /// The index of the loop this endpoint runs on.
    pub fn loop_index(&self) -> usize {
        self.me.state.loop_index
    }
}

/// Why a message was not accepted. Carries the message back.
pub enum SendError<M> {
    /// The loop's inbox is full (retry, or use [`EndpointRef::send_timeout`]).
    Full(M),
    /// The endpoint has stopped (or panicked).
    Stopped(M),
    /// The runtime is shut down.
    Shutdown(M),
}

impl<M> SendError<M> {
    /// The message that was not sent.
    pub fn into_inner(self) -> M {
        match self {
            SendError::Full(m) | SendError::Stopped(m) | SendError::Shutdown(m) => m,
        }
    }
}

impl<M> std::fmt::Debug for SendError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full(_) => "Full(..)",
            SendError::Stopped(_) => "Stopped(..)",
            SendError::Shutdown(_) => "Shutdown(..)",
        })
    }
}

impl<M> std::fmt::Display for SendError<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SendError::Full(_) => "the endpoint's inbox is full",
            SendError::Stopped(_) => "the endpoint is stopped",
            SendError::Shutdown(_) => "the runtime is shut down",
        })
    }
}

impl<M> std::error::Error for SendError<M> {}

/// Why an [`EndpointRef::ask`] got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// No reply within the timeout.
    #[error("no reply within {timeout_ms} ms")]
    Timeout {
        /// The timeout that expired.
        timeout_ms: u128,
    },
    /// The loop's inbox is full.
    #[error("the endpoint's inbox is full")]
    Full,
    /// The endpoint is stopped, or stopped (or panicked) before replying, or dropped the
    /// [`Reply`] unanswered.
    #[error("the endpoint stopped or dropped the request without replying")]
    Stopped,
    /// The runtime is shut down.
    #[error("the runtime is shut down")]
    Shutdown,
    /// Asked from a handler running on the target's own loop: the loop could not answer while
    /// it waits, so the ask is refused instead of blocking until the timeout.
    #[error("ask from the endpoint's own event loop would deadlock")]
    SameLoop,
}

const WAITING: u8 = 0;
const DONE: u8 = 1;
const DROPPED: u8 = 2;
const ABANDONED: u8 = 3;

struct ReplySlot<R> {
    state: AtomicU8,
    value: Mutex<SlotValue<R>>,
    ready: Condvar,
}

/// The answer, and the task to wake when it comes (for [`EndpointRef::ask_async`]).
struct SlotValue<R> {
    value: Option<R>,
    waker: Option<Waker>,
}

impl<R> ReplySlot<R> {
    fn new() -> Arc<ReplySlot<R>> {
        Arc::new(ReplySlot {
            state: AtomicU8::new(WAITING),
            value: Mutex::new(SlotValue {
                value: None,
                waker: None,
            }),
            ready: Condvar::new(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotValue<R>> {
        self.value.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The answer side of an ask: a one-shot channel back to the asker. Dropping it unanswered
/// makes the asker's `ask` fail with [`AskError::Stopped`].
pub struct Reply<R> {
    slot: Option<Arc<ReplySlot<R>>>,
}

impl<R> std::fmt::Debug for Reply<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reply")
    }
}

impl<R> Reply<R> {
    /// Whether the asker gave up (its ask timed out or its future was dropped): an endpoint
    /// that keeps replies to answer later can drop these.
    pub fn is_abandoned(&self) -> bool {
        self.slot
            .as_ref()
            .is_none_or(|slot| slot.state.load(Ordering::Acquire) == ABANDONED)
    }

    /// Answers the asker. `Err(value)` if it already gave up (timed out).
    pub fn send(mut self, value: R) -> Result<(), R> {
        let Some(slot) = self.slot.take() else {
            return Err(value);
        };
        let mut guard = slot.lock();
        if slot.state.load(Ordering::Acquire) == ABANDONED {
            return Err(value);
        }
        guard.value = Some(value);
        slot.state.store(DONE, Ordering::Release);
        let waker = guard.waker.take();
        drop(guard);
        slot.ready.notify_one();
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }
}

impl<R> Drop for Reply<R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let mut guard = slot.lock();
            let _ =
                slot.state
                    .compare_exchange(WAITING, DROPPED, Ordering::AcqRel, Ordering::Acquire);
            let waker = guard.waker.take();
            drop(guard);
            slot.ready.notify_one();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// A typed, cloneable, `Send` reference to an endpoint, usable from any thread.
pub struct EndpointRef<E> {
    pub(crate) shared: Arc<RuntimeShared>,
    pub(crate) state: Arc<EndpointState>,
    _marker: PhantomData<fn(E) -> E>,
}

impl<E> Clone for EndpointRef<E> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            state: self.state.clone(),
            _marker: PhantomData,
        }
    }
}

impl<E> std::fmt::Debug for EndpointRef<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointRef")
            .field("name", &self.state.name)
            .field("loop_index", &self.state.loop_index)
            .finish()
    }
}

impl<E: Endpoint> EndpointRef<E> {
    pub(crate) fn new(shared: Arc<RuntimeShared>, state: Arc<EndpointState>) -> Self {
        Self {
            shared,
            state,
            _marker: PhantomData,
        }
    }

    /// The endpoint's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    /// The index of the loop it runs on.
    pub fn loop_index(&self) -> usize {
        self.state.loop_index
    }

    /// Whether it is still running (a snapshot).
    pub fn is_alive(&self) -> bool {
        self.state.alive.load(Ordering::Acquire) && !self.shared.closed.load(Ordering::Acquire)
    }

    fn check<M>(&self, msg: M) -> Result<M, SendError<M>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(SendError::Shutdown(msg));
        }
        if !self.state.alive.load(Ordering::Acquire) {
            return Err(SendError::Stopped(msg));
        }
        Ok(msg)
    }

    /// Sends `msg` one way without blocking. Fails with `Full` when the loop's inbox is full,
    /// `Stopped` for a stopped endpoint, `Shutdown` after runtime shutdown. Wakes the loop
    /// only if it is parked.
    pub fn send(&self, msg: E::Msg) -> Result<(), SendError<E::Msg>> {
        let msg = self.check(msg)?;
        let envelope = Envelope::Deliver {
            id: self.state.id,
            msg: Box::new(msg),
        };
        self.shared.loops[self.state.loop_index]
            .push(envelope)
            .map_err(|e| SendError::Full(e.into_msg::<E::Msg>()))
    }

    /// Wakes the endpoint with `what` ([`Endpoint::on_notify`]) without a message: nothing
    /// is allocated, where [`send`](Self::send) boxes its message. For a kick that tells the
    /// endpoint to drain a queue of its own. Fails as `send` does.
    pub fn notify(&self, what: u32) -> Result<(), SendError<u32>> {
        let what = self.check(what)?;
        let envelope = Envelope::Notify {
            id: self.state.id,
            what,
        };
        self.shared.loops[self.state.loop_index]
            .push(envelope)
            .map_err(|e| SendError::Full(e.into_notice()))
    }

    /// Like [`send`](Self::send) but waits (spinning, then sleeping briefly) while the inbox
    /// is full, up to `timeout`: backpressure instead of an immediate error.
    pub fn send_timeout(&self, msg: E::Msg, timeout: Duration) -> Result<(), SendError<E::Msg>> {
        let deadline = crate::runtime::deadline_after(timeout);
        let mut msg = msg;
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            match self.send(msg) {
                Err(SendError::Full(m)) => {
                    if Instant::now() >= deadline {
                        return Err(SendError::Full(m));
                    }
                    msg = m;
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
                other => return other,
            }
        }
    }

    /// Sends the request built by `make` (which gets the [`Reply`] to put in the message) and
    /// blocks up to `timeout` for the answer: a full inbox is waited on within that same
    /// timeout (as [`send_timeout`](Self::send_timeout) does), never refused at once, so an
    /// ask behind a burst of sends still gets its answer. From a handler, asking an endpoint on the same
    /// loop fails with [`AskError::SameLoop`]; asking one on another loop works but blocks this
    /// loop meanwhile (prefer `send` with a reply message there).
    pub fn ask<R: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<R>) -> E::Msg,
        timeout: Duration,
    ) -> Result<R, AskError> {
        if super::event_loop::current_loop() == Some(self.state.loop_index) {
            return Err(AskError::SameLoop);
        }
        let slot = ReplySlot::new();
        let reply = Reply {
            slot: Some(slot.clone()),
        };
        let deadline = crate::runtime::deadline_after(timeout);
        match self.send_timeout(make(reply), timeout) {
            Ok(()) => {}
            Err(SendError::Full(_)) => return Err(AskError::Full),
            Err(SendError::Stopped(_)) => return Err(AskError::Stopped),
            Err(SendError::Shutdown(_)) => return Err(AskError::Shutdown),
        }
        // Spin briefly, then yield a few times: a reply from a busy loop usually comes within
        // microseconds, and blocking on the condition variable costs two syscalls.
        // Only where spinning pays (see `spinning_pays`).
        let backoff = crossbeam_utils::Backoff::new();
        while super::spinning_pays()
            && slot.state.load(Ordering::Acquire) == WAITING
            && !backoff.is_completed()
        {
            backoff.snooze();
        }
        let mut guard = slot.lock();
        loop {
            match slot.state.load(Ordering::Acquire) {
                DONE => return guard.value.take().ok_or(AskError::Stopped),
                DROPPED => return Err(AskError::Stopped),
                _ => {}
            }
            let now = Instant::now();
            if now >= deadline {
                slot.state.store(ABANDONED, Ordering::Release);
                return Err(AskError::Timeout {
                    timeout_ms: timeout.as_millis(),
                });
            }
            guard = slot
                .ready
                .wait_timeout(guard, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Sends the request built by `make` and returns a future of the answer: the asking
    /// thread never blocks, so async code can ask. Fails at once with `Full`, `Stopped` or
    /// `Shutdown` as [`send`](Self::send) does; the future fails with `Stopped` if the endpoint
    /// drops the [`Reply`] unanswered. Dropping the future abandons the ask. Bound the wait
    /// with the caller's own timer (e.g. `tokio::time::timeout`).
    pub fn ask_async<R: Send + 'static>(
        &self,
        make: impl FnOnce(Reply<R>) -> E::Msg,
    ) -> Result<AskFuture<R>, AskError> {
        let slot = ReplySlot::new();
        let reply = Reply {
            slot: Some(slot.clone()),
        };
        match self.send(make(reply)) {
            Ok(()) => Ok(AskFuture { slot }),
            Err(SendError::Full(_)) => Err(AskError::Full),
            Err(SendError::Stopped(_)) => Err(AskError::Stopped),
            Err(SendError::Shutdown(_)) => Err(AskError::Shutdown),
        }
    }

    /// Asks the endpoint to stop: messages queued before this request are handled, then
    /// `on_stop` runs. Sends after the stop is handled fail with `Stopped`.
    pub fn stop(&self) -> Result<(), SendError<()>> {
        self.check(())?;
        self.shared.loops[self.state.loop_index]
            .push_wait(Envelope::Stop { id: self.state.id }, Duration::from_secs(1))
            .map_err(|_| SendError::Full(()))
    }
}

/// The answer to an [`EndpointRef::ask_async`], as a future.
pub struct AskFuture<R> {
    slot: Arc<ReplySlot<R>>,
}

impl<R> std::fmt::Debug for AskFuture<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AskFuture")
    }
}

impl<R> Future for AskFuture<R> {
    type Output = Result<R, AskError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut guard = self.slot.lock();
        match self.slot.state.load(Ordering::Acquire) {
            DONE => Poll::Ready(guard.value.take().ok_or(AskError::Stopped)),
            DROPPED => Poll::Ready(Err(AskError::Stopped)),
            _ => {
                guard.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<R> Drop for AskFuture<R> {
    fn drop(&mut self) {
        let _guard = self.slot.lock();
        let _ = self.slot.state.compare_exchange(
            WAITING,
            ABANDONED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }
}
