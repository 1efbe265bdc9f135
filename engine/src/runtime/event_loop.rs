//! One event loop: the thread body that drains the inbox, fires timers, polls mio and
//! dispatches to the endpoints it owns, and the poison-pill shutdown.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::event::{Event, Source};
use mio::{Events, Interest, Poll, Token, Waker};

use super::endpoint::{Ctx, Endpoint, EndpointRef};
use super::inbox::Inbox;
use super::timer::{TimerId, Timers};
use super::{IdMap, RuntimeConfig, RuntimeShared};
use crate::clock;
use crate::spin::AdaptiveSpin;

const WAKER_TOKEN: Token = Token(usize::MAX);

/// How old the sockets' state may be when timers fire, in nanoseconds. A round with a timer due
/// that reaches it longer than this after the loop last polled (a handler busy for a while: a
/// huge job built on the driver's loop) polls without waiting and dispatches first, so what
/// peers sent meanwhile is read before a timer judges their silence (a heartbeat timeout, a
/// suspicion).
const POLL_STALE_NS: u64 = 5_000_000;

thread_local! {
    /// The index of the event loop running on this thread (`usize::MAX`: none).
    static ON_LOOP: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Whether the current thread is an event loop.
pub(crate) fn on_loop_thread() -> bool {
    ON_LOOP.with(|c| c.get()) != usize::MAX
}

/// The index of the event loop running on this thread, if any.
pub(crate) fn current_loop() -> Option<usize> {
    let index = ON_LOOP.with(|c| c.get());
    (index != usize::MAX).then_some(index)
}

/// Why a source could not be (de)registered.
#[derive(Debug, thiserror::Error)]
pub enum LoopCtxError {
    /// mio refused.
    #[error("mio registry: {0}")]
    Io(#[from] std::io::Error),
    /// The token is not registered by this endpoint.
    #[error("token {0:?} is not registered by this endpoint")]
    NotOwner(Token),
}

/// The extracted text of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

/// What goes through a loop's inbox.
pub(crate) enum Envelope {
    Spawn(Box<dyn ErasedEndpoint>),
    Deliver {
        id: u64,
        msg: Box<dyn Any + Send>,
    },
    /// A wake-up without a message (`EndpointRef::notify`): nothing to allocate.
    Notify {
        id: u64,
        what: u32,
    },
    Stop {
        id: u64,
    },
    Poison,
}

impl Envelope {
    /// The message of a `Deliver` envelope built by `EndpointRef::send` for type `M`.
    pub(crate) fn into_msg<M: 'static>(self) -> M {
        match self {
            Envelope::Deliver { msg, .. } => match msg.downcast::<M>() {
                Ok(m) => *m,
                Err(_) => unreachable!("EndpointRef<E> only builds envelopes of E::Msg"),
            },
            _ => unreachable!("EndpointRef::send only builds Deliver envelopes"),
        }
    }

    /// What a `Notify` envelope built by `EndpointRef::notify` carries.
    pub(crate) fn into_notice(self) -> u32 {
        match self {
            Envelope::Notify { what, .. } => what,
            _ => unreachable!("EndpointRef::notify only builds Notify envelopes"),
        }
    }
}

pub(crate) fn spawn_envelope<E: Endpoint>(endpoint: E, me: EndpointRef<E>) -> Envelope {
    Envelope::Spawn(Box::new(Holder { ep: endpoint, me }))
}

/// The part of a loop other threads touch.
pub(crate) struct LoopShared {
    pub(crate) inbox: Inbox<Envelope>,
    waker: Waker,
}

impl LoopShared {
    pub(crate) fn new(_index: usize, inbox_capacity: usize) -> std::io::Result<(Poll, Self)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER_TOKEN)?;
        Ok((
            poll,
            Self {
                inbox: Inbox::new(inbox_capacity),
                waker,
            },
        ))
    }

    /// Pushes without blocking; wakes the loop only if it is parked.
    #[inline]
    pub(crate) fn push(&self, envelope: Envelope) -> Result<(), Envelope> {
        if self.inbox.push(envelope)? {
            if let Err(e) = self.waker.wake() {
                tracing::error!(error = %e, "could not wake an event loop");
            }
        }
        Ok(())
    }

    /// Pushes, waiting up to `timeout` for room.
    pub(crate) fn push_wait(&self, envelope: Envelope, timeout: Duration) -> Result<(), Envelope> {
        let deadline = crate::runtime::deadline_after(timeout);
        let backoff = crossbeam_utils::Backoff::new();
        let mut envelope = envelope;
        loop {
            match self.push(envelope) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    envelope = e;
                    if backoff.is_completed() {
                        std::thread::sleep(Duration::from_micros(50));
                    } else {
                        backoff.snooze();
                    }
                }
            }
        }
    }

    /// Pushes the poison pill, waiting as long as it takes (the loop keeps draining).
    pub(crate) fn push_poison(&self) {
        let mut envelope = Envelope::Poison;
        loop {
            match self.push_wait(envelope, Duration::from_secs(1)) {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(
                        "event loop inbox full for 1 s while shutting down; still waiting"
                    );
                    envelope = e;
                }
            }
        }
    }
}

