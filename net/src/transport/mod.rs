//! One transport for every role. The server side: [`peers`], the sans-IO peer table (the
//! handshake, limits per kind, deadlines, outbound frames) that the driver's and the master's
//! cores embed, and [`server`], its IO half ([`server::Sockets`]: accept, read, append, flush,
//! write-stuck detection; [`server::Server`], sockets and a table for a handler-only role). The
//! client side, its twin: [`link`], the sans-IO link to one peer (the handshake, outbound
//! bytes, the attempt's deadline, the [`link::Backoff`] between attempts, the [`link::Silence`]
//! rule) that the executor's core embeds, and [`client`], its IO half ([`client::Link`]:
//! connect, read, write, one timer; the worker and the application client use it). Here
//! too what every role shares: [`encode`], [`unexpected`], [`send_retrying`] and [`Exit`], the
//! one-shot result a role's `run` waits on.

use std::sync::{Condvar, Mutex};

use bytes::BytesMut;
use flint_engine::runtime::{Endpoint, EndpointRef, SendError};

use crate::wire::Message;

pub mod client;
pub mod link;
pub mod peers;
pub mod server;

/// Appends a frame; a frame that cannot be encoded (over the maximum) is logged and skipped.
pub fn encode(message: &Message<'_>, out: &mut BytesMut, frame_size_max: usize) {
    if let Err(error) = message.encode(out, frame_size_max) {
        tracing::error!("{} not sent: {error}", message.kind().name());
    }
}

/// What a role says of a message its peer may not send now ("unexpected X from the master").
pub fn unexpected(message: &Message<'_>, from: &str) -> String {
    format!("unexpected {} from {from}", message.kind().name())
}

/// Wakes an endpoint with `what` ([`EndpointRef::notify`]: a kick, no message allocated), from
/// a thread off the loop, waiting while the inbox is full; gives up only when the endpoint is
/// gone.
pub fn notify_retrying<E: Endpoint>(to: &EndpointRef<E>, what: u32) {
    loop {
        match to.notify(what) {
            Ok(()) => return,
            Err(SendError::Full(_)) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

/// Sends a message that must not be lost (from a thread off the loop, such as a child's
/// waiter), waiting while the inbox is full; gives up only when the endpoint is gone.
pub fn send_retrying<E: Endpoint>(to: &EndpointRef<E>, make: impl Fn() -> E::Msg) {
    loop {
        match to.send(make()) {
            Ok(()) => return,
            Err(SendError::Full(_)) => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

/// A one-shot result: the first [`Exit::set`] wins, [`Exit::wait`] blocks until there is one.
/// A role's endpoint sets it when it must stop; the role's `run` waits on it.
#[derive(Debug)]
pub struct Exit<T> {
    slot: Mutex<Option<T>>,
    set: Condvar,
}

impl<T> Default for Exit<T> {
    fn default() -> Self {
        Exit {
            slot: Mutex::new(None),
            set: Condvar::new(),
        }
    }
}

impl<T> Exit<T> {
    /// Sets the result unless one is set already.
    pub fn set(&self, result: T) {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some(result);
            self.set.notify_all();
        }
    }

    /// Whether a result is waiting.
    pub fn is_set(&self) -> bool {
        self.slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Waits for the result and takes it. It waits as long as the role runs: the endpoint sets
    /// a result when it stops, whatever the reason.
    pub fn wait(&self) -> T {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(result) = slot.take() {
                return result;
            }
            slot = self.set.wait(slot).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// The frames in `bytes` (all well formed), for tests of the sans-IO cores.
#[cfg(test)]
pub(crate) fn frames_of(bytes: &[u8]) -> Vec<crate::wire::Frame> {
    let mut decoder = crate::wire::FrameDecoder::new(crate::wire::FRAME_SIZE_MAX_DEFAULT);
    decoder.extend_from_slice(bytes);
    std::iter::from_fn(|| decoder.next_frame().expect("well formed")).collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_first_exit_wins_and_wait_takes_it_from_another_thread() {
        let exit = Arc::new(Exit::<u32>::default());
        assert!(!exit.is_set());
        let setter = exit.clone();
        let thread = std::thread::spawn(move || {
            setter.set(1);
            setter.set(2);
        });
        assert_eq!(exit.wait(), 1);
        thread.join().expect("setter");
    }
}