/// The loop state handlers may touch through their [`Ctx`].
pub(crate) struct LoopInner {
    pub(crate) poll: Poll,
    pub(crate) timers: Timers,
    /// Which endpoint registered each token (looked up per readiness event).
    tokens: IdMap<u64>,
    next_token: usize,
}

impl LoopInner {
    pub(crate) fn register<S: Source + ?Sized>(
        &mut self,
        endpoint: u64,
        source: &mut S,
        interest: Interest,
    ) -> Result<Token, LoopCtxError> {
        let token = Token(self.next_token);
        self.poll.registry().register(source, token, interest)?;
        self.next_token += 1;
        if self.next_token == WAKER_TOKEN.0 {
            self.next_token = 0;
        }
        self.tokens.insert(token.0 as u64, endpoint);
        Ok(token)
    }

    pub(crate) fn deregister<S: Source + ?Sized>(
        &mut self,
        endpoint: u64,
        source: &mut S,
        token: Token,
    ) -> Result<(), LoopCtxError> {
        if self.tokens.get(token.0 as u64) != Some(&endpoint) {
            return Err(LoopCtxError::NotOwner(token));
        }
        self.poll.registry().deregister(source)?;
        self.tokens.remove(token.0 as u64);
        Ok(())
    }

    pub(crate) fn sources_registered(&self) -> usize {
        self.tokens.len()
    }
}

pub(crate) enum Outcome {
    Continue,
    Stop,
    Panicked,
}

/// An endpoint with its type erased, as the loop stores it.
pub(crate) trait ErasedEndpoint: Send {
    fn id(&self) -> u64;
    fn start(&mut self, inner: &mut LoopInner) -> Outcome;
    fn message(&mut self, msg: Box<dyn Any + Send>, inner: &mut LoopInner) -> Outcome;
    fn notice(&mut self, what: u32, inner: &mut LoopInner) -> Outcome;
    fn readiness(&mut self, token: Token, event: &Event, inner: &mut LoopInner) -> Outcome;
    fn timer(&mut self, timer: TimerId, inner: &mut LoopInner) -> Outcome;
    fn batch_end(&mut self, inner: &mut LoopInner) -> Outcome;
    fn stop(&mut self, inner: &mut LoopInner);
    fn mark_dead(&self);
}

struct Holder<E: Endpoint> {
    ep: E,
    me: EndpointRef<E>,
}

impl<E: Endpoint> Holder<E> {
    fn call(
        &mut self,
        inner: &mut LoopInner,
        what: &str,
        f: impl FnOnce(&mut E, &mut Ctx<'_, E>),
    ) -> Outcome {
        let mut ctx = Ctx {
            inner,
            me: &self.me,
            stop_requested: false,
        };
        let ep = &mut self.ep;
        match catch_unwind(AssertUnwindSafe(|| f(ep, &mut ctx))) {
            Ok(()) if ctx.stop_requested => Outcome::Stop,
            Ok(()) => Outcome::Continue,
            Err(payload) => {
                tracing::error!(
                    endpoint = %self.me.state.name,
                    handler = what,
                    panic = %panic_message(payload.as_ref()),
                    "endpoint handler panicked; stopping the endpoint"
                );
                Outcome::Panicked
            }
        }
    }
}

impl<E: Endpoint> ErasedEndpoint for Holder<E> {
    fn id(&self) -> u64 {
        self.me.state.id
    }

    fn start(&mut self, inner: &mut LoopInner) -> Outcome {
        self.call(inner, "on_start", |ep, ctx| ep.on_start(ctx))
    }

    fn message(&mut self, msg: Box<dyn Any + Send>, inner: &mut LoopInner) -> Outcome {
        match msg.downcast::<E::Msg>() {
            Ok(msg) => self.call(inner, "on_message", |ep, ctx| ep.on_message(*msg, ctx)),
            Err(_) => {
                tracing::error!(endpoint = %self.me.state.name, "message of the wrong type dropped");
                Outcome::Continue
            }
        }
    }

    fn notice(&mut self, what: u32, inner: &mut LoopInner) -> Outcome {
        self.call(inner, "on_notify", |ep, ctx| ep.on_notify(what, ctx))
    }

    fn readiness(&mut self, token: Token, event: &Event, inner: &mut LoopInner) -> Outcome {
        self.call(inner, "on_readiness", |ep, ctx| {
            ep.on_readiness(token, event, ctx)
        })
    }

    fn timer(&mut self, timer: TimerId, inner: &mut LoopInner) -> Outcome {
        self.call(inner, "on_timer", |ep, ctx| ep.on_timer(timer, ctx))
    }

    fn batch_end(&mut self, inner: &mut LoopInner) -> Outcome {
        self.call(inner, "on_batch_end", |ep, ctx| ep.on_batch_end(ctx))
    }

    fn stop(&mut self, inner: &mut LoopInner) {
        self.mark_dead();
        let _ = self.call(inner, "on_stop", |ep, ctx| ep.on_stop(ctx));
    }

    fn mark_dead(&self) {
        self.me.state.alive.store(false, Ordering::Release);
        self.me
            .shared
            .unregister(&self.me.state.name, self.me.state.id);
    }
}

pub(crate) struct EventLoop {
    index: usize,
    inner: LoopInner,
    endpoints: IdMap<Box<dyn ErasedEndpoint>>,
    /// Endpoints whose handlers ran in this round: their `on_batch_end` is due.
    touched: Vec<u64>,
    shared: Arc<RuntimeShared>,
    batch_max: usize,
    events_capacity: usize,
    spin_before_park: Duration,
}

impl EventLoop {
    pub(crate) fn new(
        index: usize,
        poll: Poll,
        shared: Arc<RuntimeShared>,
        config: &RuntimeConfig,
    ) -> Self {
        Self {
            index,
            inner: LoopInner {
                poll,
                timers: Timers::new(config.timers_max),
                tokens: IdMap::new(),
                next_token: 0,
            },
            endpoints: IdMap::new(),
            touched: Vec::new(),
            shared,
            batch_max: config.batch_max.max(1),
            events_capacity: config.events_capacity.max(16),
            spin_before_park: config.spin_before_park,
        }
    }

    fn me(&self) -> &LoopShared {
        &self.shared.loops[self.index]
    }

    pub(crate) fn run(mut self) {
        ON_LOOP.with(|c| c.set(self.index));
        let shared = self.shared.clone();
        let me = &shared.loops[self.index];
        let mut events = Events::with_capacity(self.events_capacity);
        let mut spin = AdaptiveSpin::new(self.spin_before_park);
        // The last round handled messages and left the sockets unpolled.
        let mut poll_skipped = false;
        // When the sockets were last polled.
        let mut polled_ns = clock::now_ns();
        // Until the poison pill.
        while let Some(handled) = self.drain_inbox(me) {
            let now = clock::now_ns();
            if now.saturating_sub(polled_ns) > POLL_STALE_NS
                && !self.inner.tokens.is_empty()
                && self
                    .inner
                    .timers
                    .next_deadline_ns()
                    .is_some_and(|due| due <= now)
            {
                polled_ns = now;
                self.poll_ready(&mut events);
            }
            self.fire_timers(now);
            self.end_batch();
            let has_sources = !self.inner.tokens.is_empty();
            let mut timeout = Some(Duration::ZERO);
            let mut parked = false;
            if handled > 0 {
                spin.work(now);
                // An inbox taken whole is likely empty now: the next round looks again and,
                // finding nothing, polls as it parks, one system call where polling now
                // first would make two. Never twice in a row, so a stream of messages does
                // not keep the sockets waiting.
                let skip = handled < self.batch_max && !poll_skipped;
                if !has_sources || skip {
                    poll_skipped = has_sources;
                    continue;
                }
            } else if spin.idle(now) {
                // Adaptive and within the process's budget of spinners (`crate::spin`).
                std::hint::spin_loop();
                if !has_sources {
                    continue;
                }
            } else {
                timeout = (self.inner.timers.next_deadline_ns())
                    .map(|d| Duration::from_nanos(d.saturating_sub(now)));
                if timeout != Some(Duration::ZERO) {
                    parked = me.inbox.park_prepare();
                    if !parked {
                        continue;
                    }
                    spin.parking();
                }
            }
            poll_skipped = false;
            let polled = self.inner.poll.poll(&mut events, timeout);
            if parked {
                me.inbox.park_done();
            }
            // When this poll returned, without a clock read of its own: `now` unless it
            // parked; a park that ran out, at its timeout; one a socket ended, read now (as
            // the spin wants it anyway); one a message ended, `now` too (a message's handler
            // busy long enough to matter then finds the sockets stale, as it should).
            let for_sockets = events.iter().any(|event| event.token() != WAKER_TOKEN);
            polled_ns = match timeout {
                _ if for_sockets => clock::now_ns(),
                Some(waited) if parked && events.is_empty() => {
                    now.saturating_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX))
                }
                _ => now,
            };
            if let Err(e) = polled {
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::error!(loop_index = self.index, error = %e, "mio poll failed");
                }
                continue;
            }
            if for_sockets {
                spin.work(polled_ns);
            }
            self.dispatch(&events);
            self.end_batch();
        }
        // What was handled before the pill still gets its batch end.
        self.end_batch();
        self.stop_all();
    }

    /// Polls the sockets without waiting and dispatches what is ready (see [`POLL_STALE_NS`]).
    #[cold]
    fn poll_ready(&mut self, events: &mut Events) {
        match self.inner.poll.poll(events, Some(Duration::ZERO)) {
            Ok(()) => self.dispatch(events),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => tracing::error!(loop_index = self.index, error = %e, "mio poll failed"),
        }
    }

    /// Handles up to `batch_max` envelopes from the inbox; returns how many, or None at the
    /// poison pill (the loop stops).
    #[inline]
    fn drain_inbox(&mut self, me: &LoopShared) -> Option<usize> {
        let mut handled = 0;
        while handled < self.batch_max {
            match me.inbox.pop() {
                None => break,
                Some(Envelope::Poison) => return None,
                Some(envelope) => {
                    self.handle(envelope);
                    handled += 1;
                }
            }
        }
        Some(handled)
    }

    /// Hands each readiness event to the endpoint whose source it names (the waker's are
    /// skipped, as are sources gone since).
    #[inline]
    fn dispatch(&mut self, events: &Events) {
        for event in events.iter() {
            let token = event.token();
            if token == WAKER_TOKEN {
                continue;
            }
            let Some(&id) = self.inner.tokens.get(token.0 as u64) else {
                continue;
            };
            if let Some(ep) = self.endpoints.get_mut(id) {
                let outcome = ep.readiness(token, event, &mut self.inner);
                self.apply(id, outcome);
            }
        }
    }

    fn handle(&mut self, envelope: Envelope) {
        match envelope {
            Envelope::Spawn(mut ep) => {
                let id = ep.id();
                let outcome = ep.start(&mut self.inner);
                self.endpoints.insert(id, ep);
                self.apply(id, outcome);
            }
            Envelope::Deliver { id, msg } => {
                if let Some(ep) = self.endpoints.get_mut(id) {
                    let outcome = ep.message(msg, &mut self.inner);
                    self.apply(id, outcome);
                }
            }
            Envelope::Notify { id, what } => {
                if let Some(ep) = self.endpoints.get_mut(id) {
                    let outcome = ep.notice(what, &mut self.inner);
                    self.apply(id, outcome);
                }
            }
            Envelope::Stop { id } => self.apply(id, Outcome::Stop),
            Envelope::Poison => {}
        }
    }

    fn fire_timers(&mut self, now_ns: u64) {
        // Bounded: at most as many as are due now (periodic ones re-arm in the future).
        while let Some((id, timer)) = self.inner.timers.pop_due(now_ns) {
            if let Some(ep) = self.endpoints.get_mut(id) {
                let outcome = ep.timer(timer, &mut self.inner);
                self.apply(id, outcome);
            }
        }
    }

    /// Runs `on_batch_end` of each endpoint whose handlers ran since the last call (once each).
    fn end_batch(&mut self) {
        while let Some(id) = self.touched.pop() {
            if let Some(ep) = self.endpoints.get_mut(id) {
                let outcome = ep.batch_end(&mut self.inner);
                if !matches!(outcome, Outcome::Continue) {
                    self.apply(id, outcome);
                }
            }
        }
    }

    fn apply(&mut self, id: u64, outcome: Outcome) {
        let run_on_stop = match outcome {
            Outcome::Continue => {
                if !self.touched.contains(&id) {
                    self.touched.push(id);
                }
                return;
            }
            Outcome::Stop => true,
            Outcome::Panicked => false,
        };
        let Some(mut ep) = self.endpoints.remove(id) else {
            return;
        };
        if run_on_stop {
            ep.stop(&mut self.inner);
        } else {
            ep.mark_dead();
        }
        self.forget(id, ep);
    }

    fn forget(&mut self, id: u64, ep: Box<dyn ErasedEndpoint>) {
        self.inner.timers.cancel_all(id);
        self.inner.tokens.retain(|_, owner| *owner != id);
        // Dropping the endpoint drops its sources (closing them removes them from the poll).
        if catch_unwind(AssertUnwindSafe(move || drop(ep))).is_err() {
            tracing::error!(
                loop_index = self.index,
                "an endpoint panicked while being dropped"
            );
        }
    }

    fn stop_all(&mut self) {
        let mut ids: Vec<u64> = self.endpoints.keys().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(mut ep) = self.endpoints.remove(id) {
                ep.stop(&mut self.inner);
                self.forget(id, ep);
            }
        }
        // Whatever raced in after the pill is dropped (asks see their Reply dropped).
        while let Some(envelope) = self.me().inbox.pop() {
            if let Envelope::Spawn(ep) = envelope {
                ep.mark_dead();
            }
        }
    }
}
